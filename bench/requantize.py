#!/usr/bin/env python3
"""requantize.py - other quant types of a GGUF for speed comparisons
(issue 18: Q8_0 and Q4_K_M beside Q4_1), made with llama.cpp's own
quantizer (llama-cpp-python's llama_model_quantize, allow_requantize).

Requantizing the 4-bit SmolLM2 keeps its 4-bit values on a finer grid: the
files are for timing kernels and engines on real shapes and real quant
layouts, not for accuracy.

    .venv/bin/python bench/requantize.py models/SmolLM2-135M-Instruct.Q4_1.gguf Q8_0 Q4_K_M
writes models/SmolLM2-135M-Instruct.Q8_0.gguf and ...Q4_K_M.gguf (skips existing files)."""
import ctypes
import os
import sys

import llama_cpp

TYPES = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
         "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "Q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
         "Q5_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M, "Q6_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K}


def main():
    if len(sys.argv) < 3 or any(t not in TYPES for t in sys.argv[2:]):
        sys.exit("usage: requantize.py IN.gguf TYPE... (TYPE: %s)" % ", ".join(TYPES))
    src = sys.argv[1]
    stem = os.path.basename(src).rsplit(".", 2)[0]
    for t in sys.argv[2:]:
        dst = os.path.join(os.path.dirname(src), "%s.%s.gguf" % (stem, t))
        if os.path.exists(dst):
            print("exists:", dst)
            continue
        p = llama_cpp.llama_model_quantize_default_params()
        p.ftype, p.allow_requantize, p.nthread = TYPES[t], True, os.cpu_count() or 1
        rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
        if rc != 0:
            sys.exit("llama_model_quantize %s failed: %d" % (t, rc))
        print("wrote", dst, os.path.getsize(dst), "bytes")


if __name__ == "__main__":
    main()
