#!/usr/bin/env python3
"""test_hf_pull.py - `ferrumctl pull ORG/NAME[:PATTERN]` and `--model ORG/NAME`
downloading from a Hub: a fake Hub on loopback (HF_ENDPOINT) that answers as
the Hugging Face Hub does (GET /api/models/REPO/revision/REV lists the files
and the commit; HEAD/GET /REPO/resolve/REV/FILE answers small files itself
with ETag = git blob sha1, and redirects large (LFS) files to a CDN path with
X-Linked-Etag = sha256 and X-Linked-Size; the CDN honours Range), serving the
real SmolLM2 GGUF and tests/golden's tiny Mistral safetensors folder.
huggingface_hub itself is the reference for the cache layout:
- a pulled GGUF is where huggingface_hub's hf_hub_download (offline) finds
  it, scan_cache_dir sees the repository, revision and size, and a blob that
  huggingface_hub downloaded from the same fake Hub is reused, not fetched;
- `run --model ORG/NAME` pulls a missing safetensors folder and generates
  what the folder generates by path; `run --model ORG/NAME:Q4_1` the same
  for the GGUF;
- a transfer that breaks off is resumed with a Range request (in the same
  pull), and so is an .incomplete file an earlier, killed pull left;
- bytes whose sha256 differs from the Hub's are refused: no blob, no
  snapshot link, no .incomplete left;
- a gated repository needs HF_TOKEN (sent as a Bearer token); a wrong
  revision, an unknown repository, a pattern matching two files are clear
  errors; HF_HUB_OFFLINE=1 downloads nothing.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... GOLDEN=build/golden python test_hf_pull.py
Exit 77 (skip) when the model, the golden models or huggingface_hub are missing.
"""
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

from test_hf_cache import ferrumctl, run_text  # this folder: the same runs of ferrumctl

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
GOLDEN = os.environ.get("GOLDEN", "")
GGUF_REPO, TINY_REPO, GATED_REPO, BAD_REPO = ("TestOrg/SmolLM2-GGUF", "TestOrg/tiny-mistral", "TestOrg/gated",
                                              "TestOrg/corrupt")
TOKEN = "hf_test_token_0123"
LFS_SUFFIXES = (".gguf", ".safetensors")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_sha1(path):
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    """Repositories: {repo: {"commits": {rev: sha}, "files": {name: path}, "gated": bool, "corrupt": bool}}."""

    def __init__(self, repos):
        self.repos = repos
        self.blobs = {}  # CDN object name -> (path, corrupt)
        for repo in repos.values():
            repo["meta"] = {}
            for name, path in repo["files"].items():
                lfs = name.endswith(LFS_SUFFIXES)
                etag = sha256_file(path) if lfs else git_sha1(path)
                obj = ("bad-" if repo.get("corrupt") else "") + etag
                repo["meta"][name] = (etag, lfs, os.path.getsize(path), obj)
                if lfs:
                    self.blobs[obj] = (path, repo.get("corrupt", False))
        self.log = []  # (method, path, range header)
        self.drop_next = set()  # sha256s whose next CDN GET stops after 3 MB
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub.handle(self, head=True)

            def do_GET(self):
                hub.handle(self, head=False)

        # The Hub and its CDN: two origins, as on the real Hub (huggingface_hub stops at a redirect to
        # another origin, and a token must not follow it there).
        self.servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(2)]
        self.url, self.cdn_url = ["http://127.0.0.1:%d" % s.server_address[1] for s in self.servers]
        for s in self.servers:
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def close(self):
        for s in self.servers:
            s.shutdown()
            s.server_close()

    def reply(self, h, status, headers, body=b"", head=False):
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        if "Content-Length" not in headers:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head and body:
            h.wfile.write(body)

    def handle(self, h, head):
        self.log.append(("HEAD" if head else "GET", h.path, h.headers.get("Range"), h.headers.get("Authorization")))
        parts = h.path.split("/")
        if h.path.startswith("/api/models/") and len(parts) == 7 and parts[5] == "revision":
            return self.listing(h, parts[3] + "/" + parts[4], parts[6], head)
        if len(parts) >= 6 and parts[3] == "resolve":
            return self.resolve(h, parts[1] + "/" + parts[2], parts[4], "/".join(parts[5:]), head)
        if len(parts) == 3 and parts[1] == "cdn":
            return self.cdn(h, parts[2], head)
        self.reply(h, 404, {"X-Error-Code": "EntryNotFound"}, b"not found", head)

    def repo_or_error(self, h, repo_id, rev, head):
        repo = self.repos.get(repo_id)
        if repo is None:
            self.reply(h, 401, {"X-Error-Code": "RepoNotFound"}, b"Repository not found", head)  # as the Hub does
            return None, None
        if repo.get("gated") and h.headers.get("Authorization") != "Bearer " + TOKEN:
            self.reply(h, 401, {"X-Error-Code": "GatedRepo"}, b"Access to this repository is restricted", head)
            return None, None
        sha = repo["commits"].get(rev) or (rev if rev in repo["commits"].values() else None)
        if sha is None:
            self.reply(h, 404, {"X-Error-Code": "RevisionNotFound"}, b"Revision not found", head)
            return None, None
        return repo, sha

    def listing(self, h, repo_id, rev, head):
        repo, sha = self.repo_or_error(h, repo_id, rev, head)
        if repo:
            body = json.dumps({"id": repo_id, "sha": sha, "siblings": [{"rfilename": n} for n in repo["files"]]})
            self.reply(h, 200, {"Content-Type": "application/json"}, body.encode(), head)

    def resolve(self, h, repo_id, rev, name, head):
        repo, sha = self.repo_or_error(h, repo_id, rev, head)
        if not repo:
            return
        if name not in repo["files"]:
            return self.reply(h, 404, {"X-Error-Code": "EntryNotFound"}, b"Entry not found", head)
        etag, lfs, size, obj = repo["meta"][name]
        common = {"X-Repo-Commit": sha, "ETag": '"%s"' % etag}
        if lfs:  # the Hub: a redirect to the CDN, the LFS object's sha256 and size in X-Linked-*
            common.update({"X-Linked-Etag": '"%s"' % etag, "X-Linked-Size": str(size),
                           "Location": self.cdn_url + "/cdn/" + obj})
            return self.reply(h, 302, common, b"", head)
        with open(repo["files"][name], "rb") as f:
            body = f.read()
        self.reply(h, 200, common, body, head)

    def cdn(self, h, sha, head):
        if sha not in self.blobs:
            return self.reply(h, 404, {}, b"no such object", head)
        path, corrupt = self.blobs[sha]
        size = os.path.getsize(path)
        start, status, headers = 0, 200, {}
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= size:
                return self.reply(h, 416, {"Content-Range": "bytes */%d" % size}, b"", head)
            status, headers = 206, {"Content-Range": "bytes %d-%d/%d" % (start, size - 1, size)}
        headers["Content-Length"] = str(size - start)
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        drop = sha in self.drop_next
        self.drop_next.discard(sha)
        with open(path, "rb") as f:
            f.seek(start)
            sent = 0
            for chunk in iter(lambda: f.read(1 << 20), b""):
                if corrupt and sent == 0:
                    chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                if drop and sent >= 3 << 20:  # the connection breaks off mid-body
                    h.close_connection = True
                    h.wfile.flush()
                    h.connection.shutdown(2)
                    return
                h.wfile.write(chunk)
                sent += len(chunk)


class HfPull(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ferrum-hf-pull-")
        tiny = os.path.join(GOLDEN, "tiny-mistral-window-hf")
        readme = os.path.join(cls.dir, "README.md")
        with open(readme, "w") as f:
            f.write("---\nlicense: apache-2.0\n---\n# a test repository\n")
        gguf = {"README.md": readme, "SmolLM2-135M-Instruct-Q4_1.gguf": MODEL,
                "SmolLM2-135M-Instruct-Q4_1-copy.gguf": MODEL}
        cls.hub = FakeHub({
            GGUF_REPO: {"commits": {"main": "1" * 40, "v1": "2" * 40}, "files": gguf},
            TINY_REPO: {"commits": {"main": "3" * 40}, "files": {f: os.path.join(tiny, f) for f in os.listdir(tiny)}},
            GATED_REPO: {"commits": {"main": "4" * 40}, "files": {"m-Q4_1.gguf": MODEL}, "gated": True},
            BAD_REPO: {"commits": {"main": "5" * 40}, "files": {"m-Q4_1.gguf": MODEL}, "corrupt": True},
        })
        cls.sha = sha256_file(MODEL)

    @classmethod
    def tearDownClass(cls):
        cls.hub.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def env(self, cache, **extra):
        env = dict(os.environ, HF_ENDPOINT=self.hub.url, HF_HUB_CACHE=cache, **extra)
        for k in ("HF_HOME", "HF_TOKEN", "HF_HUB_OFFLINE", "HF_TOKEN_PATH"):
            if k not in extra:
                env.pop(k, None)
        env["HF_TOKEN_PATH"] = os.path.join(self.dir, "no-token")
        return env

    def fresh_cache(self, name):
        return os.path.join(self.dir, name, "hub")

    def cdn_gets(self, since):
        return [e for e in self.hub.log[since:] if e[0] == "GET" and e[1].startswith("/cdn/")]

    def test_1_pull_gguf_resumes_and_huggingface_hub_reads_it(self):
        from huggingface_hub import hf_hub_download, scan_cache_dir
        cache = self.fresh_cache("c1")
        mark = len(self.hub.log)
        self.hub.drop_next.add(self.sha)
        p = ferrumctl("pull", GGUF_REPO + ":Q4_1.gguf", env=self.env(cache))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("resuming", p.stderr)
        gets = self.cdn_gets(mark)
        self.assertEqual(len(gets), 2, gets)
        self.assertIsNone(gets[0][2])
        self.assertTrue(gets[1][2].startswith("bytes=") and int(gets[1][2][6:-1]) >= 3 << 20, gets)
        path = p.stdout.strip()
        self.assertEqual(sha256_file(path), self.sha)
        ref = hf_hub_download(GGUF_REPO, "SmolLM2-135M-Instruct-Q4_1.gguf", cache_dir=cache, local_files_only=True)
        self.assertEqual(os.path.realpath(ref), os.path.realpath(path))
        info = scan_cache_dir(cache)
        self.assertEqual(len(info.warnings), 0, info.warnings)
        (repo,) = info.repos
        self.assertEqual(repo.repo_id, GGUF_REPO)
        self.assertEqual([r.commit_hash for r in repo.revisions], ["1" * 40])
        self.assertEqual(repo.size_on_disk, os.path.getsize(MODEL))
        self.assertEqual(sorted(os.listdir(os.path.join(cache, "models--TestOrg--SmolLM2-GGUF", "blobs"))), [self.sha])
        # cached: a run by name loads it without asking the Hub, and gives the file's text
        mark = len(self.hub.log)
        rc, by_name, err = run_text(GGUF_REPO + ":Q4_1.gguf", self.env(cache))
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.hub.log[mark:], [])
        rc, by_path, err = run_text(MODEL, self.env(cache))
        self.assertEqual((rc, by_name), (0, by_path))

    def test_2_killed_pull_resumes_from_incomplete(self):
        cache = self.fresh_cache("c2")
        blobs = os.path.join(cache, "models--TestOrg--SmolLM2-GGUF", "blobs")
        os.makedirs(blobs)
        with open(MODEL, "rb") as src, open(os.path.join(blobs, self.sha + ".incomplete"), "wb") as dst:
            dst.write(src.read(5 << 20))
        mark = len(self.hub.log)
        p = ferrumctl("pull", GGUF_REPO + ":Q4_1.gguf", "--revision", "v1", env=self.env(cache))
        self.assertEqual(p.returncode, 0, p.stderr)
        gets = self.cdn_gets(mark)
        self.assertEqual([g[2] for g in gets], ["bytes=%d-" % (5 << 20)])
        self.assertEqual(sorted(os.listdir(blobs)), [self.sha])
        repo = os.path.join(cache, "models--TestOrg--SmolLM2-GGUF")
        with open(os.path.join(repo, "refs", "v1")) as f:
            self.assertEqual(f.read(), "2" * 40)
        self.assertEqual(sha256_file(os.path.join(repo, "snapshots", "2" * 40, "SmolLM2-135M-Instruct-Q4_1.gguf")),
                         self.sha)

    def test_3_run_pulls_a_safetensors_folder(self):
        cache = self.fresh_cache("c3")
        tiny = os.path.join(GOLDEN, "tiny-mistral-window-hf")
        rc, by_path, err = run_text(tiny, self.env(cache))
        self.assertEqual(rc, 0, err)
        rc, by_name, err = run_text(TINY_REPO, self.env(cache))
        self.assertEqual(rc, 0, err)
        self.assertEqual(by_name, by_path)
        snap = os.path.join(cache, "models--TestOrg--tiny-mistral", "snapshots", "3" * 40)
        self.assertEqual(sorted(os.listdir(snap)), sorted(os.listdir(tiny)))
        for f in os.listdir(tiny):
            self.assertTrue(os.path.islink(os.path.join(snap, f)))
            with open(os.path.join(snap, f), "rb") as a, open(os.path.join(tiny, f), "rb") as b:
                self.assertEqual(a.read(), b.read(), f)

    def test_4_blob_downloaded_by_huggingface_hub_is_reused(self):
        from huggingface_hub import hf_hub_download
        cache = self.fresh_cache("c4")
        env = self.env(cache)
        code = ("import sys; from huggingface_hub import hf_hub_download; "
                "print(hf_hub_download(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3]))")
        r = subprocess.run([sys.executable, "-c", code, GGUF_REPO, "SmolLM2-135M-Instruct-Q4_1.gguf", cache],
                           capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        mark = len(self.hub.log)
        p = ferrumctl("pull", GGUF_REPO + ":Q4_1.gguf", env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(self.cdn_gets(mark), [])
        self.assertEqual(os.path.realpath(p.stdout.strip()), os.path.realpath(r.stdout.strip()))
        self.assertEqual(hf_hub_download(GGUF_REPO, "SmolLM2-135M-Instruct-Q4_1.gguf", cache_dir=cache,
                                         local_files_only=True), r.stdout.strip())

    def test_5_corrupt_bytes_are_refused(self):
        cache = self.fresh_cache("c5")
        p = ferrumctl("pull", BAD_REPO + ":Q4_1", env=self.env(cache))
        self.assertEqual(p.returncode, 1)
        self.assertIn("sha256", p.stderr)
        repo = os.path.join(cache, "models--TestOrg--corrupt")
        self.assertEqual(os.listdir(os.path.join(repo, "blobs")), [])
        self.assertFalse(os.path.exists(os.path.join(repo, "snapshots")))
        rc, _, err = run_text(BAD_REPO + ":Q4_1", self.env(cache))
        self.assertNotEqual(rc, 0)
        self.assertIn("sha256", err)

    def test_6_token_offline_and_errors(self):
        cache = self.fresh_cache("c6")
        p = ferrumctl("pull", GATED_REPO + ":Q4_1", env=self.env(cache))
        self.assertEqual(p.returncode, 1)
        self.assertIn("HF_TOKEN", p.stderr)
        mark = len(self.hub.log)
        p = ferrumctl("pull", GATED_REPO + ":Q4_1", env=self.env(cache, HF_TOKEN=TOKEN))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sha256_file(p.stdout.strip()), self.sha)
        seen = self.hub.log[mark:]
        self.assertTrue(all(e[3] == "Bearer " + TOKEN for e in seen if not e[1].startswith("/cdn/")), seen)
        self.assertTrue(all(e[3] is None for e in seen if e[1].startswith("/cdn/")), seen)  # never to the CDN
        token_file = os.path.join(self.dir, "token")  # huggingface_hub's login writes the token to a file
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        p = ferrumctl("pull", GATED_REPO + ":Q4_1", env=dict(self.env(self.fresh_cache("c6b")),
                                                              HF_TOKEN_PATH=token_file))
        self.assertEqual(p.returncode, 0, p.stderr)
        p = ferrumctl("pull", GGUF_REPO, env=self.env(cache))
        self.assertEqual(p.returncode, 1)
        self.assertIn("2 .gguf files match", p.stderr)
        p = ferrumctl("pull", GGUF_REPO + ":Q8_0", env=self.env(cache))
        self.assertEqual(p.returncode, 1)
        self.assertIn("no matching .gguf file", p.stderr)
        p = ferrumctl("pull", GGUF_REPO + ":Q4_1.gguf", "--revision", "nope", env=self.env(cache))
        self.assertEqual(p.returncode, 1)
        self.assertIn("HTTP 404", p.stderr)
        p = ferrumctl("pull", "TestOrg/absent", env=self.env(cache))
        self.assertEqual(p.returncode, 1)
        self.assertIn("gated or private", p.stderr)  # the Hub answers 401 for a repository it does not show
        mark = len(self.hub.log)
        rc, _, err = run_text(GGUF_REPO + ":Q4_1.gguf", self.env(cache, HF_HUB_OFFLINE="1"))
        self.assertEqual(rc, 2)
        self.assertIn("HF_HUB_OFFLINE is set", err)
        p = ferrumctl("pull", GGUF_REPO + ":Q4_1.gguf", env=self.env(cache, HF_HUB_OFFLINE="1"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("HF_HUB_OFFLINE", p.stderr)
        self.assertEqual(self.hub.log[mark:], [])
        p = ferrumctl("pull", "not-a-name", env=self.env(cache))
        self.assertEqual(p.returncode, 2)


if __name__ == "__main__":
    if not (MODEL and os.path.exists(MODEL) and FERRUMCTL and os.path.exists(os.path.join(GOLDEN, "tiny-mistral-window-hf"))):
        print("SKIP: FERRUM_MODEL, FERRUMCTL or the golden models missing")
        sys.exit(77)
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        print("SKIP: huggingface_hub missing")
        sys.exit(77)
    unittest.main(verbosity=2)
