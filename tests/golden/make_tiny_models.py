#!/usr/bin/env python3
"""Writes small random-weight models of real architectures for the model
tests, with the SmolLM2 tokenizer copied from the real GGUF:

  tiny-llama.gguf        llama, F32, untied output, q/k permuted as convert_hf_to_gguf does,
                         llama3 rope scaling as rope_freqs.weight
  tiny-llama-hf/         the same weights as a Hugging Face folder
                         (config.json with rope_scaling llama3,
                         model.safetensors, un-permuted, BF16 or F32)
  tiny-qwen2.gguf        qwen2 (q/k/v bias), Q8_0 / Q4_K / Q6_K / Q5_0 / F16 weights
  tiny-qwen3.gguf        qwen3 (q/k norm, head_dim 64 != dim / heads),
                         Q4_0 / Q4_1 / Q5_1 / Q5_K / BF16 weights
  tiny-qwen3-hf/         a qwen3 Hugging Face folder (BF16, tied embeddings)
                         with SmolLM2's tokenizer as tokenizer.json (built
                         with HF `tokenizers`, as the tokenizer golden does)
  tiny-qwen3moe.gguf     qwen3moe: 3 layers of 8 experts (2 used, expert FFN 64),
                         F32 weights holding BF16-rounded values, experts as
                         3-D stacks (ffn_{gate,up,down}_exps), untied output
  tiny-qwen3moe-hf/      the same weights as a Qwen3MoeForCausalLM folder
                         (BF16, one tensor per expert)
  tiny-qwen3moe-q.gguf   the same model quantized: Q8_0 / Q5_0 / Q4_1 experts,
                         Q8_0 / Q4_0 attention, F16 embedding

usage: make_tiny_models.py SMOLLM2_GGUF OUT_DIR

Outputs whose inputs have not changed since they were written are kept
(tests/golden/stamp.py).
"""
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

from stamp import cached

RNG = np.random.default_rng(1234)


def tokenizer_fields(path):
    """The tokenizer.* key/values of a GGUF file, ready to re-add."""
    r = gguf.GGUFReader(path)
    out = {}
    for name, f in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        out[name] = f
    return r, out


def copy_tokenizer(w, reader, fields):
    for name, f in fields.items():
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            et = f.types[1]
            vals = [f.parts[i] for i in f.data]
            if et == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(v).decode("utf-8", errors="surrogateescape") for v in vals])
            else:
                w.add_array(name, [v.tolist()[0] for v in vals])
        elif vt == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[f.data[0]]).decode())
        elif vt == gguf.GGUFValueType.BOOL:
            w.add_bool(name, bool(f.parts[f.data[0]][0]))
        elif vt == gguf.GGUFValueType.UINT32:
            w.add_uint32(name, int(f.parts[f.data[0]][0]))
        elif vt == gguf.GGUFValueType.INT32:
            w.add_int32(name, int(f.parts[f.data[0]][0]))
        else:
            raise SystemExit(f"unhandled tokenizer field {name} {vt}")


def rand(shape, scale):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def random_kquant(rows, cols, qtype):
    """Random valid K-quant blocks (gguf-py cannot quantize K types):
    random payload bytes with f16 scales chosen so the weights' spread is
    about 1/sqrt(cols), like the float weights beside them."""
    bsz, tsz = gguf.GGML_QUANT_SIZES[qtype]
    nb = cols // bsz
    raw = RNG.integers(0, 256, size=(rows, nb, tsz), dtype=np.uint8)
    target = cols ** -0.5
    def f16(v):
        return np.frombuffer(np.float16(v).tobytes(), dtype=np.uint8)
    for r in range(rows):
        for b in range(nb):
            if qtype in (T.Q4_K, T.Q5_K):
                qmax = 15 if qtype == T.Q4_K else 31
                # w = d*sc*q - dmin*m, sc/m 6-bit: center q around qmax/2
                raw[r, b, 0:2] = f16(target / (32 * qmax / 3) * (1 + RNG.random()))
                raw[r, b, 2:4] = f16(target / (32 * 2) * RNG.random())
            elif qtype == T.Q6_K:
                raw[r, b, 192:208] = RNG.integers(-20, 20, 16).astype(np.int8).view(np.uint8)
                raw[r, b, 208:210] = f16(target / (10 * 18) * (1 + RNG.random()))
    return raw.reshape(rows, nb * tsz)


def add_weight(w, name, data, qtype):
    """data: f32 (rows, cols); stored in qtype."""
    if qtype == T.F32:  # any rank: 3-D expert stacks too
        w.add_tensor(name, data.astype(np.float32))
    elif qtype == T.F16:
        w.add_tensor(name, data.astype(np.float16))
    elif qtype in (T.Q4_K, T.Q5_K, T.Q6_K):
        raw = random_kquant(data.shape[0], data.shape[1], qtype)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
    else:
        q = quantize(data, qtype)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)


def permute(w, n_head):
    """convert_hf_to_gguf LlamaModel.permute: HF rotate-half rows -> GGUF interleaved."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(theta, dim, factor, low, high, orig):
    inv = theta ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * np.pi / inv
    out = []
    for i, wl in enumerate(wavelen):
        if wl < orig / high:
            out.append(1.0)
        elif wl > orig / low:
            out.append(factor)
        else:
            s = (orig / wl - low) / (high - low)
            out.append(1.0 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


def make_weights(cfg, with_bias=False, with_qk_norm=False):
    d, f, hd = cfg["dim"], cfg["ffn"], cfg["head_dim"]
    nh, nkv, V = cfg["heads"], cfg["kv_heads"], cfg["vocab"]
    W = {"token_embd.weight": rand((V, d), 1.0), "output_norm.weight": 1 + rand((d,), 0.1)}
    for i in range(cfg["layers"]):
        p = f"blk.{i}."
        W[p + "attn_norm.weight"] = 1 + rand((d,), 0.1)
        W[p + "attn_q.weight"] = rand((nh * hd, d), d ** -0.5)
        W[p + "attn_k.weight"] = rand((nkv * hd, d), d ** -0.5)
        W[p + "attn_v.weight"] = rand((nkv * hd, d), d ** -0.5)
        W[p + "attn_output.weight"] = rand((d, nh * hd), (nh * hd) ** -0.5)
        W[p + "ffn_norm.weight"] = 1 + rand((d,), 0.1)
        W[p + "ffn_gate.weight"] = rand((f, d), d ** -0.5)
        W[p + "ffn_up.weight"] = rand((f, d), d ** -0.5)
        W[p + "ffn_down.weight"] = rand((d, f), f ** -0.5)
        if with_bias:
            for t, n in (("q", nh), ("k", nkv), ("v", nkv)):
                W[p + f"attn_{t}.bias"] = rand((n * hd,), 0.5)
        if with_qk_norm:
            W[p + "attn_q_norm.weight"] = 1 + rand((hd,), 0.1)
            W[p + "attn_k_norm.weight"] = 1 + rand((hd,), 0.1)
    return W


def write_gguf(path, arch, cfg, W, types, tok):
    reader, fields = tok
    w = gguf.GGUFWriter(str(path), arch)
    if "experts" in cfg:
        w.add_expert_count(cfg["experts"])
        w.add_expert_used_count(cfg["experts_used"])
        w.add_expert_feed_forward_length(cfg["expert_ffn"])
    w.add_name(Path(path).stem)
    w.add_context_length(cfg["ctx"])
    w.add_embedding_length(cfg["dim"])
    w.add_block_count(cfg["layers"])
    w.add_feed_forward_length(cfg["ffn"])
    w.add_head_count(cfg["heads"])
    w.add_head_count_kv(cfg["kv_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(cfg["theta"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_file_type(0)
    copy_tokenizer(w, reader, fields)
    for name, data in W.items():
        add_weight(w, name, data, types(name) if data.ndim >= 2 else T.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_safetensors(path, tensors, dtype):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        if dtype == "BF16":
            u = a.astype(np.float32).view(np.uint32)
            b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
        else:
            b = a.astype(np.float32).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


HF_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def to_bf16_values(a):
    u = a.astype(np.float32).view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return r.view(np.float32)


def write_hf_folder(hf, cfg, W, names, arch, model_type, extra, more=None):
    """A Hugging Face folder: model.safetensors (BF16; lm_head when W has an
    untied output; `more` HF-named tensors added) and config.json with extra
    keys added."""
    hf.mkdir(exist_ok=True)
    st = {"model.embed_tokens.weight": W["token_embd.weight"], "model.norm.weight": W["output_norm.weight"]}
    st.update(more or {})
    if "output.weight" in W:
        st["lm_head.weight"] = W["output.weight"]
    for i in range(cfg["layers"]):
        for g, h in names.items():
            st[f"model.layers.{i}.{h}.weight"] = W[f"blk.{i}.{g}.weight"]
    write_safetensors(hf / "model.safetensors", st, "BF16")
    config = {
        "architectures": [arch], "model_type": model_type, "hidden_size": cfg["dim"],
        "intermediate_size": cfg["ffn"], "num_hidden_layers": cfg["layers"], "num_attention_heads": cfg["heads"],
        "num_key_value_heads": cfg["kv_heads"], "head_dim": cfg["head_dim"], "vocab_size": cfg["vocab"],
        "max_position_embeddings": cfg["ctx"], "rms_norm_eps": cfg["eps"], "rope_theta": cfg["theta"],
        "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, **extra}
    (hf / "config.json").write_text(json.dumps(config, indent=1))


def tiny_llama(out, tok):
    cfg = dict(dim=128, ffn=256, heads=4, kv_heads=2, head_dim=32, layers=2, vocab=49152, ctx=2048,
               theta=500000.0, eps=1e-5)
    rs = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
    W = make_weights(cfg)
    W["output.weight"] = rand((cfg["vocab"], cfg["dim"]), 3 * cfg["dim"] ** -0.5)  # untied
    # HF weights are stored in BF16: round once so GGUF F32 and HF BF16 hold the same values.
    W = {k: to_bf16_values(v) for k, v in W.items()}
    # HF folder (rotate-half q/k)
    write_hf_folder(out / "tiny-llama-hf", cfg, W, HF_NAMES, "LlamaForCausalLM", "llama",
                    {"rope_scaling": dict(rope_type="llama3", **rs), "tie_word_embeddings": False})
    # GGUF (interleaved q/k, rope_freqs)
    G = dict(W)
    for i in range(cfg["layers"]):
        G[f"blk.{i}.attn_q.weight"] = permute(W[f"blk.{i}.attn_q.weight"], cfg["heads"])
        G[f"blk.{i}.attn_k.weight"] = permute(W[f"blk.{i}.attn_k.weight"], cfg["kv_heads"])
    G["rope_freqs.weight"] = llama3_rope_freqs(cfg["theta"], cfg["head_dim"], rs["factor"], rs["low_freq_factor"],
                                               rs["high_freq_factor"], rs["original_max_position_embeddings"])
    write_gguf(out / "tiny-llama.gguf", "llama", cfg, G, lambda n: T.F32, tok)


def tiny_qwen2(out, tok):
    cfg = dict(dim=256, ffn=512, heads=4, kv_heads=2, head_dim=64, layers=2, vocab=49152, ctx=2048,
               theta=1000000.0, eps=1e-6)
    W = make_weights(cfg, with_bias=True)
    def types(n):
        if "token_embd" in n: return T.F16
        if "attn_q." in n or "attn_k." in n: return T.Q8_0
        if "attn_v." in n: return T.Q5_0
        if "attn_output" in n: return T.Q8_0
        if "ffn_gate" in n or "ffn_up" in n: return T.Q4_K
        return T.Q6_K
    write_gguf(out / "tiny-qwen2.gguf", "qwen2", cfg, W, types, tok)


def tiny_qwen3(out, tok):
    cfg = dict(dim=256, ffn=512, heads=8, kv_heads=2, head_dim=64, layers=2, vocab=49152, ctx=2048,
               theta=1000000.0, eps=1e-6)
    W = make_weights(cfg, with_qk_norm=True)
    def types(n):
        if "token_embd" in n: return T.BF16
        if "attn_q." in n: return T.Q4_0
        if "attn_k." in n or "attn_v." in n: return T.Q4_1
        if "attn_output" in n: return T.Q5_1
        if "ffn_down" in n: return T.Q8_0
        return T.Q5_K
    write_gguf(out / "tiny-qwen3.gguf", "qwen3", cfg, W, types, tok)


def tiny_qwen3_hf(out, src):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tokenizer"))
    from gen_tok_golden import hf_tokenizer, read_gguf  # noqa: E402
    cfg = dict(dim=128, ffn=384, heads=8, kv_heads=2, head_dim=32, layers=2, vocab=49152, ctx=2048,
               theta=1000000.0, eps=1e-6)
    W = make_weights(cfg, with_qk_norm=True)
    hf = out / "tiny-qwen3-hf"
    names = dict(HF_NAMES, attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")
    write_hf_folder(hf, cfg, W, names, "Qwen3ForCausalLM", "qwen3",
                    {"tie_word_embeddings": True, "attention_bias": False})
    kv = read_gguf(src)
    tokens, types = kv["tokenizer.ggml.tokens"][1], kv["tokenizer.ggml.token_type"][1]
    hf_tokenizer(tokens, types, kv["tokenizer.ggml.merges"][1], "smollm").save(str(hf / "tokenizer.json"))


def tiny_qwen3moe(out, tok):
    """Qwen3-MoE: qwen3 attention, every layer a mixture of 8 experts."""
    cfg = dict(dim=128, ffn=256, heads=4, kv_heads=2, head_dim=32, layers=3, vocab=49152, ctx=2048,
               theta=1000000.0, eps=1e-6, experts=8, experts_used=2, expert_ffn=64)
    d, E, F = cfg["dim"], cfg["experts"], cfg["expert_ffn"]
    W = make_weights(cfg, with_qk_norm=True)
    # untied, as Qwen3-30B-A3B: a tied table makes a random model repeat its last token
    W["output.weight"] = rand((cfg["vocab"], d), 3 * d ** -0.5)
    more = {}
    for i in range(cfg["layers"]):
        p = f"blk.{i}."
        for k in ("ffn_gate", "ffn_up", "ffn_down"):
            del W[p + k + ".weight"]
        W[p + "ffn_gate_inp.weight"] = rand((E, d), 2 * d ** -0.5)
        W[p + "ffn_gate_exps.weight"] = rand((E, F, d), d ** -0.5)
        W[p + "ffn_up_exps.weight"] = rand((E, F, d), d ** -0.5)
        W[p + "ffn_down_exps.weight"] = rand((E, d, F), F ** -0.5)
    W = {k: to_bf16_values(v) for k, v in W.items()}
    for i in range(cfg["layers"]):
        p, h = f"blk.{i}.", f"model.layers.{i}.mlp."
        more[h + "gate.weight"] = W[p + "ffn_gate_inp.weight"]
        for e in range(E):
            for g, n in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                more[f"{h}experts.{e}.{n}.weight"] = W[p + f"ffn_{g}_exps.weight"][e]
    names = {k: v for k, v in HF_NAMES.items() if not k.startswith("ffn_") or k == "ffn_norm"}
    names.update(attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")
    hf = out / "tiny-qwen3moe-hf"
    write_hf_folder(hf, cfg, W, names, "Qwen3MoeForCausalLM", "qwen3_moe",
                    {"tie_word_embeddings": False, "attention_bias": False, "num_experts": E,
                     "num_experts_per_tok": cfg["experts_used"], "moe_intermediate_size": F,
                     "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}, more)
    shutil.copy(out / "tiny-qwen3-hf" / "tokenizer.json", hf / "tokenizer.json")
    write_gguf(out / "tiny-qwen3moe.gguf", "qwen3moe", cfg, W, lambda n: T.F32, tok)
    def types(n):
        if "token_embd" in n: return T.F16
        if "ffn_gate_inp" in n: return T.F32
        if "ffn_gate_exps" in n: return T.Q8_0
        if "ffn_up_exps" in n: return T.Q5_0
        if "ffn_down_exps" in n: return T.Q4_1
        if "attn_q." in n or "attn_output" in n: return T.Q8_0
        return T.Q4_0
    write_gguf(out / "tiny-qwen3moe-q.gguf", "qwen3moe", cfg, W, types, tok)


def tiny_mistral_window(out, src):
    """A Mistral HF folder whose every layer has a sliding window of 16
    tokens (the engine releases KV blocks before it: test_kv_window.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tokenizer"))
    from gen_tok_golden import hf_tokenizer, read_gguf  # noqa: E402
    cfg = dict(dim=128, ffn=256, heads=4, kv_heads=2, head_dim=32, layers=2, vocab=49152, ctx=2048,
               theta=10000.0, eps=1e-5)
    W = make_weights(cfg)
    W["output.weight"] = rand((cfg["vocab"], cfg["dim"]), 3 * cfg["dim"] ** -0.5)  # untied
    hf = out / "tiny-mistral-window-hf"
    write_hf_folder(hf, cfg, W, HF_NAMES, "MistralForCausalLM", "mistral",
                    {"sliding_window": 16, "tie_word_embeddings": False})
    kv = read_gguf(src)
    tokens, types = kv["tokenizer.ggml.tokens"][1], kv["tokenizer.ggml.token_type"][1]
    hf_tokenizer(tokens, types, kv["tokenizer.ggml.merges"][1], "smollm").save(str(hf / "tokenizer.json"))


def main():
    src, out = sys.argv[1], Path(sys.argv[2])
    cached(out, "tiny-models", [src], [], lambda: make_all(src, out))


def make_all(src, out):
    tok = tokenizer_fields(src)
    tiny_llama(out, tok)
    tiny_qwen2(out, tok)
    tiny_qwen3(out, tok)
    tiny_qwen3_hf(out, src)
    tiny_qwen3moe(out, tok)
    tiny_mistral_window(out, src)


if __name__ == "__main__":
    main()
