#!/usr/bin/env python3
"""GPTQ and AWQ int4 checkpoints on the CPU (docs/QUANTIZED.md).

tests/golden/make_gptq.py writes six small random LLaMA models (GPTQ with
act-order on and off, symmetric and asymmetric zeros, groups 32/64/128/-1,
v1 and v2 zeros, the config in config.json or quantize_config.json; AWQ
with groups 128 and 32) and their dequantized F32 twins. Then:

1. every quantized layer as ferrum decodes it (dump_weight: the source's
   repacked I4G rows through the reference dequantizer, act-order undone)
   equals make_gptq.dequantize() of the file, bit for bit;
2. each model generates the same 32 greedy tokens as its twin for 4
   prompts on the CPU (run_model), and the last prompt token's logits agree
   within 1e-3 of their largest (activations are not quantized on this path:
   only the order of float sums differs, seen through the f16 KV cache's
   rounding, about 1e-4; a wrong zero or scale moves them by 1e-1);
3. broken files (a g_idx past the groups, misshaped qzeros or scales,
   bits 8, group size 16, F32 qweight, no quantization config) are refused
   with a message naming the problem, never a crash;
4. a rank's part of an act-order row-parallel layer (o_proj, down_proj
   split by inputs; dump_weight --cols, model_quant_cols) holds exactly
   the reference's columns of that range, bit for bit, each once, its
   padding marked -1 in its permutation, and no more padding than whole
   blocks per group need;
5. tensor parallelism on the CPU (`ferrumctl serve --tensor-parallel-size
   2`): a GPTQ model without act-order and an AWQ one generate what they
   generate at size 1; the act-order models generate size 1's tokens with
   logprobs within TP_LOGPROB_TOL (activations are f32 on this path: only
   the all-reduce's order of additions differs).

usage: test_gptq.py DUMP_WEIGHT RUN_MODEL FERRUMCTL SMOLLM2_GGUF WORK_DIR
"""
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "golden"))
import make_gptq  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "common"))
from local_serve import LocalServer  # noqa: E402

PROMPTS = [[1, 50, 600, 7000, 123], [9, 8, 7], [31337, 2, 444, 12, 48000, 5, 77, 1000], [4242]]
N_GREEDY = 32
ACT_ORDER = ("gptq-g32-asym-act", "gptq-g64-sym-act-v2")
TP_LOGPROB_TOL = 1e-3
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def gguf_name(base):
    """The GGUF name of the weight of HF linear layer base (model.layers.N.self_attn.q_proj, lm_head)."""
    if base == "lm_head":
        return "output.weight"
    parts = base.split(".")
    return f"blk.{parts[2]}.{GGUF_NAMES['.'.join(parts[3:])]}.weight"


def quantized_layers(st):
    """(HF base, GGUF name) of every quantized layer in a folder's tensors."""
    bases = [name[:-len(".qweight")] for name in sorted(st) if name.endswith(".qweight")]
    return [(base, gguf_name(base)) for base in bases]


def dump_layers(dump, folder, layers, type_name, tmp):
    """Layers [(HF base, GGUF name)] of folder as ferrum's source decodes them (dump_weight): flat float32
    arrays, each of a tensor of type type_name."""
    args = [dump, str(folder)]
    for i, (_, gguf) in enumerate(layers):
        args += [gguf, str(tmp / f"w{i}.f32")]
    r = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{folder.name}: dump_weight failed: {r.stderr}"
    assert r.stdout.count(f" {type_name} ") == len(layers), r.stdout
    return [np.fromfile(tmp / f"w{i}.f32", dtype=np.float32) for i in range(len(layers))]


def check_dequant(dump, folder, tmp):
    st = make_gptq.read_safetensors(folder / "model.safetensors")
    layers = quantized_layers(st)
    assert len(layers) >= 14, f"{folder.name}: only {len(layers)} quantized layers"
    decoded = dump_layers(dump, folder, layers, "I4G", tmp)
    for (base, gguf), got in zip(layers, decoded):
        ref = make_gptq.dequantize_layer(folder, st, base)
        got = got.reshape(ref.shape)
        bad = np.count_nonzero(got.view(np.uint32) != ref.view(np.uint32))
        assert bad == 0, f"{folder.name} {gguf}: {bad} of {ref.size} values differ from the reference decoder"
    return len(layers)


def run_model(run, folder, ids, logits):
    r = subprocess.run([run, "--model", str(folder), "--ids", ",".join(map(str, ids)), "--greedy", str(N_GREEDY),
                        "--logits-out", str(logits)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"run_model {folder.name}: {r.stderr[-2000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])["greedy"]


def check_greedy(run, folder, twin, tmp):
    worst = 0.0
    for p in PROMPTS:
        a = run_model(run, folder, p, tmp / "a.f32")
        b = run_model(run, twin, p, tmp / "b.f32")
        assert len(a) == N_GREEDY and a == b, f"{folder.name} prompt {p}: {a} != twin's {b}"
        la, lb = np.fromfile(tmp / "a.f32", dtype=np.float32), np.fromfile(tmp / "b.f32", dtype=np.float32)
        err = float(np.abs(la - lb).max() / np.abs(lb).max())
        assert err < 1e-3, f"{folder.name} prompt {p}: logits differ from the twin's by {err:.3g} (relative)"
        worst = max(worst, err)
    return worst


# ---- broken files ---------------------------------------------------------------

def copy_with(src, dst, edit_tensors=None, edit_qc=None):
    """A copy of folder src at dst with its tensors and/or quantization config changed."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    if edit_tensors:
        st = make_gptq.read_safetensors(src / "model.safetensors")
        header = json.loads((src / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
            (src / "model.safetensors").read_bytes()[:8], "little")])
        tensors = {n: (header[n]["dtype"], a) for n, a in st.items()}
        edit_tensors(tensors)
        make_gptq.write_safetensors(dst / "model.safetensors", tensors)
    if edit_qc:
        cfg = json.loads((dst / "config.json").read_text())
        edit_qc(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))


def expect_refused(run, good, bad, edit_tensors, edit_qc, want):
    """A copy of folder good at bad, edited (copy_with), must fail to load with an error saying want."""
    copy_with(good, bad, edit_tensors, edit_qc)
    r = subprocess.run([run, "--model", str(bad), "--ids", "1,2,3", "--greedy", "2"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode > 0, f"{bad.name}: exit {r.returncode} (a crash is < 0, success 0): {r.stderr}"
    assert want in r.stderr, f"{bad.name}: the error does not say {want!r}: {r.stderr[-600:]}"
    shutil.rmtree(bad)


def check_broken(run, good, tmp):
    L = "model.layers.1.mlp.down_proj"

    def g_idx_past(t):
        g = t[L + ".g_idx"][1].copy()
        g[17] = 1000
        t[L + ".g_idx"] = ("I32", g)

    def qzeros_shape(t):
        t[L + ".qzeros"] = ("I32", t[L + ".qzeros"][1][:-1].copy())

    def scales_shape(t):
        t[L + ".scales"] = ("F16", np.ascontiguousarray(t[L + ".scales"][1][:, :-8]))

    def f32_qweight(t):
        t[L + ".qweight"] = ("F32", t[L + ".qweight"][1].view(np.float32))

    def no_config(c):
        del c["quantization_config"]

    cases = [
        ("g_idx", g_idx_past, None, "g_idx[17] = 1000"),
        ("qzeros", qzeros_shape, None, "qzeros has shape"),
        ("scales", scales_shape, None, "scales has shape"),
        ("dtype", f32_qweight, None, "has dtype F32, expected I32"),
        ("bits", None, lambda c: c["quantization_config"].update(bits=8), "8 bits"),
        ("group", None, lambda c: c["quantization_config"].update(group_size=16), "group_size 16"),
        ("method", None, lambda c: c["quantization_config"].update(quant_method="bitsandbytes"),
         "bitsandbytes is not supported"),
        ("noconfig", None, no_config, "no quantization config"),
    ]
    for name, et, eq, want in cases:
        expect_refused(run, good, tmp / f"broken-{name}", et, eq, want)
    return len(cases)


# ---- tensor parallelism -----------------------------------------------------------

def padded_width(groups):
    """Columns of a part whose inputs have these groups: each group's run padded to whole blocks of 32."""
    return sum(-(-n // 32) * 32 for n in np.unique(groups, return_counts=True)[1])


def check_part(dump, folder, st, base, gguf, c0, nc, tmp):
    """The part of act-order layer base for inputs [c0, c0 + nc) as a TP rank loads it, against the reference
    decoder; returns its padding columns."""
    ref = make_gptq.dequantize_layer(folder, st, base)
    out = tmp / "part.f32"
    r = subprocess.run([dump, "--cols", str(c0), str(nc), str(folder), gguf, str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"{folder.name} {gguf}: dump_weight --cols failed: {r.stderr}"
    perm = np.fromfile(str(out) + ".perm", dtype=np.int32)
    got = np.fromfile(out, dtype=np.float32).reshape(ref.shape[0], -1)
    where = f"{folder.name} {gguf} inputs [{c0}, {c0 + nc})"
    assert got.shape[1] == len(perm) and len(perm) % 32 == 0, f"{where}: {got.shape[1]} columns, {len(perm)} perm"
    real = perm >= 0
    assert np.all(perm[~real] == -1), f"{where}: perm entries below -1"
    assert np.array_equal(np.sort(perm[real]), np.arange(nc)), f"{where}: the part does not take each input once"
    want = np.ascontiguousarray(ref[:, c0:c0 + nc][:, perm[real]])
    bad = np.count_nonzero(np.ascontiguousarray(got[:, real]).view(np.uint32) != want.view(np.uint32))
    assert bad == 0, f"{where}: {bad} of {want.size} values differ from the reference decoder"
    expect = padded_width(st[base + ".g_idx"][c0:c0 + nc])
    assert len(perm) == expect, f"{where}: {len(perm)} columns, whole blocks per group need {expect}"
    return len(perm) - nc


def check_tp_parts(dump, folder):
    """check_part for both halves of every o_proj and down_proj (TP=2's cut: heads and the FFN in two)."""
    st = make_gptq.read_safetensors(folder / "model.safetensors")
    cfg = make_gptq.CFG
    padding = parts = 0
    with tempfile.TemporaryDirectory() as t:
        for il in range(cfg["layers"]):
            for base, gguf, width in ((f"model.layers.{il}.self_attn.o_proj", f"blk.{il}.attn_output.weight",
                                       cfg["heads"] * cfg["head_dim"]),
                                      (f"model.layers.{il}.mlp.down_proj", f"blk.{il}.ffn_down.weight", cfg["ffn"])):
                for rank in range(2):
                    padding += check_part(dump, folder, st, base, gguf, rank * width // 2, width // 2, Path(t))
                    parts += 1
    assert padding > 0, f"{folder.name}: no part needed padding, so none was tested"
    return parts, padding


def served(ferrumctl, model, tp):
    """Greedy completions of two prompts: (text, tokens, token logprobs) each."""
    s = LocalServer(ferrumctl, ["--model", str(model), "--tensor-parallel-size", str(tp), "--threads", "1",
                                "--max-num-seqs", "4"], prefix="ferrum-gptq-")
    try:
        out = []
        for prompt in ("Hello world, this is", "The quick brown fox"):
            st, data = s.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0,
                                                             "ignore_eos": True, "logprobs": 1})
            assert st == 200, (st, data)
            c = json.loads(data)["choices"][0]
            out.append((c["text"], c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"]))
        return out
    finally:
        s.stop()


def check_tp(ferrumctl, work):
    for name in ("gptq-g128-sym", "awq-g32"):
        one, two = served(ferrumctl, work / name, 1), served(ferrumctl, work / name, 2)
        assert [o[0] for o in one] == [t[0] for t in two], f"{name}: tensor parallel 2 generated {two}, size 1 {one}"
    worst = 0.0
    for name in ACT_ORDER:
        one, two = served(ferrumctl, work / name, 1), served(ferrumctl, work / name, 2)
        for (text1, tok1, lp1), (text2, tok2, lp2) in zip(one, two):
            assert tok1 == tok2 and len(tok1) == 16, f"{name}: tensor parallel 2 generated {text2!r}, size 1 {text1!r}"
            err = max(abs(a - b) for a, b in zip(lp1, lp2))
            assert err <= TP_LOGPROB_TOL, f"{name}: tensor parallel 2's logprobs differ from size 1's by {err:.3g}"
            worst = max(worst, err)
    return worst


def main():
    dump, run, ferrumctl, gguf, work = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], Path(sys.argv[5])
    subprocess.run([sys.executable, str(Path(make_gptq.__file__)), gguf, str(work)], check=True, timeout=600)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for name in make_gptq.VARIANTS:
            n = check_dequant(dump, work / name, tmp)
            err = check_greedy(run, work / name, work / f"{name}-twin", tmp)
            print(f"{name}: {n} layers decoded bit-exact; {len(PROMPTS)} x {N_GREEDY} greedy tokens equal the "
                  f"twin's; logits within {err:.2g} (relative)")
        n = check_broken(run, work / "gptq-g32-asym-act", tmp)
        print(f"{n} broken files refused with clear errors")
    for name in ACT_ORDER:
        parts, padding = check_tp_parts(dump, work / name)
        print(f"{name}: {parts} TP=2 parts of o_proj/down_proj decoded bit-exact, {padding} padding columns")
    worst = check_tp(ferrumctl, work)
    print(f"tensor parallel 2 = 1 for GPTQ and AWQ; act-order: the same tokens, logprobs within {worst:.2g}")
    print("PASS")


if __name__ == "__main__":
    main()
