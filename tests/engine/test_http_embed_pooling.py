#!/usr/bin/env python3
"""test_http_embed_pooling.py - `ferrumctl serve --task embed --pooling
mean|cls` with the real SmolLM2 (a decoder), through the official openai
client, against llama.cpp (llama-cpp-python, embedding=True, the same
pooling_type, normalized) on the same GGUF:
- mean pooling: each input's vector is llama.cpp's within cosine 0.999
  (both engines dot int8-quantized activations with the 4-bit weights; last
  or CLS pooling instead of mean gives < 0.95, which the test checks too, so
  it can tell the poolings apart), unit length, in input order;
- a prompt seen before (its blocks in the prefix cache) and 12 concurrent
  requests give the same vectors: mean pooling computes every token each
  time, in one step;
- a prompt longer than the step budget is a 400 that names
  --max-num-batched-tokens (mean pooling does not chunk);
- cls pooling: the first token's state, as llama.cpp's CLS pooling.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_embed_pooling.py
Exit 77 (skip) when the model file, openai or llama-cpp-python is missing.
"""
import concurrent.futures
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402
from embed_util import cosine, embeddings, llama_embedder  # noqa: E402
from skip import main_or_skip  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol-mean"
MAX_LEN = 256
BUDGET = 96
TEXTS = ["The capital of France is", "hello",
         "A long sentence about the weather in Paris during the spring, when the trees bloom."]
LONG = "word " * 120  # more tokens than BUDGET
srv = None
refs = {}  # pooling type -> llama.cpp


def ref(kind):
    if kind not in refs:
        refs[kind] = llama_embedder(MODEL, kind, MAX_LEN)
    return refs[kind]


def serve(pooling):
    return LocalServer(FERRUMCTL, ["--model", MODEL, "--task", "embed", "--pooling", pooling, "--host", "127.0.0.1",
                                   "--served-model-name", NAME, "--max-model-len", str(MAX_LEN),
                                   "--max-num-batched-tokens", str(BUDGET), "--threads", "2"])


def setUpModule():
    global srv
    srv = serve("mean")


def tearDownModule():
    if srv is not None:
        srv.stop()


def embed(s, inputs):
    return embeddings(s, NAME, inputs)[0]


class MeanPooling(unittest.TestCase):
    def test_1_openai_client_matches_llama_cpp_mean(self):
        r = srv.openai(timeout=120).embeddings.create(model=NAME, input=TEXTS)
        self.assertEqual([d.index for d in r.data], [0, 1, 2])
        for text, d in zip(TEXTS, r.data):
            want = ref("mean").embed(text, normalize=True)
            self.assertGreater(cosine(d.embedding, want), 0.999, text)
            self.assertAlmostEqual(sum(x * x for x in d.embedding), 1.0, places=4)
            if len(ref("mean").tokenize(text.encode(), add_bos=False)) > 2:  # other poolings differ
                self.assertLess(cosine(d.embedding, ref("last").embed(text, normalize=True)), 0.95, text)
                self.assertLess(cosine(d.embedding, ref("cls").embed(text, normalize=True)), 0.95, text)

    def test_2_cached_prompts_and_concurrency(self):
        first = embed(srv, TEXTS)
        again = embed(srv, TEXTS)  # every block of these prompts is in the prefix cache now
        longer = embed(srv, TEXTS[2] + " It rained.")[0]
        for a, b in zip(first, again):
            self.assertGreater(cosine(a, b), 0.99999)
        self.assertGreater(cosine(longer, ref("mean").embed(TEXTS[2] + " It rained.", normalize=True)), 0.999)
        inputs = [TEXTS[i % 3] + " " * (i // 3) for i in range(12)]
        serial = [embed(srv, t)[0] for t in inputs[:3]]
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            got = list(pool.map(lambda t: embed(srv, t)[0], inputs))
        for a, b in zip(serial, got[:3]):
            self.assertGreater(cosine(a, b), 0.99999)

    def test_3_prompt_past_the_step_budget_is_400(self):
        st, out = srv.json("POST", "/v1/embeddings", {"model": NAME, "input": LONG})
        self.assertEqual(st, 400, out)
        self.assertIn("--max-num-batched-tokens", out["error"]["message"])
        st, _ = srv.json("GET", "/health")
        self.assertEqual(st, 200)

    def test_4_cls_pooling(self):
        cls = serve("cls")
        try:
            for text, got in zip(TEXTS, embed(cls, TEXTS)):
                self.assertGreater(cosine(got, ref("cls").embed(text, normalize=True)), 0.999, text)
        finally:
            cls.stop()


if __name__ == "__main__":
    main_or_skip(files=[MODEL], programs=[FERRUMCTL], modules=["llama_cpp", "openai"])
