#!/usr/bin/env python3
"""test_kv_window.py - sliding-window KV block release, end to end.

tiny-mistral-window-hf (GOLDEN_DIR; tests/golden/make_tiny_models.py) is a
random Mistral whose every layer has a window of 16 tokens, so the engine
releases each running sequence's KV blocks before its window
(kv_seq_release_before). The same greedy completions (300 tokens, EOS
ignored; prompts shorter and longer than the window) are asked of:
  - a server that releases, with a pool of 10 blocks of 16 tokens (160
    tokens) and a 512-token context, three requests at once;
  - a server that keeps every block (FERRUM_KV_WINDOW_FREE=0) with a pool
    of 96 blocks, one request at a time.
The tokens must be identical; and the first server generates 3 x 308+
tokens in a pool of 160 tokens, which only holds if blocks are released
(a third server that keeps them in the same 10 blocks caps the context at
160 tokens and refuses the request).

Run: FERRUMCTL=build/bin/ferrumctl GOLDEN_DIR=build/golden python test_kv_window.py
"""
import json
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

FERRUMCTL = os.environ.get("FERRUMCTL", "")
MODEL = os.path.join(os.environ.get("GOLDEN_DIR", ""), "tiny-mistral-window-hf")
PROMPTS = [
    "The keeper of the light climbed the stairs",
    "Once upon a time",
    "A prompt longer than the window of sixteen tokens, so that its prefill already reaches past the window "
    "and the blocks before it are released while the sequence is still decoding its first tokens.",
]
N_OUT = 300


def complete(server, prompt):
    st, body = server.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": N_OUT, "temperature": 0,
                                                          "ignore_eos": True, "logprobs": 1}, timeout=600)
    return st, json.loads(body)


def tokens_of(resp):
    return resp["choices"][0]["logprobs"]["tokens"]


class KvWindowTest(unittest.TestCase):
    def test_release_matches_keep(self):
        old = os.environ.get("FERRUM_KV_WINDOW_FREE")
        os.environ["FERRUM_KV_WINDOW_FREE"] = "0"
        keep = None
        try:
            keep = LocalServer(FERRUMCTL, ["--model", MODEL, "--threads", "1", "--num-kv-blocks", "96",
                                           "--max-model-len", "512"], prefix="ferrum-kvw-keep-")
            self.assertIn("KV cache: 96 blocks", keep.log_text())
            self.assertNotIn("are released", keep.log_text())
            want = []
            for p in PROMPTS:
                st, r = complete(keep, p)
                self.assertEqual(st, 200, r)
                self.assertEqual(r["usage"]["completion_tokens"], N_OUT)
                want.append(tokens_of(r))
            small = LocalServer(FERRUMCTL, ["--model", MODEL, "--threads", "1", "--num-kv-blocks", "10",
                                            "--max-model-len", "512"], prefix="ferrum-kvw-small-")
            try:  # keeping every block, 10 blocks cap the context at 160 tokens
                self.assertIn("context capped at 160 tokens", small.log_text())
                st, r = complete(small, PROMPTS[0])
                self.assertEqual(st, 400, r)
            finally:
                small.stop()
        finally:
            if keep:
                keep.stop()
            if old is None:
                os.environ.pop("FERRUM_KV_WINDOW_FREE", None)
            else:
                os.environ["FERRUM_KV_WINDOW_FREE"] = old
        rel = LocalServer(FERRUMCTL, ["--model", MODEL, "--threads", "1", "--num-kv-blocks", "10",
                                      "--max-model-len", "512"], prefix="ferrum-kvw-rel-")
        try:
            self.assertIn("KV blocks before it are released", rel.log_text())
            got = [None] * len(PROMPTS)

            def run(i):
                got[i] = complete(rel, PROMPTS[i])

            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(900)
            for i, (st, r) in enumerate(got):
                self.assertEqual(st, 200, r)
                self.assertEqual(r["usage"]["completion_tokens"], N_OUT)
                self.assertGreater(r["usage"]["prompt_tokens"] + N_OUT, 160)
                self.assertEqual(tokens_of(r), want[i], "prompt %d: tokens differ with block release" % i)
        finally:
            rel.stop()


if __name__ == "__main__":
    if not FERRUMCTL or not os.path.isdir(MODEL):
        print("skip: FERRUMCTL or GOLDEN_DIR/tiny-mistral-window-hf missing")
        sys.exit(77)
    unittest.main()
