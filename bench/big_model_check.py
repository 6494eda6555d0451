#!/usr/bin/env python3
"""Checks that ferrum runs a bigger GGUF (bench/fetch_big_model.sh) as
llama.cpp (llama-cpp-python) does, before the two are timed on it with
bench/model_vs_llamacpp.py. For each prompt (raw text, and chat prompts
written out in the model's ChatML):

- tokens: `ferrumctl tokenize` against llama.cpp's tokenizer (special tokens
  parsed);
- logits: the last prompt token's logits from tests/parity/run_model against
  llama.cpp's (largest difference, and whether the argmax is the same);
- greedy: N greedy tokens from run_model against llama.cpp's, with vLLM's
  rule (equal, or at the first divergence each side's token is in the
  other's top-5, as tests/parity/compare_greedy.py);
- text (raw prompts only): `ferrumctl run --in-process --raw --temperature 0`
  against llama.cpp's greedy text for the same prompt, both stopping at EOS.

Exits 1 when a tokenization differs or a greedy run fails the rule.

usage: big_model_check.py BUILD_BIN_DIR MODEL.gguf [--greedy 32] [--threads 2]
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama

RAW_PROMPTS = [
    "def fibonacci(n):",
    "The quick brown fox",
    "Paris is the capital of",
    "东京是日本的首都，",
]
CHAT_PROMPTS = [
    "Write a Python function that reverses a string.",
    "What is 17 times 23?",
]
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chatml(text):
    return (f"<|im_start|>system\n{QWEN_SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def llama_greedy(llm, ids, n):
    """(greedy tokens, top-5 at each step, logits at each step)."""
    llm.reset()
    llm.eval(ids)
    cur = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    toks, top5, steps = [], [], []
    for i in range(n):
        t = int(np.argmax(cur))
        toks.append(t)
        top5.append([int(x) for x in np.argsort(-cur)[:5]])
        steps.append(cur)
        if i + 1 < n:
            llm.eval([t])
            cur = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return toks, top5, steps


def llama_text(llm, ids, n):
    """Greedy text up to n tokens or EOS, as ferrumctl run prints it."""
    llm.reset()
    out = []
    for t in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
        if t == llm.token_eos() or len(out) == n:
            break
        out.append(t)
    return llm.detokenize(out).decode("utf-8", "replace")


def greedy_verdict(fr, ll, steps):
    """vLLM's rule on ferrum's and llama.cpp's {greedy, top5} runs: (ok,
    words). At a divergence the words give llama.cpp's logit margin of its
    token over ferrum's (a near tie is a small margin)."""
    ga, gb = fr["greedy"], ll["greedy"]
    div = next((i for i, (x, y) in enumerate(zip(ga, gb)) if x != y), None)
    if div is None:
        return len(ga) == len(gb), f"all {len(ga)} equal"
    ok = ga[div] in ll["top5"][div] and gb[div] in fr["top5"][div]
    margin = float(steps[div][gb[div]] - steps[div][ga[div]])
    return ok, (f"equal for {div}, then {ga[div]} vs {gb[div]}, llama.cpp margin {margin:.3f} "
                f"({'each in the other top-5' if ok else 'NOT in top-5'})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("model")
    ap.add_argument("--greedy", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    bin_dir = Path(a.bin_dir)
    llm = Llama(model_path=a.model, n_ctx=512, n_threads=a.threads, n_threads_batch=a.threads,
                logits_all=True, verbose=False)
    cases = [(p, p, "raw") for p in RAW_PROMPTS] + [(chatml(p), p, "chat") for p in CHAT_PROMPTS]
    failed = 0
    for text, prompt, kind in cases:
        label = f"{kind} {prompt!r}"
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        fids = json.loads(subprocess.run([bin_dir / "ferrumctl", "tokenize", "--model", a.model, "--", text],
                                         capture_output=True, text=True, check=True).stdout)
        fids = fids["ids"] if isinstance(fids, dict) else fids
        if fids != ids:
            print(f"{label}: tokens differ: ferrum {fids} llama.cpp {ids}  FAIL")
            failed += 1
            continue
        toks, top5, steps = llama_greedy(llm, ids, a.greedy)
        lg = steps[0]
        logits_file = Path("/tmp") / f"big_model_check.{id(text)}.f32"
        run = subprocess.run([bin_dir / "run_model", "--model", a.model, "--ids", ",".join(map(str, ids)),
                              "--greedy", str(a.greedy), "--logits-out", str(logits_file)],
                             capture_output=True, text=True, check=True)
        fr = json.loads(run.stdout)
        flg = np.fromfile(logits_file, dtype=np.float32)
        logits_file.unlink()
        ok, words = greedy_verdict(fr, {"greedy": toks, "top5": top5}, steps)
        diff = float(np.max(np.abs(flg - lg)))
        same_top = int(np.argmax(flg)) == int(np.argmax(lg))
        print(f"{label}: {len(ids)} tokens equal; logits max |diff| {diff:.3f} "
              f"(argmax {'same' if same_top else 'differs'}); greedy {words}  {'PASS' if ok else 'FAIL'}")
        failed += not ok
        if kind == "raw":
            want = llama_text(llm, ids, a.greedy)
            got = subprocess.run([bin_dir / "ferrumctl", "run", "--in-process", "--model", a.model, "--raw",
                                  "--prompt", text, "--max-tokens", str(a.greedy), "--temperature", "0",
                                  "--threads", str(a.threads)], capture_output=True, text=True, check=True).stdout
            same = got.rstrip("\n") == want.rstrip("\n")
            print(f"  text: {'same as llama.cpp' if same else 'differs'}: {got.strip()[:70]!r}")
            if not same:
                print(f"  llama.cpp: {want.strip()[:70]!r}")
    print("ok" if not failed else f"{failed} case(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
