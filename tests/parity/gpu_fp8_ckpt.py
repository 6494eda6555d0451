#!/usr/bin/env python3
"""FP8 checkpoints on a CUDA device (docs/QUANTIZED.md, "FP8 checkpoints").

tests/golden/make_fp8.py writes its four small random LLaMA folders (a
scale per tensor, compressed-tensors per channel, 48 x 80 blocks and
128 x 128 blocks, those two with the lm_head FP8) and their BF16 twins,
without a tokenizer (PyTorch's E4M3 and BF16 conversions where ml_dtypes is
missing). For each folder:

1. the load runs the layers as they are in the file where the device can
   (KERN_F8R for scales per tensor or row, KERN_F8B for 128 x 128 blocks):
   run_model's log must count every layer weight so (4 a layer: q/k/v,
   o, gate/up, down) but in the 48 x 80 folder, whose weights are decoded
   into BF16 and quantized again a scale a row, and the FP8 lm_head, which
   is decoded;
2. a one-token prompt and 24 greedy tokens (every matmul on the GEMV over
   the file's bytes, no activation quantization) follow the CPU, where the
   folder runs decoded into BF16: vLLM's greedy rule, and the prompt
   token's logits within EXACT_TOL relative error (REQUANT_TOL for the
   48 x 80 folder, whose weights moved); the twin with --quantization fp8
   (the same weights quantized again a scale a row, as the 48 x 80
   folder's are) is printed beside it;
3. prompts of 5, 40 and 300 tokens (tests/parity/gpu_gptq.py's): the last
   prompt token's logits within PREFILL_TOL of the CPU's. Past 2 rows a
   matmul quantizes its activations to E4M3 (a scale a token, or a token's
   128 columns), which moves these small random models' logits by 6e-2 to
   2e-1 and their greedy tokens out of each other's top 5 (printed, not
   held); tests/gpu/test_cuda_ops.c holds those GEMMs to an f64 reference
   of the same quantization.

usage: gpu_fp8_ckpt.py RUN_MODEL WORK_DIR [DEVICE]   (DEVICE: cuda, the default, or cuda:N;
cpu runs the script's own check: the CPU against itself, every weight decoded)
"""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "golden"))
sys.path.insert(0, str(HERE))
import make_fp8  # noqa: E402
from gpu_gptq import N_GREEDY, prompts, run  # noqa: E402

EXACT_TOL = 1.5e-2
REQUANT_TOL = 1.5e-1
PREFILL_TOL = 3e-1
LAYERS = 2                       # make_gptq.CFG's
KEPT = {"tensor": 4 * LAYERS, "channel": 4 * LAYERS, "block": 0, "block128": 4 * LAYERS}
FP8_LM_HEAD = {"block", "block128"}
ONE_TOKEN = [600]


def run_one(run_model, folder, device, logits, extra=()):
    """run_model on the one-token prompt: (its log's (kept, decoded) FP8 weight counts, its greedy line, the
    logits)."""
    r = subprocess.run([run_model, "--model", str(folder), "--device", device, "--ids",
                        ",".join(map(str, ONE_TOKEN)), "--greedy", str(N_GREEDY), "--logits-out", str(logits), *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"run_model {folder.name} on {device}: {r.stderr[-2000:]}"
    m = re.search(r"FP8 checkpoint: (\d+) weights run as they are in the file, (\d+) decoded", r.stderr)
    counts = (int(m.group(1)), int(m.group(2))) if m else None
    return counts, r.stdout.strip().splitlines()[-1], np.fromfile(logits, dtype=np.float32)


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def greedy_rule(what, a, b):
    """vLLM's greedy rule (tests/parity/compare_greedy.py): (held, its line)."""
    r = subprocess.run([sys.executable, str(HERE / "compare_greedy.py"), what, a, b], capture_output=True, text=True)
    return r.returncode == 0, r.stdout.strip()


def check_as_in_file(run_model, variant, folder, twin, device, work):
    """Checks 1 and 2 for one folder; prints what it found. Returns the number of failures."""
    counts, g_cpu, cpu = run_one(run_model, folder, "cpu", work / "cpu1.f32")
    n_fp8 = 4 * LAYERS + (variant in FP8_LM_HEAD)
    want = (0, n_fp8)
    g_dev, dev, req = g_cpu, cpu, cpu
    if device != "cpu":
        want = (KEPT[variant], n_fp8 - KEPT[variant])
        counts, g_dev, dev = run_one(run_model, folder, device, work / "dev1.f32")
        req = run_one(run_model, twin, device, work / "req1.f32", ("--quantization", "fp8"))[2]
    err, err_req = rel_err(dev, cpu), rel_err(req, cpu)
    tol = EXACT_TOL if KEPT[variant] or device == "cpu" else REQUANT_TOL
    held, line = greedy_rule(f"fp8-{variant} one-token prompt", g_cpu, g_dev)
    ok = counts == want and err < tol and held
    print(f"fp8-{variant}: FP8 weights as in the file / decoded {counts} (expected {want}); {line}; the prompt "
          f"token's logits against the CPU {err:.2g} (at most {tol:g}; the twin quantized again a scale a row: "
          f"{err_req:.2g}){'' if ok else '  FAIL'}")
    return int(not ok)


def check_prefill(run_model, folder, device, ids, work):
    """Check 3 for one prompt: whether the logits are within PREFILL_TOL of the CPU's; prints them and the greedy
    tokens."""
    a = run(run_model, folder, "cpu", ids, work / "cpu.f32")
    b = run(run_model, folder, device, ids, work / "dev.f32")
    err = rel_err(np.fromfile(work / "dev.f32", dtype=np.float32), np.fromfile(work / "cpu.f32", dtype=np.float32))
    line = greedy_rule(f"{folder.name} prompt of {len(ids)}", a, b)[1].replace("FAIL", "(not held)")
    ok = err < PREFILL_TOL
    print(f"{line}; logits' relative error {err:.2g}{'' if ok else '  FAIL'}")
    return ok


def main():
    run_model, work = sys.argv[1], Path(sys.argv[2])
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    subprocess.run([sys.executable, make_fp8.__file__, "-", str(work)], check=True, timeout=600)
    bad = 0
    for variant in make_fp8.VARIANTS:
        folder, twin = work / f"fp8-{variant}", work / f"fp8-{variant}-twin"
        bad += check_as_in_file(run_model, variant, folder, twin, device, work)
        for ids in prompts():
            bad += not check_prefill(run_model, folder, device, ids, work)
    print("PASS" if bad == 0 else f"FAIL: {bad} checks")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
