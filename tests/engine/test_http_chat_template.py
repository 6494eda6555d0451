#!/usr/bin/env python3
"""The served chat path uses the chat template: `ferrumctl serve
--chat-template FILE` (a template written here) on the real model, then
/tokenize and /v1/chat/completions with messages (content parts, tool calls, null
content), tools and chat_template_kwargs give the prompt jinja2 renders
from the same template,
and a template that raises gives a 400 with its message.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http_openai as base  # noqa: E402  (request(), the server in base.srv)
from local_serve import LocalServer  # noqa: E402  (on the path through test_http_openai)
from skip import main_or_skip  # noqa: E402
from temp_dir import temp_dir  # noqa: E402

TEMPLATE = """{%- if messages[0]['content'] == 'boom' %}{{ raise_exception('boom: this template refuses') }}{% endif %}
{%- for m in messages %}
<|im_start|>{{ m.role }}
{% if m.content is string or m.content is none %}{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}
{%- if m.tool_calls is defined %} calls {{ m.tool_calls|tojson }}{% endif %}<|im_end|>
{% endfor %}
{%- if tools %}<|im_start|>tools {{ tools|map(attribute='function.name')|join(',') }}<|im_end|>
{% endif %}
{%- if add_generation_prompt %}<|im_start|>assistant {{ 'think' if enable_thinking is defined and enable_thinking else 'plain' }}
{% endif %}"""


def jinja2_render(variables):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tokenizer"))
    from check_jinja import hf_env
    return hf_env().from_string(TEMPLATE).render(**variables)


class ChatTemplate(unittest.TestCase):
    def prompt_text(self, body):
        st, data = base.request("POST", "/tokenize", body)
        self.assertEqual(st, 200, data)
        ids = json.loads(data)["tokens"]
        st, data = base.request("POST", "/detokenize", {"tokens": ids})
        self.assertEqual(st, 200, data)
        return json.loads(data)["prompt"], len(ids)

    def test_prompt_is_the_template(self):
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        msgs = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "tool", "content": "21 C", "tool_call_id": "c1"},
                {"role": "user", "content": [{"type": "text", "text": "Thanks"}, {"type": "text", "text": "!"}]}]
        body = {"messages": msgs, "tools": tools, "chat_template_kwargs": {"enable_thinking": True}}
        text, n = self.prompt_text(body)
        # the template loops over content: parts reach it as a list, as given (null content too)
        want = jinja2_render({"messages": msgs, "tools": tools, "enable_thinking": True, "add_generation_prompt": True,
                              "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"})
        self.assertEqual(text, want)
        self.assertIn("assistant think", text)
        self.assertIn("[Thanks][!]", text)
        self.assertIn("assistant\nNone calls", text)
        # the completion bills the same prompt (its prefill takes a minute under ThreadSanitizer); tool_choice
        # "none" still renders the tools (vLLM's default), and needs no --enable-auto-tool-choice
        st, data = base.request("POST", "/v1/chat/completions",
                                dict(body, max_tokens=1, model=base.NAME, tool_choice="none"), timeout=300)
        self.assertEqual(st, 200, data)
        self.assertEqual(json.loads(data)["usage"]["prompt_tokens"], n)
        plain, _ = self.prompt_text({"messages": msgs[:1]})
        self.assertTrue(plain.endswith("<|im_start|>assistant plain\n"), plain)

    def test_raise_is_a_400(self):
        for path in ("/v1/chat/completions", "/tokenize"):
            st, data = base.request("POST", path, {"model": base.NAME, "messages": [{"role": "user", "content": "boom"}],
                                                   "max_tokens": 1})
            self.assertEqual(st, 400, data)
            self.assertIn("boom: this template refuses", json.loads(data)["error"]["message"])
        st, data = base.request("GET", "/health", key=None)
        self.assertEqual(st, 200)


def setUpModule():
    path = os.path.join(temp_dir("ferrum-chat-template-"), "template.jinja")
    with open(path, "w") as f:
        f.write(TEMPLATE)
    base.srv = LocalServer(base.FERRUMCTL, ["--model", base.MODEL, "--api-key", base.KEY, "--served-model-name",
                                            base.NAME, "--max-model-len", "512", "--threads", "2",
                                            "--chat-template", path])


def tearDownModule():
    if base.srv is not None:
        base.srv.stop(30)


if __name__ == "__main__":
    main_or_skip(files=[base.MODEL, base.FERRUMCTL])
