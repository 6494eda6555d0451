#!/usr/bin/env python3
"""test_hf_cache.py - models named as on the Hugging Face Hub, from the cache
huggingface_hub keeps: a cache laid out as huggingface_hub lays it out
(blobs named by their sha256, snapshots of symlinks into them, refs/main),
read by huggingface_hub's own scan_cache_dir as the reference:
- `ferrumctl list` shows the repositories, revisions and sizes it reports;
- `run --model ORG/NAME:PATTERN` (a GGUF repository) and `--model ORG/NAME`
  (a safetensors folder: tests/golden's tiny Mistral) give the text the same files give by path; a
  pattern matching two files, or none, and an unknown name are clear errors;
- `serve --model ORG/NAME:PATTERN` serves it under that name;
- HF_HOME/hub is the cache when HF_HUB_CACHE is unset;
- `ferrumctl rm ORG/NAME` deletes the repository (huggingface_hub no longer
  sees it) and a later run says it is not in the cache.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... GOLDEN=build/golden python test_hf_cache.py
Exit 77 (skip) when the model, the golden models or huggingface_hub are missing.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
GOLDEN = os.environ.get("GOLDEN", "")  # tests/golden's models: tiny-mistral-window-hf, a folder with a tokenizer
GGUF_REPO, TINY_REPO, TWO_REPO = "TestOrg/SmolLM2-135M-Instruct-GGUF", "TestOrg/tiny-llama", "TestOrg/two-quants"
PROMPT = "The capital of France is"


def add_repo(cache, repo, files, rev):
    """Lays out repo as huggingface_hub does: each file a blob named by its
    sha256 (a hard link where possible), the snapshot a symlink to it."""
    root = os.path.join(cache, "models--" + repo.replace("/", "--"))
    snap = os.path.join(root, "snapshots", rev)
    os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    os.makedirs(snap, exist_ok=True)
    for name, src in files.items():
        h = hashlib.sha256()
        with open(src, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        blob = os.path.join(root, "blobs", h.hexdigest())
        if not os.path.exists(blob):
            try:
                os.link(src, blob)
            except OSError:
                shutil.copyfile(src, blob)
        os.symlink(os.path.join("..", "..", "blobs", h.hexdigest()), os.path.join(snap, name))
    with open(os.path.join(root, "refs", "main"), "w") as f:
        f.write(rev)


def ferrumctl(*args, env=None):
    return subprocess.run([FERRUMCTL, *args], capture_output=True, text=True, timeout=300, env=env)


def run_text(model, env):
    p = ferrumctl("run", "--in-process", "--model", model, "--prompt", PROMPT, "--raw", "--temperature", "0",
                  "--max-tokens", "12", env=env)
    return p.returncode, p.stdout, p.stderr


class HfCache(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ferrum-hf-")
        cls.cache = os.path.join(cls.dir, "hub")
        add_repo(cls.cache, GGUF_REPO, {"smollm2-135m-instruct-q4_1.gguf": MODEL}, "a" * 40)
        tiny = os.path.join(GOLDEN, "tiny-mistral-window-hf")
        add_repo(cls.cache, TINY_REPO, {f: os.path.join(tiny, f) for f in os.listdir(tiny)}, "b" * 40)
        add_repo(cls.cache, TWO_REPO, {"m-Q4_1.gguf": MODEL, "m-Q4_1-copy.gguf": MODEL}, "c" * 40)
        # Offline: a name missing from this cache must not be pulled (test_hf_pull does that, on loopback).
        cls.env = dict(os.environ, HF_HUB_CACHE=cls.cache, HF_HUB_OFFLINE="1")
        cls.env.pop("HF_HOME", None)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_1_list_agrees_with_huggingface_hub(self):
        from huggingface_hub import scan_cache_dir
        info = scan_cache_dir(self.cache)
        self.assertEqual(len(info.warnings), 0, info.warnings)
        p = ferrumctl("list", env=self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = [line.split() for line in p.stdout.splitlines()]
        got = {(r[0], r[1], r[2]) for r in rows}
        want = {(repo.repo_id, rev.commit_hash[:12], "%.1f" % (repo.size_on_disk / 1e6))
                for repo in info.repos for rev in repo.revisions}
        self.assertEqual(got, want)
        by_repo = {r[0]: " ".join(r[4:]) for r in rows}
        self.assertEqual(by_repo[TINY_REPO], "safetensors folder")
        self.assertEqual(by_repo[GGUF_REPO], "smollm2-135m-instruct-q4_1.gguf")
        self.assertEqual(by_repo[TWO_REPO], "m-Q4_1-copy.gguf m-Q4_1.gguf")

    def test_2_names_load_what_paths_load(self):
        rc, by_path, err = run_text(MODEL, self.env)
        self.assertEqual(rc, 0, err)
        for name in (GGUF_REPO, GGUF_REPO + ":Q4_1", GGUF_REPO + ":q4_1", TWO_REPO + ":copy"):
            rc, by_name, err = run_text(name, self.env)
            self.assertEqual(rc, 0, name + ": " + err)
            self.assertEqual(by_name, by_path, name)
        tiny = os.path.join(GOLDEN, "tiny-mistral-window-hf")
        rc, tiny_path, err = run_text(tiny, self.env)
        self.assertEqual(rc, 0, err)
        rc, tiny_name, err = run_text(TINY_REPO, self.env)
        self.assertEqual(rc, 0, err)
        self.assertEqual(tiny_name, tiny_path)

    def test_3_errors(self):
        rc, _, err = run_text(TWO_REPO, self.env)
        self.assertEqual(rc, 2)
        self.assertIn("2 .gguf files match", err)
        self.assertIn("m-Q4_1-copy.gguf, m-Q4_1.gguf", err)
        rc, _, err = run_text(GGUF_REPO + ":Q8_0", self.env)
        self.assertEqual(rc, 2)
        self.assertIn("no matching .gguf file", err)
        rc, _, err = run_text("TestOrg/absent", self.env)
        self.assertEqual(rc, 2)
        self.assertIn("neither a path nor a model in the Hugging Face cache", err)
        self.assertIn("HF_HUB_OFFLINE is set", err)

    def test_4_serve_by_name(self):
        os.environ.update(HF_HUB_CACHE=self.cache, HF_HUB_OFFLINE="1")  # the server's environment is the test's
        try:
            srv = LocalServer(FERRUMCTL, ["--model", GGUF_REPO + ":Q4_1", "--host", "127.0.0.1", "--threads", "2"])
        finally:
            del os.environ["HF_HUB_CACHE"], os.environ["HF_HUB_OFFLINE"]
        try:
            st, body = srv.json("GET", "/v1/models")
            self.assertEqual(st, 200)
            self.assertEqual(body["data"][0]["id"], GGUF_REPO + ":Q4_1")
            st, body = srv.json("POST", "/v1/completions", {"model": GGUF_REPO + ":Q4_1", "prompt": PROMPT,
                                                             "max_tokens": 12, "temperature": 0})
            self.assertEqual(st, 200, body)
            rc, by_path, err = run_text(MODEL, self.env)
            self.assertEqual(body["choices"][0]["text"], by_path.rstrip("\n"))  # run ends its text with a newline
        finally:
            srv.stop()

    def test_5_hf_home(self):
        env = dict(os.environ, HF_HOME=self.dir)
        env.pop("HF_HUB_CACHE", None)
        p = ferrumctl("list", env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn(GGUF_REPO, p.stdout)

    def test_6_rm(self):
        from huggingface_hub import scan_cache_dir
        p = ferrumctl("rm", TWO_REPO, env=self.env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn(TWO_REPO, {r.repo_id for r in scan_cache_dir(self.cache).repos})
        self.assertNotIn(TWO_REPO, ferrumctl("list", env=self.env).stdout)
        rc, _, err = run_text(TWO_REPO + ":copy", self.env)
        self.assertEqual(rc, 2)
        self.assertIn("neither a path nor a model in the Hugging Face cache", err)
        self.assertIn("HF_HUB_OFFLINE is set", err)
        p = ferrumctl("rm", TWO_REPO, env=self.env)
        self.assertEqual(p.returncode, 1)
        self.assertEqual(ferrumctl("rm", "not-a-name", env=self.env).returncode, 2)


if __name__ == "__main__":
    tiny = os.path.join(GOLDEN, "tiny-mistral-window-hf")
    if not (MODEL and os.path.exists(MODEL) and FERRUMCTL and os.path.isdir(tiny)):
        print("FERRUM_MODEL, FERRUMCTL or the golden models missing: skipped")
        sys.exit(77)
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        print("huggingface_hub missing: skipped")
        sys.exit(77)
    unittest.main()
