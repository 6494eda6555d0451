#!/usr/bin/env python3
"""Writes the fixtures of the formats tests into OUT_DIR (argv[1]).

GGUF files come from the `gguf` package's GGUFWriter (the writer llama.cpp's
converters use); quantized blocks from gguf.quants where it can quantize,
random bytes otherwise. Each file gets a JSON manifest of what was written
(keys, values, tensor types and shapes, data offsets as gguf.GGUFReader sees
them) and a .bin with every tensor's bytes in manifest order, so the C
reader is checked against an outside reader and writer.

safetensors files are written here by hand per the format's README (u64
header length, JSON header padded with spaces to 8 bytes, then the buffer),
plus small Hugging Face folders (config.json, single and sharded weights).

Rerun: .venv/bin/python tests/formats/make_fixtures.py build-formats/tests/formats-fixtures
"""
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

RNG = np.random.default_rng(1234)

# ---------------------------------------------------------------- GGUF ----

SCALARS = [  # key, type, value
    ("test.u8", VT.UINT8, 200),
    ("test.i8", VT.INT8, -100),
    ("test.u16", VT.UINT16, 60000),
    ("test.i16", VT.INT16, -30000),
    ("test.u32", VT.UINT32, 4000000000),
    ("test.i32", VT.INT32, -2000000000),
    ("test.f32", VT.FLOAT32, 3.5),
    ("test.bool_t", VT.BOOL, True),
    ("test.bool_f", VT.BOOL, False),
    ("test.str", VT.STRING, "h\u00e9llo w\u00f6rld \U0001F600"),
    ("test.u64", VT.UINT64, 2**63 + 5),  # does not fit int64
    ("test.u64_small", VT.UINT64, 123456789012),
    ("test.i64", VT.INT64, -(2**62)),
    ("test.f64", VT.FLOAT64, 2.718281828459045),
]

ARRAYS = [  # key, element type, values
    ("test.arr.u8", VT.UINT8, [0, 1, 255]),
    ("test.arr.i8", VT.INT8, [-128, 0, 127]),
    ("test.arr.u16", VT.UINT16, [0, 65535]),
    ("test.arr.i16", VT.INT16, [-32768, 32767]),
    ("test.arr.u32", VT.UINT32, [1, 2, 4294967295]),
    ("test.arr.i32", VT.INT32, [-5, 6, -7, 8]),
    ("test.arr.f32", VT.FLOAT32, [0.5, -1.25, 1e10]),
    ("test.arr.bool", VT.BOOL, [True, False, True]),
    ("test.arr.u64", VT.UINT64, [0, 2**40]),
    ("test.arr.i64", VT.INT64, [-(2**40), 7]),
    ("test.arr.f64", VT.FLOAT64, [1.5, -2.0]),
    ("test.arr.str", VT.STRING, ["a", "", "\u00fcn\u00efc\u00f6de", "x" * 300, "last"]),
    # the shape of a tokenizer's arrays
    ("tokenizer.ggml.tokens", VT.STRING, ["<unk>", "<s>", "</s>", "hello", "\u0120world"]),
    ("tokenizer.ggml.scores", VT.FLOAT32, [0.0, -1.0, -2.0, -3.5, -4.25]),
    ("tokenizer.ggml.token_type", VT.INT32, [2, 3, 3, 1, 1]),
]

BLOCK = {QT.F32: (1, 4), QT.F16: (1, 2), QT.BF16: (1, 2), QT.Q4_0: (32, 18), QT.Q4_1: (32, 20),
         QT.Q5_0: (32, 22), QT.Q5_1: (32, 24), QT.Q8_0: (32, 34), QT.Q4_K: (256, 144),
         QT.Q5_K: (256, 176), QT.Q6_K: (256, 210)}


def tensor_bytes(qtype, rows, cols):
    """(uint8 array of shape (rows, row_bytes), or a float array) for a tensor of known content."""
    vals = RNG.standard_normal((rows, cols)).astype(np.float32)
    if qtype == QT.F32:
        return vals
    if qtype == QT.F16:
        return vals.astype(np.float16)
    if qtype == QT.BF16:
        b = (vals.view(np.uint32) >> 16).astype(np.uint16)
        return b.view(np.uint8).reshape(rows, cols * 2)
    try:
        return gguf.quants.quantize(vals, qtype)
    except (NotImplementedError, Exception):  # K-quants: arbitrary bytes are valid blocks
        blck, size = BLOCK[qtype]
        return RNG.integers(0, 256, (rows, cols // blck * size), dtype=np.uint8)


def add_tensor(w, name, qtype, shape):
    """shape is numpy order (slowest first); GGUF ne is its reverse."""
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    cols = shape[-1]
    data = tensor_bytes(qtype, rows, cols)
    if qtype in (QT.F32, QT.F16):
        data = data.reshape(shape)
        w.add_tensor(name, data)
    else:
        blck, size = BLOCK[qtype]
        data = data.reshape(list(shape[:-1]) + [cols // blck * size])
        w.add_tensor(name, data, raw_dtype=qtype)
    return np.ascontiguousarray(data).tobytes()


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reader_offsets(path):
    r = gguf.GGUFReader(path)
    return {t.name: int(t.data_offset) for t in r.tensors}


def json_value(vt, v):
    if vt == VT.STRING:
        return v
    if vt == VT.BOOL:
        return bool(v)
    if vt in (VT.FLOAT32,):
        return float(np.float32(v))
    if vt == VT.FLOAT64:
        return float(v)
    if v >= 2**63:
        return {"u64": str(v)}  # past int64: JSON readers cannot hold it as an integer
    return int(v)


def write_all_types(out, alignment=None, name="all_types"):
    path = os.path.join(out, name + ".gguf")
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.data_alignment = alignment
        w.add_uint32("general.alignment", alignment)
    kvs = [{"key": "general.architecture", "type": "string", "value": "llama"}]
    if alignment:
        kvs.append({"key": "general.alignment", "type": "uint32", "value": alignment})
    for key, vt, v in SCALARS:
        w.add_key_value(key, v, vt)
        kvs.append({"key": key, "type": vt.name.lower(), "value": json_value(vt, v)})
    for key, vt, vals in ARRAYS:
        w.add_key_value(key, vals, VT.ARRAY, sub_type=vt)
        kvs.append({"key": key, "type": "array", "arr_type": vt.name.lower(),
                    "values": [json_value(vt, v) for v in vals]})
    specs = [("t.f32", QT.F32, [3, 64]), ("t.f16", QT.F16, [5, 32]), ("t.bf16", QT.BF16, [2, 16]),
             ("t.q8_0", QT.Q8_0, [4, 64]), ("t.q4_0", QT.Q4_0, [3, 96]), ("t.q4_1", QT.Q4_1, [2, 64]),
             ("t.q5_0", QT.Q5_0, [2, 32]), ("t.q5_1", QT.Q5_1, [3, 32]), ("t.q4_k", QT.Q4_K, [2, 256]),
             ("t.q5_k", QT.Q5_K, [1, 512]), ("t.q6_k", QT.Q6_K, [3, 256]),
             ("t.vec", QT.F32, [7]), ("t.3d", QT.F32, [2, 3, 4]), ("t.4d", QT.F16, [2, 2, 3, 8])]
    blobs, tensors = [], []
    for tname, qt, shape in specs:
        blobs.append(add_tensor(w, tname, qt, shape))
        tensors.append({"name": tname, "type": int(qt), "ne": list(reversed(shape)), "nbytes": len(blobs[-1])})
    finish(w)
    offs = reader_offsets(path)
    for t in tensors:
        t["file_offset"] = offs[t["name"]]
    manifest = {"version": 3, "alignment": alignment or 32, "kv": kvs, "tensors": tensors}
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
    with open(os.path.join(out, name + ".bin"), "wb") as f:
        for b in blobs:
            f.write(b)


# A tiny model of each architecture: (dim, heads, kv heads, head_dim, ffn, layers, vocab)
TINY = dict(dim=64, heads=4, kv=2, hd=16, ffn=96, layers=2, vocab=100)


# A tiny qwen3moe: (experts, used per token, expert FFN)
TINY_MOE = dict(experts=4, used=2, eff=32)


def write_gguf_model(out, arch, tied, bias=False, qk_norm=False, head_dim=None, rope_freqs=False, fname=None,
                     moe=None, bad_up_experts=None):
    """moe: a TINY_MOE-like dict (every layer sparse); bad_up_experts: layer 1's
    ffn_up_exps stack has that many experts instead."""
    c = dict(TINY)
    hd = head_dim or c["hd"]
    path = os.path.join(out, fname or "tiny_%s.gguf" % arch)
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny-" + arch)
    w.add_uint32(arch + ".block_count", c["layers"])
    w.add_uint64(arch + ".embedding_length", c["dim"])  # any integer type is accepted
    w.add_int32(arch + ".feed_forward_length", c["ffn"])
    w.add_uint16(arch + ".attention.head_count", c["heads"])
    w.add_uint8(arch + ".attention.head_count_kv", c["kv"])
    w.add_uint32(arch + ".context_length", 4096)
    w.add_float32(arch + ".attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(arch + ".rope.freq_base", 500000.0)
    if head_dim:
        w.add_uint32(arch + ".attention.key_length", hd)
        w.add_uint32(arch + ".attention.value_length", hd)
    if arch == "llama" and not rope_freqs:
        w.add_string(arch + ".rope.scaling.type", "linear")
        w.add_float32(arch + ".rope.scaling.factor", 4.0)
    if moe:
        w.add_uint32(arch + ".expert_count", moe["experts"])
        w.add_uint32(arch + ".expert_used_count", moe["used"])
        w.add_uint32(arch + ".expert_feed_forward_length", moe["eff"])
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    d, q, kv, f, v = c["dim"], c["heads"] * hd, c["kv"] * hd, c["ffn"], c["vocab"]
    add_tensor(w, "token_embd.weight", QT.Q8_0, [v, d])
    add_tensor(w, "output_norm.weight", QT.F32, [d])
    if not tied:
        add_tensor(w, "output.weight", QT.Q6_K if d % 256 == 0 else QT.F16, [v, d])
    if rope_freqs:
        add_tensor(w, "rope_freqs.weight", QT.F32, [hd // 2])
    for i in range(c["layers"]):
        p = "blk.%d." % i
        add_tensor(w, p + "attn_norm.weight", QT.F32, [d])
        add_tensor(w, p + "attn_q.weight", QT.Q4_0, [q, d])
        add_tensor(w, p + "attn_k.weight", QT.Q4_1, [kv, d])
        add_tensor(w, p + "attn_v.weight", QT.Q5_0, [kv, d])
        add_tensor(w, p + "attn_output.weight", QT.Q5_1, [d, q])
        if bias:
            add_tensor(w, p + "attn_q.bias", QT.F32, [q])
            add_tensor(w, p + "attn_k.bias", QT.F32, [kv])
            add_tensor(w, p + "attn_v.bias", QT.F32, [kv])
        if qk_norm:
            add_tensor(w, p + "attn_q_norm.weight", QT.F32, [hd])
            add_tensor(w, p + "attn_k_norm.weight", QT.F32, [hd])
        add_tensor(w, p + "ffn_norm.weight", QT.F32, [d])
        if moe:
            n, ef = moe["experts"], moe["eff"]
            add_tensor(w, p + "ffn_gate_inp.weight", QT.F32, [n, d])
            add_tensor(w, p + "ffn_gate_exps.weight", QT.Q8_0, [n, ef, d])
            n_up = bad_up_experts if bad_up_experts and i == 1 else n
            add_tensor(w, p + "ffn_up_exps.weight", QT.Q4_0, [n_up, ef, d])
            add_tensor(w, p + "ffn_down_exps.weight", QT.F16, [n, d, ef])
            continue
        add_tensor(w, p + "ffn_gate.weight", QT.F16, [f, d])
        add_tensor(w, p + "ffn_up.weight", QT.BF16, [f, d])
        add_tensor(w, p + "ffn_down.weight", QT.Q8_0, [d, f])
    finish(w)


# --------------------------------------------------------- safetensors ----

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "U8": np.uint8, "I32": np.int32,
             "BOOL": np.bool_, "F64": np.float64}


def st_array(dtype, shape):
    if dtype == "BF16":
        f = RNG.standard_normal(shape).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16)
    if dtype == "F8_E4M3":
        return RNG.integers(0, 256, shape, dtype=np.uint8)
    if dtype in ("I64", "U8", "I32"):
        return RNG.integers(0, 100, shape).astype(ST_DTYPES[dtype])
    if dtype == "BOOL":
        return RNG.integers(0, 2, shape).astype(np.bool_)
    return RNG.standard_normal(shape).astype(ST_DTYPES[dtype])


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape); returns {name: bytes}."""
    header, blobs, at = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    data = {}
    for name, dtype, shape in tensors:
        b = np.ascontiguousarray(st_array(dtype, shape)).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(b)]}
        at += len(b)
        blobs.append(b)
        data[name] = b
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return data


def write_st_all(out):
    specs = [("w.f32", "F32", [3, 5]), ("w.f16", "F16", [4, 2, 3]), ("w.bf16", "BF16", [6]),
             ("w.i64", "I64", [2, 2]), ("w.u8", "U8", [5]), ("w.bool", "BOOL", [3]),
             ("w.f8", "F8_E4M3", [4]), ("w.scalar", "F32", []), ("w.empty", "F32", [0, 4]),
             ("w.f64", "F64", [2])]
    data = write_safetensors(os.path.join(out, "st_all.safetensors"), specs, {"format": "pt", "k": "v"})
    manifest = [{"name": n, "dtype": d, "shape": s, "nbytes": len(data[n])} for n, d, s in sorted(specs)]
    with open(os.path.join(out, "st_all.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    with open(os.path.join(out, "st_all.bin"), "wb") as f:
        for m in manifest:
            f.write(data[m["name"]])


def write_st_gptq(out):
    """A seed for fuzz_safetensors' GPTQ/AWQ repacking: one GPTQ layer (64
    inputs, 16 outputs, 2 groups of 32, act-order g_idx) and one AWQ layer
    of the same sizes, with valid values; and for its FP8 decoding, three
    F8_E4M3 layers of 5 x 7 (bytes without NaN) with a scale per tensor, per
    row and per 2 x 3 block."""
    g_idx = np.repeat(np.arange(2, dtype=np.int32), 32)
    RNG.shuffle(g_idx)
    fp8 = lambda: ("F8_E4M3", RNG.integers(0, 0x7f, (5, 7)).astype(np.uint8))  # noqa: E731
    arrays = {"gptq.qweight": ("I32", RNG.integers(-2**31, 2**31, (8, 16)).astype(np.int32)),
              "gptq.qzeros": ("I32", RNG.integers(-2**31, 2**31, (2, 2)).astype(np.int32)),
              "gptq.scales": ("F16", (0.01 + RNG.random((2, 16))).astype(np.float16)),
              "gptq.g_idx": ("I32", g_idx),
              "awq.qweight": ("I32", RNG.integers(-2**31, 2**31, (64, 2)).astype(np.int32)),
              "awq.qzeros": ("I32", RNG.integers(-2**31, 2**31, (2, 2)).astype(np.int32)),
              "awq.scales": ("F16", (0.01 + RNG.random((2, 16))).astype(np.float16)),
              "fp8t.weight": fp8(), "fp8t.weight_scale": ("F32", np.array(0.5, dtype=np.float32)),
              "fp8r.weight": fp8(), "fp8r.weight_scale": ("F16", (0.01 + RNG.random((5, 1))).astype(np.float16)),
              "fp8b.weight": fp8(), "fp8b.weight_scale_inv": ("F32", (0.01 + RNG.random((3, 3))).astype(np.float32))}
    write_st_arrays(os.path.join(out, "st_gptq.safetensors"), arrays)


def write_st_gptq_wide(out):
    """GPTQ (act-order) and AWQ layers of 64 inputs and 392 outputs, 2 groups
    of 32: enough rows for model_quant_rows to share them over threads."""
    g_idx = np.repeat(np.arange(2, dtype=np.int32), 32)
    RNG.shuffle(g_idx)
    n = 392
    arrays = {"gptq.qweight": ("I32", RNG.integers(-2**31, 2**31, (8, n)).astype(np.int32)),
              "gptq.qzeros": ("I32", RNG.integers(-2**31, 2**31, (2, n // 8)).astype(np.int32)),
              "gptq.scales": ("F16", (0.01 + RNG.random((2, n))).astype(np.float16)),
              "gptq.g_idx": ("I32", g_idx),
              "awq.qweight": ("I32", RNG.integers(-2**31, 2**31, (64, n // 8)).astype(np.int32)),
              "awq.qzeros": ("I32", RNG.integers(-2**31, 2**31, (2, n // 8)).astype(np.int32)),
              "awq.scales": ("F16", (0.01 + RNG.random((2, n))).astype(np.float16))}
    write_st_arrays(os.path.join(out, "st_gptq_wide.safetensors"), arrays)


def write_st_arrays(path, arrays):
    """A safetensors file of arrays: name -> (dtype, numpy array), in order."""
    header, blobs, at = {}, [], 0
    for name, (dtype, a) in arrays.items():
        b = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        at += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def hf_tensors(c, dtype, tied, bias, qk_norm, hd, moe=None):
    """moe: a TINY_MOE-like dict plus "dense", the layers that keep a dense MLP."""
    d, q, kv, f, v = c["dim"], c["heads"] * hd, c["kv"] * hd, c["ffn"], c["vocab"]
    t = [("model.embed_tokens.weight", dtype, [v, d]), ("model.norm.weight", dtype, [d])]
    if not tied:
        t.append(("lm_head.weight", dtype, [v, d]))
    for i in range(c["layers"]):
        p = "model.layers.%d." % i
        t += [(p + "input_layernorm.weight", dtype, [d]),
              (p + "self_attn.q_proj.weight", dtype, [q, d]),
              (p + "self_attn.k_proj.weight", "F16", [kv, d]),
              (p + "self_attn.v_proj.weight", "F32", [kv, d]),
              (p + "self_attn.o_proj.weight", dtype, [d, q]),
              (p + "post_attention_layernorm.weight", dtype, [d]),
              (p + "self_attn.rotary_emb.inv_freq", "F32", [hd // 2])]  # skipped by the loader
        if moe and i not in moe["dense"]:
            t.append((p + "mlp.gate.weight", dtype, [moe["experts"], d]))
            for e in range(moe["experts"]):
                x = p + "mlp.experts.%d." % e
                t += [(x + "gate_proj.weight", dtype, [moe["eff"], d]), (x + "up_proj.weight", dtype, [moe["eff"], d]),
                      (x + "down_proj.weight", dtype, [d, moe["eff"]])]
        else:
            t += [(p + "mlp.gate_proj.weight", dtype, [f, d]), (p + "mlp.up_proj.weight", dtype, [f, d]),
                  (p + "mlp.down_proj.weight", dtype, [d, f])]
        if bias:
            t += [(p + "self_attn.q_proj.bias", dtype, [q]), (p + "self_attn.k_proj.bias", dtype, [kv]),
                  (p + "self_attn.v_proj.bias", dtype, [kv])]
        if qk_norm:
            t += [(p + "self_attn.q_norm.weight", dtype, [hd]), (p + "self_attn.k_norm.weight", dtype, [hd])]
    return t


def hf_config(arch, c, tied, hd, extra):
    cfg = {"architectures": [arch], "hidden_size": c["dim"], "intermediate_size": c["ffn"],
           "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
           "num_key_value_heads": c["kv"], "vocab_size": c["vocab"], "max_position_embeddings": 2048,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": tied,
           "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
    cfg.update(extra)
    return cfg


def write_hf_folder(out, name, arch, tied, bias=False, qk_norm=False, hd=None, shards=1, extra=None, moe=None):
    c = dict(TINY)
    hd = hd or c["hd"]
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config(arch, c, tied, hd, extra or {}), f, indent=1)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        f.write("{}")
    tensors = hf_tensors(c, "BF16", tied, bias, qk_norm, hd, moe)
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), tensors, {"format": "pt"})
        return
    weight_map = {}
    for s in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = tensors[s::shards]
        write_safetensors(os.path.join(folder, fname), part)
        for t in part:
            weight_map[t[0]] = fname
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=1)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    write_all_types(out)
    write_all_types(out, alignment=64, name="align64")
    write_gguf_model(out, "llama", tied=True)
    write_gguf_model(out, "qwen2", tied=False, bias=True)
    write_gguf_model(out, "qwen3", tied=True, qk_norm=True, head_dim=32)
    write_gguf_model(out, "llama", tied=False, rope_freqs=True, fname="tiny_llama3.gguf")
    write_gguf_model(out, "qwen3moe", tied=True, qk_norm=True, head_dim=32, moe=TINY_MOE)
    write_gguf_model(out, "qwen3moe", tied=True, qk_norm=True, head_dim=32, moe=TINY_MOE,
                     bad_up_experts=3, fname="tiny_qwen3moe_bad_experts.gguf")
    write_st_all(out)
    write_st_gptq(out)
    write_hf_folder(out, "hf_llama", "LlamaForCausalLM", tied=False,
                    extra={"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})
    write_hf_folder(out, "hf_qwen2", "Qwen2ForCausalLM", tied=True, bias=True, shards=3,
                    extra={"eos_token_id": [2, 3], "use_sliding_window": False, "sliding_window": 4096})
    write_hf_folder(out, "hf_qwen3", "Qwen3ForCausalLM", tied=True, qk_norm=True, hd=32,
                    extra={"head_dim": 32, "attention_bias": False})
    m = TINY_MOE
    write_hf_folder(out, "hf_qwen3moe", "Qwen3MoeForCausalLM", tied=True, qk_norm=True, hd=32,
                    extra={"head_dim": 32, "num_experts": m["experts"], "num_experts_per_tok": m["used"],
                           "moe_intermediate_size": m["eff"], "norm_topk_prob": True, "mlp_only_layers": [0]},
                    moe=dict(m, dense=[0]))
    write_st_gptq_wide(out)
    print("fixtures written to", out)


if __name__ == "__main__":
    main()
