#!/usr/bin/env python3
"""Renders real chat templates with ferrum's Jinja interpreter (jinja_render)
and with jinja2 configured as transformers' apply_chat_template does, on a
corpus of conversations, and requires byte-identical output (or both
failing). Templates come from fetch_templates.py.

usage: check_jinja.py JINJA_RENDER TEMPLATE_DIR

A template listed in KNOWN_SKIPS is reported as SKIP with its reason; a
missing template or any difference fails the test.
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# template file -> (bos, eos): these must be present. Every other template
# fetch_templates.py put in the folder is rendered too, with <s> and </s>.
TEMPLATES = {
    "SmolLM2-135M-Instruct.gguf.jinja": ("<|im_start|>", "<|im_end|>"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": ("", "<|im_end|>"),
    "Qwen-QwQ-32B.jinja": ("", "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("<s>", "</s>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "HuggingFaceTB-SmolLM3-3B.jinja": ("", "<|im_end|>"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("", "<|end_of_text|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
}

# template -> why ferrum does not render it yet (reported, never a silent pass)
KNOWN_SKIPS = {}


def m(role, content, **kw):
    return {"role": role, "content": content, **kw}


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}]
CALL = {"id": "call12345", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}

CONVERSATIONS = [
    [m("user", "Hello")],
    [m("system", "You are a pirate."), m("user", "Hi there")],
    [m("system", "Be brief."), m("user", "What is 2+2?"), m("assistant", "4"), m("user", "And 3+3?")],
    [m("user", "Hi"), m("assistant", "Hello! How can I help?"), m("user", "Tell me a joke.")],
    [m("user", "Привет 😀 你好"), m("assistant", "こんにちは 👍🏽"), m("user", "Ελληνικά? \"quoted\" 'single'")],
    [m("system", "  padded \n"), m("user", "\n\n  space\t\n"), m("assistant", "  answer  "), m("user", " x ")],
    [m("user", "Think first."), m("assistant", "<think>\nhmm\n</think>\n\nFour."), m("user", "Again?")],
    [m("user", [{"type": "text", "text": "part one"}, {"type": "text", "text": " part two"}])],
    [m("system", [{"type": "text", "text": "sys parts"}]), m("user", [{"type": "text", "text": "hi"}])],
    [m("user", "2+2?"), m("assistant", "4", reasoning_content="Adding."), m("user", "3+3?")],
]

TOOL_CONVERSATIONS = [
    [m("user", "Weather in Paris?")],
    [m("system", "Use tools."), m("user", "Weather in Paris?"),
     {"role": "assistant", "content": "", "tool_calls": [CALL]},
     {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21}"},
     m("user", "Thanks")],
    [m("user", "Weather?"),  # arguments as OpenAI clients send them: a JSON string
     {"role": "assistant", "content": None, "tool_calls": [dict(CALL, function={"name": "get_weather",
                                                                              "arguments": "{\"city\": \"Oslo\"}"})]},
     {"role": "tool", "tool_call_id": "call12345", "content": "cold"}],
]


# Small templates for the corners real templates touch only now and then:
# whitespace control, operators, slicing, scoping, filters, float printing.
SNIPPETS = [
 "a\n  {% if true %}\n    b\n  {% endif %}\nc",
 "x {{ 1 }}   {% if true %}y{% endif %}",
 "\t{% if true %}\tz{% endif %}\t\n",
 "a {#- c -#} b\n{# d #}  \n e",
 "{% for i in range(3) %}\n  {{ i }}\n{% endfor %}",
 "{%+ if true %} a {%+ endif %}\n b",
 "{% if true +%}\nkeep\n{% endif %}",
 "  {{- 'x' }}  \n  {{ 'y' -}}  \n z",
 "{% set a = [1,2,3] %}{{ a[::2] }}{{ a[-2:] }}{{ a[:-1] }}{{ 'héllo'[1:3] }}",
 "{{ 'a' if 0 else 'b' if 1 else 'c' }}",
 "{{ not 1 == 2 }}{{ - 2 ** 2 }}{{ 2 ** 3 ** 2 }}{{ 10 - 2 - 3 }}{{ 7 / 2 }}{{ -7 % 3 }}{{ 7.5 // 2 }}",
 "{{ 'abc' ~ 1 + 2 }}",
 "{{ [1, 'a', none, true, 1.0, {'k': [1]}] }}",
 "{{ {'a': 1}.items()|list }}{{ (1,) }}{{ (1, 2) }}{{ () }}",
 "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{{ loop.revindex }}{{ loop.first }}{% endfor %}",
 "{{ 'x'|center(5) if false else 'ok' }}",
 "{{ '  a b  '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a b c'.split(' ', 1) }}{{ 'abc'.rstrip('c') }}",
 "{{ 'Hello World'.lower().title() }}{{ 'hello'.capitalize() }}{{ 'x'.join(['a','b']) }}",
 "{{ '\\u00e9\\n\\t\\\\' }}",
 "{{ 1 == 1.0 }}{{ true == 1 }}{{ none == none }}{{ [1] == [1] }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}",
 "{% macro m(x) %}[{{ x }}]{% endmacro %}{{ m('a') ~ m('b') }}{% set s = m(1) %}{{ s|length }}",
 "{{ x|default(none) is none }}{{ y|default('a', true) }}",
 "{% set ns = namespace(a=[]) %}{% set ns.a = ns.a + [1] %}{{ ns.a }}{{ ns }}",
 "{{ 1.5e3 }}{{ 100000000000000000.0 }}{{ 0.0001 }}{{ 0.00001 }}{{ -0.0 }}{{ 1/3 }}",
 "{{ [3,1,2]|sort|first }}{{ 'abc'|list }}{{ 'abc'|reverse }}{{ [1,2]|reverse|list }}",
 "{{ {'z': 1, 'a': {'q': [1, 2]}}|tojson(indent=4) }}",
 "{{ '\"quoted\" <tag> & é \\u2028'|tojson }}",
 "{% for m in msgs if m.r != 's' %}{{ loop.index }}/{{ loop.length }}{{ m.r }}{% else %}none{% endfor %}",
 "{{ msgs|selectattr('r', 'in', ['u', 'a'])|map(attribute='r')|join('-') }}",
 "{{ msgs|map(attribute='missing', default='d')|list }}",
 "{{ msgs[0] }}{{ msgs|length }}{{ msgs|first }}",
 "{% if msgs[0].r is defined and msgs[0].q is not defined %}yes{% endif %}",
 "{{ 'a\\nb\\n\\nc'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}",
 "{{ 'abc'|replace('', '-') }}{{ 'aaa'|replace('a', 'b', 2) }}",
 "{{ '%d' if false else 'x' }}{{ 5 // 0 if false else 1 }}",
 "{%- set x -%}\n  block  \n{%- endset -%}[{{ x }}]",
 "{% filter trim %}   padded   {% endfilter %}|",
 "{% for i in range(10) %}{% if i is even %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
 "{{ range(2, 10, 3)|list }}{{ range(5, 0, -2)|list }}",
 "{{ '1' + '2' }}{{ [0] * 3 }}{{ 'ab' * 0 }}",
 "{{ x.y.z is defined if x is defined else 'nx' }}",
 "{{ true and 'a' or 'b' }}{{ false or 0 or '' }}{{ none or [] }}",
]
SNIPPET_VARS = {"msgs": [{"r": "s"}, {"r": "u"}, {"r": "a"}]}


def cases():
    out = []
    for conv in CONVERSATIONS:
        for agp in (True, False):
            out.append({"messages": conv, "add_generation_prompt": agp})
    for conv in CONVERSATIONS[:4]:
        for think in (True, False):
            out.append({"messages": conv, "add_generation_prompt": True, "enable_thinking": think})
    for conv in TOOL_CONVERSATIONS:
        out.append({"messages": conv, "add_generation_prompt": True, "tools": TOOLS})
    return out


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag: renders its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def hf_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_jinja2(env, src, cases):
    """src rendered with each case's variables, compiled once (transformers
    caches the compiled template too): a list of {"out": text} or {"error": why}."""
    def err(e):
        return {"error": f"{type(e).__name__}: {e}"}

    try:
        template = env.from_string(src)
    except Exception as e:  # noqa: BLE001 - any template failure is an expected error
        return [err(e)] * len(cases)
    res = []
    for c in cases:
        try:
            res.append({"out": template.render(**c)})
        except Exception as e:  # noqa: BLE001
            res.append(err(e))
    return res


def check_snippets(exe, env):
    """Each snippet rendered by both; returns how many differ."""
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        cp = os.path.join(tmp, "cases.json")
        json.dump([SNIPPET_VARS], open(cp, "w"))
        for i, src in enumerate(SNIPPETS):
            tp, op = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "out.json")
            open(tp, "w", encoding="utf-8").write(src)
            subprocess.run([exe, tp, cp, op], check=True)
            (g,) = json.load(open(op, encoding="utf-8"))
            (w,) = render_jinja2(env, src, [SNIPPET_VARS])
            if not (("out" in w and g.get("out") == w["out"]) or ("error" in w and "error" in g)):
                bad += 1
                print(f"FAIL snippet {i}: {src!r}\n    jinja2: {w}\n    ferrum: {g}")
    print(f"{'ok  ' if not bad else 'FAIL'} {len(SNIPPETS) - bad}/{len(SNIPPETS)} snippets identical")
    return bad


def main():
    exe, tdir = sys.argv[1], sys.argv[2]
    env = hf_env()
    failed = check_snippets(exe, env)
    others = sorted(n for n in os.listdir(tdir) if n.endswith(".jinja") and n not in TEMPLATES)
    for name, (bos, eos) in list(TEMPLATES.items()) + [(n, ("<s>", "</s>")) for n in others]:
        path = os.path.join(tdir, name)
        if name in KNOWN_SKIPS:
            print(f"SKIP {name}: {KNOWN_SKIPS[name]}")
            continue
        if not os.path.exists(path):
            print(f"FAIL {name}: missing (run fetch_templates.py)")
            failed += 1
            continue
        src = open(path, encoding="utf-8").read()
        # as transformers passes them: tools and documents are None when not given
        cs = [dict({"tools": None, "documents": None}, **c, bos_token=bos, eos_token=eos) for c in cases()]
        want = render_jinja2(env, src, cs)
        with tempfile.TemporaryDirectory() as tmp:
            cp, op = os.path.join(tmp, "cases.json"), os.path.join(tmp, "out.json")
            json.dump(cs, open(cp, "w"), ensure_ascii=False)
            subprocess.run([exe, path, cp, op], check=True)
            got = json.load(open(op, encoding="utf-8"))
        bad = 0
        for i, (w, g) in enumerate(zip(want, got)):
            same = ("out" in w and g.get("out") == w["out"]) or ("error" in w and "error" in g)
            if not same:
                bad += 1
                if bad <= 2:
                    print(f"  case {i}: {json.dumps(cs[i]['messages'], ensure_ascii=False)[:160]}"
                          f" agp={cs[i]['add_generation_prompt']}")
                    print(f"    jinja2: {json.dumps(w, ensure_ascii=False)[:600]}")
                    print(f"    ferrum: {json.dumps(g, ensure_ascii=False)[:600]}")
        n_err = sum("error" in w for w in want)
        print(f"{'ok  ' if not bad else 'FAIL'} {name}: {len(cs) - bad}/{len(cs)} identical ({n_err} rejected by both)"
              if not bad else f"FAIL {name}: {bad}/{len(cs)} differ")
        failed += bool(bad)
    print(f"{failed} template(s) differ" if failed else "all templates identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
