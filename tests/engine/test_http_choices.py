#!/usr/bin/env python3
"""test_http_choices.py - several answers per request, end to end with the
real model through the official openai client:
- n > 1: seeded n = 4 gives the same 4 answers as 4 single requests seeded
  seed .. seed + 3 (vLLM's rule), the prompt is counted once in usage, and
  the metrics show the 3 later sequences sharing the first one's prompt KV
  blocks (forked, full blocks shared, the partial one copied on write);
  chat too; a stream carries each choice's index and one usage chunk;
- best_of: the answer is the sequence of highest cumulative logprob of
  the best_of seeded sequences;
- several prompts (text and token ids) in one completions request, choice
  i * n + j being prompt i's answer j; a token-id prompt answers as its text;
- truncate_prompt_tokens keeps the last k tokens; stop_reason names the
  stop string or stop token id (null at EOS or length); /v1/models gives
  max_model_len;
- every field of the openai client's completions and chat request types is
  either acted on, accepted as vLLM accepts it (it changes no output), or a
  400 naming it.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_choices.py
Exit 77 (skip) when the model file or the openai package is missing.
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol"
MAX_LEN = 512
BLOCK = 16  # the server's KV block size (KV_BLOCK_SIZE_DEFAULT)
# 40-odd tokens: two full KV blocks and a partial one
LONG = ("The history of the city of Paris begins with a small settlement on an island in the river Seine, "
        "where a Celtic tribe fished and traded for centuries before the Romans came and")
srv = None  # the LocalServer of this module


def request(method, path, body=None, timeout=120):
    """Sends body as JSON; returns (status, parsed body or text)."""
    return srv.json(method, path, body, timeout)


def setUpModule():
    global srv
    srv = LocalServer(FERRUMCTL, ["--model", MODEL, "--host", "127.0.0.1",
                                  "--served-model-name", NAME, "--max-model-len", str(MAX_LEN), "--threads", "2"])


def tearDownModule():
    if srv is not None:
        srv.stop()


def client():
    return srv.openai(timeout=120)


def tokens(text):
    st, r = request("POST", "/tokenize", {"prompt": text})
    assert st == 200, r
    return r["tokens"]


def metrics():
    st, text = request("GET", "/metrics")
    assert st == 200
    out = {}
    for name in ("forked_sequences_total", "kv_fork_shared_blocks_total", "kv_fork_copied_blocks_total"):
        m = re.search(r"^ferrum:%s\{[^}]*\} (\d+)$" % name, text, re.M)
        out[name] = int(m.group(1))
    return out


def extra(choice, key):
    """A field the openai types do not declare (vLLM's stop_reason)."""
    return (choice.model_extra or {}).get(key)


def single(prompt, seed, max_tokens=12, **kw):
    r = client().completions.create(model=NAME, prompt=prompt, max_tokens=max_tokens, temperature=1.0, seed=seed,
                                    **kw)
    return r.choices[0]


class N(unittest.TestCase):
    def test_seeded_n_is_n_seeded_singles_sharing_blocks(self):
        n_prompt = len(tokens(LONG))
        self.assertGreater(n_prompt, 2 * BLOCK)
        before = metrics()
        r = client().completions.create(model=NAME, prompt=LONG, n=4, max_tokens=12, temperature=1.0, seed=1234)
        after = metrics()
        self.assertEqual([c.index for c in r.choices], [0, 1, 2, 3])
        texts = [c.text for c in r.choices]
        self.assertGreater(len(set(texts)), 1, texts)  # four samples, not one answer four times
        self.assertEqual(r.usage.prompt_tokens, n_prompt)  # counted once
        self.assertEqual(r.usage.completion_tokens, 4 * 12)
        shared = (n_prompt - 1) // BLOCK  # full blocks before the last prompt token
        copied = 1 if (n_prompt - 1) % BLOCK else 0
        self.assertEqual(after["forked_sequences_total"] - before["forked_sequences_total"], 3)
        self.assertEqual(after["kv_fork_shared_blocks_total"] - before["kv_fork_shared_blocks_total"], 3 * shared)
        self.assertEqual(after["kv_fork_copied_blocks_total"] - before["kv_fork_copied_blocks_total"], 3 * copied)
        for i in range(4):
            self.assertEqual(single(LONG, 1234 + i).text, texts[i], "choice %d" % i)

    def test_chat_n(self):
        msgs = [{"role": "user", "content": "Name a fruit."}]
        r = client().chat.completions.create(model=NAME, messages=msgs, n=3, max_tokens=10, temperature=1.0,
                                             seed=77)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2])
        for i in range(3):
            one = client().chat.completions.create(model=NAME, messages=msgs, max_tokens=10, temperature=1.0,
                                                   seed=77 + i)
            self.assertEqual(one.choices[0].message.content, r.choices[i].message.content)
            self.assertEqual(one.usage.prompt_tokens, r.usage.prompt_tokens)

    def test_stream_indexes_and_usage(self):
        ref = client().completions.create(model=NAME, prompt=LONG, n=3, max_tokens=8, temperature=1.0, seed=5)
        texts, finish, usage = ["", "", ""], [None] * 3, []
        stream = client().completions.create(model=NAME, prompt=LONG, n=3, max_tokens=8, temperature=1.0, seed=5,
                                             stream=True, stream_options={"include_usage": True})
        for chunk in stream:
            if chunk.usage is not None:
                usage.append(chunk.usage)
            for c in chunk.choices:
                self.assertIsNone(finish[c.index], "a chunk after the choice finished")
                texts[c.index] += c.text
                finish[c.index] = c.finish_reason
        self.assertEqual(texts, [c.text for c in ref.choices])
        self.assertEqual(finish, ["length"] * 3)
        self.assertEqual(len(usage), 1)
        self.assertEqual(usage[0].prompt_tokens, ref.usage.prompt_tokens)
        self.assertEqual(usage[0].completion_tokens, 24)

    def test_best_of_picks_highest_cumulative_logprob(self):
        r = client().completions.create(model=NAME, prompt=LONG, n=1, best_of=3, max_tokens=10, temperature=1.0,
                                        seed=99)
        self.assertEqual(len(r.choices), 1)
        cands = [single(LONG, 99 + i, max_tokens=10, logprobs=0) for i in range(3)]
        scores = [sum(c.logprobs.token_logprobs) for c in cands]
        best = max(range(3), key=lambda i: scores[i])
        self.assertEqual(r.choices[0].text, cands[best].text, scores)
        self.assertIsNone(r.choices[0].logprobs)  # ranked by logprobs, not asked for
        # n = 2 of best_of = 3: the two best, best first
        r2 = client().completions.create(model=NAME, prompt=LONG, n=2, best_of=3, max_tokens=10, temperature=1.0,
                                         seed=99)
        order = sorted(range(3), key=lambda i: -scores[i])
        self.assertEqual([c.text for c in r2.choices], [cands[order[0]].text, cands[order[1]].text])
        self.assertEqual(r2.usage.prompt_tokens, r.usage.prompt_tokens)


class Prompts(unittest.TestCase):
    def test_several_prompts_with_n(self):
        ps = ["The capital of France is", "My favourite colour is"]
        r = client().completions.create(model=NAME, prompt=ps, n=2, max_tokens=6, temperature=1.0, seed=11)
        self.assertEqual([c.index for c in r.choices], [0, 1, 2, 3])
        for i, p in enumerate(ps):
            for j in range(2):
                self.assertEqual(r.choices[i * 2 + j].text, single(p, 11 + j, max_tokens=6).text, (i, j))
        self.assertEqual(r.usage.prompt_tokens, sum(len(tokens(p)) for p in ps))

    def test_token_prompts_answer_as_their_text(self):
        ps = ["Once upon a time", "The weather today"]
        ids = [tokens(p) for p in ps]
        by_text = client().completions.create(model=NAME, prompt=ps, max_tokens=6, temperature=0)
        by_ids = client().completions.create(model=NAME, prompt=ids, max_tokens=6, temperature=0)
        self.assertEqual([c.text for c in by_ids.choices], [c.text for c in by_text.choices])
        one = client().completions.create(model=NAME, prompt=ids[1], max_tokens=6, temperature=0)
        self.assertEqual(one.choices[0].text, by_text.choices[1].text)
        self.assertEqual(one.usage.prompt_tokens, len(ids[1]))
        mixed = client().completions.create(model=NAME, prompt=[ps[0], ids[1]], max_tokens=6, temperature=0,
                                            echo=True)
        self.assertEqual(mixed.choices[0].text, ps[0] + by_text.choices[0].text)
        self.assertEqual(mixed.choices[1].text, ps[1] + by_text.choices[1].text)

    def test_truncate_prompt_tokens(self):
        ids = tokens(LONG)
        k = 9
        r = client().completions.create(model=NAME, prompt=LONG, max_tokens=6, temperature=0,
                                        extra_body={"truncate_prompt_tokens": k})
        self.assertEqual(r.usage.prompt_tokens, k)
        tail = client().completions.create(model=NAME, prompt=ids[-k:], max_tokens=6, temperature=0)
        self.assertEqual(r.choices[0].text, tail.choices[0].text)
        # a token prompt past the context is let in when truncated to fit
        long_ids = (ids * (MAX_LEN // len(ids) + 2))[:MAX_LEN + 20]
        r = client().completions.create(model=NAME, prompt=long_ids, max_tokens=4, temperature=0,
                                        extra_body={"truncate_prompt_tokens": 100})
        self.assertEqual(r.usage.prompt_tokens, 100)
        st, err = request("POST", "/v1/completions", {"model": NAME, "prompt": long_ids, "max_tokens": 4})
        self.assertEqual((st, err["error"]["param"]), (400, "prompt"))


class Reasons(unittest.TestCase):
    def test_stop_reason(self):
        greedy = client().completions.create(model=NAME, prompt=LONG, max_tokens=12, temperature=0)
        self.assertIsNone(extra(greedy.choices[0], "stop_reason"))  # length
        text = greedy.choices[0].text
        stop = text[len(text) // 2:len(text) // 2 + 3]
        self.assertTrue(stop.strip())
        r = client().completions.create(model=NAME, prompt=LONG, max_tokens=12, temperature=0, stop=["zzqx", stop])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(extra(r.choices[0], "stop_reason"), stop)
        lp = client().completions.create(model=NAME, prompt=LONG, max_tokens=12, temperature=0, logprobs=0)
        second = tokens(lp.choices[0].logprobs.tokens[1])[-1]  # the second greedy token's id
        r = client().completions.create(model=NAME, prompt=LONG, max_tokens=12, temperature=0,
                                        extra_body={"stop_token_ids": [second]})
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertEqual(extra(r.choices[0], "stop_reason"), second)
        chat = client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Say hi."}],
                                                max_tokens=200, temperature=0)
        self.assertEqual(chat.choices[0].finish_reason, "stop")  # EOS
        self.assertIsNone(extra(chat.choices[0], "stop_reason"))

    def test_models_max_model_len(self):
        models = client().models.list().data
        self.assertEqual([m.id for m in models], [NAME])
        self.assertEqual(extra(models[0], "max_model_len"), MAX_LEN)


def schema_fields(typed_dict):
    keys = set()
    for base in typed_dict.__mro__:
        keys |= set(getattr(base, "__annotations__", {}))
    return keys


class SchemaAudit(unittest.TestCase):
    """Every request field of the openai client's types: acted on (other
    tests), accepted with no effect on the output (vLLM accepts them), or a
    400 naming it. A field the client gains fails here until it is sorted."""
    ACTED = {"model", "prompt", "messages", "best_of", "echo", "frequency_penalty", "presence_penalty",
             "logit_bias", "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens", "n", "seed", "stop",
             "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice",
             "response_format"}  # the last two: test_http_tool_calls.py, test_http_structured.py
    ACCEPTED = {"user": "u1", "safety_identifier": "s1", "metadata": {"k": "v"}, "store": True,
                "service_tier": "auto", "parallel_tool_calls": False, "prompt_cache_key": "k",
                "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "auto"}}
    REFUSED = {"suffix": " end", "audio": {"voice": "alloy", "format": "mp3"},
               "function_call": {"name": "f"}, "functions": [{"name": "f", "parameters": {}}],
               "modalities": ["text", "audio"], "moderation": {"mode": "strict"},
               "prediction": {"type": "content", "content": "x"}, "reasoning_effort": "high",
               "verbosity": "low",
               "web_search_options": {"search_context_size": "low"}}

    def audit(self, path, typed_dict, base):
        fields = schema_fields(typed_dict) | {"stream"}
        unsorted = fields - self.ACTED - set(self.ACCEPTED) - set(self.REFUSED)
        self.assertFalse(unsorted, "fields of the openai client this test does not sort: %s" % sorted(unsorted))
        for f in sorted(fields & set(self.ACCEPTED)):
            st, r = request("POST", path, dict(base, **{f: self.ACCEPTED[f]}))
            self.assertEqual(st, 200, (f, r))
        for f in sorted(fields & set(self.REFUSED)):
            st, r = request("POST", path, dict(base, **{f: self.REFUSED[f]}))
            self.assertEqual((st, r["error"]["param"]), (400, f), r)
            self.assertIn(f, r["error"]["message"])

    def test_completions(self):
        from openai.types import completion_create_params as p
        self.audit("/v1/completions", p.CompletionCreateParamsBase, {"model": NAME, "prompt": "Hi", "max_tokens": 2})

    def test_chat(self):
        from openai.types.chat import completion_create_params as p
        self.audit("/v1/chat/completions", p.CompletionCreateParamsBase,
                   {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})


if __name__ == "__main__":
    if not (MODEL and os.path.exists(MODEL) and FERRUMCTL):
        print("skip: FERRUM_MODEL / FERRUMCTL not set or missing")
        sys.exit(77)
    try:
        import openai  # noqa: F401
    except ImportError:
        print("skip: the openai package is missing")
        sys.exit(77)
    unittest.main(verbosity=2)
