#!/usr/bin/env python3
"""Golden data from llama.cpp (llama-cpp-python) for ferrum's model tests.

For each GGUF model and each prompt: the prompt's token ids (tokenized by
llama.cpp with special tokens parsed), the last prompt token's logits, and
N greedy tokens. Written as OUT/<name>.json plus OUT/<name>.logits (float32
rows, one per case, in case order).

usage: gen_llama_golden.py OUT_DIR NAME=MODEL.gguf[:chat|:raw] ... [--greedy N]

Outputs whose inputs have not changed since they were written are kept
(tests/golden/stamp.py).
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama

from stamp import cached

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a five-year-old.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 23?",
    "Write a Python function that reverses a string.",
    "Who wrote Romeo and Juliet?",
    "Give me a recipe for pancakes.",
    "What are the colors of the rainbow?",
    "Summarize the plot of Cinderella in two sentences.",
    "Why is the sky blue?",
    "Name a mammal that can fly.",
    "How many days are in a leap year?",
    "Describe a cat in one sentence.",
    "What does CPU stand for?",
    "Tell me a joke about computers.",
    "What is the boiling point of water in Fahrenheit?",
    "Write a short poem about autumn leaves.",
    "How do I make a cup of tea?",
    "What is the largest planet in our solar system?",
    "Spell the word 'necessary' backwards.",
    "Café, naïve, 東京, and 🚀: what do these have in common?",
    "Count from one to ten in French.",
]

RAW_PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away,",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5,",
    "Paris is the capital of",
    "東京は日本の首都です。",
    "The meaning of life is",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
]


def smollm2_chat(text):
    return (f"<|im_start|>system\n{SMOLLM2_SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def greedy_run(llm, ids, n_greedy):
    """Greedy continuation: (tokens, top-5 at each step, last prompt logits)."""
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    greedy, top5, cur = [], [], logits
    for _ in range(n_greedy):
        t = int(np.argmax(cur))
        greedy.append(t)
        top5.append([int(i) for i in np.argsort(-cur)[:5]])
        if llm.n_tokens + 1 >= llm.n_ctx():
            break
        llm.eval([t])
        cur = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return greedy, top5, logits


def run_model(name, path, mode, out, n_greedy):
    kw = dict(model_path=path, n_ctx=1024, n_batch=512, n_threads=2, n_threads_batch=2, logits_all=True, seed=0,
              verbose=False)
    llm = Llama(**kw, flash_attn=False)
    # llama.cpp's own flash-attention path: how much llama.cpp agrees with
    # itself when only the attention arithmetic changes (the noise floor).
    llm_fa = Llama(**kw, flash_attn=True)
    vocab = llm.n_vocab()
    prompts = PROMPTS if mode == "chat" else RAW_PROMPTS
    cases, rows = [], []
    for p in prompts:
        text = smollm2_chat(p) if mode == "chat" else p
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        greedy, top5, logits = greedy_run(llm, ids, n_greedy)
        greedy_fa, _, _ = greedy_run(llm_fa, ids, n_greedy)
        rows.append(logits)
        cases.append({"prompt": p, "text": text, "ids": [int(i) for i in ids], "greedy": greedy, "top5": top5,
                      "greedy_fa": greedy_fa})
    np.stack(rows).astype(np.float32).tofile(out / f"{name}.logits")
    meta = {"model": os.path.basename(path), "mode": mode, "vocab": vocab, "n_greedy": n_greedy, "cases": cases}
    (out / f"{name}.json").write_text(json.dumps(meta, ensure_ascii=False))
    print(f"{name}: {len(cases)} cases, vocab {vocab}")


def main():
    args = sys.argv[1:]
    n_greedy = 32
    if "--greedy" in args:
        i = args.index("--greedy")
        n_greedy = int(args[i + 1])
        del args[i:i + 2]
    out = Path(args[0])
    for spec in args[1:]:
        name, rest = spec.split("=", 1)
        path, _, mode = rest.partition(":")
        mode = mode or "raw"
        cached(out, f"llama-{name}", [path], [name, mode, n_greedy],
               lambda: run_model(name, path, mode, out, n_greedy))


if __name__ == "__main__":
    main()
