#!/usr/bin/env python3
"""Writes small random LLaMA models with FP8 E4M3 weights, each with its
dequantized twin, for tests/model/test_fp8_ckpt.py:

  fp8-<variant>/       config.json with quantization_config, model.safetensors
                       with X.weight (F8_E4M3) and its scales for every linear
                       layer of the decoder, SmolLM2's tokenizer.json
  fp8-<variant>-twin/  the same model with those layers as BF16 X.weight,
                       decoded from the FP8 file by dequantize() below

Variants, as the tools that make such files write them:
  tensor   quant_method "fp8", activation_scheme "static" (vLLM's and
           AutoFP8's per-tensor files): X.weight_scale and X.input_scale,
           F32 scalars of shape []
  channel  quant_method "compressed-tensors", format "float-quantized",
           strategy "channel" (llm-compressor's FP8-dynamic): X.weight_scale
           BF16 [out, 1]; lm_head in the ignore list, left BF16
  block    quant_method "fp8" with weight_block_size (transformers'
           FineGrainedFP8, DeepSeek-V3 and Qwen3 FP8 files):
           X.weight_scale_inv F32 [ceil(out / 48), ceil(in / 80)], blocks
           that do not divide the layers, so edge blocks are partial;
           lm_head quantized too
  block128 the same with those files' own blocks, 128 x 128, and a
           head_dim of 128, so that every layer is whole blocks

E4M3 and BF16 conversions are ml_dtypes' (float8_e4m3fn, bfloat16: round to
nearest even), not ferrum's, or PyTorch's where ml_dtypes is missing (the
GPU machine, tests/parity/gpu_fp8_ckpt.py): dequantize() multiplies the
E4M3 value by its scale in float32 and rounds the product to BF16. It is
the reference that test_fp8_ckpt.py holds ferrum's decoded weights to, bit
for bit.

With --convert, a BF16 folder SRC (tests/golden/make_tiny_models.py's
tiny-qwen3moe-hf: the experts too) becomes OUT_DIR/NAME in layout VARIANT,
with its twin.

usage: make_fp8.py SMOLLM2_GGUF OUT_DIR   (SMOLLM2_GGUF "-": no tokenizer.json)
       make_fp8.py --convert SRC OUT_DIR NAME VARIANT
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_gptq  # noqa: E402

E4M3_MAX = 448.0
BLOCKS = {"block": (48, 80), "block128": (128, 128)}  # (rows, columns) of a scale's block
VARIANTS = ("tensor", "channel", "block", "block128")

try:
    import ml_dtypes

    def e4m3_to_f32(q):
        return np.asarray(q, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)

    def f32_to_e4m3(x):
        return np.asarray(x, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)

    def bf16_to_f32(bits):
        return np.asarray(bits, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)

    def f32_to_bf16_bits(a):
        return np.asarray(a, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
except ImportError:  # PyTorch's conversions, also round to nearest even
    import torch

    def e4m3_to_f32(q):
        return torch.from_numpy(np.ascontiguousarray(q, dtype=np.uint8)).view(torch.float8_e4m3fn).float().numpy()

    def f32_to_e4m3(x):
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
        return t.to(torch.float8_e4m3fn).view(torch.uint8).numpy()

    def bf16_to_f32(bits):
        t = torch.from_numpy(np.ascontiguousarray(bits, dtype=np.uint16).view(np.int16))
        return t.view(torch.bfloat16).float().numpy()

    def f32_to_bf16_bits(a):
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def expand_scales(scales, shape, block=None):
    """A float32 scale for every element of a weight of this shape."""
    s = np.asarray(scales, dtype=np.float32)
    if s.size == 1:
        return np.full(shape, s.reshape(()), dtype=np.float32)
    if block is None:  # one a row: [out] or [out, 1]
        return np.repeat(s.reshape(-1, 1), shape[1], axis=1)
    br, bc = block
    return np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:shape[0], :shape[1]]


def dequantize(qbytes, scales, block=None):
    """The BF16 bits of a layer: bf16(float32(e4m3) * float32(scale)), ml_dtypes' conversions."""
    q = e4m3_to_f32(qbytes)
    return f32_to_bf16_bits(q * expand_scales(scales, q.shape, block))


def quantize(w, variant):
    """w float32 [out, in] -> (E4M3 bytes, the scale tensor (dtype name, array), scale name)."""
    out, inn = w.shape
    if variant == "tensor":
        s = np.float32(np.abs(w).max() / E4M3_MAX)
        scale = ("F32", np.array(s, dtype=np.float32).reshape(()))
        name = "weight_scale"
    elif variant == "channel":  # BF16 scales, as llm-compressor stores them in the model's dtype
        bits = f32_to_bf16_bits(np.abs(w).max(axis=1, keepdims=True) / E4M3_MAX)
        scale = ("BF16", bits)
        name = "weight_scale"
    else:
        br, bc = BLOCKS[variant]
        nb = (-(-out // br), -(-inn // bc))
        s = np.zeros(nb, dtype=np.float32)
        for i in range(nb[0]):
            for j in range(nb[1]):
                s[i, j] = np.abs(w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]).max() / E4M3_MAX
        scale = ("F32", s)
        name = "weight_scale_inv"
    s32 = bf16_to_f32(scale[1]) if scale[0] == "BF16" else scale[1]
    full = expand_scales(s32, w.shape, BLOCKS.get(variant))
    q = f32_to_e4m3(np.clip(w / full, -E4M3_MAX, E4M3_MAX))
    return q, scale, name


def quant_config(variant):
    if variant == "tensor":
        return {"quant_method": "fp8", "activation_scheme": "static"}
    if variant in BLOCKS:
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                "weight_block_size": list(BLOCKS[variant])}
    fp8 = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None, "block_structure": None,
           "actorder": None, "observer": "minmax", "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "ignore": ["lm_head"], "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "output_activations": None,
                                          "weights": {**fp8, "strategy": "channel", "dynamic": False},
                                          "input_activations": {**fp8, "strategy": "token", "dynamic": True,
                                                                "observer": None}}}}


def scale_of(tensors, base, variant):
    """(scale array, block or None) of FP8 layer base in the tensors of a folder of variant (read back by
    make_gptq)."""
    if base + ".weight_scale_inv" in tensors:
        return tensors[base + ".weight_scale_inv"], BLOCKS[variant]
    s = tensors[base + ".weight_scale"]
    return (bf16_to_f32(s) if s.dtype == np.uint16 else s), None


def add_layer(qt, twin, base, w, variant):
    """Layer base (its float32 weight w) quantized: its E4M3 bytes and scales into qt, their decoding into twin."""
    q, scale, sname = quantize(w, variant)
    qt[base + ".weight"] = ("F8_E4M3", q)
    qt[f"{base}.{sname}"] = scale
    if variant == "tensor":  # a static activation scale, which ferrum does not read
        qt[base + ".input_scale"] = ("F32", np.array(0.05, dtype=np.float32).reshape(()))
    s32 = bf16_to_f32(scale[1]) if scale[0] == "BF16" else scale[1]
    ref = dequantize(q, s32, BLOCKS.get(variant))
    err = np.abs(bf16_to_f32(ref) - w).max() / np.abs(w).max()
    assert err < 0.07, f"{base}: the FP8 layer is {err:.3g} off the weight it quantized"
    twin[base + ".weight"] = ("BF16", ref)


def write_pair(out, name, qt, twin, config, variant, tokenizer_json):
    """Folders out/name (config + quantization_config) and out/name-twin."""
    for folder, tensors, extra in ((out / name, qt, {"quantization_config": quant_config(variant)}),
                                   (out / f"{name}-twin", twin, {})):
        folder.mkdir(parents=True, exist_ok=True)
        make_gptq.write_safetensors(folder / "model.safetensors", tensors)
        (folder / "config.json").write_text(json.dumps({**config, **extra}, indent=1))
        if tokenizer_json is not None:
            (folder / "tokenizer.json").write_text(tokenizer_json)


def make_variant(out, variant, tokenizer_json, seed):
    rng = np.random.default_rng(seed)
    cfg = {**make_gptq.CFG, "head_dim": 128} if variant == "block128" else make_gptq.CFG
    qt, twin = make_gptq.shared_tensors(rng, cfg), make_gptq.shared_tensors(np.random.default_rng(seed), cfg)
    layers = [(f"model.layers.{i}.{lin}", shape) for i in range(cfg["layers"])
              for lin, shape in make_gptq.linear_shapes(cfg).items()]
    layers.append(("lm_head", (cfg["vocab"], cfg["dim"])))
    for base, (n_out, n_in) in layers:
        w = rng.normal(0, 1.5 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32)
        if base == "lm_head" and variant not in BLOCKS:
            qt[base + ".weight"] = twin[base + ".weight"] = ("BF16", make_gptq.bf16_bits(w))
        else:
            add_layer(qt, twin, base, w, variant)
    write_pair(out, f"fp8-{variant}", qt, twin, make_gptq.base_config({}, cfg), variant, tokenizer_json)


LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def convert(src, out, name, variant):
    """A BF16 Hugging Face folder src as FP8 folder out/name and its twin: every linear layer of the decoder
    (attention, MLP, each expert) quantized; embeddings, norms, routers (mlp.gate) and lm_head kept, as
    llm-compressor's and Qwen's FP8 files keep them."""
    raw = (src / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
    qt, twin = {}, {}
    for tname, a in make_gptq.read_safetensors(src / "model.safetensors").items():
        dtype, base = header[tname]["dtype"], tname[:-len(".weight")]
        if tname.endswith(".weight") and a.ndim == 2 and base.rsplit(".", 1)[-1] in LINEAR:
            add_layer(qt, twin, base, bf16_to_f32(a) if dtype == "BF16" else a.astype(np.float32), variant)
        else:
            qt[tname] = twin[tname] = (dtype, a)
    tok = src / "tokenizer.json"
    write_pair(out, name, qt, twin, json.loads((src / "config.json").read_text()), variant,
               tok.read_text() if tok.exists() else None)


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--convert":
        src, out, name, variant = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5]
        convert(src, out, name, variant)
        print(f"wrote {out / name} and its twin")
        return
    gguf_path, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    tok = None if gguf_path == "-" else make_gptq.smollm_tokenizer_json(gguf_path, out / "fp8-tokenizer.json")
    for i, variant in enumerate(VARIANTS):
        make_variant(out, variant, tok, 200 + i)
        print(f"wrote {out / f'fp8-{variant}'} and its twin")


if __name__ == "__main__":
    main()
