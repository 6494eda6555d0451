#!/usr/bin/env python3
"""GPTQ and AWQ int4 checkpoints on a CUDA device against the CPU backend
(docs/QUANTIZED.md; issue 14).

tests/golden/make_gptq.py writes its six small random LLaMA models (GPTQ
with act-order on and off, symmetric and asymmetric zeros, groups
32/64/128/-1, v1 and v2 zeros, an int4 lm_head; AWQ with groups 128 and 32),
numpy only, no tokenizer. Each model is run by run_model on the CPU and on
CUDA for prompts of 5 tokens (every matmul on the int8-activation GEMV) and
of 40 and 300 tokens (the prefill matmuls on the dequant + cuBLAS path, the
decode on the GEMV). The greedy tokens must follow vLLM's rule
(tests/parity/compare_greedy.py: equal, or at the first divergence each
side's token is in the other's top-5), and the last prompt token's logits
must agree within 5e-2 relative error ||cuda - cpu|| / ||cpu|| (CUDA runs
bf16 activations, and int8 ones in the GEMV: hf_parity.py holds GGUF
models to 1e-2; a wrong zero, scale or column order moves them by 1e-1 and
more; an ignored act-order permutation by about 1).

usage: gpu_gptq.py RUN_MODEL WORK_DIR [DEVICE]   (DEVICE: cuda, the default, or cuda:N;
cpu runs the script's own check, the CPU against itself)
"""
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "golden"))
import make_gptq  # noqa: E402

N_GREEDY = 24
LOGITS_TOL = 5e-2


def prompts():
    rnd = random.Random(14)
    return [[1, 50, 600, 7000, 123]] + [[rnd.randrange(100, 40000) for _ in range(n)] for n in (40, 300)]


def run(run_model, folder, device, ids, logits, extra=()):
    r = subprocess.run([run_model, "--model", str(folder), "--device", device, "--ids", ",".join(map(str, ids)),
                        "--greedy", str(N_GREEDY), "--logits-out", str(logits), *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"run_model {folder.name} on {device}: {r.stderr[-2000:]}"
    return r.stdout.strip().splitlines()[-1]


def compare_with_cpu(run_model, folder, device, ids, work, tol):
    """Whether folder on device follows the CPU's greedy tokens (vLLM's rule) with logits within tol; prints why."""
    a = run(run_model, folder, "cpu", ids, work / "cpu.f32")
    b = run(run_model, folder, device, ids, work / "dev.f32")
    la, lb = np.fromfile(work / "cpu.f32", dtype=np.float32), np.fromfile(work / "dev.f32", dtype=np.float32)
    err = float(np.linalg.norm(la - lb) / np.linalg.norm(la))
    r = subprocess.run([sys.executable, str(HERE / "compare_greedy.py"), f"{folder.name} prompt of {len(ids)}", a, b],
                       capture_output=True, text=True)
    ok = r.returncode == 0 and err < tol
    print(f"{r.stdout.strip()}; logits' relative error {err:.2g}{'' if ok else '  FAIL'}")
    return ok


def main():
    run_model, work = sys.argv[1], Path(sys.argv[2])
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    subprocess.run([sys.executable, make_gptq.__file__, "-", str(work)], check=True, timeout=600)
    bad = 0
    for name in make_gptq.VARIANTS:
        for ids in prompts():
            bad += not compare_with_cpu(run_model, work / name, device, ids, work, LOGITS_TOL)
    print("PASS" if bad == 0 else f"FAIL: {bad} runs")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
