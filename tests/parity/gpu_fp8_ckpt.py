#!/usr/bin/env python3
"""FP8 checkpoints on a CUDA device (docs/QUANTIZED.md, "FP8 checkpoints").

tests/golden/make_fp8.py writes its three small random LLaMA folders (a
scale per tensor, compressed-tensors per channel, 48 x 80 blocks with the
lm_head FP8) and their BF16 twins, without a tokenizer (PyTorch's E4M3 and
BF16 conversions where ml_dtypes is missing). For each folder and prompts
of 5, 40 and 300 tokens (tests/parity/gpu_gptq.py's):

1. on the device, the folder and its twin run with --quantization fp8 give
   the same greedy tokens and bit-identical logits: the folder's layers are
   decoded into the twin's BF16 values and both are quantized again, a
   scale a row, at upload;
2. the folder on the device follows the CPU (where it runs in BF16):
   vLLM's greedy rule, and the last prompt token's logits within
   LOGITS_TOL relative error (the device quantizes weights per row and
   activations per token to E4M3; tests/parity/gpu_fp8.py measured that
   at 1e-2 to 7e-2 against transformers).

usage: gpu_fp8_ckpt.py RUN_MODEL WORK_DIR [DEVICE]   (DEVICE: cuda, the default, or cuda:N;
cpu runs the script's own check: the twin without --quantization, the CPU against itself)
"""
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "golden"))
sys.path.insert(0, str(HERE))
import make_fp8  # noqa: E402
from gpu_gptq import compare_with_cpu, prompts, run  # noqa: E402

LOGITS_TOL = 1e-1


def same_as_twin(run_model, folder, twin, device, ids, work):
    """Whether folder and twin --quantization fp8 generate the same tokens and logits on device; prints why."""
    a = run(run_model, folder, device, ids, work / "ckpt.f32")
    b = run(run_model, twin, device, ids, work / "twin.f32", () if device == "cpu" else ("--quantization", "fp8"))
    la, lb = np.fromfile(work / "ckpt.f32", dtype=np.float32), np.fromfile(work / "twin.f32", dtype=np.float32)
    ok = a == b and la.size == lb.size and np.array_equal(la, lb)
    how = "" if device == "cpu" else " with --quantization fp8"
    print(f"{folder.name} prompt of {len(ids)}: the twin{how} "
          f"{'gives the same tokens and logits' if ok else 'differs  FAIL'}")
    return ok


def main():
    run_model, work = sys.argv[1], Path(sys.argv[2])
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    subprocess.run([sys.executable, make_fp8.__file__, "-", str(work)], check=True, timeout=600)
    bad = 0
    for variant in make_fp8.VARIANTS:
        folder, twin = work / f"fp8-{variant}", work / f"fp8-{variant}-twin"
        for ids in prompts():
            bad += not same_as_twin(run_model, folder, twin, device, ids, work)
            bad += not compare_with_cpu(run_model, folder, device, ids, work, LOGITS_TOL)
    print("PASS" if bad == 0 else f"FAIL: {bad} runs")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
