#!/usr/bin/env python3
"""test_http_tool_calls.py - tool calls end to end: `ferrumctl serve
--enable-auto-tool-choice --tool-call-parser hermes` with the real model,
driven by the real `openai` client. SmolLM2 has no tool training, so the
conversation shows it four calls in the Hermes format first (few-shot) and
it answers the fifth question with a call at temperature 0: parsed into
tool_calls (content None, finish_reason "tool_calls", arguments a JSON
string), streamed as vLLM streams them (a delta with index, id and name,
then the arguments) into the same call; the call and its result go back as
an assistant message with tool_calls and a tool message (two turns); a
plain question keeps its text. Bad tools / tool_choice values are 400s
naming the field.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_tool_calls.py
Exit 77 (skip) when the model file or the openai package is missing.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol"
srv = None  # the LocalServer of this module

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the time in a time zone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}
TOOLS = [WEATHER, TIME]


def hermes_call(city):
    return '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>' % city


def few_shot(city="Paris"):
    msgs = [{"role": "system", "content": "You call tools."}]
    for c in ("London", "Berlin", "Madrid", "Rome"):
        msgs += [{"role": "user", "content": "Weather in %s?" % c}, {"role": "assistant", "content": hermes_call(c)}]
    return msgs + [{"role": "user", "content": "Weather in %s?" % city}]


def request(path, body, timeout=60):
    return srv.json("POST", path, body, timeout)


def setUpModule():
    global srv
    srv = LocalServer(FERRUMCTL, ["--model", MODEL, "--host", "127.0.0.1",
                                  "--served-model-name", NAME, "--max-model-len", "1024", "--threads", "2",
                                  "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])


def tearDownModule():
    if srv is not None:
        srv.stop()


def client():
    return srv.openai(timeout=120)


def assemble(stream):
    """vLLM's stream of tool calls folded as clients fold it: per index, the
    first delta's id and name, the arguments concatenated."""
    calls, content, finish, first_keys = {}, "", None, []
    for ch in stream:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                first_keys.append((tc.id, tc.type, tc.function.name))
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish, first_keys


class Auto(unittest.TestCase):
    def test_call_parsed(self):
        r = client().chat.completions.create(model=NAME, messages=few_shot(), tools=TOOLS, temperature=0,
                                             max_tokens=60)
        m = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls", m)
        self.assertIsNone(m.content)
        self.assertEqual(len(m.tool_calls), 1)
        tc = m.tool_calls[0]
        self.assertEqual(tc.type, "function")
        self.assertTrue(tc.id.startswith("chatcmpl-tool-"))
        self.assertEqual(tc.function.name, "get_weather")
        self.assertEqual(json.loads(tc.function.arguments), {"city": "Paris"})

    def test_stream_gives_the_same_call(self):
        kw = dict(model=NAME, messages=few_shot("Oslo"), tools=TOOLS, temperature=0, max_tokens=60)
        whole = client().chat.completions.create(**kw).choices[0]
        content, calls, finish, first = assemble(client().chat.completions.create(stream=True, **kw))
        self.assertEqual(finish, whole.finish_reason)
        self.assertEqual(finish, "tool_calls")
        self.assertEqual(content, whole.message.content or "")
        self.assertEqual([(c["name"], c["arguments"]) for c in calls],
                         [(t.function.name, t.function.arguments) for t in whole.message.tool_calls])
        # the first delta of a call carries its id, type and name (vLLM's order)
        self.assertTrue(first[0][0].startswith("chatcmpl-tool-") and first[0][1:] == ("function", "get_weather"))

    def test_two_turns(self):
        msgs = few_shot()
        r = client().chat.completions.create(model=NAME, messages=msgs, tools=TOOLS, temperature=0, max_tokens=60)
        tc = r.choices[0].message.tool_calls[0]
        # content "" rather than None: SmolLM2's template adds content to a string (jinja2 fails on None too)
        msgs += [{"role": "assistant", "content": "",
                  "tool_calls": [{"id": tc.id, "type": "function",
                                  "function": {"name": tc.function.name, "arguments": tc.function.arguments}}]},
                 {"role": "tool", "tool_call_id": tc.id, "content": "18 C and sunny"},
                 {"role": "user", "content": "Thanks! Weather in Rome?"}]
        r2 = client().chat.completions.create(model=NAME, messages=msgs, tools=TOOLS, temperature=0, max_tokens=60)
        self.assertIn(r2.choices[0].finish_reason, ("tool_calls", "stop", "length"))
        # the tool turn reached the prompt: it bills more tokens than the conversation without it
        st, a = request("/tokenize", {"model": NAME, "messages": msgs})
        st2, b = request("/tokenize", {"model": NAME, "messages": msgs[:-3] + msgs[-1:]})
        self.assertEqual((st, st2), (200, 200))
        self.assertGreater(a["count"], b["count"])

    def test_plain_answer_stays_text(self):
        msgs = [{"role": "user", "content": "Say hello."}]
        r = client().chat.completions.create(model=NAME, messages=msgs, tools=TOOLS, temperature=0, max_tokens=20)
        m = r.choices[0].message
        self.assertTrue(m.content)
        self.assertFalse(m.tool_calls)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        content, calls, finish, _ = assemble(client().chat.completions.create(
            model=NAME, messages=msgs, tools=TOOLS, temperature=0, max_tokens=20, stream=True))
        self.assertEqual((content, calls, finish), (m.content, [], r.choices[0].finish_reason))

    def test_tool_choice_none_is_text(self):
        r = client().chat.completions.create(model=NAME, messages=few_shot(), tools=TOOLS, tool_choice="none",
                                             temperature=0, max_tokens=60)
        self.assertFalse(r.choices[0].message.tool_calls)
        self.assertIn("<tool_call>", r.choices[0].message.content)


class Forced(unittest.TestCase):
    """tool_choice "required" and a named function constrain the output to
    the calls' JSON schema (as vLLM builds it), so even a model with no tool
    training answers with calls whose arguments validate."""

    def check_calls(self, calls, names):
        import jsonschema
        self.assertTrue(calls)
        params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
        for tc in calls:
            self.assertIn(tc.function.name, names)
            jsonschema.validate(json.loads(tc.function.arguments), params[tc.function.name])

    def test_required(self):
        for temp in (0.0, 0.8):
            r = client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                                 tools=TOOLS, tool_choice="required", temperature=temp, seed=3,
                                                 max_tokens=200)
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "tool_calls", c.message)
            self.check_calls(c.message.tool_calls, ("get_weather", "get_time"))

    def test_named(self):
        choice = {"type": "function", "function": {"name": "get_time"}}
        for temp in (0.0, 0.8):
            r = client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Time in Tokyo?"}],
                                                 tools=TOOLS, tool_choice=choice, temperature=temp, seed=4,
                                                 max_tokens=100)
            c = r.choices[0]
            self.assertEqual(c.finish_reason, "stop")  # vLLM: a named function finishes as it stopped
            self.assertEqual(len(c.message.tool_calls), 1)
            self.check_calls(c.message.tool_calls, ("get_time",))

    def test_stream_gives_the_same_calls(self):
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            kw = dict(model=NAME, messages=[{"role": "user", "content": "Weather in Rome?"}], tools=TOOLS,
                      tool_choice=choice, temperature=0, max_tokens=200)
            whole = client().chat.completions.create(**kw).choices[0]
            content, calls, finish, _ = assemble(client().chat.completions.create(stream=True, **kw))
            self.assertEqual(finish, whole.finish_reason)
            self.assertEqual([(c["name"], c["arguments"]) for c in calls],
                             [(t.function.name, t.function.arguments) for t in whole.message.tool_calls])

    def test_auto_with_a_constrained_format(self):
        # the Hermes format forced by a regex: the parser reads what the grammar made
        pat = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,12}"\}\}\n</tool_call>'
        r = client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Weather in Lima?"}],
                                             tools=TOOLS, temperature=0, max_tokens=60,
                                             extra_body={"structured_outputs": {"regex": pat}})
        c = r.choices[0]
        self.assertEqual(c.finish_reason, "tool_calls", c.message)
        self.assertEqual(c.message.tool_calls[0].function.name, "get_weather")
        self.assertRegex(json.loads(c.message.tool_calls[0].function.arguments)["city"], "^[A-Z][a-z]{2,12}$")


class BadRequests(unittest.TestCase):
    def test_400_naming_the_field(self):
        msgs = [{"role": "user", "content": "hi"}]
        for body, param in (({"tools": {"type": "function"}}, "tools"),
                            ({"tools": [{"type": "code"}]}, "tools"),
                            ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools"),
                            ({"tool_choice": "auto"}, "tool_choice"),
                            ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
                            ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                             "tool_choice"),
                            ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
                            ({"functions": [WEATHER["function"]]}, "functions")):
            st, r = request("/v1/chat/completions", dict(model=NAME, messages=msgs, max_tokens=2, **body))
            self.assertEqual(st, 400, (body, r))
            self.assertEqual(r["error"]["param"], param, r)


if __name__ == "__main__":
    if not MODEL or not os.path.exists(MODEL) or not FERRUMCTL:
        print("skip: FERRUM_MODEL / FERRUMCTL not set or missing", file=sys.stderr)
        sys.exit(77)
    try:
        import openai  # noqa: F401
    except ImportError:
        print("skip: the openai package is missing", file=sys.stderr)
        sys.exit(77)
    unittest.main()
