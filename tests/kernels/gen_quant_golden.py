#!/usr/bin/env python3
"""Golden data for tests/kernels/test_dequant.c, from the `gguf` package's own
quantizer and dequantizer (gguf.quants), an implementation independent of ours.

For every weight type, writes into OUT_DIR:
  <TYPE>.bin  raw rows (ROWS rows of COLS elements, GGUF block layout)
  <TYPE>.f32  the float32 values gguf.quants.dequantize gives for them
Rows 0..3 come from gguf.quants.quantize of random data at several scales
(where gguf can quantize the type); the other rows are random valid blocks
(random bytes with sane f16 scales), so every bit pattern of the payload is
covered. K-quant types (which gguf cannot quantize) use random blocks only.

usage: gen_quant_golden.py OUT_DIR
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

ROWS, COLS = 8, 1024
# block elements, bytes, offsets of f16 scale fields
LAYOUT = {
    T.Q4_0: (32, 18, [0]),
    T.Q4_1: (32, 20, [0, 2]),
    T.Q5_0: (32, 22, [0]),
    T.Q5_1: (32, 24, [0, 2]),
    T.Q8_0: (32, 34, [0]),
    T.Q4_K: (256, 144, [0, 2]),
    T.Q5_K: (256, 176, [0, 2]),
    T.Q6_K: (256, 210, [208]),
}


def sane_f16(rng, n):
    """Random f16 scales of both signs spanning 1e-4 .. 2."""
    mag = 10.0 ** rng.uniform(-4, 0.3, n)
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def random_blocks(rng, qtype, rows):
    blck, size, f16_offs = LAYOUT[qtype]
    nb = rows * COLS // blck
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in f16_offs:
        raw[:, off:off + 2] = sane_f16(rng, nb).view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, COLS // blck * size)


def float_rows(rng, qtype):
    """F16/BF16: random finite bit patterns (normals, subnormals, zeros)."""
    bits = rng.integers(0, 1 << 16, size=(ROWS, COLS), dtype=np.uint32).astype(np.uint16)
    if qtype == T.F16:
        bad = (bits & 0x7C00) == 0x7C00  # inf / nan
        bits[bad] &= 0xBFFF
    else:
        bad = (bits & 0x7F80) == 0x7F80
        bits[bad] &= 0xBFFF
    return bits.view(np.uint8).reshape(ROWS, COLS * 2)


def quantized_rows(rng, qtype):
    if qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        return random_blocks(rng, qtype, ROWS)
    scales = np.array([1e-3, 1.0, 30.0, 1000.0], dtype=np.float32)[:, None]
    x = (rng.standard_normal((4, COLS)).astype(np.float32) * scales).astype(np.float32)
    q = quantize(x, qtype)
    return np.concatenate([q, random_blocks(rng, qtype, ROWS - 4)], axis=0)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(20261126)
    types = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K]
    for qt in types:
        raw = float_rows(rng, qt) if qt in (T.F16, T.BF16) else quantized_rows(rng, qt)
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        ref = dequantize(raw, qt).astype(np.float32)
        assert ref.shape == (ROWS, COLS), (qt.name, ref.shape)
        raw.tofile(os.path.join(out, qt.name + ".bin"))
        ref.tofile(os.path.join(out, qt.name + ".f32"))
    with open(os.path.join(out, "MANIFEST"), "w") as f:
        f.write("%d %d\n" % (ROWS, COLS))
        for qt in types:
            f.write("%s %d\n" % (qt.name, int(qt)))


if __name__ == "__main__":
    main()
