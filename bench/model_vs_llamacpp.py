#!/usr/bin/env python3
"""CPU prefill and decode tokens/s of ferrum (bench/model_bench) beside
llama.cpp (llama-cpp-python, same GGUF, same thread count), as in
llama-bench's pp/tg tests: prefill of P tokens in one batch, then G decode
steps of one token. Prints a markdown table for docs/bench/.

usage: model_vs_llamacpp.py MODEL_BENCH_BINARY MODEL.gguf [--threads 2] [--prefill 128] [--gen 128] [--reps 3]
"""
import argparse
import re
import subprocess
import time

import numpy as np
from llama_cpp import Llama


def llama_cpp(model, threads, prefill, gen, reps):
    llm = Llama(model_path=model, n_ctx=prefill + gen + 16, n_batch=max(prefill, 32), n_threads=threads,
                n_threads_batch=threads, verbose=False, logits_all=False)
    ids = [int(x) for x in np.random.default_rng(0).integers(100, 40000, prefill)]
    pp, tg = [], []
    for _ in range(reps + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        for i in range(gen):
            llm.eval([ids[i % prefill]])
        t2 = time.perf_counter()
        pp.append(prefill / (t1 - t0))
        tg.append(gen / (t2 - t1))
    return max(pp[1:]), max(tg[1:])


def ferrum(binary, model, threads, prefill, gen, reps):
    pp, tg = [], []
    for _ in range(reps):
        out = subprocess.run([binary, "--model", model, "--threads", str(threads), "--prefill", str(prefill),
                              "--prompt", "16", "--gen", str(gen + 1), "--batch", "1", "--repeat", "1"],
                             capture_output=True, text=True, check=True).stdout
        pp.append(float(re.search(r"prefill .*?([\d.]+) tok/s", out).group(1)))
        tg.append(float(re.search(r"decode .*?([\d.]+) tok/s", out).group(1)))
    return max(pp), max(tg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    lpp, ltg = llama_cpp(a.model, a.threads, a.prefill, a.gen, a.reps)
    fpp, ftg = ferrum(a.binary, a.model, a.threads, a.prefill, a.gen, a.reps)
    print(f"| engine | pp{a.prefill} tok/s | tg{a.gen} tok/s |")
    print("|---|---:|---:|")
    print(f"| llama.cpp (llama-cpp-python) | {lpp:.1f} | {ltg:.1f} |")
    print(f"| ferrum | {fpp:.1f} | {ftg:.1f} |")
    print(f"| ferrum / llama.cpp | {fpp / lpp:.2f} | {ftg / ltg:.2f} |")


if __name__ == "__main__":
    main()
