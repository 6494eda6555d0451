#!/usr/bin/env python3
"""FP8 weights (--quantization fp8) on a CUDA device against transformers.

hf_parity.py's small random llama / qwen2 / qwen3 / mistral models (bf16
safetensors) are run by ferrum's run_model with --quantization fp8 and by
transformers with the same quantization emulated in PyTorch, as vLLM's
dynamic FP8 defines it and ferrum computes it (kern_fp8_quantize_row):
  - every decoder layer's linear weight (not the LM head) becomes
    e4m3(w * 448 / m) * m / 448 with m = max|w| over its row (an output);
  - a linear's input over more than 8 tokens (the prompt; ferrum's FP8
    GEMM) likewise, a scale per token; over 8 or fewer (decode steps:
    ferrum's GEMV over the bytes, which run_model is set to take up to 8
    rows) it stays as it is.
The reference is that emulation in fp32. Two prompts:
  - 6 tokens: every matmul runs the GEMV, so only the weights are
    quantized, the same bits on both sides; the last token's logits must
    be within max(1e-2, 1.5x transformers' own error running the emulation
    in bf16) of the reference, as hf_parity.py holds MoE models, and the
    reference must be at least 3x further from the unquantized model (so
    the check sees a weight left unquantized or a wrong scale);
  - 48 tokens: the prompt's activations are quantized too, where bf16 and
    fp32 inputs round to different FP8 steps now and then (transformers'
    bf16 run lands about 6e-2 from the fp32 one): the same tolerance.
Both: greedy tokens over 32 steps equal, or at the first divergence ours
in the reference's top-5 (vLLM's rule). Also printed: each side's error
against the unquantized fp32 model (what FP8 costs).

usage: gpu_fp8.py RUN_MODEL OUT_DIR
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_parity  # noqa: E402

GEMV_MAX_TOKENS = 8  # FERRUM_CUDA_F8_GEMV_MAX_N for run_model (main): up to 8 rows run the GEMV


def fp8_rows(t):
    """t (..., k) rounded as FP8 E4M3 rows with one scale a row, in fp32."""
    x = t.float()
    m = x.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(m > 0, 448.0 / m, torch.zeros_like(m))
    q = (x * inv).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()
    return (q * (m / 448.0)).to(t.dtype)


def quantize_input(module, args):
    x = args[0]
    tokens = x.numel() // x.shape[-1]
    return (fp8_rows(x),) + args[1:] if tokens > GEMV_MAX_TOKENS else None


def emulate_fp8(model):
    """The model's decoder linears as FP8 (in place) with their inputs' hooks."""
    with torch.no_grad():
        for name, mod in model.model.layers.named_modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(fp8_rows(mod.weight))
                mod.register_forward_pre_hook(quantize_input)
    return model


def check(binary, out_dir, name, cls, folder, ids):
    """One prompt: the row of the table, and whether it passed."""
    load = lambda: cls.from_pretrained(folder, torch_dtype=torch.float32)  # noqa: E731
    plain, _, _ = hf_parity.hf_run(load(), ids, torch.float32)
    ref, greedy_ref, top5_ref = hf_parity.hf_run(emulate_fp8(load()), ids, torch.float32)
    ref16, _, _ = hf_parity.hf_run(emulate_fp8(load().to(torch.bfloat16)), ids, torch.bfloat16)
    hf_rel = float((ref16 - ref).norm() / ref.norm())
    fp8_cost = float((ref - plain).norm() / plain.norm())
    logits, greedy = hf_parity.ours_run(binary, folder, ids, "cuda", out_dir, name, ["--quantization", "fp8"])
    rel = float((logits - ref).norm() / ref.norm())
    rel_plain = float((logits - plain).norm() / plain.norm())
    div, in5 = hf_parity.greedy_check(greedy, greedy_ref, top5_ref)
    passed = rel <= max(1e-2, 1.5 * hf_rel) and in5
    if len(ids) <= GEMV_MAX_TOKENS:
        passed = passed and fp8_cost >= 3 * rel
    row = (f"{name:9} {len(ids):6} {rel:11.2e} {hf_rel:9.2e} {rel_plain:9.2e} {fp8_cost:13.2e}  "
           f"{'all 32 equal' if div is None else f'diverge@{div} top5={in5}'}  {'PASS' if passed else 'FAIL'}")
    return row, passed


def main():
    binary, out_dir = sys.argv[1], sys.argv[2]
    os.environ["FERRUM_CUDA_F8_GEMV_MAX_N"] = str(GEMV_MAX_TOKENS)
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    ok, rows = True, []
    for i, (name, (cls, cfg)) in enumerate(hf_parity.configs().items()):
        if name not in ("llama", "qwen2", "qwen3", "mistral"):
            continue
        model = cls(cfg)
        hf_parity.randomize(model, 100 + i)
        folder = os.path.join(out_dir, f"tiny-{name}")
        model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
        g = torch.Generator().manual_seed(7 + i)
        ids = torch.randint(0, cfg.vocab_size, (48,), generator=g).tolist()
        for prompt in (ids[:6], ids):
            row, passed = check(binary, out_dir, name, cls, folder, prompt)
            rows.append(row)
            ok &= passed
    print(f"{'model':9} {'prompt':>6} {'vs FP8 ref':>11} {'HF bf16':>9} {'vs plain':>9} {'ref vs plain':>13}  greedy")
    print("\n".join(rows))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
