#!/usr/bin/env python3
"""test_http_embed_bert.py - BERT encoders behind `ferrumctl serve --task
embed`, on a tiny random BERT that make_tiny_bert.py writes (seeded, a
WordPiece vocabulary trained on a few sentences), against llama.cpp
(llama-cpp-python, embedding=True) on the same GGUF:
- the GGUF (pooling_type mean): each input's vector is llama.cpp's mean-
  pooled one within cosine 0.9999 (a causal mask, a missing position or
  token-type row, post- instead of pre-norm or another pooling gives far
  less, which the test checks for CLS), usage counts llama.cpp's tokens,
  [CLS] and [SEP] included; token-id inputs equal their text; batches equal
  single requests;
- the same weights as a transformers folder (safetensors, tokenizer.json,
  sentence-transformers' Pooling config naming mean, where a BERT's
  default is CLS): the vectors equal llama.cpp's mean-pooled ones within
  cosine 0.9999, and /tokenize gives HF tokenizers' ids;
- vLLM's --override-pooler-config '{"pooling_type": "CLS"}' on the GGUF
  gives llama.cpp's CLS-pooled vectors;
- a prompt longer than the step budget or the position table is a 400 that
  says why, and text generation on the encoder is a 400; a generation
  server refuses to start on an encoder, naming --task embed, and a
  sentence-transformers folder with a Dense module (which ferrum does not
  run) is refused at start, naming it.

Run: FERRUMCTL=build/bin/ferrumctl python test_http_embed_bert.py
Exit 77 (skip) when llama-cpp-python, gguf, tokenizers or numpy is missing.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from local_serve import LocalServer  # noqa: E402
from embed_util import cosine, embeddings, llama_embedder  # noqa: E402
from skip import main_or_skip  # noqa: E402

FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "tiny-bert"
BUDGET = 64
TEXTS = ["Hello world", "The capital of France is Paris.", "Caf\u00e9 r\u00e9sum\u00e9, na\u00efve!",
         "Mean pooling averages every token's final hidden state.", "unknownword xyzzy \u4f60\u597d"]
tmp = None
srv = None


def setUpModule():
    global tmp, srv
    tmp = tempfile.TemporaryDirectory(prefix="ferrum-bert-")
    subprocess.run([sys.executable, os.path.join(HERE, "make_tiny_bert.py"), tmp.name], check=True,
                   stdout=subprocess.DEVNULL)
    srv = LocalServer(FERRUMCTL, ["--model", gguf_path(), "--task", "embed", "--host", "127.0.0.1",
                                  "--served-model-name", NAME, "--max-num-batched-tokens", str(BUDGET),
                                  "--threads", "2"])


def tearDownModule():
    if srv is not None:
        srv.stop()
    if tmp is not None:
        tmp.cleanup()


def gguf_path():
    return os.path.join(tmp.name, "tiny-bert.gguf")


def llama(pooling):
    return llama_embedder(gguf_path(), pooling, 128)


def embed(s, inputs):
    return embeddings(s, NAME, inputs)


class Bert(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mean = llama("mean")

    def test_1_gguf_matches_llama_cpp_mean(self):
        got, body = embed(srv, TEXTS)
        n_tokens = 0
        for text, v in zip(TEXTS, got):
            want = self.mean.embed(text, normalize=True)
            n_tokens += len(self.mean.tokenize(text.encode(), add_bos=True))
            self.assertEqual(len(v), 64)
            self.assertGreater(cosine(v, want), 0.9999, text)
            self.assertAlmostEqual(sum(x * x for x in v), 1.0, places=4)
        self.assertEqual(body["usage"]["prompt_tokens"], n_tokens)
        cls = llama("cls")
        for text, v in zip(TEXTS, got):  # the test tells poolings apart
            self.assertLess(cosine(v, cls.embed(text, normalize=True)), 0.99, text)

    def test_2_token_ids_and_batches(self):
        ids = self.mean.tokenize(TEXTS[1].encode(), add_bos=True)  # [CLS] ... [SEP]
        (by_ids,), _ = embed(srv, [ids])
        (by_text,), _ = embed(srv, TEXTS[1])
        self.assertGreater(cosine(by_ids, by_text), 0.999999)
        batch, _ = embed(srv, TEXTS)
        self.assertGreater(cosine(batch[1], by_text), 0.999999)

    def test_3_errors(self):
        long_text = " ".join(["paris"] * (BUDGET + 5))
        st, out = srv.json("POST", "/v1/embeddings", {"model": NAME, "input": long_text})
        self.assertEqual(st, 400, out)
        self.assertIn("--max-num-batched-tokens", out["error"]["message"])
        st, out = srv.json("POST", "/v1/completions", {"model": NAME, "prompt": "hi", "max_tokens": 2})
        self.assertEqual(st, 400, out)
        self.assertIn("--task embed", out["error"]["message"])
        st, _ = srv.json("GET", "/health")
        self.assertEqual(st, 200)

    def test_4_position_table_bounds_the_context_and_cls(self):
        wide = LocalServer(FERRUMCTL, ["--model", gguf_path(), "--task", "embed",
                                       "--override-pooler-config", '{"pooling_type": "CLS"}',
                                       "--host", "127.0.0.1",
                                       "--served-model-name", NAME, "--max-num-batched-tokens", "512", "--threads", "1"])
        try:
            st, out = wide.json("POST", "/v1/embeddings", {"input": " ".join(["paris"] * 200)})
            self.assertEqual(st, 400, out)
            self.assertIn("context", out["error"]["message"])
            long_text = " ".join(["paris"] * 100)
            got, _ = embed(wide, [long_text] + TEXTS)
            cls = llama("cls")
            for text, v in zip([long_text] + TEXTS, got):
                self.assertGreater(cosine(v, cls.embed(text, normalize=True)), 0.9999, text)
        finally:
            wide.stop()

    def test_5_hf_folder_st_pooling_and_tokenizer(self):
        from tokenizers import Tokenizer
        folder = os.path.join(tmp.name, "tiny-bert-hf")
        hf = LocalServer(FERRUMCTL, ["--model", folder, "--task", "embed", "--host", "127.0.0.1",
                                     "--served-model-name", NAME, "--threads", "1"])
        try:
            got, _ = embed(hf, TEXTS)
            for text, v in zip(TEXTS, got):
                self.assertGreater(cosine(v, self.mean.embed(text, normalize=True)), 0.9999, text)
            tk = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
            for text in TEXTS:
                st, out = hf.json("POST", "/tokenize", {"model": NAME, "prompt": text})
                self.assertEqual(st, 200, out)
                self.assertEqual(out["tokens"], tk.encode(text).ids, text)
        finally:
            hf.stop()

    def test_6_generation_server_refuses_an_encoder(self):
        p = subprocess.run([FERRUMCTL, "serve", "--model", gguf_path(), "--host", "127.0.0.1", "--port", "0",
                            "--threads", "1"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--task embed", p.stderr)


    def test_7_sentence_transformers_dense_module_is_refused(self):
        folder = os.path.join(tmp.name, "tiny-bert-dense")
        shutil.copytree(os.path.join(tmp.name, "tiny-bert-hf"), folder)
        with open(os.path.join(folder, "modules.json")) as f:
            mods = json.load(f)
        mods.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
        with open(os.path.join(folder, "modules.json"), "w") as f:
            json.dump(mods, f)
        p = subprocess.run([FERRUMCTL, "serve", "--model", folder, "--task", "embed", "--host", "127.0.0.1",
                            "--port", "0", "--threads", "1"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("Dense", p.stderr)
        with open(os.path.join(folder, "modules.json"), "w") as f:
            f.write("[{\"type\": ")  # cut short: an error naming the file, not the default pooling
        p = subprocess.run([FERRUMCTL, "serve", "--model", folder, "--task", "embed", "--host", "127.0.0.1",
                            "--port", "0", "--threads", "1"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("modules.json", p.stderr)


if __name__ == "__main__":
    main_or_skip(programs=[FERRUMCTL], modules=["gguf", "llama_cpp", "numpy", "tokenizers"])
