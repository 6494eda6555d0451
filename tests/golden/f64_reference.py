#!/usr/bin/env python3
"""Accuracy against exact math: a float64 forward pass of a llama-architecture
GGUF (numpy, written from the format: weights dequantized with the gguf
package, GGUF's interleaved rope on its permuted q/k), and the distance of
ferrum's and llama.cpp's first-token log-probs from it on 24 prompts: for
each prompt, the mean |logprob - exact| over the exact top-5 tokens; the
median over the prompts is the engine's score (nats). SmolLM2 Q4_1 is
chaotic at the rounding level (int8 activations), so a prompt's distance
swings with any change of summation order: with the first 7 prompts alone
the median of the same build was 0.089 on one AVX2 host and 0.155 on
another kind, against llama.cpp's 0.087; over 24 it is 0.074 against
0.083 (docs/bench/cpu-model.md).

usage: f64_reference.py RUN_MODEL GGUF [--check]
  RUN_MODEL: ferrum's tests/parity run_model (CPU); --check exits 1 when
  ferrum's median is above llama.cpp's by more than 0.02 nats."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n <",
    "Once upon a time, in a small village by the sea,",
    "The chemical symbol for gold is",
    "1, 2, 3, 4, 5, 6,",
    "Question: What is the largest planet in our solar system?\nAnswer:",
    "In machine learning, overfitting happens when",
    "The quick brown fox jumps over the",
    "Water boils at a temperature of",
    "import numpy as np\nx = np.",
    "The first president of the United States was",
    "Translate to French: Good morning ->",
    "The sum of 17 and 25 is",
    "Shakespeare wrote the play",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis converts sunlight into",
    "for (int i = 0; i <",
    "The mitochondria is the powerhouse of the",
    "Monday, Tuesday, Wednesday,",
    "The speed of light is approximately",
    "My favourite colour is",
    "SELECT * FROM users WHERE",
    "The Great Wall of China is located in",
    "A haiku about autumn:\n",
]


def field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if f.types[0].name == "STRING" else v[0]


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        arch = field(r, "general.architecture")
        g = lambda k: field(r, f"{arch}.{k}")  # noqa: E731
        self.n_layers, self.dim = int(g("block_count")), int(g("embedding_length"))
        self.n_heads, self.n_kv = int(g("attention.head_count")), int(g("attention.head_count_kv"))
        self.eps, self.theta = float(g("attention.layer_norm_rms_epsilon")), float(g("rope.freq_base"))
        self.hd = self.dim // self.n_heads
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.w[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 and len(t.shape) > 1 else a
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]
        self.vocab = self.w["token_embd.weight"].shape[0]

    def norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # x (n, heads, hd); GGUF llama: adjacent pairs
        i = np.arange(0, self.hd, 2, dtype=np.float64)
        ang = pos[:, None] * self.theta ** (-i / self.hd)
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
        return out

    def forward(self, ids):
        n, w, hd = len(ids), self.w, self.hd
        x = w["token_embd.weight"][ids]
        pos = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for il in range(self.n_layers):
            p = f"blk.{il}."
            h = self.norm(x, w[p + "attn_norm.weight"])
            q = self.rope((h @ w[p + "attn_q.weight"].T).reshape(n, self.n_heads, hd), pos)
            k = self.rope((h @ w[p + "attn_k.weight"].T).reshape(n, self.n_kv, hd), pos)
            v = (h @ w[p + "attn_v.weight"].T).reshape(n, self.n_kv, hd)
            rep = self.n_heads // self.n_kv
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hqk,khd->qhd", s, v).reshape(n, self.dim)
            x = x + o @ w[p + "attn_output.weight"].T
            h = self.norm(x, w[p + "ffn_norm.weight"])
            gt, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            x = x + (gt / (1 + np.exp(-gt)) * up) @ w[p + "ffn_down.weight"].T
        logits = self.norm(x[-1], w["output_norm.weight"]) @ w["output.weight"].T
        return logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    return z - z.max() - np.log(np.exp(z - z.max()).sum())


def ferrum_logprobs(run_model, gguf, ids):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        subprocess.run([run_model, "--model", gguf, "--device", "cpu", "--ids", ",".join(map(str, ids)),
                        "--greedy", "1", "--logits-out", out], check=True, stdout=subprocess.DEVNULL)
        return log_softmax(np.fromfile(out, dtype=np.float32))


def main():
    run_model, gguf = sys.argv[1], sys.argv[2]
    from llama_cpp import Llama
    llm = Llama(model_path=gguf, n_ctx=256, n_threads=os.cpu_count(), logits_all=True, verbose=False)
    ref = Model(gguf)
    scores = {"ferrum": [], "llama.cpp": []}
    for text in PROMPTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        exact = ref.forward(np.array(ids))
        top = np.argsort(-exact)[:5]
        llm.reset()
        llm.eval(ids)
        got = {"ferrum": ferrum_logprobs(run_model, gguf, ids),
               "llama.cpp": log_softmax(llm.scores[len(ids) - 1])}
        for k, lp in got.items():
            scores[k].append(float(np.mean(np.abs(lp[top] - exact[top]))))
    med = {k: float(np.median(v)) for k, v in scores.items()}
    print(json.dumps({"median_nats": med, "per_prompt": scores}, indent=1))
    closer = sum(f <= l for f, l in zip(scores["ferrum"], scores["llama.cpp"]))
    print(f"ferrum {med['ferrum']:.4f} nats, llama.cpp {med['llama.cpp']:.4f}; ferrum closer on {closer} of "
          f"{len(PROMPTS)} prompts")
    if "--check" in sys.argv and med["ferrum"] > med["llama.cpp"] + 0.02:
        sys.exit(1)


if __name__ == "__main__":
    main()
