#!/usr/bin/env python3
"""Structured output on a device's sampler, end to end: `ferrumctl serve`
(CUDA by default) through the real openai client.

1. Every schema of a bounded set (objects, bounded strings, booleans, enums,
   const, null, arrays with maxItems, nested objects, $defs), greedy and
   sampled, alone and 32 at once: every answer ends with finish_reason
   "stop", parses as JSON and validates against its schema. With
   `--load-format dummy` (random weights) only the mask keeps the output in
   the grammar, so this checks the mask, not the model.
2. Step time: a fixed number of threads keep decoding for a fixed time,
   first all unguided, then half of them guided; the mean step and sample
   times per step (/metrics: ferrum:step_round_trip_seconds_total /
   ferrum:steps_total, ferrum:worker_sample_seconds_total /
   ferrum:worker_steps_total) of both phases are printed. Run it with the
   binaries of an older tree (guided rows sampled on the host) to compare.

usage: gpu_guided.py FERRUMCTL MODEL [serve args...]
  e.g. gpu_guided.py build-cuda/bin/ferrumctl /tmp/smol-dummy --load-format dummy --device cuda
  (the folder from tests/parity/make_dummy_folder.py SMOLLM2_GGUF DIR smollm2-135m)
Environment: GUIDED_PHASE_S (seconds a timing phase lasts, default 20),
GUIDED_THREADS (threads of a timing phase, default 32).
Exit 0 when every answer validates, 1 otherwise."""
import concurrent.futures as cf
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

NAME = "guided"


def S(n=12):
    return {"type": "string", "maxLength": n}


def obj(props, required=None):
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


# Bounded: a random model ends each of them within max_tokens (no unbounded
# numbers or strings), so finish_reason must be "stop".
SCHEMAS = [
    obj({"name": S(), "ok": {"type": "boolean"}}),
    obj({"color": {"enum": ["red", "green", "blue"]}, "shade": {"enum": ["light", "dark"]}}),
    obj({"kind": {"const": "fruit"}, "name": S(8)}),
    obj({"tags": {"type": "array", "items": S(6), "minItems": 1, "maxItems": 3}}),
    obj({"user": obj({"handle": S(10), "admin": {"type": "boolean"}})}),
    obj({"a": S(6), "b": {"type": "null"}, "c": {"type": "boolean"}}),
    obj({"first": S(8), "middle": S(8)}, ["first"]),
    obj({"status": {"enum": ["ok", "error", None, True]}}),
    obj({"value": {"anyOf": [{"type": "boolean"}, S(6)]}}),
    obj({"items": {"type": "array", "maxItems": 2, "items": obj({"name": S(6), "fresh": {"type": "boolean"}})}}),
    obj({"reason": {"type": ["string", "null"], "maxLength": 10}}),
    {"$defs": {"P": obj({"name": S(6)})}, **obj({"friends": {"type": "array", "items": {"$ref": "#/$defs/P"},
                                                             "maxItems": 2}})},
]
PROMPTS = ["Answer in JSON.", "Give me a record.", "Fill in the form, please, as JSON."]


def resolve(schema, root):
    ref = schema.get("$ref")
    return root["$defs"][ref.rsplit("/", 1)[1]] if ref else schema


def valid(v, schema, root):
    """The subset above, checked by hand (no jsonschema on the GPU machine)."""
    schema = resolve(schema, root)
    if "const" in schema:
        return v == schema["const"]
    if "enum" in schema:
        return any(v == e and type(v) is type(e) for e in schema["enum"])
    if "anyOf" in schema:
        return any(valid(v, s, root) for s in schema["anyOf"])
    t = schema.get("type")
    types = t if isinstance(t, list) else [t]
    checks = {"string": lambda: isinstance(v, str) and len(v) <= schema.get("maxLength", 1 << 30),
              "boolean": lambda: isinstance(v, bool), "null": lambda: v is None,
              "array": lambda: isinstance(v, list) and schema.get("minItems", 0) <= len(v) <= schema.get(
                  "maxItems", 1 << 30) and all(valid(x, schema["items"], root) for x in v),
              "object": lambda: isinstance(v, dict) and set(schema["required"]) <= set(v) <= set(
                  schema["properties"]) and all(valid(v[k], schema["properties"][k], root) for k in v)}
    return any(checks[x]() for x in types)


def rf(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def guided_one(client, i, temperature, seed):
    schema = SCHEMAS[i % len(SCHEMAS)]
    r = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                       temperature=temperature, seed=seed, max_tokens=300, response_format=rf(schema))
    text, fin = r.choices[0].message.content, r.choices[0].finish_reason
    try:
        ok = fin == "stop" and valid(json.loads(text), schema, schema)
    except ValueError:
        ok = False
    return ok, f"schema {i % len(SCHEMAS)} T={temperature}: finish {fin}, {text!r}"


def metrics(srv):
    status, body = srv.request("GET", "/metrics", timeout=10)
    assert status == 200, status
    out = {}
    for name in ("steps_total", "step_round_trip_seconds_total", "worker_steps_total",
                 "worker_sample_seconds_total", "worker_forward_seconds_total"):
        m = re.search(r"^ferrum:%s\{[^}]*?(rank=\"0\")?[^}]*\} (\S+)$" % name, body.decode(), re.M)
        out[name] = float(m.group(2)) if m else 0.0
    return out


def phase(srv, n_threads, n_guided, seconds):
    """n_threads threads send requests for `seconds`; the first n_guided
    send guided ones, the others 48 unguided tokens each (ignore_eos).
    Returns (ms a step, ms of sampling a step, steps, guided answers that
    failed, guided answers)."""
    client = srv.openai(timeout=300)
    end = time.time() + seconds
    bad, done, lock = [], [0], threading.Lock()

    def run(t):
        k = 0
        while time.time() < end:
            if t < n_guided:
                ok, what = guided_one(client, t + k, 0.8, 1000 * t + k)
                with lock:
                    done[0] += 1
                    if not ok:
                        bad.append(what)
            else:
                client.completions.create(model=NAME, prompt=f"Story {t}.{k}:", max_tokens=48, temperature=0.8,
                                          seed=t, extra_body={"ignore_eos": True})
            k += 1

    m0 = metrics(srv)
    with cf.ThreadPoolExecutor(n_threads) as ex:
        list(ex.map(run, range(n_threads)))
    m1 = metrics(srv)
    d = {k: m1[k] - m0[k] for k in m0}
    steps, wsteps = max(d["steps_total"], 1), max(d["worker_steps_total"], 1)
    return (1e3 * d["step_round_trip_seconds_total"] / steps, 1e3 * d["worker_sample_seconds_total"] / wsteps,
            int(d["steps_total"]), bad, done[0])


def main():
    ferrumctl, model, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
    if "--device" not in extra:
        extra += ["--device", "cuda"]
    seconds, threads = float(os.environ.get("GUIDED_PHASE_S", "20")), int(os.environ.get("GUIDED_THREADS", "32"))
    srv = LocalServer(ferrumctl, ["--model", model, "--host", "127.0.0.1", "--served-model-name", NAME,
                                  "--max-model-len", "1024", "--max-num-seqs", str(max(threads, 32)), *extra],
                      ready_s=300)
    failures = []
    try:
        client = srv.openai(timeout=300)
        n = 0
        for i in range(len(SCHEMAS) * len(PROMPTS)):  # alone: greedy and sampled
            for temp in (0.0, 0.8):
                ok, what = guided_one(client, i, temp, i)
                n += 1
                if not ok:
                    failures.append(what)
        with cf.ThreadPoolExecutor(32) as ex:  # together: one batch of 32 guided rows
            for ok, what in ex.map(lambda i: guided_one(client, i, 0.8, 7 * i), range(32)):
                n += 1
                if not ok:
                    failures.append(what)
        print(f"{'PASS' if not failures else 'FAIL'}  {n - len(failures)}/{n} guided answers alone and 32 at once "
              "end, parse and validate")
        base = phase(srv, threads, 0, seconds)
        mixed = phase(srv, threads, threads // 2, seconds)
        failures += mixed[3]
        print(f"step time, {threads} threads, {seconds:.0f} s each ({model}, {' '.join(extra)}):")
        print(f"  unguided only:       {base[0]:.3f} ms a step, sampling {base[1]:.3f} ms ({base[2]} steps)")
        print(f"  half of them guided: {mixed[0]:.3f} ms a step, sampling {mixed[1]:.3f} ms ({mixed[2]} steps, "
              f"{mixed[4]} guided answers, {len(mixed[3])} invalid)")
    finally:
        srv.stop()
    for f in failures[:20]:
        print("FAIL ", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
