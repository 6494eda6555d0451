#!/usr/bin/env python3
"""test_http_openai.py - the HTTP frontend end to end: starts `ferrumctl
serve` (the real model, FERRUM_MODEL) on 127.0.0.1 with a free port and an
API key, drives /v1/completions and /v1/chat/completions with the real
`openai` client (streamed and not, stream_options.include_usage), checks
every bad input's status and OpenAI error body, oversized bodies, slow and
vanishing clients, /metrics counters, and that SIGTERM leaves no
/dev/shm/ferrum* segment of the server behind.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_openai.py
Exit 77 (skip) when the model file is missing.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402
from skip import main_or_skip  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
KEY = "test-key-123"
NAME = "smol"
srv = None  # the server (LocalServer)


def request(method, path, body=None, headers=None, key=KEY, timeout=30):
    """Returns (status, body bytes); with the API key unless key is None."""
    h = dict({"Authorization": "Bearer " + key} if key else {}, **(headers or {}))
    return srv.request(method, path, body, timeout, h)


def metrics():
    st, data = request("GET", "/metrics")
    assert st == 200, st
    out = {}
    for line in data.decode().splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^(\S+?)(\{.*\})? (\S+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def metric(ms, name, **labels):
    lab = ",".join(['%s="%s"' % kv for kv in sorted(dict(labels, model_name=NAME).items())])
    return ms.get("ferrum:%s{%s}" % (name, lab), 0.0)


def setUpModule():
    global srv
    srv = LocalServer(FERRUMCTL, ["--model", MODEL, "--api-key", KEY, "--served-model-name", NAME,
                                  "--max-model-len", "512", "--threads", "2"])


def tearDownModule():
    if srv is None:
        return
    rc = srv.stop(30)
    # no shared memory segment of this server (named after its pid) is left
    left = [n for n in os.listdir("/dev/shm") if n.startswith("ferrum") and ("p%d." % srv.proc.pid) in n]
    assert not left, "segments left behind: %s" % left
    assert rc == 0, "exit status %s (-9: it did not stop within 30 s of SIGTERM)" % rc


def client():
    return srv.openai(timeout=60, api_key=KEY)


class OpenAIClient(unittest.TestCase):
    def test_models(self):
        ms = client().models.list()
        self.assertEqual([m.id for m in ms.data], [NAME])

    def test_completion_stream_matches_json(self):
        c = client()
        r = c.completions.create(model=NAME, prompt="The capital of France is", max_tokens=8, temperature=0)
        self.assertEqual(r.object, "text_completion")
        self.assertTrue(r.id.startswith("cmpl-"))
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 8)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + 8)
        self.assertTrue(r.choices[0].text)
        parts, usage = [], None
        for ch in c.completions.create(model=NAME, prompt="The capital of France is", max_tokens=8, temperature=0,
                                       stream=True, stream_options={"include_usage": True}):
            if ch.choices:
                parts.append(ch.choices[0].text)
            if ch.usage:
                usage = ch.usage
        self.assertEqual("".join(parts), r.choices[0].text)  # greedy: the same text
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, 8)

    def test_completion_token_prompt_and_stop(self):
        c = client()
        r = c.completions.create(model=NAME, prompt=[504, 3575, 282, 4649, 314], max_tokens=4, temperature=0)
        self.assertEqual(r.usage.prompt_tokens, 5)
        r = c.completions.create(model=NAME, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=["7"])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertNotIn("7", r.choices[0].text)

    def test_chat(self):
        c = client()
        msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello."}]
        r = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=0, seed=7)
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertTrue(r.choices[0].message.content)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        text, usage, roles = [], None, []
        for ch in c.chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
            if ch.choices:
                if ch.choices[0].delta.role:
                    roles.append(ch.choices[0].delta.role)
                text.append(ch.choices[0].delta.content or "")
            if ch.usage:
                usage = ch.usage
        self.assertEqual(roles, ["assistant"])
        self.assertEqual("".join(text), r.choices[0].message.content)
        self.assertEqual(usage.completion_tokens, r.usage.completion_tokens)
        # no include_usage: no usage chunk
        chunks = list(c.chat.completions.create(model=NAME, messages=msgs, max_tokens=3, stream=True))
        self.assertTrue(all(ch.usage is None for ch in chunks))

    def test_chat_logprobs(self):
        r = client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                             temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for e in content:
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(len(e.top_logprobs), 3)
            # greedy: the chosen token is the most likely one
            self.assertAlmostEqual(e.logprob, e.top_logprobs[0].logprob, places=4)
        self.assertEqual("".join(e.token for e in content), r.choices[0].message.content)


class BadInput(unittest.TestCase):
    def check(self, path, body, status, key=KEY, method="POST"):
        st, data = request(method, path, body, key=key)
        self.assertEqual(st, status, "%s %s -> %d %s" % (path, body, st, data[:200]))
        err = json.loads(data)["error"]
        self.assertIsInstance(err["message"], str)
        self.assertTrue(err["message"])
        self.assertIsInstance(err["type"], str)
        self.assertIn("param", err)
        self.assertIn("code", err)
        return err

    def test_statuses(self):
        C, H = "/v1/completions", "/v1/chat/completions"
        self.check(C, '{"prompt": "hi"', 400)
        self.check(C, "[]", 400)
        self.check(C, {"prompt": "hi", "n": 2, "best_of": 1}, 400)  # best_of under n
        self.check(C, {"prompt": "hi", "temperature": "warm"}, 400)
        self.check(C, {"prompt": "hi", "max_tokens": -1}, 400)
        self.check(C, {"prompt": "hi", "top_p": 1.5}, 400)
        self.check(C, {"prompt": "hi", "logprobs": 50}, 400)
        self.check(C, {"prompt": "hi", "stream_options": {"include_usage": True}}, 400)
        self.check(H, {"messages": "hi"}, 400)
        self.check(H, {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400)
        self.assertEqual(self.check(C, {"prompt": "hi", "model": "gpt-4"}, 404)["code"], "model_not_found")
        self.check(C, {"prompt": "hi"}, 401, key=None)
        self.check(C, {"prompt": "hi"}, 401, key="wrong")
        self.assertIn("--task embed", self.check("/v1/embeddings", {"input": "hi"}, 400)["message"])
        self.check("/v1/audio/speech", {"input": "hi"}, 404)
        self.check(C, None, 405, method="GET")
        # longer than the context (512): tokens and text
        self.check(C, {"prompt": [1] * 600, "max_tokens": 1}, 400)
        self.check(C, {"prompt": "hello " * 700, "max_tokens": 1}, 400)
        self.check(H, {"messages": [{"role": "user", "content": "hello " * 700}], "max_tokens": 1}, 400)
        # the openai client sees the same
        import openai
        with self.assertRaises(openai.BadRequestError):
            client().completions.create(model=NAME, prompt="hi", n=3, best_of=2)
        with self.assertRaises(openai.NotFoundError):
            client().completions.create(model="nope", prompt="hi")
        # what ferrum does not act on yet is refused by name, not ignored
        msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
        tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
        for kwargs, param in (({"extra_body": {"guided_grammar": "root ::= \"a\""}}, "guided_grammar"),
                              ({"response_format": {"type": "yaml"}}, "response_format")):
            with self.assertRaises(openai.BadRequestError) as cm:
                client().chat.completions.create(model=NAME, messages=msgs, max_tokens=2, **kwargs)
            self.assertEqual(cm.exception.body.get("param"), param, cm.exception.body)
        # tools with tool_choice "auto" (their default) need --enable-auto-tool-choice, as in vLLM
        with self.assertRaises(openai.BadRequestError) as cm:
            client().chat.completions.create(model=NAME, messages=msgs, max_tokens=2, tools=[tool])
        self.assertEqual(cm.exception.body.get("param"), "tool_choice", cm.exception.body)
        self.assertIn("--enable-auto-tool-choice", cm.exception.body.get("message"))
        # their "off" values pass; tools go to the chat template
        r = client().chat.completions.create(model=NAME, messages=msgs, max_tokens=2, tools=[tool], tool_choice="none",
                                             logit_bias={}, response_format={"type": "text"})
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(request("GET", "/health", key=None)[0], 200)

    def test_tokenize_and_detokenize(self):
        text = "Hello world, héllo wörld!"
        ids = json.loads(subprocess.run([FERRUMCTL, "tokenize", "--model", MODEL, "--", text], capture_output=True,
                                        text=True, timeout=60, check=True).stdout)
        st, data = request("POST", "/tokenize", {"model": NAME, "prompt": text, "return_token_strs": True})
        self.assertEqual(st, 200, data)
        out = json.loads(data)
        self.assertEqual(out["tokens"], ids)
        self.assertEqual(out["count"], len(ids))
        self.assertEqual(out["max_model_len"], 512)
        self.assertEqual("".join(out["token_strs"]), text)
        st, data = request("POST", "/detokenize", {"tokens": ids})
        self.assertEqual((st, json.loads(data)["prompt"]), (200, text))
        # a chat counts the tokens /v1/chat/completions bills for the same messages
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}]
        st, data = request("POST", "/tokenize", {"messages": msgs})
        self.assertEqual(st, 200, data)
        r = client().chat.completions.create(model=NAME, messages=msgs, max_tokens=1)
        self.assertEqual(json.loads(data)["count"], r.usage.prompt_tokens)
        # bad input: a clear error, the server goes on
        self.check("/detokenize", {"tokens": [1, 10 ** 9]}, 400)
        self.check("/detokenize", {"tokens": "abc"}, 400)
        self.check("/tokenize", {"prompt": "x", "model": "other"}, 404)
        self.check("/tokenize", {"prompt": 5}, 400)
        self.check("/tokenize", {"prompt": "x"}, 401, key=None)
        self.check("/tokenize", None, 405, method="GET")

    def test_oversized_body(self):
        st, data = request("POST", "/v1/completions", b'{"prompt": "' + b"a" * (5 << 20) + b'"}')
        self.assertEqual(st, 413)
        self.assertIn("error", json.loads(data))
        self.assertEqual(request("GET", "/health", key=None)[0], 200)


class Clients(unittest.TestCase):
    def test_slow_clients_do_not_block(self):
        socks = []
        for _ in range(32):  # half a request each, then silence
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro")
            socks.append(s)
        t = time.time()
        r = client().completions.create(model=NAME, prompt="Hello", max_tokens=2, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 2)
        self.assertLess(time.time() - t, 20)
        for s in socks:
            s.close()

    def test_disconnect_mid_stream_frees(self):
        before = metrics()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        body = json.dumps({"model": NAME, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
                           "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while b"data: " not in got:
            got += s.recv(4096)
        s.close()
        deadline = time.time() + 5
        while time.time() < deadline:
            m = metrics()
            if metric(m, "num_requests_running") == 0 and \
                    metric(m, "request_success_total", finished_reason="abort") > \
                    metric(before, "request_success_total", finished_reason="abort"):
                break
            time.sleep(0.1)
        else:
            self.fail("the job was not aborted within 5 s of its client leaving")
        time.sleep(0.5)  # no more tokens for it
        m2 = metrics()
        self.assertEqual(metric(m2, "generation_tokens_total"), metric(m, "generation_tokens_total"))
        self.assertLess(metric(m2, "generation_tokens_total") - metric(before, "generation_tokens_total"), 400)


class Metrics(unittest.TestCase):
    def test_counters_move(self):
        before = metrics()
        client().completions.create(model=NAME, prompt="Count: one, two,", max_tokens=5, temperature=0)
        after = metrics()
        self.assertGreaterEqual(metric(after, "generation_tokens_total") - metric(before, "generation_tokens_total"), 5)
        self.assertGreater(metric(after, "prompt_tokens_total"), metric(before, "prompt_tokens_total"))
        self.assertEqual(metric(after, "request_success_total", finished_reason="length") -
                         metric(before, "request_success_total", finished_reason="length"), 1)
        self.assertGreater(metric(after, "e2e_request_latency_seconds_count"),
                           metric(before, "e2e_request_latency_seconds_count"))
        self.assertGreater(metric(after, "time_to_first_token_seconds_count"),
                           metric(before, "time_to_first_token_seconds_count"))
        self.assertGreater(metric(after, "kv_blocks_total"), 0)
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "num_preemptions_total",
                     "prefix_cache_queries_total", "prefix_cache_hits_total", "inter_token_latency_seconds_sum"):
            self.assertIn("ferrum:%s{model_name=\"%s\"}" % (name, NAME), after)


if __name__ == "__main__":
    main_or_skip(files=[MODEL, FERRUMCTL], modules=["openai"])
