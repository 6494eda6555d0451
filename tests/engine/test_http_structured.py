#!/usr/bin/env python3
"""test_http_structured.py - constrained decoding end to end: `ferrumctl
serve` with the real model, driven by the real `openai` client.
response_format json_object and json_schema (strict) on 25 schemas of the
supported subset (objects, required and optional properties, strings with
lengths, numbers, integers, booleans, null, enum, const, arrays with item
bounds, nested objects, anyOf, $defs) at temperature 0 and 0.8, asked at
once (one batch of sequences under different grammars): every
answer parses with Python's json and validates against its schema with
`jsonschema`, 0 failures; a stream gives the greedy answer's text; vLLM's
guided_regex, guided_choice and structured_outputs on chat and
completions; what the grammar does not support is a 400 naming it.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_structured.py
Exit 77 (skip) when the model file, openai or jsonschema is missing.
"""
import json
import os
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol"
srv = None  # the LocalServer of this module


def S(n=24):
    return {"type": "string", "maxLength": n}


def obj(props, required=None):
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


# (schema, prompt): the supported subset, strings and arrays bounded so that a
# sampled answer ends within max_tokens
SCHEMAS = [
    (obj({"name": S(), "age": {"type": "integer"}}), "Describe a person."),
    (obj({"city": S(), "country": S(), "population": {"type": "integer"}}), "Describe a city."),
    (obj({"title": S(40), "year": {"type": "integer"}, "rating": {"type": "number"}}), "Describe a movie."),
    (obj({"answer": {"type": "boolean"}}), "Is the sky blue?"),
    (obj({"color": {"enum": ["red", "green", "blue"]}}), "Pick a color."),
    (obj({"kind": {"const": "fruit"}, "name": S()}), "Name a fruit."),
    (obj({"tags": {"type": "array", "items": S(12), "minItems": 1, "maxItems": 3}}), "Give tags for a blog post."),
    (obj({"numbers": {"type": "array", "items": {"type": "integer"}, "maxItems": 5}}), "List some numbers."),
    (obj({"user": obj({"id": {"type": "integer"}, "email": S(30)})}), "Make a user record."),
    (obj({"a": S(), "b": S(), "c": {"type": "null"}}), "Fill in the fields."),
    (obj({"name": S(), "nickname": S()}, ["name"]), "Describe a dog."),
    (obj({"x": {"type": "number"}, "y": {"type": "number"}}), "Give a point on a plane."),
    (obj({"status": {"enum": ["ok", "error", 404, None]}}), "Report a status."),
    (obj({"value": {"anyOf": [{"type": "integer"}, S(10)]}}), "Give a value."),
    (obj({"items": {"type": "array", "maxItems": 3, "items": obj({"name": S(12), "qty": {"type": "integer"}})}}),
     "List groceries."),
    (obj({"ok": {"type": "boolean"}, "reason": {"type": ["string", "null"], "maxLength": 30}}), "Can fish fly?"),
    (obj({"first": S(), "last": S(), "middle": S()}, ["first", "last"]), "Name a famous scientist."),
    (obj({"lat": {"type": "number"}, "lon": {"type": "number"}, "label": S()}), "Where is Paris?"),
    (obj({"steps": {"type": "array", "items": S(30), "minItems": 2, "maxItems": 4}}), "How do I make tea?"),
    (obj({"book": obj({"title": S(30), "author": obj({"name": S()})})}), "Recommend a book."),
    (obj({"temperature": {"type": "number"}, "unit": {"enum": ["C", "F"]}}), "What is the weather like?"),
    ({"$defs": {"P": obj({"name": S()})}, **obj({"friends": {"type": "array", "items": {"$ref": "#/$defs/P"},
                                                             "maxItems": 2}})}, "List two friends."),
    (obj({"code": {"type": "integer"}, "message": S(40)}), "Describe an HTTP error."),
    (obj({"yes": {"type": "boolean"}, "no": {"type": "boolean"}}), "Answer yes and no."),
    (obj({"word": S(15), "letters": {"type": "integer"}}), "Pick a word and count its letters."),
]


def request(path, body, timeout=120):
    return srv.json("POST", path, body, timeout)


def setUpModule():
    global srv
    srv = LocalServer(FERRUMCTL, ["--model", MODEL, "--host", "127.0.0.1",
                                  "--served-model-name", NAME, "--max-model-len", "1024", "--threads", "2"])


def tearDownModule():
    if srv is not None:
        srv.stop()


def client():
    return srv.openai(timeout=300)


def chat(prompt, **kw):
    return client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}], **kw)


def chat_all(calls):
    """The answers to [(prompt, kw), ...], asked at once: the server batches
    sequences with different grammars, as it does under load."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        return list(pool.map(lambda c: chat(c[0], **c[1]), calls))


def json_schema(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


class JsonSchemas(unittest.TestCase):
    def test_every_schema_validates(self):
        import jsonschema
        cases = [(i, temp) for i in range(len(SCHEMAS)) for temp in (0.0, 0.8)]
        answers = chat_all([(SCHEMAS[i][1] + " Answer in JSON.",
                             dict(temperature=temp, seed=i, max_tokens=400, response_format=json_schema(SCHEMAS[i][0])))
                            for i, temp in cases])
        failures = []
        for (i, temp), r in zip(cases, answers):
            text = r.choices[0].message.content
            try:
                self.assertEqual(r.choices[0].finish_reason, "stop")
                jsonschema.validate(json.loads(text), SCHEMAS[i][0])
            except Exception as e:  # noqa: BLE001 - collected, reported together
                failures.append((i, temp, text, str(e)[:200]))
        self.assertEqual(failures, [], "%d of %d answers failed" % (len(failures), len(cases)))

    def test_json_object(self):
        # any object: nothing bounds its keys, so a sampled answer may run on (SmolLM2 repeats keys) until
        # max_tokens; every answer that ends is an object, and the greedy ones end
        cases = [(prompt, temp, seed)
                 for prompt in ("Give the name and age of a person as JSON.",
                                "Return a JSON object with the capital of France.")
                 for temp, seed in ((0.0, 0), (0.7, 1), (0.7, 2))]
        answers = chat_all([(prompt, dict(temperature=temp, seed=seed, max_tokens=300,
                                          response_format={"type": "json_object"}))
                            for prompt, temp, seed in cases])
        ended = 0
        for (prompt, temp, seed), r in zip(cases, answers):
            c = r.choices[0]
            if temp == 0:
                self.assertEqual(c.finish_reason, "stop", c.message.content)
            if c.finish_reason == "stop":
                self.assertIsInstance(json.loads(c.message.content), dict)
                ended += 1
            else:
                self.assertEqual(c.finish_reason, "length")
                self.assertTrue(c.message.content.lstrip().startswith("{"))
        self.assertGreaterEqual(ended, 2)

    def test_stream_gives_the_same_text(self):
        schema, prompt = SCHEMAS[0]
        kw = dict(temperature=0, max_tokens=200, response_format=json_schema(schema))
        whole = chat(prompt, **kw).choices[0].message.content
        text = "".join(ch.choices[0].delta.content or "" for ch in chat(prompt, stream=True, **kw) if ch.choices)
        self.assertEqual(text, whole)

    def test_completions_api(self):
        schema = obj({"n": {"type": "integer"}})
        r = client().completions.create(model=NAME, prompt="Give a number as JSON:", max_tokens=100, temperature=0,
                                        extra_body={"guided_json": schema})
        self.assertEqual(list(json.loads(r.choices[0].text)), ["n"])


class Regex(unittest.TestCase):
    def test_guided_regex(self):
        pat = r"\(\d{3}\) \d{3}-\d{4}"
        for temp in (0.0, 0.9):
            r = chat("What is the phone number of the office?", temperature=temp, seed=5, max_tokens=40,
                     extra_body={"guided_regex": pat})
            self.assertRegex(r.choices[0].message.content, "^" + pat + "$")
            self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_choice(self):
        options = ["Positive", "Negative", "Neutral (mixed)"]
        r = chat("Classify: 'I loved this film!'", temperature=0, max_tokens=20, extra_body={"guided_choice": options})
        self.assertIn(r.choices[0].message.content, options)
        r = chat("Classify: 'meh'", temperature=0.9, seed=2, max_tokens=20,
                 extra_body={"structured_outputs": {"choice": options}})
        self.assertIn(r.choices[0].message.content, options)
        r = client().completions.create(model=NAME, prompt="The capital of France is", max_tokens=10, temperature=0,
                                        extra_body={"structured_outputs": {"regex": " (Paris|Lyon)\\."}})
        self.assertIn(r.choices[0].text, (" Paris.", " Lyon."))


class BadRequests(unittest.TestCase):
    def test_400_naming_what_is_unsupported(self):
        m = [{"role": "user", "content": "x"}]
        for body, param, words in (
                ({"response_format": json_schema({"type": "string", "pattern": "^a"})}, "response_format", "pattern"),
                ({"response_format": json_schema({"type": "integer", "minimum": 3})}, "response_format", "minimum"),
                ({"response_format": json_schema({"allOf": [{"type": "string"}]})}, "response_format", "allOf"),
                ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format",
                 "schema"),
                ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "combined"),
                ({"guided_regex": "(ab"}, "guided_regex", "unbalanced"),
                ({"guided_choice": "yes"}, "guided_choice", "list"),
                ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs", "grammar")):
            st, r = request("/v1/chat/completions", dict(model=NAME, messages=m, max_tokens=2, **body))
            self.assertEqual(st, 400, (body, r))
            self.assertEqual(r["error"]["param"], param, r)
            self.assertIn(words, r["error"]["message"])


if __name__ == "__main__":
    if not MODEL or not os.path.exists(MODEL) or not FERRUMCTL:
        print("skip: FERRUM_MODEL / FERRUMCTL not set or missing", file=sys.stderr)
        sys.exit(77)
    try:
        import jsonschema  # noqa: F401
        import openai  # noqa: F401
    except ImportError:
        print("skip: the openai or jsonschema package is missing", file=sys.stderr)
        sys.exit(77)
    unittest.main()
