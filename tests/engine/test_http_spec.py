#!/usr/bin/env python3
"""test_http_spec.py - speculative decoding end to end with the real model
through `ferrumctl serve` and the official openai client: greedy outputs
with --speculative-config (n-gram prompt lookup) are byte-identical to
those without, for prompts that repeat their input (rewrite code, repeat a
list, extract), several at once, with logprobs, a stop string and a
max_tokens cut; the speculative server runs with a small KV pool (so jobs
are preempted and recomputed), chunked prefill (a 64-token budget), the
prefix cache, and a worker killed mid-request (recomputed after the
restart). The metrics show proposals accepted; a seeded temperature > 0
request is reproducible; a bad --speculative-config fails the start with
a message naming the field.

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_http_spec.py
Exit 77 (skip) when the model file or the openai package is missing.
"""
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402
from skip import main_or_skip  # noqa: E402

MODEL = os.environ.get("FERRUM_MODEL", "")
FERRUMCTL = os.environ.get("FERRUMCTL", "")
NAME = "smol"
SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
# every decode proposes, whatever its acceptance: the most verification to check
SPEC_ALL = SPEC[:-1] + ', "min_acceptance_rate": 0}'
CODE = ("def area(width, height):\n    return width * height\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n\n"
        "def describe(width, height):\n    return f'{width} by {height}'\n")
FRUIT = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine"
# (messages, extra request fields)
CASES = [
    ([{"role": "user", "content": "Rewrite this Python code exactly, keeping every name:\n\n" + CODE}], {}),
    ([{"role": "user", "content": "Repeat this list exactly: " + FRUIT}], {"logprobs": True, "top_logprobs": 2}),
    ([{"role": "user", "content": "Copy this code:\n\n" + CODE}], {"stop": ["perimeter"]}),
    ([{"role": "user", "content": "Repeat this list twice: " + FRUIT}], {"max_tokens": 7}),
    ([{"role": "user", "content": "Extract the function names from this code:\n\n" + CODE}], {}),
    ([{"role": "user", "content": "Rewrite this Python code exactly, keeping every name:\n\n" + CODE}],
     {"max_tokens": 33}),  # the prefix cache holds case 0's prompt
]


def start(extra):
    """A server of the test's shape with extra arguments (a LocalServer)."""
    return LocalServer(FERRUMCTL, ["--model", MODEL, "--served-model-name", NAME, "--max-model-len", "1024",
                                   "--threads", "2", "--max-num-batched-tokens", "64", *extra])


def ask(srv, case):
    msgs, extra = case
    body = dict({"max_tokens": 96, "temperature": 0}, **extra)
    r = srv.openai(timeout=300).chat.completions.create(model=NAME, messages=msgs, **body)
    ch = r.choices[0]
    lps = None
    if ch.logprobs:
        lps = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in ch.logprobs.content]
    return ch.message.content, ch.finish_reason, r.usage.completion_tokens, lps


def ask_all(srv):
    """Every case, four at a time; results in case order."""
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        return list(ex.map(lambda c: ask(srv, c), CASES))


def metrics(srv):
    text = srv.request("GET", "/metrics", timeout=30)[1].decode()
    out = {}
    for m in re.finditer(r'^ferrum:(\w+)\{([^}]*)\} (\S+)$', text, re.M):
        pos = re.search(r'position="(\d+)"', m.group(2))
        out[m.group(1) + ("[%s]" % pos.group(1) if pos else "")] = float(m.group(3))
    return out


def kill_workers_mid_request(srv, case):
    """Asks case, kills the workers once it has had a few drafts; its answer.
    The drafts are counted from before the request (earlier requests' count
    too, so the kill never comes before this one reached the server)."""
    before = metrics(srv).get("spec_decode_num_drafts_total", 0)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(ask, srv, case)
        deadline = time.time() + 60
        while time.time() < deadline and metrics(srv).get("spec_decode_num_drafts_total", 0) < before + 3:
            time.sleep(0.05)
        pids = srv.worker_pids()
        assert pids
        for p in pids.values():
            os.kill(p, signal.SIGKILL)
        return fut.result(300)


class Speculative(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        srv = start([])
        try:
            cls.plain = ask_all(srv)
            cls.plain_metrics = metrics(srv)
        finally:
            srv.stop()

    def check_same(self, got):
        for i, (a, b) in enumerate(zip(self.plain, got)):
            self.assertEqual(a[0], b[0], "case %d: text differs" % i)
            self.assertEqual(a[1:3], b[1:3], "case %d: finish reason / token count differ" % i)
            if a[3] is not None:
                self.assertEqual([t[0] for t in a[3]], [t[0] for t in b[3]])
                for x, y in zip(a[3], b[3]):
                    self.assertAlmostEqual(x[1], y[1], places=3)
                    self.assertEqual([t for t, _ in x[2]], [t for t, _ in y[2]])

    def test_greedy_identical_and_accepted(self):
        self.assertEqual(self.plain_metrics.get("spec_decode_num_drafts_total"), 0)
        self.assertEqual(self.plain[2][1], "stop")  # the stop string ends case 2
        self.assertEqual(self.plain[3][1:3], ("length", 7))
        # a small KV pool: jobs are preempted and recomputed with their proposals dropped
        srv = start(["--speculative-config", SPEC_ALL, "--num-kv-blocks", "24"])
        try:
            self.check_same(ask_all(srv))
            m = metrics(srv)
            self.check_same(ask_all(srv))  # again: the prefix cache now serves the prompts
            c = srv.openai(timeout=300)
            seeded = [c.chat.completions.create(model=NAME, messages=CASES[1][0], max_tokens=40, temperature=0.8,
                                                seed=11).choices[0].message.content for _ in range(2)]
            self.assertEqual(seeded[0], seeded[1])
        finally:
            srv.stop()
        drafts, proposed, accepted = (m["spec_decode_num_drafts_total"], m["spec_decode_num_draft_tokens_total"],
                                      m["spec_decode_num_accepted_tokens_total"])
        print("drafts %d, proposed %d, accepted %d (%.0f%%), preemptions %d" % (
            drafts, proposed, accepted, 100 * accepted / max(proposed, 1), m["num_preemptions_total"]),
              file=sys.stderr)
        self.assertGreater(drafts, 10)
        self.assertGreater(accepted, 0.2 * proposed)
        self.assertGreater(m["num_preemptions_total"], 0)
        self.assertEqual(m["spec_decode_num_accepted_tokens_per_pos_total[0]"],
                         max(v for k, v in m.items() if k.startswith("spec_decode_num_accepted_tokens_per_pos")))
        self.assertEqual(sum(v for k, v in m.items() if k.startswith("spec_decode_num_accepted_tokens_per_pos")),
                         accepted)

    def test_worker_restart_recomputes(self):
        srv = start(["--speculative-config", SPEC])
        try:
            got = kill_workers_mid_request(srv, CASES[0])
            m = metrics(srv)
        finally:
            srv.stop()
        self.assertEqual(got[:3], self.plain[0][:3])
        self.assertGreater(m["spec_decode_num_accepted_tokens_total"], 0)

    def test_bad_config_fails_the_start(self):
        for bad, field in [('{"method": "ngram"}', "num_speculative_tokens"),
                           ('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_mx": 2}',
                            "prompt_lookup_mx"),
                           ('{"method": "ngram", "num_speculative_tokens": -1}', "num_speculative_tokens"),
                           ('{"method": "ngram", "num_speculative_tokens": 2, "min_acceptance_rate": 2}',
                            "min_acceptance_rate"),
                           ("{method: ngram}", "not JSON")]:
            r = subprocess.run([FERRUMCTL, "serve", "--model", MODEL, "--speculative-config", bad],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(field, r.stderr)


if __name__ == "__main__":
    main_or_skip(files=[MODEL], programs=[FERRUMCTL], modules=["openai"])
