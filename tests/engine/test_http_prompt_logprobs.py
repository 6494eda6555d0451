#!/usr/bin/env python3
"""test_http_prompt_logprobs.py - prompt logprobs end to end with the real
model through the official openai client:
- vLLM's prompt_logprobs (completions: per choice; chat: on the response):
  null for the first prompt token, then each token's logprob given the
  ones before it, its rank and the top alternatives, equal to llama.cpp's
  on the same GGUF (llama-cpp-python, logits_all: the log-softmax of row
  i - 1 at token i) within LP_TOL nats per token and LP_MEAN_TOL on
  average;
- a completions stream carries them in each choice's first chunk;
- completions echo with logprobs (OpenAI's legacy form, what
  lm-evaluation-harness sends for log-likelihoods): the prompt's tokens
  first in tokens / token_logprobs (first null) / top_logprobs /
  text_offset, then the generated ones; max_tokens 0 with echo gives the
  prompt alone;
- tensor parallelism (TP = 2, the vocabulary split over the ranks) gives
  TP = 1's values within TP_TOL;
- chunked prefill (--max-num-batched-tokens 16: the prompt spans many
  steps) and a prompt of more rows than one logits pass holds
  (--max-num-seqs 8) give the same values as one chunk; a prompt already
  in the prefix cache still gets every position's logprob;
- skip_special_tokens false keeps special tokens in the text;
- bad values are a 400 naming the field.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_prompt_logprobs.py
Exit 77 (skip) when the model file, the openai package or llama_cpp is missing.
"""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol"
# ferrum and llama.cpp sum in different orders (and ferrum's CPU dots use
# int8 activations): on SmolLM2 Q4_1 the prompt logprobs differ by about
# 0.06 nats on average, 0.28 at most on these prompts (112 tokens)
LP_TOL = 0.35
LP_MEAN_TOL = 0.1
# the same engine, chunked or not: only the summation order of attention
# over chunks differs
CHUNK_TOL = 0.02
# tensor parallelism sums partial products in another order, and with
# quantized weights a rounding of the int8 activations can move: test_tp.py's
# tolerance for SmolLM2 (measured here: 0.25 nats at most)
TP_TOL = 0.5
PROMPTS = [
    "The capital of France is Paris, and the capital of Germany is Berlin.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who had three sons. "
    "Every morning he went out in his boat before the sun rose, and every evening he came home with his nets "
    "full of silver fish, which his wife sold at the market in the town on the hill.",
]
SERVE = ["--model", MODEL, "--host", "127.0.0.1", "--served-model-name", NAME, "--max-model-len", "512",
         "--threads", "2"]
srv = None  # one chunk per prompt (512 tokens per step, 64 logits rows per pass)
llm = None  # llama.cpp on the same file


def setUpModule():
    global srv, llm
    from llama_cpp import Llama
    llm = Llama(model_path=MODEL, n_ctx=512, logits_all=True, verbose=False, n_threads=2)
    srv = LocalServer(FERRUMCTL, SERVE)


def tearDownModule():
    if srv is not None:
        srv.stop()


def llama_prompt_logprobs(ids):
    """llama.cpp's logprob of each token after the first, given the ones
    before it. (llama-cpp-python's own echo logprobs read row i for token
    i, one position off, so they are computed here from its logits.)"""
    import numpy as np
    llm.reset()
    llm.eval(ids)
    sc = np.array(llm.scores[:len(ids)], dtype=np.float64)
    mx = sc.max(axis=1, keepdims=True)
    ls = sc - mx - np.log(np.exp(sc - mx).sum(axis=1, keepdims=True))
    return [float(ls[i - 1, ids[i]]) for i in range(1, len(ids))]


def plp_values(plp, ids):
    """The prompt token's logprob of each vLLM prompt_logprobs entry."""
    return [plp[i][str(ids[i])]["logprob"] for i in range(1, len(ids))]


def complete_plp(server, prompt, k=2, **kw):
    st, r = server.json("POST", "/v1/completions", dict(model=NAME, prompt=prompt, max_tokens=1, temperature=0,
                                                         prompt_logprobs=k, **kw))
    assert st == 200, r
    return r


def tokenize(prompt):
    st, r = srv.json("POST", "/tokenize", {"model": NAME, "prompt": prompt})
    assert st == 200, r
    return r["tokens"]


class PromptLogprobs(unittest.TestCase):
    def test_equal_llama_cpp(self):
        """prompt_logprobs through the openai client equal llama.cpp's."""
        c = srv.openai()
        worst, diffs = 0.0, []
        for p in PROMPTS:
            ids = tokenize(p)
            r = c.completions.create(model=NAME, prompt=p, max_tokens=1, temperature=0,
                                     extra_body={"prompt_logprobs": 3})
            plp = r.choices[0].model_extra["prompt_logprobs"]
            self.assertEqual(len(plp), len(ids))
            self.assertIsNone(plp[0])
            ref = llama_prompt_logprobs(ids)
            got = plp_values(plp, ids)
            for i, entry in enumerate(plp[1:]):
                self.assertIn(str(ids[i + 1]), entry)
                self.assertGreaterEqual(len(entry), 3)  # the 3 alternatives, and the token when not among them
                ranks = sorted(v["rank"] for v in entry.values())
                self.assertEqual([x for x in ranks if x <= 3], [1, 2, 3])
                lps = [v["logprob"] for v in entry.values()]
                self.assertTrue(all(x <= 0 and math.isfinite(x) for x in lps))
                top1 = [v for v in entry.values() if v["rank"] == 1][0]["logprob"]
                self.assertEqual(top1, max(lps))
            d = [abs(a - b) for a, b in zip(got, ref)]
            diffs += d
            worst = max(worst, max(d))
        mean = sum(diffs) / len(diffs)
        print("prompt logprobs vs llama.cpp: %d tokens, max |diff| %.4f nats, mean %.4f" % (len(diffs), worst, mean))
        self.assertLessEqual(worst, LP_TOL)
        self.assertLessEqual(mean, LP_MEAN_TOL)

    def test_chat(self):
        """chat: the response's prompt_logprobs cover the templated prompt."""
        c = srv.openai()
        r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Name a color."}],
                                      max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 0})
        plp = r.model_extra["prompt_logprobs"]
        self.assertEqual(len(plp), r.usage.prompt_tokens)
        self.assertIsNone(plp[0])
        self.assertTrue(all(len(e) == 1 and list(e.values())[0]["logprob"] <= 0 for e in plp[1:]))

    def test_echo_logprobs(self):
        """echo + logprobs: the prompt's tokens, then the generated ones; max_tokens 0 the prompt alone."""
        c = srv.openai()
        p = PROMPTS[0]
        ids = tokenize(p)
        plp = complete_plp(srv, p)["choices"][0]["prompt_logprobs"]
        r = c.completions.create(model=NAME, prompt=p, max_tokens=3, temperature=0, echo=True, logprobs=2)
        lp = r.choices[0].logprobs
        self.assertTrue(r.choices[0].text.startswith(p))
        self.assertEqual(len(lp.tokens), len(ids) + 3)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertEqual(lp.token_logprobs[1:len(ids)], plp_values(plp, ids))
        self.assertEqual("".join(lp.tokens[:len(ids)]), p)
        self.assertEqual(lp.text_offset[:len(ids)], [len("".join(lp.tokens[:i])) for i in range(len(ids))])
        self.assertEqual(lp.text_offset[len(ids)], len(p))
        for i in range(1, len(lp.tokens)):  # each position's top logprobs hold its token (lm-eval's is_greedy)
            self.assertIn(lp.tokens[i], lp.top_logprobs[i])
            self.assertEqual(lp.top_logprobs[i][lp.tokens[i]], lp.token_logprobs[i])
        r0 = c.completions.create(model=NAME, prompt=p, max_tokens=0, temperature=0, echo=True, logprobs=1)
        self.assertEqual(r0.choices[0].text, p)
        self.assertEqual(r0.choices[0].logprobs.tokens, lp.tokens[:len(ids)])
        self.assertEqual(r0.choices[0].logprobs.token_logprobs, lp.token_logprobs[:len(ids)])
        self.assertEqual(r0.usage.completion_tokens, 0)
        self.assertEqual(r0.choices[0].finish_reason, "length")

    def test_prefix_cache_and_chunks(self):
        """A cached prompt and a chunked prefill give the one-chunk values."""
        long_p = PROMPTS[2] + " " + PROMPTS[2]  # > 64 rows: several logits passes of one chunk
        ids = tokenize(long_p)
        self.assertGreater(len(ids), 100)
        one = plp_values(complete_plp(srv, long_p)["choices"][0]["prompt_logprobs"], ids)
        for _ in range(2):  # the first fills the prefix cache, the second would hit it
            st, r = srv.json("POST", "/v1/completions", {"model": NAME, "prompt": long_p, "max_tokens": 1})
            self.assertEqual(st, 200, r)
        again = plp_values(complete_plp(srv, long_p)["choices"][0]["prompt_logprobs"], ids)
        self.assertEqual(again, one)
        chunked = LocalServer(FERRUMCTL, SERVE + ["--max-num-batched-tokens", "16", "--max-num-seqs", "8"])
        try:
            got = plp_values(complete_plp(chunked, long_p)["choices"][0]["prompt_logprobs"], ids)
        finally:
            chunked.stop()
        worst = max(abs(a - b) for a, b in zip(got, one))
        print("chunked (16 tokens a step, 8 rows a pass) vs one chunk: %d tokens, max |diff| %.5f" % (len(ids), worst))
        self.assertLessEqual(worst, CHUNK_TOL)

    def test_tensor_parallel(self):
        """TP = 2 (the vocabulary split over the ranks, gathered on rank 0), chunked: TP = 1's values."""
        p = PROMPTS[2]
        ids = tokenize(p)
        one = plp_values(complete_plp(srv, p)["choices"][0]["prompt_logprobs"], ids)
        tp = LocalServer(FERRUMCTL, SERVE + ["--tensor-parallel-size", "2", "--max-num-batched-tokens", "16"])
        try:
            got = plp_values(complete_plp(tp, p)["choices"][0]["prompt_logprobs"], ids)
        finally:
            tp.stop()
        worst = max(abs(a - b) for a, b in zip(got, one))
        print("TP=2 vs TP=1: %d tokens, max |diff| %.4f nats" % (len(ids), worst))
        self.assertLessEqual(worst, TP_TOL)

    def test_keep_special_tokens(self):
        """skip_special_tokens false: a special token generated stays in the text."""
        special = tokenize("<|im_start|>")
        self.assertEqual(len(special), 1)
        body = {"model": NAME, "prompt": "Hello", "max_tokens": 2, "logit_bias": {str(special[0]): 100},
                "ignore_eos": True}
        st, kept = srv.json("POST", "/v1/completions", dict(body, skip_special_tokens=False))
        self.assertEqual(st, 200, kept)
        self.assertEqual(kept["choices"][0]["text"], "<|im_start|><|im_start|>")
        st, skipped = srv.json("POST", "/v1/completions", body)
        self.assertEqual(st, 200, skipped)
        self.assertEqual(skipped["choices"][0]["text"], "")

    def test_bad_values(self):
        cases = [({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
                 ({"prompt_logprobs": "x"}, "prompt_logprobs"),
                 ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 0, "echo": True, "stream": True}, "max_tokens"),
                 ({"skip_special_tokens": "no"}, "skip_special_tokens")]
        for extra, field in cases:
            st, r = srv.json("POST", "/v1/completions", dict({"model": NAME, "prompt": "Hi"}, **extra))
            self.assertEqual(st, 400, (extra, r))
            self.assertEqual(r["error"]["param"], field, (extra, r))
        chat = {"model": NAME, "messages": [{"role": "user", "content": "Hi"}]}
        st, r = srv.json("POST", "/v1/chat/completions", dict(chat, max_tokens=0))
        self.assertEqual((st, r["error"]["param"]), (400, "max_tokens"), r)
        st, r = srv.json("POST", "/v1/chat/completions", dict(chat, prompt_logprobs=1, stream=True))
        self.assertEqual((st, r["error"]["param"]), (400, "prompt_logprobs"), r)  # as vLLM: not in a chat stream

    def test_stream(self):
        """A completions stream: prompt_logprobs and the echoed prompt's logprobs in each choice's first chunk."""
        c = srv.openai()
        p = PROMPTS[1]
        ids = tokenize(p)
        plp = complete_plp(srv, p, k=1)["choices"][0]["prompt_logprobs"]
        chunks = list(c.completions.create(model=NAME, prompt=p, max_tokens=3, temperature=0, echo=True, logprobs=1,
                                           stream=True, extra_body={"prompt_logprobs": 1}))
        first = chunks[0].choices[0]
        self.assertEqual(first.model_extra["prompt_logprobs"], plp)
        self.assertTrue(first.text.startswith(p))
        self.assertEqual(first.logprobs.token_logprobs[1:len(ids)], plp_values(plp, ids))
        self.assertIsNone(first.logprobs.token_logprobs[0])
        self.assertTrue(all("prompt_logprobs" not in (ch.choices[0].model_extra or {}) for ch in chunks[1:] if ch.choices))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        n_lp = sum(len(ch.choices[0].logprobs.tokens) for ch in chunks if ch.choices and ch.choices[0].logprobs)
        self.assertEqual(n_lp, len(ids) + 3)
        once = c.completions.create(model=NAME, prompt=p, max_tokens=3, temperature=0, echo=True)
        self.assertEqual(text, once.choices[0].text)


if __name__ == "__main__":
    try:
        import llama_cpp  # noqa: F401
        import openai  # noqa: F401
    except ImportError as e:
        print("skip: %s" % e)
        sys.exit(77)
    if not MODEL or not os.path.exists(MODEL) or not FERRUMCTL:
        print("skip: FERRUM_MODEL / FERRUMCTL not set")
        sys.exit(77)
    unittest.main(verbosity=2)
