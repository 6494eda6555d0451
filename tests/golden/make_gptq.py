#!/usr/bin/env python3
"""Writes small random LLaMA models quantized to GPTQ and AWQ int4 (numpy
only), each with its dequantized twin, for tests/model/test_gptq.py:

  gptq-<variant>/       config.json with quantization_config (or a
                        quantize_config.json beside it), model.safetensors
                        with X.qweight / X.qzeros / X.scales / X.g_idx for
                        every linear layer of the decoder, SmolLM2's
                        tokenizer as tokenizer.json
  gptq-<variant>-twin/  the same model with those layers as F32 X.weight,
                        decoded from the quantized file by dequantize()
                        below

The embedding, the norms and the untied lm_head are BF16 in both (the
lm_head is quantized too in gptq-g32-asym-act, as gptqmodel's lm_head
option does); act-order layers that read one input (q/k/v, gate/up) share
one column order, as they share GPTQ's Hessian. The packing and
decoding are written from the formats as docs/QUANTIZED.md states them;
dequantize() is the reference the test holds ferrum's decoded weights to,
bit for bit.

usage: make_gptq.py SMOLLM2_GGUF OUT_DIR   (SMOLLM2_GGUF "-": no tokenizer.json,
for runs that feed token ids, as tests/parity/gpu_gptq.py does)
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

# head_dim 64: the smallest the CUDA attention kernels take (tests/parity/gpu_gptq.py)
CFG = dict(dim=128, ffn=256, heads=2, kv_heads=1, head_dim=64, layers=2, vocab=49152)
LINEAR = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
# name: (method, group_size, sym, act_order, checkpoint_format, config in quantize_config.json, lm_head quantized)
VARIANTS = {
    "gptq-g128-sym": ("gptq", 128, True, False, "gptq", False, False),
    "gptq-g32-asym-act": ("gptq", 32, False, True, "gptq", False, True),
    "gptq-g64-sym-act-v2": ("gptq", 64, True, True, "gptq_v2", True, False),
    "gptq-gall-asym-v2": ("gptq", -1, False, False, "gptq_v2", False, False),
    "awq-g128": ("awq", 128, False, False, None, False, False),
    "awq-g32": ("awq", 32, False, False, None, True, False),
}
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]    # nibble i of a word holds column 8j + AWQ_ORDER[i]
AWQ_REVERSE = [0, 4, 1, 5, 2, 6, 3, 7]  # column 8j + c sits in nibble AWQ_REVERSE[c]
SHIFTS = (4 * np.arange(8)).astype(np.uint32)
ST_DTYPES = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "BF16": np.uint16, "F8_E4M3": np.uint8}


# ---- safetensors -----------------------------------------------------------

def bf16_bits(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def write_safetensors(path, tensors):
    """tensors: name -> (dtype name, array already of that dtype's numpy form)."""
    header, blobs, off = {}, [], 0
    for name, (dt, a) in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
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


def read_safetensors(path):
    """name -> numpy array (BF16 as uint16 bits, F8_E4M3 as uint8 bytes)."""
    data = Path(path).read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + end], dtype=ST_DTYPES[e["dtype"]]).reshape(e["shape"])
    return out


# ---- the reference decoder (docs/QUANTIZED.md) ------------------------------

def unpack_rows(words):
    """int32 [a, b] -> the 8 nibbles of each word along a new last axis: [a, b, 8], nibble i = bits 4i..4i+3."""
    return (words.view(np.uint32)[:, :, None] >> SHIFTS[None, None, :]) & 15


def dequantize(method, group_size, v1, qweight, qzeros, scales, g_idx=None):
    """The f32 weight [out, in] of one layer: scale * (q - zero), exact in f32."""
    if method == "gptq":
        q = unpack_rows(qweight).transpose(0, 2, 1).reshape(-1, qweight.shape[1])  # [in, out]: k = 8 * row + i
        z = unpack_rows(qzeros).reshape(qzeros.shape[0], -1)                       # [groups, out]: n = 8 * col + i
        z = z + 1 if v1 else z
    else:
        q = unpack_rows(qweight)[:, :, AWQ_REVERSE].reshape(qweight.shape[0], -1)  # [in, out]
        z = unpack_rows(qzeros)[:, :, AWQ_REVERSE].reshape(qzeros.shape[0], -1)
    n_in = q.shape[0]
    if g_idx is None:
        g_idx = np.arange(n_in) // group_size if group_size > 0 else np.zeros(n_in, dtype=np.int64)
    s = scales.astype(np.float32)
    w = s[g_idx, :] * (q.astype(np.float32) - z[g_idx, :].astype(np.float32))
    return np.ascontiguousarray(w.T)


def dequantize_layer(folder, st, base):
    """dequantize() of layer `base` of a folder written here (its config read back)."""
    qc = quant_config(folder)
    v1 = qc.get("checkpoint_format", "gptq") == "gptq"
    return dequantize(qc.get("quant_method", "gptq"), qc["group_size"], v1, st[base + ".qweight"],
                      st[base + ".qzeros"], st[base + ".scales"], st.get(base + ".g_idx"))


def quant_config(folder):
    cfg = json.loads((Path(folder) / "config.json").read_text())
    if "quantization_config" in cfg:
        return cfg["quantization_config"]
    return json.loads((Path(folder) / "quantize_config.json").read_text())


# ---- the quantizer -----------------------------------------------------------

def quantize(w, group_size, sym, order):
    """w [out, in] -> int q [out, in], zeros [groups, out], f16 scales [groups, out], g_idx [in]; order: the
    columns in the order GPTQ quantizes them (desc_act: by decreasing Hessian diagonal; else 0, 1, ...)."""
    n_out, n_in = w.shape
    gs = group_size if group_size > 0 else n_in
    groups = (n_in + gs - 1) // gs
    g_idx = np.empty(n_in, dtype=np.int32)
    g_idx[order] = np.arange(n_in) // gs
    q = np.zeros((n_out, n_in), dtype=np.int64)
    zeros = np.zeros((groups, n_out), dtype=np.int64)
    scales = np.zeros((groups, n_out), dtype=np.float16)
    for g in range(groups):
        cols = np.nonzero(g_idx == g)[0]
        wg = w[:, cols]
        if sym:
            s = (2 * np.abs(wg).max(axis=1) / 15).astype(np.float16)
            z = np.full(n_out, 8)
        else:
            lo, hi = np.minimum(wg.min(axis=1), 0), np.maximum(wg.max(axis=1), 0)
            s = ((hi - lo) / 15).astype(np.float16)
            z = np.clip(np.round(-lo / s.astype(np.float32)), 1, 15).astype(np.int64)  # >= 1: v1 stores zero - 1
        s = np.where(s == 0, np.float16(1e-3), s)
        q[:, cols] = np.clip(np.round(wg / s.astype(np.float32)[:, None]) + z[:, None], 0, 15)
        zeros[g], scales[g] = z, s
    return q, zeros, scales, g_idx


def pack_nibbles(vals, order=range(8)):
    """[a, 8 * b] values 0..15 -> int32 [a, b]: nibble i of word j = vals[:, 8 j + order[i]]."""
    v = vals.astype(np.uint32).reshape(vals.shape[0], -1, 8)
    words = np.zeros(v.shape[:2], dtype=np.uint32)
    for i, c in enumerate(order):
        words |= v[:, :, c] << np.uint32(4 * i)
    return words.view(np.int32)


def pack_layer(method, q, zeros, scales, g_idx, v1):
    """The checkpoint tensors of one layer (suffix -> (dtype, array))."""
    if method == "gptq":
        return {"qweight": ("I32", np.ascontiguousarray(pack_nibbles(q).T)),       # [in / 8, out]
                "qzeros": ("I32", pack_nibbles(zeros - 1 if v1 else zeros)),     # [groups, out / 8]
                "scales": ("F16", scales),
                "g_idx": ("I32", g_idx)}
    return {"qweight": ("I32", pack_nibbles(np.ascontiguousarray(q.T), AWQ_ORDER)),  # [in, out / 8]
            "qzeros": ("I32", pack_nibbles(zeros, AWQ_ORDER)),                     # [groups, out / 8]
            "scales": ("F16", scales)}


# ---- models ------------------------------------------------------------------

def linear_shapes(c=CFG):
    q, kv = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    return {"self_attn.q_proj": (q, c["dim"]), "self_attn.k_proj": (kv, c["dim"]),
            "self_attn.v_proj": (kv, c["dim"]), "self_attn.o_proj": (c["dim"], q),
            "mlp.gate_proj": (c["ffn"], c["dim"]), "mlp.up_proj": (c["ffn"], c["dim"]),
            "mlp.down_proj": (c["dim"], c["ffn"])}


def base_config(extra, c=CFG):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c["dim"],
            "intermediate_size": c["ffn"], "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
            "num_key_value_heads": c["kv_heads"], "head_dim": c["head_dim"], "vocab_size": c["vocab"],
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
            "tie_word_embeddings": False, "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2, **extra}


def shared_tensors(rng, c=CFG):
    t = {"model.embed_tokens.weight": ("BF16", bf16_bits(rng.normal(0, 1.0, (c["vocab"], c["dim"])))),
         "model.norm.weight": ("BF16", bf16_bits(1 + 0.1 * rng.normal(size=c["dim"])))}
    for i in range(c["layers"]):
        for n in ("input_layernorm", "post_attention_layernorm"):
            t[f"model.layers.{i}.{n}.weight"] = ("BF16", bf16_bits(1 + 0.1 * rng.normal(size=c["dim"])))
    return t


def make_variant(out, name, spec, tokenizer_json, seed):
    method, gs, sym, act, fmt, sidecar, lm_head_q = spec
    rng = np.random.default_rng(seed)
    v1 = fmt == "gptq"
    qt, twin = shared_tensors(rng), shared_tensors(np.random.default_rng(seed))
    layers = [(f"model.layers.{i}.{lin}", shape) for i in range(CFG["layers"]) for lin, shape in linear_shapes().items()]
    layers.append(("lm_head", (CFG["vocab"], CFG["dim"])))  # untied; quantized only where lm_head_q
    orders = {}
    for base, (n_out, n_in) in layers:
        w = rng.normal(0, 1.5 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32)
        if base == "lm_head" and not lm_head_q:
            qt[base + ".weight"] = twin[base + ".weight"] = ("BF16", bf16_bits(w))
            continue
        # Act-order: layers that read the same input (q/k/v, gate/up) share one order, as they share a Hessian.
        key = base.rsplit(".", 1)[0] + ("qkv" if base.endswith(("q_proj", "k_proj", "v_proj")) else
                                        "gu" if base.endswith(("gate_proj", "up_proj")) else base)
        if key not in orders:
            orders[key] = np.argsort(-rng.random(n_in)) if act else np.arange(n_in)
        q, zeros, scales, g_idx = quantize(w, gs, sym, orders[key])
        packed = pack_layer(method, q, zeros, scales, g_idx, v1)
        for sfx, v in packed.items():
            qt[f"{base}.{sfx}"] = v
        ref = dequantize(method, gs, v1, *(packed[k][1] for k in ("qweight", "qzeros", "scales")),
                         packed["g_idx"][1] if "g_idx" in packed else None)
        expect = (scales.astype(np.float32)[g_idx] * (q.T - zeros[g_idx]).astype(np.float32)).T
        assert np.array_equal(ref, expect), f"{name} {base}: packing does not round-trip"
        twin[f"{base}.weight"] = ("F32", ref)
    qc = {"quant_method": method, "bits": 4, "group_size": gs}
    if method == "gptq":
        qc.update(desc_act=act, sym=sym, checkpoint_format=fmt)
    else:
        qc.update(zero_point=True, version="gemm")
    for folder, tensors, extra in ((out / name, qt, {} if sidecar else {"quantization_config": qc}),
                                   (out / f"{name}-twin", twin, {})):
        folder.mkdir(parents=True, exist_ok=True)
        write_safetensors(folder / "model.safetensors", tensors)
        (folder / "config.json").write_text(json.dumps(base_config(extra), indent=1))
        if tokenizer_json is not None:
            (folder / "tokenizer.json").write_text(tokenizer_json)
    if sidecar:
        (out / name / "quantize_config.json").write_text(json.dumps(qc, indent=1))


def smollm_tokenizer_json(gguf_path, tmp):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tokenizer"))
    from gen_tok_golden import hf_tokenizer, read_gguf  # noqa: E402
    kv = read_gguf(gguf_path)
    tokens, types = kv["tokenizer.ggml.tokens"][1], kv["tokenizer.ggml.token_type"][1]
    hf_tokenizer(tokens, types, kv["tokenizer.ggml.merges"][1], "smollm").save(str(tmp))
    return tmp.read_text()


def main():
    gguf_path, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    tok = None if gguf_path == "-" else smollm_tokenizer_json(gguf_path, out / "gptq-tokenizer.json")
    for i, (name, spec) in enumerate(VARIANTS.items()):
        make_variant(out, name, spec, tok, 100 + i)
        print(f"wrote {out / name} and its twin")


if __name__ == "__main__":
    main()
