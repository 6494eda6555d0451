#!/usr/bin/env python3
"""Perplexity of the real SmolLM2 over a fixed text with each KV cache dtype.

ferrum's `perplexity` program (bench/perplexity.c) scores the text with an
f16 KV cache (auto on the CPU), int8 and fp8; llama.cpp (llama-cpp-python)
scores the same token ids, chunked and scored the same way, with its f16
cache and with q8_0 K and V (flash attention, which a quantized V needs).

    kv_ppl.py PERPLEXITY_EXE MODEL TEXT [--json OUT] [--check]

--check asserts (the test `test_kv_ppl`): int8 within 0.5% of f16, fp8
within 1%, ferrum's f16 within 1% of llama.cpp's f16, ferrum's int8 within
1% of llama.cpp's q8_0, and every perplexity finite and plausible
(1 < ppl < 1000). Measured (docs/bench/kv-cache-dtype.md): 0.05%, 0.19%,
0.25% and 0.10%.
Prints one line per configuration and the time each took.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

CTX = 512


def ferrum_ppl(exe, model, text, dtype, tokens_out=None):
    cmd = [exe, "--model", model, "--text", text, "--ctx", str(CTX), "--kv-cache-dtype", dtype]
    if tokens_out:
        cmd += ["--tokens-out", tokens_out]
    t0 = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    f = out.stdout.split()
    r = dict(zip(f[0::2], f[1::2]))
    return {"ppl": float(r["ppl"]), "scored": int(r["scored"]), "tokens": int(r["tokens"]), "s": time.time() - t0}


def llama_ppl(model, ids, quant):
    import llama_cpp
    import numpy as np

    kw = dict(n_ctx=CTX, n_batch=CTX, n_ubatch=CTX, logits_all=True, verbose=False, seed=0,
              n_threads=max(1, min(4, os.cpu_count() or 1)))
    if quant:
        kw.update(type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q8_0, flash_attn=True)
    t0 = time.time()
    llm = llama_cpp.Llama(model_path=model, **kw)
    nll, scored = 0.0, 0
    for c in range(len(ids) // CTX):
        chunk = ids[c * CTX:(c + 1) * CTX]
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:CTX], dtype=np.float64)
        mx = logits.max(axis=1, keepdims=True)
        lse = (mx[:, 0] + np.log(np.exp(logits - mx).sum(axis=1)))
        for i in range(CTX - 1):
            nll += lse[i] - logits[i, chunk[i + 1]]
            scored += 1
    del llm
    return {"ppl": math.exp(nll / scored), "scored": scored, "tokens": len(ids) // CTX * CTX, "s": time.time() - t0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--json")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    res = {}
    with tempfile.TemporaryDirectory() as d:
        tok = os.path.join(d, "tokens.txt")
        res["ferrum f16"] = ferrum_ppl(a.exe, a.model, a.text, "auto", tok)
        ids = [int(x) for x in open(tok).read().split()]
    res["ferrum int8"] = ferrum_ppl(a.exe, a.model, a.text, "int8")
    res["ferrum fp8"] = ferrum_ppl(a.exe, a.model, a.text, "fp8")
    res["llama.cpp f16"] = llama_ppl(a.model, ids, False)
    res["llama.cpp q8_0"] = llama_ppl(a.model, ids, True)
    for k, v in res.items():
        print(f"{k:16s} ppl {v['ppl']:.4f}  ({v['scored']} tokens scored, {v['s']:.1f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if not a.check:
        return
    p = {k: v["ppl"] for k, v in res.items()}
    for k, v in p.items():
        assert 1.0 < v < 1000.0 and math.isfinite(v), f"{k}: perplexity {v}"
    assert res["ferrum f16"]["scored"] == res["llama.cpp f16"]["scored"] >= 3000, res
    rel = lambda a, b: abs(p[a] - p[b]) / p[b]
    checks = [("ferrum int8", "ferrum f16", 0.005), ("ferrum fp8", "ferrum f16", 0.01),
              ("ferrum f16", "llama.cpp f16", 0.01), ("ferrum int8", "llama.cpp q8_0", 0.01)]
    for x, y, tol in checks:
        assert rel(x, y) < tol, f"{x} ({p[x]:.4f}) vs {y} ({p[y]:.4f}): {rel(x, y):.2%} > {tol:.1%}"
        print(f"ok: {x} within {rel(x, y):.3%} of {y} (bound {tol:.1%})")


if __name__ == "__main__":
    main()
