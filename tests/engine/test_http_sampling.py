#!/usr/bin/env python3
"""test_http_sampling.py - the sampling fields of OpenAI and vLLM that shape
the output, end to end with the real model at temperature 0: logit_bias
(a +100 bias makes its token every token; -100 on the greedy first token
gives the next best one by the unbiased logprobs), min_tokens (EOS is
banned until then, stop strings are not looked for before it),
include_stop_str_in_output, echo (the prompt in front of the text), and
a 400 naming the field for each bad value.
The official openai client must accept every answer.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_sampling.py
Exit 77 (skip) when the model file or the openai package is missing.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402
from skip import main_or_skip  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol"
PROMPT = "The capital of France is"
SHORT = [{"role": "user", "content": "Reply with one word: yes or no. Is the sky blue?"}]  # answered in ~2 tokens
srv = None


def request(path, body, timeout=60):
    """POSTs body as JSON; returns (status, parsed body)."""
    return srv.json("POST", path, body, timeout)


def setUpModule():
    global srv
    srv = LocalServer(FERRUMCTL, ["--model", MODEL, "--served-model-name", NAME, "--max-model-len", "512",
                                  "--threads", "2"])


def tearDownModule():
    if srv is not None:
        srv.stop()


def client():
    return srv.openai(timeout=60)


def token_id(text):
    st, r = request("/tokenize", {"prompt": text})
    assert st == 200, r
    return r["tokens"][-1]


class LogitBias(unittest.TestCase):
    def test_plus_100_makes_every_token(self):
        t = token_id(" Paris")
        r = client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=6, temperature=0,
                                        logit_bias={str(t): 100})
        self.assertEqual(r.choices[0].text, " Paris" * 6)
        self.assertEqual(r.choices[0].finish_reason, "length")
        # sampled too, and in a chat
        r = client().chat.completions.create(model=NAME, messages=SHORT, max_tokens=4, temperature=0.8, seed=3,
                                             logit_bias={str(t): 100})
        self.assertEqual(r.choices[0].message.content, " Paris" * 4)

    def test_minus_100_gives_next_best(self):
        c = client()
        r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=5)
        top = r.choices[0].logprobs.top_logprobs[0]
        ranked = sorted(top.items(), key=lambda kv: -kv[1])
        first, second = ranked[0][0], ranked[1][0]
        self.assertEqual(r.choices[0].text, first)
        banned = token_id(first)
        r2 = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=5,
                                  logit_bias={str(banned): -100})
        self.assertEqual(r2.choices[0].text, second)
        # the logprobs stay those of the unbiased logits (vLLM's default)
        self.assertAlmostEqual(r2.choices[0].logprobs.token_logprobs[0], top[second], places=3)
        # streamed: the same
        parts = [ch.choices[0].text for ch in c.completions.create(
            model=NAME, prompt=PROMPT, max_tokens=1, temperature=0, stream=True, logit_bias={str(banned): -100})
            if ch.choices]
        self.assertEqual("".join(parts), second)

    def test_bad_values_are_400(self):
        cases = [({"logit_bias": {"7042": 101}}, "logit_bias"), ({"logit_bias": {"x": 1}}, "logit_bias"),
                 ({"logit_bias": {"-3": 1}}, "logit_bias"), ({"logit_bias": {"7042": "1"}}, "logit_bias"),
                 ({"logit_bias": {"999999": 1}}, "logit_bias"),  # past the vocabulary: the engine's check
                 ({"logit_bias": [1, 2]}, "logit_bias"),
                 ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
                 ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": "3"}, "min_tokens"),
                 ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
                 ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output")]
        for extra, param in cases:
            body = dict({"model": NAME, "prompt": PROMPT, "max_tokens": 4}, **extra)
            st, r = request("/v1/completions", body)
            self.assertEqual(st, 400, (extra, r))
            self.assertEqual(r["error"]["param"], param, (extra, r))
            self.assertIn(param, r["error"]["message"], r)
        import openai
        with self.assertRaises(openai.BadRequestError) as cm:
            client().completions.create(model=NAME, prompt=PROMPT, max_tokens=2, logit_bias={"7042": -150})
        self.assertEqual(cm.exception.body.get("param"), "logit_bias")


class MinTokens(unittest.TestCase):
    def test_eos_banned_until_min_tokens(self):
        c = client()
        r = c.chat.completions.create(model=NAME, messages=SHORT, max_tokens=40, temperature=0)
        n = r.usage.completion_tokens
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertLess(n, 6, r.choices[0].message.content)  # the prompt ends quickly with EOS
        for mn in (6, 15):
            r = c.chat.completions.create(model=NAME, messages=SHORT, max_tokens=40, temperature=0,
                                          extra_body={"min_tokens": mn})
            self.assertGreaterEqual(r.usage.completion_tokens, mn, r.choices[0].message.content)
            self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        # min_tokens == max_tokens: exactly that many, finished by length
        r = c.chat.completions.create(model=NAME, messages=SHORT, max_tokens=10, temperature=0,
                                      extra_body={"min_tokens": 10})
        self.assertEqual(r.usage.completion_tokens, 10)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_stop_strings_wait_for_min_tokens(self):
        c = client()
        base = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
        self.assertIn(".", base)  # " Paris.\n\nThe ..."
        r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, stop=["."])
        self.assertEqual(r.choices[0].text, base[:base.index(".")])
        r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, stop=["."],
                                 extra_body={"min_tokens": 4})
        self.assertGreaterEqual(r.usage.completion_tokens, 4)
        self.assertTrue(base.startswith(r.choices[0].text))
        self.assertGreater(len(r.choices[0].text), base.index("."))  # the first "." came too early to stop


class IncludeStop(unittest.TestCase):
    def test_stop_string_kept_when_asked(self):
        c = client()
        for stream in (False, True):
            for inc in (False, True):
                kw = dict(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0, stop=["."],
                          extra_body={"include_stop_str_in_output": inc})
                if stream:
                    parts, fin = [], None
                    for ch in c.completions.create(stream=True, **kw):
                        if ch.choices:
                            parts.append(ch.choices[0].text)
                            fin = ch.choices[0].finish_reason or fin
                    text = "".join(parts)
                else:
                    r = c.completions.create(**kw)
                    text, fin = r.choices[0].text, r.choices[0].finish_reason
                self.assertEqual(fin, "stop")
                self.assertEqual(text, " Paris." if inc else " Paris", (stream, inc))
        r = c.chat.completions.create(model=NAME, messages=SHORT, max_tokens=10, temperature=0, stop=["o"],
                                      extra_body={"include_stop_str_in_output": True})
        self.assertTrue(r.choices[0].message.content.endswith("o"), r.choices[0].message.content)


class Echo(unittest.TestCase):
    def test_prompt_in_front(self):
        c = client()
        base = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0).choices[0].text
        r = c.completions.create(model=NAME, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
        self.assertEqual(r.choices[0].text, PROMPT + base)
        self.assertEqual(r.usage.completion_tokens, 4)
        parts = [ch.choices[0].text for ch in c.completions.create(model=NAME, prompt=PROMPT, max_tokens=4,
                                                                   temperature=0, echo=True, stream=True)
                 if ch.choices]
        self.assertEqual("".join(parts), PROMPT + base)
        ids = request("/tokenize", {"prompt": PROMPT})[1]["tokens"]
        r = c.completions.create(model=NAME, prompt=ids, max_tokens=4, temperature=0, echo=True)
        self.assertEqual(r.choices[0].text, PROMPT + base)  # a token prompt, detokenized
        # echo with logprobs: the prompt's tokens come first (test_http_prompt_logprobs.py checks the values)
        st, r = request("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "echo": True, "logprobs": 1})
        self.assertEqual(st, 200, r)
        self.assertEqual(len(r["choices"][0]["logprobs"]["tokens"]), len(ids) + 2)
        self.assertIsNone(r["choices"][0]["logprobs"]["token_logprobs"][0])


if __name__ == "__main__":
    main_or_skip(files=[MODEL, FERRUMCTL], modules=["openai"])
