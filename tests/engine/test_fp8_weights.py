#!/usr/bin/env python3
"""test_fp8_weights.py - `--quantization fp8` where the device cannot keep
FP8 weights (the CPU), end to end on the real SmolLM2: `serve` and `run`
(engine and in-process) stop with a clear error before any weight loads,
and a method other than fp8 is a usage error (exit 2). The FP8 numerics
are checked on a GPU (tests/gpu/test_cuda_ops.c, tests/parity/gpu_fp8.py).

Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_fp8_weights.py
"""
import os
import subprocess
import sys
import unittest

FERRUMCTL = os.environ.get("FERRUMCTL", "")
MODEL = os.environ.get("FERRUM_MODEL", "")
WHY = "--quantization fp8: the cpu backend cannot keep FP8 weights"


def ferrumctl(*args):
    return subprocess.run([FERRUMCTL, *args], capture_output=True, text=True, timeout=120)


class Fp8WeightsTest(unittest.TestCase):
    def test_serve_on_cpu(self):
        r = ferrumctl("serve", "--model", MODEL, "--threads", "1", "--port", "0", "--quantization", "fp8")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(WHY, r.stderr)

    def test_run_on_cpu(self):
        for extra in ([], ["--in-process"]):
            r = ferrumctl("run", "--model", MODEL, "--prompt", "hi", "--max-tokens", "4", "--quantization", "fp8",
                          *extra)
            self.assertNotEqual(r.returncode, 0, extra)
            self.assertIn(WHY, r.stderr, extra)

    def test_other_methods(self):
        for cmd in (["serve"], ["run", "--prompt", "hi"]):
            r = ferrumctl(*cmd, "--model", MODEL, "--quantization", "gptq")
            self.assertEqual(r.returncode, 2, cmd)
            self.assertIn("--quantization takes fp8", r.stderr, cmd)


if __name__ == "__main__":
    if not FERRUMCTL or not os.path.isfile(MODEL):
        print("skip: FERRUMCTL or FERRUM_MODEL missing")
        sys.exit(77)
    unittest.main()
