#!/usr/bin/env python3
"""GPU whole-model parity with Hugging Face transformers + PyTorch.

Builds small llama / qwen2 / qwen3 / mistral (a sliding window of 16
tokens) / qwen3moe (16 experts top-2, and 64 experts top-8 renormalised
with one dense layer) models with random weights (real
architectures, scaled so logits are not flat), saves them as bf16
safetensors with config.json, runs transformers on the GPU (fp32 reference
and bf16) and ferrum's run_model on --device cuda (and cpu), and compares:
  - last-token logits: relative error ||ours - ref|| / ||ref|| <= 1e-2
    (MoE models: or at most 1.5x transformers' own bf16 error, since a
    bf16 router may pick another expert near a tie);
  - greedy tokens over 32 steps equal, or at the first divergence each
    side's token inside the other's top-5 (vLLM's check).
Prints a table and exits non-zero on failure.

usage: hf_parity.py RUN_MODEL_BINARY OUT_DIR [--devices cuda,cpu]
"""
import json
import os
import subprocess
import sys

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

N_GREEDY = 32


def configs():
    common = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                  max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False)
    return {
        "llama": (LlamaForCausalLM, LlamaConfig(**common, num_attention_heads=8, num_key_value_heads=2,
                                                 rope_theta=500000.0,
                                                 rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                                   low_freq_factor=1.0, high_freq_factor=4.0,
                                                                   original_max_position_embeddings=64))),
        "qwen2": (Qwen2ForCausalLM, Qwen2Config(**common, num_attention_heads=8, num_key_value_heads=2,
                                                 rope_theta=1000000.0)),
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(**{**common, "tie_word_embeddings": True}, num_attention_heads=8,
                                                 num_key_value_heads=4, head_dim=128, rope_theta=1000000.0)),
        # a sliding window shorter than the 48-token prompt: prefill and decode both cut the context
        "mistral": (MistralForCausalLM, MistralConfig(**common, num_attention_heads=8, num_key_value_heads=2,
                                                       rope_theta=10000.0, sliding_window=16)),
        "qwen3moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(**common, num_attention_heads=8, num_key_value_heads=4,
                                                         head_dim=128, rope_theta=1000000.0, num_experts=16,
                                                         num_experts_per_tok=2, moe_intermediate_size=256,
                                                         norm_topk_prob=False, decoder_sparse_step=1)),
        "qwen3moe8": (Qwen3MoeForCausalLM, Qwen3MoeConfig(**common, num_attention_heads=8, num_key_value_heads=4,
                                                          head_dim=128, rope_theta=1000000.0, num_experts=64,
                                                          num_experts_per_tok=8, moe_intermediate_size=128,
                                                          norm_topk_prob=True, decoder_sparse_step=1,
                                                          mlp_only_layers=[2])),
    }


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3:  # fused experts (transformers 5: (E, out, in))
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[2] ** 0.5)
            elif p.ndim == 2:
                scale = 1.0 if "embed_tokens" in name else (2.0 if "lm_head" in name else 1.0) / p.shape[1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g) * scale)
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:  # biases
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def hf_run(model, ids, dtype):
    m = model.to(device="cuda", dtype=dtype).eval()
    x = torch.tensor([ids], device="cuda")
    with torch.no_grad():
        logits = m(x).logits[0, -1].float().cpu()
        out = m.generate(x, max_new_tokens=N_GREEDY, do_sample=False, num_beams=1, top_k=None, top_p=None,
                         temperature=None, pad_token_id=0, eos_token_id=None)
    greedy = out[0, len(ids):].tolist()
    # top-5 at each greedy step, for the divergence rule
    with torch.no_grad():
        full = m(out[:, :-1]).logits[0, len(ids) - 1:].float()
    top5 = full.topk(5, dim=-1).indices.tolist()
    return logits, greedy, top5


def ours_run(binary, folder, ids, device, out_dir, tag, extra=()):
    path = os.path.join(out_dir, f"{tag}.{device}.logits")
    r = subprocess.run([binary, "--model", folder, "--device", device, "--ids", ",".join(map(str, ids)),
                        "--greedy", str(N_GREEDY), "--logits-out", path, *extra], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"run_model {tag} {device}: {r.stderr[-2000:]}")
    res = json.loads(r.stdout)
    logits = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.float32)
    return logits, res["greedy"]


def greedy_check(ours, ref, ref_top5, our_logits_fn=None):
    for t, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            return t, a in ref_top5[t]
    return None, True


def main():
    binary, out_dir = sys.argv[1], sys.argv[2]
    devices = ["cuda", "cpu"]
    if "--devices" in sys.argv:
        devices = sys.argv[sys.argv.index("--devices") + 1].split(",")
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    ok = True
    rows = []
    for i, (name, (cls, cfg)) in enumerate(configs().items()):
        model = cls(cfg)
        randomize(model, 100 + i)
        folder = os.path.join(out_dir, f"tiny-{name}")
        model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
        model = cls.from_pretrained(folder, torch_dtype=torch.bfloat16)  # exactly the saved weights
        g = torch.Generator().manual_seed(7 + i)
        ids = torch.randint(0, cfg.vocab_size, (48,), generator=g).tolist()
        ref32, greedy32, top5_32 = hf_run(model, ids, torch.float32)
        ref16, greedy16, _ = hf_run(model, ids, torch.bfloat16)
        hf_rel = float((ref16 - ref32).norm() / ref32.norm())
        for dev in devices:
            logits, greedy = ours_run(binary, folder, ids, dev, out_dir, name)
            rel = float((logits - ref32).norm() / ref32.norm())
            div, in5 = greedy_check(greedy, greedy32, top5_32)
            tol = max(1e-2, 1.5 * hf_rel) if "moe" in name else 1e-2
            passed = rel <= tol and in5
            ok &= passed
            rows.append((name, dev, rel, hf_rel, "all 32 equal" if div is None else f"diverge@{div} top5={in5}",
                         "PASS" if passed else "FAIL"))
    print(f"{'model':9} {'device':6} {'rel.err vs HF fp32':>20} {'HF bf16 rel.err':>16}  greedy")
    for r in rows:
        print(f"{r[0]:9} {r[1]:6} {r[2]:20.2e} {r[3]:16.2e}  {r[4]}  {r[5]}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
