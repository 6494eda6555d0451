#!/usr/bin/env python3
"""test_http_load.py - many clients at once against a real `ferrumctl serve`
(the real model, FERRUM_MODEL, on the CPU), the way a benchmark from one
host loads a server:

  - 1000 clients connect, then all send a streamed completion at once: every
    one gets its 200, its tokens, a finish reason and [DONE]; none is
    refused or cut (they wait in the engine's queue);
  - with --max-queue 50, 300 clients at once: every one gets an HTTP answer,
    a 200 stream or a 429 with OpenAI's error body, never a refused or
    reset connection, and the 429s are the ones past the queue;
  - requests that arrive while a killed worker's replacement loads (held
    stopped, so the window is sure) wait in the queue, as RPC submits do,
    and get the greedy text they get before the kill; /health says 503
    meanwhile.

Every wait is bounded (a deadline for the whole run); sockets only on
127.0.0.1. Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_load.py
Exit 77 (skip) when the model file is missing.
"""
import http.client
import json
import os
import resource
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

FERRUMCTL = os.environ.get("FERRUMCTL", "")
MODEL = os.environ.get("FERRUM_MODEL", "")
RUN_LIMIT_S = 240  # the whole of one crowd


def Server(*extra):
    return LocalServer(FERRUMCTL, ["--model", MODEL, *extra], prefix="ferrum-load-")


def crowd(port, n, body):
    """n clients: all connect, then all send at once (a barrier). Returns one
    result per client: ("ok", finish_reason, tokens), ("http", status,
    body) or ("error", repr)."""
    results = [None] * n
    ready = threading.Barrier(n + 1, timeout=RUN_LIMIT_S)
    deadline = time.time() + RUN_LIMIT_S

    def client(i):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=RUN_LIMIT_S)
        try:
            c.connect()
            ready.wait()
            c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                results[i] = ("http", r.status, r.read())
                return
            finish, tokens, done = None, 0, False
            while time.time() < deadline:
                line = r.readline()
                if not line:
                    break
                line = line.strip()
                if line == b"data: [DONE]":
                    done = True
                    break
                if line.startswith(b"data: "):
                    ch = json.loads(line[6:])["choices"][0]
                    tokens += 1
                    finish = ch.get("finish_reason") or finish
            results[i] = ("ok", finish, tokens) if done else ("error", "no [DONE]")
        except Exception as e:  # noqa: BLE001 - every failure is a result
            results[i] = ("error", repr(e))
        finally:
            c.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()
    for t in threads:
        t.join(max(1.0, deadline - time.time()))
    return [r if r is not None else ("error", "no answer in time") for r in results]


# A short prompt and one token: on 2 CPU cores the forward pass, not the
# crowd, would otherwise set the test's time.
BODY = {"prompt": "Hi there", "max_tokens": 1, "temperature": 0, "ignore_eos": True, "stream": True}


class HttpLoad(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # 1000 client sockets in this process
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))

    def test_1000_clients_at_once_all_answered(self):
        srv = Server("--threads", "2", "--max-num-seqs", "256")
        try:
            t0 = time.time()
            res = crowd(srv.port, 1000, BODY)
            bad = [r for r in res if r[0] != "ok" or r[1] != "length"]
            self.assertFalse(bad, "%d of 1000 failed, e.g. %r" % (len(bad), bad[:3]))
            print("1000 clients answered in %.1f s" % (time.time() - t0), file=sys.stderr)
        finally:
            srv.stop()
        self.assertEqual(srv.proc.returncode, 0)

    def test_queue_full_is_429_not_refused(self):
        srv = Server("--threads", "2", "--max-queue", "50", "--max-num-seqs", "8")
        try:
            res = crowd(srv.port, 300, dict(BODY, max_tokens=16))
        finally:
            srv.stop()
        ok = [r for r in res if r[0] == "ok" and r[1] == "length"]
        busy = [r for r in res if r[0] == "http" and r[1] == 429]
        other = [r for r in res if r not in ok and r not in busy]
        self.assertFalse(other, "neither a stream nor a 429: %r" % other[:3])
        self.assertGreaterEqual(len(ok), 50)  # the queue's worth (and the running) got in
        self.assertGreater(len(busy), 0)      # the rest were told so
        for r in busy:  # OpenAI's error body
            err = json.loads(r[2])["error"]
            self.assertEqual(err["type"], "rate_limit_error")
            self.assertEqual(err["code"], "rate_limit_exceeded")

    def test_requests_during_a_restart_wait(self):
        srv = Server("--threads", "2")
        body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
        stopped = None
        try:
            st, want = srv.json("POST", "/v1/completions", body)
            self.assertEqual(st, 200, want)
            want = want["choices"][0]["text"]
            stopped = self.stop_replacement(srv)
            self.assertEqual(srv.request("GET", "/health", timeout=10)[0], 503)  # not ready: a balancer routes away
            answers = [None] * 4

            def ask(i):
                try:
                    answers[i] = srv.json("POST", "/v1/completions", dict(body, stream=i % 2 == 1), timeout=120)
                except Exception as e:  # noqa: BLE001 - reported below
                    answers[i] = ("error", repr(e))

            threads = [threading.Thread(target=ask, args=(i,), daemon=True) for i in range(4)]
            for t in threads:
                t.start()
            time.sleep(2.0)  # the old frontend answered 503 at once
            self.assertEqual(answers, [None] * 4, "answered while no worker could run them")
            os.kill(stopped, signal.SIGCONT)
            stopped = None
            for t in threads:
                t.join(120)
            for i, (st, got) in enumerate(answers):
                self.assertEqual(st, 200, got)
                if i % 2:  # a stream: its text pieces
                    pieces = [json.loads(ln[6:])["choices"][0]["text"] for ln in got.splitlines()
                              if ln.startswith("data: {")]
                    self.assertTrue(got.rstrip().endswith("data: [DONE]"), got[-200:])
                    got = "".join(pieces)
                else:
                    got = got["choices"][0]["text"]
                self.assertEqual(got, want)
            srv.wait_healthy(60)
        finally:
            if stopped:
                os.kill(stopped, signal.SIGCONT)
            srv.stop()
        self.assertEqual(srv.proc.returncode, 0)

    def stop_replacement(self, srv):
        """Kills the worker and stops (SIGSTOP) the one started in its place
        before it has loaded; returns its pid. A few tries: the replacement
        must be caught before it is ready."""
        for _ in range(5):
            old = srv.worker_pids()[0]
            os.kill(old, signal.SIGKILL)
            deadline = time.time() + 30
            new = None
            while time.time() < deadline and new is None:
                pid = srv.worker_pids().get(0)
                if pid and pid != old:
                    os.kill(pid, signal.SIGSTOP)
                    new = pid
                else:
                    time.sleep(0.002)
            self.assertIsNotNone(new, "no worker started in the killed one's place")
            if srv.request("GET", "/health", timeout=10)[0] == 503:
                return new
            os.kill(new, signal.SIGCONT)  # it had loaded already: again
            srv.wait_healthy(60)
        self.fail("the replacement worker loaded before it could be stopped, 5 times")


if __name__ == "__main__":
    if not FERRUMCTL or not os.path.exists(MODEL):
        print("skip: FERRUMCTL and FERRUM_MODEL needed", file=sys.stderr)
        sys.exit(77)
    unittest.main(verbosity=2)
