#!/usr/bin/env python3
"""Chat template goldens: the upstream Jinja templates in templates/ rendered
with jinja2 the way transformers' apply_chat_template does (sandboxed
environment, trim_blocks, lstrip_blocks, raise_exception, tojson,
add_generation_prompt=True, enable_thinking=False, the model's bos/eos).

usage: gen_chat_golden.py OUT.json [MODEL.gguf]

With MODEL.gguf it also checks that templates/smollm2.jinja is the template
the model ships. A conversation the template rejects (raise_exception) has
"expected": null.
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))

# template file, expected ferrum kind, bos, eos (as the models' tokenizer_config.json)
TEMPLATES = [
    ("chatml.jinja", "chatml", "", ""),
    ("smollm2.jinja", "smollm2", "<|im_start|>", "<|im_end|>"),
    ("qwen2.5.jinja", "qwen2.5", "", "<|im_end|>"),
    ("qwen3.jinja", "qwen3", "", "<|im_end|>"),
    ("llama3.jinja", "llama3", "<|begin_of_text|>", "<|eot_id|>"),
    ("llama2.jinja", "llama2", "<s>", "</s>"),
    ("mistral.jinja", "mistral", "<s>", "</s>"),
]


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    [m("user", "Hello")],
    [m("system", "You are a pirate."), m("user", "Hi there")],
    [m("system", "Be brief."), m("user", "What is 2+2?"), m("assistant", "4"), m("user", "And 3+3?")],
    [m("user", "Hi"), m("assistant", "Hello! How can I help?"), m("user", "Tell me a joke.")],
    [m("user", "Привет 😀 你好"), m("assistant", "こんにちは 👍🏽 e\u0301"), m("user", "Ελληνικά? עברית!")],
    [m("system", "  padded system \n"), m("user", "\n\n  lots of space\t\n"), m("assistant", "  answer  "),
     m("user", " \u00a0nbsp\u3000 ")],
    [m("user", "<|im_start|> inside [INST] text </s> <<SYS>>")],
    [m("user", "")],
    [m("system", "S")],
    [m("user", "a"), m("system", "late system"), m("user", "b")],
    [m("user", "Q1"), m("assistant", "<think>\nsome reasoning\n</think>\n\nThe answer."), m("user", "Q2")],
    [m("user", "Solve"), m("assistant", "<think>\nstep 1\nstep 2\n</think>\n\nDone.")],
    [m("user", "Q"), m("assistant", "no think here")],
    [m("user", "Q"), m("assistant", "\n\nA</think>\n\nB</think>\nC")],
    [m("user", "line1\nline2\r\nline3"), m("assistant", "tab\there"), m("user", "`code`\n```\nx\n```")],
    [m("assistant", "I start"), m("user", "odd")],
]


def render(env, text, msgs, bos, eos):
    def raise_exception(message):
        raise TemplateError(message)

    tmpl = env.from_string(text)
    return tmpl.render(messages=msgs, add_generation_prompt=True, bos_token=bos, eos_token=eos,
                       enable_thinking=False, raise_exception=raise_exception, tools=None, documents=None)


def main():
    out = sys.argv[1]
    if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
        from gguf import GGUFReader
        shipped = GGUFReader(sys.argv[2]).fields["tokenizer.chat_template"].contents()
        with open(os.path.join(HERE, "templates", "smollm2.jinja"), encoding="utf-8") as f:
            assert f.read() == shipped, "templates/smollm2.jinja differs from the model's template"
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    cases = []
    for fname, kind, bos, eos in TEMPLATES:
        path = os.path.join(HERE, "templates", fname)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for conv in CONVERSATIONS:
            try:
                expected = render(env, text, conv, bos, eos)
            except TemplateError:
                expected = None
            cases.append({"template": path, "kind": kind, "bos": bos, "messages": conv, "expected": expected})
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, indent=1)
    print(f"{len(cases)} renderings, {sum(c['expected'] is None for c in cases)} rejected")


if __name__ == "__main__":
    main()
