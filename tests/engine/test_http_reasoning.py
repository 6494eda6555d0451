#!/usr/bin/env python3
"""test_http_reasoning.py - reasoning models end to end: `ferrumctl serve
--reasoning-parser qwen3` (and deepseek_r1) with the real SmolLM2 model,
driven by the real `openai` client. SmolLM2 has no <think> token, so a
few-shot chat teaches it to answer "<think>...</think>answer" (the tags as
text, which the parsers match as text); at temperature 0 it does, and:
- the raw output (the same request with chat_template_kwargs
  enable_thinking false, which SmolLM2's template ignores, so the prompt
  is the same, and which turns the parser off) split as vLLM's qwen3 /
  deepseek_r1 parsers split it is message.reasoning_content and
  message.content;
- a stream's delta.reasoning_content pieces, then its delta.content
  pieces, join to the same two texts;
- structured output (guided_regex, response_format json_schema) and a
  required tool choice hold for the answer after </think>, as vLLM starts
  the grammar when the reasoning ends: the reasoning is free text, the
  content matches; with enable_thinking false the grammar holds from the
  first token and no reasoning is parsed;
- include_reasoning false (vLLM's) drops the reasoning, the content stays;
- deepseek_r1: an output cut before </think> is all reasoning, content null;
- an unknown --reasoning-parser is refused at start.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_reasoning.py
Exit 77 (skip) when the model file or the openai package is missing.
"""
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol"
qwen3 = r1 = None  # the LocalServers of this module

SHOTS = [("What is 2 + 2?", "<think>two plus two is four</think>The answer is 4."),
         ("What color is the sky?", "<think>the sky looks blue by day</think>The sky is blue."),
         ("What is the capital of France?", "<think>france has paris as its capital</think>The capital is Paris.")]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def messages(question):
    out = []
    for q, a in SHOTS:
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return out + [{"role": "user", "content": question}]


def vllm_qwen3(text):
    """vLLM's Qwen3ReasoningParser on a whole output: (reasoning, content)."""
    if "<think>" not in text or "</think>" not in text:
        return None, text
    text = text.partition("<think>")[2]
    reasoning, _, content = text.partition("</think>")
    return reasoning, content or None


def vllm_r1(text):
    """vLLM's DeepSeekR1ReasoningParser on a whole output."""
    parts = text.partition("<think>")
    text = parts[2] if parts[1] else parts[0]
    if "</think>" not in text:
        return text, None
    reasoning, _, content = text.partition("</think>")
    return reasoning, content or None


def setUpModule():
    global qwen3, r1
    args = ["--model", MODEL, "--host", "127.0.0.1", "--served-model-name", NAME, "--max-model-len", "1024",
            "--threads", "2"]
    qwen3 = LocalServer(FERRUMCTL, args + ["--reasoning-parser", "qwen3"])
    r1 = LocalServer(FERRUMCTL, args + ["--reasoning-parser", "deepseek_r1"])


def tearDownModule():
    for s in (qwen3, r1):
        if s is not None:
            s.stop()


def chat(srv, question, **kw):
    kw.setdefault("max_tokens", 60)
    return srv.openai().chat.completions.create(model=NAME, messages=messages(question), temperature=0, **kw)


def streamed(srv, question, **kw):
    """(reasoning, content, finish_reason) joined from a stream's deltas;
    asserts the reasoning pieces all come before the content ones."""
    reasoning, content, finish, order = [], [], None, []
    for ch in chat(srv, question, stream=True, **kw):
        d = ch.choices[0].delta
        r = getattr(d, "reasoning_content", None)
        if r:
            reasoning.append(r)
            order.append("r")
        if d.content:
            content.append(d.content)
            order.append("c")
        finish = ch.choices[0].finish_reason or finish
    joined = "".join(order)
    assert "cr" not in joined, "reasoning after content: " + joined
    return ("".join(reasoning) if reasoning else None), ("".join(content) if content else None), finish


class Qwen3(unittest.TestCase):
    def test_split_as_vllm_splits(self):
        for q in ("What is 3 + 5?", "What color is grass?"):
            raw = chat(qwen3, q, extra_body=OFF).choices[0].message
            self.assertIsNone(getattr(raw, "reasoning_content", None))  # parser off: all content
            self.assertTrue(raw.content.startswith("<think>") and "</think>" in raw.content, raw.content)
            want = vllm_qwen3(raw.content)
            self.assertTrue(want[0] and want[1], want)
            msg = chat(qwen3, q).choices[0].message
            self.assertEqual((msg.reasoning_content, msg.content), want)
            self.assertEqual(streamed(qwen3, q)[:2], want)

    def test_include_reasoning_false_drops_it(self):
        full = chat(qwen3, "What is 3 + 5?").choices[0].message
        msg = chat(qwen3, "What is 3 + 5?", extra_body={"include_reasoning": False}).choices[0].message
        self.assertTrue(full.reasoning_content)
        self.assertIsNone(msg.reasoning_content)
        self.assertEqual(msg.content, full.content)
        self.assertEqual(streamed(qwen3, "What is 3 + 5?", extra_body={"include_reasoning": False})[:2],
                         (None, full.content))

    def test_no_think_block_is_content(self):
        r = qwen3.openai().chat.completions.create(model=NAME, temperature=0, max_tokens=20,
                                                   messages=[{"role": "user", "content": "Say hello."}])
        msg = r.choices[0].message
        self.assertNotIn("<think>", msg.content)
        self.assertIsNone(msg.reasoning_content)
        self.assertTrue(msg.content)

    def test_guided_regex_holds_after_the_think_block(self):
        pattern = "[A-Z][a-z]+ [a-z]+ [0-9]{1,3}[.]"
        msg = chat(qwen3, "What is 3 + 5?", extra_body={"guided_regex": pattern}).choices[0].message
        self.assertTrue(msg.reasoning_content, msg)
        self.assertRegex(msg.content, "^" + pattern + "$")
        self.assertEqual(streamed(qwen3, "What is 3 + 5?", extra_body={"guided_regex": pattern})[:2],
                         (msg.reasoning_content, msg.content))
        # enable_thinking false: the grammar holds from the first token, no reasoning
        off = chat(qwen3, "What is 3 + 5?", extra_body=dict(OFF, guided_regex=pattern)).choices[0].message
        self.assertIsNone(getattr(off, "reasoning_content", None))
        self.assertRegex(off.content, "^" + pattern + "$")

    def test_json_schema_holds_after_the_think_block(self):
        schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
                  "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
        msg = chat(qwen3, "What is 3 + 5?", response_format=rf, max_tokens=80).choices[0].message
        self.assertTrue(msg.reasoning_content, msg)
        self.assertNotIn("</think>", msg.reasoning_content)
        self.assertIsInstance(json.loads(msg.content)["answer"], int)

    def test_required_tool_call_after_the_think_block(self):
        tools = [{"type": "function", "function": {"name": "add", "parameters": {
            "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"], "additionalProperties": False}}}]
        r = chat(qwen3, "What is 3 + 5?", tools=tools, tool_choice="required", max_tokens=100)
        msg = r.choices[0].message
        self.assertTrue(msg.reasoning_content, msg)
        self.assertEqual(r.choices[0].finish_reason, "tool_calls", r)
        self.assertEqual(msg.tool_calls[0].function.name, "add")
        self.assertEqual(set(json.loads(msg.tool_calls[0].function.arguments)), {"a", "b"})


class DeepSeekR1(unittest.TestCase):
    def test_split_as_vllm_splits(self):
        raw = chat(r1, "What is 3 + 5?", extra_body=OFF).choices[0].message.content
        want = vllm_r1(raw)
        self.assertTrue(want[0] and want[1], want)
        msg = chat(r1, "What is 3 + 5?").choices[0].message
        self.assertEqual((msg.reasoning_content, msg.content), want)
        self.assertEqual(streamed(r1, "What is 3 + 5?")[:2], want)

    def test_cut_before_the_end_is_all_reasoning(self):
        raw = chat(r1, "What is 3 + 5?", max_tokens=4, extra_body=OFF).choices[0].message.content
        self.assertNotIn("</think>", raw)
        msg = chat(r1, "What is 3 + 5?", max_tokens=4).choices[0]
        self.assertEqual(msg.finish_reason, "length")
        self.assertEqual((msg.message.reasoning_content, msg.message.content), vllm_r1(raw))
        self.assertIsNone(msg.message.content)
        self.assertEqual(streamed(r1, "What is 3 + 5?", max_tokens=4), (vllm_r1(raw)[0], None, "length"))


class Flags(unittest.TestCase):
    def test_unknown_parser_refused(self):
        p = subprocess.run([FERRUMCTL, "serve", "--model", MODEL, "--reasoning-parser", "deepseek-r1"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 2)
        self.assertIn("--reasoning-parser is qwen3 or deepseek_r1", p.stderr)


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
