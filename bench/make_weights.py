#!/usr/bin/env python3
"""Writes random bf16 weights for a Hugging Face Llama-family config as a
sharded safetensors folder (model-0000N-of-0000M.safetensors plus
model.safetensors.index.json, shards of at most 5 GB as transformers
writes them), next to a copy of the config and tokenizer files: the 16 GB
folder that bench/load_bench.sh loads. Needs torch and safetensors (the GPU
machine has both; values are N(0, 0.02), made on the GPU when there is one).
usage: make_weights.py CONFIG_DIR OUT_DIR"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

SHARD_BYTES = 5 * 10**9


def tensor_shapes(c):
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = c.get("head_dim") or d // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (v, d)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (d,)
        yield p + "self_attn.q_proj.weight", (q, d)
        yield p + "self_attn.k_proj.weight", (kv, d)
        yield p + "self_attn.v_proj.weight", (kv, d)
        yield p + "self_attn.o_proj.weight", (d, q)
        yield p + "post_attention_layernorm.weight", (d,)
        yield p + "mlp.gate_proj.weight", (f, d)
        yield p + "mlp.up_proj.weight", (f, d)
        yield p + "mlp.down_proj.weight", (d, f)
    yield "model.norm.weight", (d,)
    if not c.get("tie_word_embeddings"):
        yield "lm_head.weight", (v, d)


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), out)
    cfg = json.load(open(os.path.join(src, "config.json")))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    shards, cur, cur_bytes = [], {}, 0
    for name, shape in tensor_shapes(cfg):
        t = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).mul_(0.02)
        if len(shape) == 1:
            t.fill_(1.0)
        t = t.to(torch.bfloat16).cpu()
        if cur and cur_bytes + t.numel() * 2 > SHARD_BYTES:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[name] = t
        cur_bytes += t.numel() * 2
    shards.append(cur)
    weight_map, total = {}, 0
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, os.path.join(out, fname), metadata={"format": "pt"})
        for k, t in sh.items():
            weight_map[k] = fname
            total += t.numel() * 2
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    print(f"{out}: {len(shards)} shards, {total / 1e9:.2f} GB")


if __name__ == "__main__":
    main()
