#!/usr/bin/env python3
"""test_http_embeddings.py - /v1/embeddings from `ferrumctl serve --task
embed` with the real SmolLM2, through the official openai client, against
llama.cpp (llama-cpp-python, embedding=True, last-token pooling, normalized)
on the same GGUF:
- each input's vector is llama.cpp's within cosine 0.999 (both engines dot
  int8-quantized activations with the 4-bit weights, so they differ in the
  fourth digit; a wrong pooling, norm or position gives < 0.9), unit length,
  in input order, and usage counts llama.cpp's tokens;
- a prompt longer than the step's token budget (chunked prefill) and a
  prompt whose prefix is cached give the same vector as alone;
- float and base64 encodings carry the same float32 values; token-id
  inputs equal their text; 24 concurrent requests equal the serial ones;
- errors: dimensions other than the model's, an empty or too-long input, a
  bad encoding_format, text generation on an embedding server, and
  embeddings on a generation server are 400s that say why.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_embeddings.py
Exit 77 (skip) when the model file, openai or llama-cpp-python is missing.
"""
import base64
import concurrent.futures
import os
import struct
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402
from embed_util import cosine, embeddings, llama_embedder  # noqa: E402
from skip import main_or_skip  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol-embed"
MAX_LEN = 256
BUDGET = 64  # --max-num-batched-tokens: LONG is prefilled in chunks
TEXTS = ["The capital of France is", "hello",
         "A long sentence about the weather in Paris during the spring, when the trees bloom."]
LONG = ("The history of the city of Paris begins with a small settlement on an island in the river Seine, where a "
        "Celtic tribe fished and traded for centuries before the Romans came and built a town they called Lutetia, "
        "with baths, a forum and an arena, on the left bank of the river, where the Latin Quarter stands today.")
srv = None
ref = None  # llama.cpp


def setUpModule():
    global srv, ref
    ref = llama_embedder(MODEL, "last", MAX_LEN)
    srv = LocalServer(FERRUMCTL, ["--model", MODEL, "--task", "embed", "--host", "127.0.0.1", "--served-model-name",
                                  NAME, "--max-model-len", str(MAX_LEN), "--max-num-batched-tokens", str(BUDGET),
                                  "--threads", "2"])


def tearDownModule():
    if srv is not None:
        srv.stop()


def embed(inputs, **extra):
    return embeddings(srv, NAME, inputs, **extra)


class Embeddings(unittest.TestCase):
    def test_1_openai_client_matches_llama_cpp(self):
        r = srv.openai(timeout=120).embeddings.create(model=NAME, input=TEXTS + [LONG])
        self.assertEqual(r.model, NAME)
        self.assertEqual([d.index for d in r.data], [0, 1, 2, 3])
        n_tokens = 0
        for text, d in zip(TEXTS + [LONG], r.data):
            want = ref.embed(text, normalize=True)
            n_tokens += len(ref.tokenize(text.encode(), add_bos=False))
            self.assertEqual(len(d.embedding), len(want))
            self.assertGreater(cosine(d.embedding, want), 0.999, text)
            self.assertAlmostEqual(sum(x * x for x in d.embedding), 1.0, places=4)
        self.assertGreater(len(ref.tokenize(LONG.encode(), add_bos=False)), BUDGET)  # it was chunked
        self.assertEqual(r.usage.prompt_tokens, n_tokens)
        self.assertEqual(r.usage.total_tokens, n_tokens)

    def test_2_encodings_token_ids_and_prefix_cache(self):
        floats, _ = embed(TEXTS)
        b64, _ = embed(TEXTS, encoding_format="base64")
        for f, b in zip(floats, b64):
            raw = base64.b64decode(b)
            self.assertEqual(list(struct.unpack("<%df" % (len(raw) // 4), raw)),
                             [struct.unpack("<f", struct.pack("<f", x))[0] for x in f])
        ids = ref.tokenize(TEXTS[2].encode(), add_bos=False)
        by_ids, _ = embed(ids)
        self.assertEqual(by_ids[0], floats[2])
        both, _ = embed([ids, TEXTS[0]])  # a list of token lists and text in one batch
        self.assertEqual(both, [floats[2], floats[0]])
        # LONG's first blocks are in the prefix cache now: a prompt that extends it computes only its tail
        (alone,), _ = embed(LONG)
        (longer,), _ = embed(LONG + " It grew.")
        (again,), _ = embed(LONG)
        self.assertGreater(cosine(alone, again), 0.99999)
        self.assertGreater(cosine(longer, ref.embed(LONG + " It grew.", normalize=True)), 0.999)

    def test_3_concurrent_requests_equal_serial(self):
        inputs = [TEXTS[i % 3] + " " * (i // 3) for i in range(24)]
        serial = [embed(t)[0][0] for t in inputs[:6]]
        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            got = list(pool.map(lambda t: embed(t)[0][0], inputs))
        for a, b in zip(serial, got[:6]):
            self.assertGreater(cosine(a, b), 0.99999)

    def test_4_errors(self):
        cases = [({"input": "x", "dimensions": 16}, "dimensions"), ({"input": ""}, "input"), ({"input": []}, "input"),
                 ({"input": "x", "encoding_format": "int8"}, "encoding_format"), ({}, "input"),
                 ({"input": "word " * (MAX_LEN + 10)}, None), ({"input": [1, -5]}, None),
                 ({"input": "x", "model": "other"}, None)]
        for body, param in cases:
            st, out = srv.json("POST", "/v1/embeddings", body)
            self.assertIn(st, (400, 404), body)
            self.assertIn("error", out, body)
            if param:
                self.assertEqual(out["error"]["param"], param, out)
        st, body = srv.json("POST", "/v1/embeddings", {"input": "x", "dimensions": 576})
        self.assertEqual(st, 200, body)
        st, out = srv.json("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 2})
        self.assertEqual(st, 400)
        self.assertIn("--task embed", out["error"]["message"])
        st, _ = srv.json("GET", "/health")
        self.assertEqual(st, 200)

    def test_5_generation_server_refuses_embeddings(self):
        gen = LocalServer(FERRUMCTL, ["--model", MODEL, "--host", "127.0.0.1", "--max-model-len", "128",
                                      "--threads", "1"])
        try:
            st, out = gen.json("POST", "/v1/embeddings", {"input": "hello"})
            self.assertEqual(st, 400)
            self.assertIn("--task embed", out["error"]["message"])
        finally:
            gen.stop()


if __name__ == "__main__":
    main_or_skip(files=[MODEL], programs=[FERRUMCTL], modules=["llama_cpp", "openai"])
