#!/usr/bin/env python3
"""FP8 E4M3 checkpoints on the CPU (docs/QUANTIZED.md, "FP8 checkpoints").

tests/golden/make_fp8.py writes four small random LLaMA models in the
layouts that vLLM, llm-compressor and transformers write (per tensor with
static input scales, compressed-tensors per channel with BF16 scales, and
blocks of 48 x 80 and of 128 x 128 with weight_scale_inv, the lm_head too)
and their BF16 twins, decoded with ml_dtypes' E4M3 and BF16 conversions.
Then:

1. every FP8 layer as ferrum decodes it (dump_weight) equals the twin's
   BF16 weight bit for bit;
2. each model generates the same 32 greedy tokens as its twin for 4
   prompts on the CPU (run_model), with the same last-token logits bit for
   bit: the decoded weights are the twin's, so the CPU runs the same sums;
3. `ferrumctl inspect` names the quantization;
4. broken files (a missing scale, a misshaped one, a NaN scale, a NaN
   weight byte, E5M2 weights, no quantization config, compressed-tensors
   int4 weights, a group strategy) are refused with a message naming the
   problem, never a crash;
5. served through `ferrumctl serve` with tensor parallelism 2 on the CPU,
   the block-scaled model answers as it does at size 1;
6. Qwen3-MoE as Qwen's FP8 files hold it: tests/golden's tiny-qwen3moe-hf
   (8 experts, top 2) converted to block scales (attention and every
   expert FP8, the routers and lm_head BF16) generates its twin's greedy
   tokens, with the same logits bit for bit.

usage: test_fp8_ckpt.py DUMP_WEIGHT RUN_MODEL FERRUMCTL SMOLLM2_GGUF GOLDEN_DIR WORK_DIR
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "golden"))
import make_fp8  # noqa: E402
import make_gptq  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gptq import N_GREEDY, PROMPTS, dump_layers, expect_refused, gguf_name, run_model, served  # noqa: E402


def fp8_layers(st):
    """(HF base, GGUF name) of every F8_E4M3 weight in a folder's tensors."""
    bases = [name[:-len(".weight")] for name in sorted(st) if name.endswith(".weight") and st[name].dtype == np.uint8]
    return [(base, gguf_name(base)) for base in bases]


def check_dequant(dump, folder, twin, variant, tmp):
    st = make_gptq.read_safetensors(folder / "model.safetensors")
    ref = make_gptq.read_safetensors(twin / "model.safetensors")
    layers = fp8_layers(st)
    assert len(layers) >= 14, f"{folder.name}: only {len(layers)} FP8 layers"
    decoded = dump_layers(dump, folder, layers, "BF16", tmp)
    for (base, gguf), got in zip(layers, decoded):
        want = make_fp8.bf16_to_f32(ref[base + ".weight"])
        got = got.reshape(want.shape)
        bad = np.count_nonzero(got.view(np.uint32) != want.view(np.uint32))
        assert bad == 0, f"{folder.name} {gguf}: {bad} of {want.size} values differ from the reference decoder"
        scale, block = make_fp8.scale_of(st, base, variant)
        again = make_fp8.dequantize(st[base + ".weight"], scale, block)
        assert np.array_equal(again, ref[base + ".weight"]), f"{folder.name} {base}: the twin is not the file decoded"
    return len(layers)


def check_greedy(run, folder, twin, tmp):
    for p in PROMPTS:
        a = run_model(run, folder, p, tmp / "a.f32")
        b = run_model(run, twin, p, tmp / "b.f32")
        assert len(a) == N_GREEDY and a == b, f"{folder.name} prompt {p}: {a} != twin's {b}"
        la, lb = np.fromfile(tmp / "a.f32", dtype=np.float32), np.fromfile(tmp / "b.f32", dtype=np.float32)
        assert la.size == lb.size > 1000 and np.array_equal(la, lb), \
            f"{folder.name} prompt {p}: logits differ from the twin's by {np.abs(la - lb).max():.3g}"


def check_inspect(ferrumctl, folder, want):
    r = subprocess.run([ferrumctl, "inspect", str(folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"inspect {folder.name}: {r.stderr}"
    assert want in r.stdout, f"inspect {folder.name} does not say {want!r}: {r.stdout}"


# ---- broken files ---------------------------------------------------------------

def check_broken(run, work, tmp):
    L = "model.layers.1.mlp.down_proj"

    def no_scale(t):
        del t[L + ".weight_scale_inv"]

    def scale_shape(t):
        t[L + ".weight_scale_inv"] = ("F32", np.ascontiguousarray(t[L + ".weight_scale_inv"][1][:, :-1]))

    def nan_scale(t):
        s = t[L + ".weight_scale_inv"][1].copy()
        s[1, 2] = np.nan
        t[L + ".weight_scale_inv"] = ("F32", s)

    def nan_byte(t):
        q = t[L + ".weight"][1].copy()
        q[3, 5] = 0x7F
        t[L + ".weight"] = ("F8_E4M3", q)

    def e5m2(t):
        t[L + ".weight"] = ("F8_E5M2", t[L + ".weight"][1])

    def no_config(c):
        del c["quantization_config"]

    def ct_int4(c):
        c["quantization_config"]["config_groups"]["group_0"]["weights"].update(num_bits=4, type="int")

    def ct_group(c):
        c["quantization_config"]["config_groups"]["group_0"]["weights"].update(strategy="group", group_size=128)

    block, channel = work / "fp8-block", work / "fp8-channel"
    cases = [
        ("noscale", block, no_scale, None, "weight_scale (or weight_scale_inv) is missing"),
        ("scaleshape", block, scale_shape, None, "weight_scale_inv has shape [3, 3]"),
        ("nanscale", block, nan_scale, None, "a scale must be finite"),
        ("nanbyte", block, nan_byte, None, "down_proj.weight[3, 5] is NaN"),
        ("e5m2", block, e5m2, None, "has dtype F8_E5M2"),
        ("noconfig", block, None, no_config, "no FP8 quantization config"),
        ("int4", channel, None, ct_int4, "4-bit int (8-bit float, FP8, is supported"),
        ("group", channel, None, ct_group, "strategy group"),
    ]
    for name, good, et, eq, want in cases:
        expect_refused(run, good, tmp / f"broken-{name}", et, eq, want)
    return len(cases)


# ---- served, tensor parallelism ------------------------------------------------------

def check_tp(ferrumctl, folder):
    one, two = served(ferrumctl, folder, 1), served(ferrumctl, folder, 2)
    worst = 0.0
    for (text1, _, lp1), (text2, _, lp2) in zip(one, two):
        assert text1 == text2 and len(lp1) == 16, f"{folder.name}: tensor parallel 2 said {text2!r}, size 1 {text1!r}"
        worst = max(worst, max(abs(a - b) for a, b in zip(lp1, lp2)))
    assert worst <= 1e-3, f"{folder.name}: tensor parallel 2's logprobs differ from size 1's by {worst:.3g}"
    return worst


def check_moe(run, golden, work, tmp):
    src = golden / "tiny-qwen3moe-hf"
    assert (src / "model.safetensors").exists(), f"{src} is missing (the golden_models fixture makes it)"
    subprocess.run([sys.executable, str(Path(make_fp8.__file__)), "--convert", str(src), str(work), "fp8-qwen3moe",
                    "block"], check=True, timeout=600)
    st = make_gptq.read_safetensors(work / "fp8-qwen3moe" / "model.safetensors")
    experts = sum(1 for n, a in st.items() if ".experts." in n and n.endswith(".weight") and a.dtype == np.uint8)
    assert experts == 3 * 8 * 3, f"fp8-qwen3moe: {experts} FP8 expert weights"
    check_greedy(run, work / "fp8-qwen3moe", work / "fp8-qwen3moe-twin", tmp)
    return experts


def main():
    dump, run, ferrumctl, gguf = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    golden, work = Path(sys.argv[5]), Path(sys.argv[6])
    subprocess.run([sys.executable, str(Path(make_fp8.__file__)), gguf, str(work)], check=True, timeout=600)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        for variant in make_fp8.VARIANTS:
            folder, twin = work / f"fp8-{variant}", work / f"fp8-{variant}-twin"
            n = check_dequant(dump, folder, twin, variant, tmp)
            check_greedy(run, folder, twin, tmp)
            print(f"fp8-{variant}: {n} layers decoded bit-exact; {len(PROMPTS)} x {N_GREEDY} greedy tokens and the "
                  "logits equal the twin's")
        check_inspect(ferrumctl, work / "fp8-block", "quantization: fp8, E4M3 weights with a scale a 48 x 80 block")
        check_inspect(ferrumctl, work / "fp8-channel", "quantization: fp8, E4M3 weights with a scale a tensor or a row")
        n = check_broken(run, work, tmp)
        print(f"{n} broken files refused with clear errors")
        n = check_moe(run, golden, work, tmp)
        print(f"fp8-qwen3moe: {n} FP8 experts; {len(PROMPTS)} x {N_GREEDY} greedy tokens and the logits equal the "
              "twin's")
    worst = check_tp(ferrumctl, work / "fp8-block")
    print(f"fp8-block served at tensor parallel 2 = 1: the same text, logprobs within {worst:.2g}")
    print("PASS")


if __name__ == "__main__":
    main()
