#!/usr/bin/env python3
"""A model folder for `--load-format dummy` runs on the GPU machine: the
Llama-3-8B (or, with a third argument, `llama-3-70b`: Llama-3-70B,
`llama-3.2-1b`: Llama-3.2-1B, the speculative benchmarks' draft, or
`smollm2-135m`: SmolLM2-135M's own shapes, `qwen3-30b-a3b`: Qwen3-30B-A3B,
128 experts, top 8) config.json with SmolLM2's
tokenizer (tokenizer.json built from the GGUF's vocabulary and merges with
HF `tokenizers`, as the tokenizer golden test does; tokenizer_config.json
with the GGUF's chat template). Prompts are token ids below SmolLM2's
49152, so the tokenizer only needs to round-trip text.
usage: make_dummy_folder.py SMOLLM2_GGUF OUT_DIR [llama-3-8b|llama-3-70b|llama-3.2-1b|smollm2-135m|qwen3-30b-a3b]"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tokenizer"))
from gen_tok_golden import hf_tokenizer, read_gguf  # noqa: E402

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2,
}
LLAMA3_70B = dict(LLAMA3_8B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                  num_attention_heads=64)
LLAMA32_1B = dict(LLAMA3_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                  num_attention_heads=32, head_dim=64, tie_word_embeddings=True,
                  rope_scaling=dict(LLAMA3_8B["rope_scaling"], factor=32.0))
SMOLLM2_135M = dict({k: v for k, v in LLAMA3_8B.items() if k != "rope_scaling"}, hidden_size=576,
                    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    head_dim=64, rope_theta=100000.0, vocab_size=49152, tie_word_embeddings=True)
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}
SHAPES = {"llama-3-8b": LLAMA3_8B, "llama-3-70b": LLAMA3_70B, "llama-3.2-1b": LLAMA32_1B,
          "smollm2-135m": SMOLLM2_135M, "qwen3-30b-a3b": QWEN3_30B_A3B}


def main():
    gguf_path, out = sys.argv[1:3]
    config = SHAPES[sys.argv[3] if len(sys.argv) > 3 else "llama-3-8b"]
    kv = read_gguf(gguf_path)
    tokens, types = kv["tokenizer.ggml.tokens"][1], kv["tokenizer.ggml.token_type"][1]
    os.makedirs(out, exist_ok=True)
    hf_tokenizer(tokens, types, kv["tokenizer.ggml.merges"][1], "smollm").save(os.path.join(out, "tokenizer.json"))
    bos, eos = kv["tokenizer.ggml.bos_token_id"][1], kv["tokenizer.ggml.eos_token_id"][1]
    tc = {"bos_token": tokens[bos], "eos_token": tokens[eos], "chat_template": kv["tokenizer.chat_template"][1]}
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tc, f, indent=1)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
