#!/usr/bin/env python3
"""test_kv_dtype.py - `ferrumctl serve --kv-cache-dtype`, end to end on the
real SmolLM2 (CPU workers).

The same KV byte budget (--kv-cache-memory-bytes 16M) with auto (f16), int8
and fp8 caches: the coordinator's log states the pool's token capacity,
which must be at least 1.9x f16's for int8 and fp8, and no worker may
call the option unknown. Greedy completions (24 tokens, top-5 logprobs)
of the quantized servers against f16's, by the rule the GPU parity
script uses: equal up to the first divergence, if any, where the
quantized server's token is among f16's top 5. A bad dtype
is a usage error (exit 2).

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_kv_dtype.py
"""
import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from local_serve import LocalServer  # noqa: E402

FERRUMCTL = os.environ.get("FERRUMCTL", "")
MODEL = os.environ.get("FERRUM_MODEL", "")
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):"]
N_OUT = 24


def run_server(dtype):
    s = LocalServer(FERRUMCTL, ["--model", MODEL, "--threads", "1", "--kv-cache-memory-bytes", "16M",
                                "--kv-cache-dtype", dtype], prefix="ferrum-kvd-")
    m = re.search(r"KV cache: (\d+) blocks of (\d+) tokens, (\d+) tokens", s.log_text())
    assert m, s.log_text()[-2000:]
    out = []
    for p in PROMPTS:
        st, body = s.request("POST", "/v1/completions", {"prompt": p, "max_tokens": N_OUT, "temperature": 0,
                                                         "logprobs": 5, "ignore_eos": True}, timeout=300)
        assert st == 200, body
        lp = json.loads(body)["choices"][0]["logprobs"]
        out.append((lp["tokens"], lp["top_logprobs"]))
    log = s.log_text()
    s.stop()
    return int(m.group(3)), out, log


class KvDtypeTest(unittest.TestCase):
    def test_capacity_and_tokens(self):
        cap16, ref, log16 = run_server("auto")
        self.assertNotIn("unknown load option", log16)  # the workers took the option they were sent
        for dt in ("int8", "fp8"):
            cap, got, log = run_server(dt)
            self.assertIn("of %s K/V" % dt, log)
            self.assertNotIn("unknown load option", log)
            print("%s: %d tokens of KV in 16 MiB, f16 %d (%.3fx)" % (dt, cap, cap16, cap / cap16))
            self.assertGreaterEqual(cap / cap16, 1.9)
            for i, ((toks, _), (rtoks, rtop)) in enumerate(zip(got, ref)):
                self.assertEqual(len(toks), N_OUT)
                div = next((t for t in range(N_OUT) if toks[t] != rtoks[t]), None)
                print("%s prompt %d: %s" % (dt, i, "all %d equal" % N_OUT if div is None else "diverge@%d" % div))
                if div is not None:
                    self.assertIn(toks[div], rtop[div], "%s prompt %d: token %d not in f16's top 5" % (dt, i, div))

    def test_bad_dtype(self):
        r = subprocess.run([FERRUMCTL, "serve", "--model", MODEL, "--kv-cache-dtype", "fp16"], capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--kv-cache-dtype is auto, int8 or fp8", r.stderr)


if __name__ == "__main__":
    if not FERRUMCTL or not os.path.isfile(MODEL):
        print("skip: FERRUMCTL or FERRUM_MODEL missing")
        sys.exit(77)
    unittest.main()
