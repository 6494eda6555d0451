#!/usr/bin/env bash
# The engine end to end on a GPU (device machine, repo root, after
# `source .device/env.sh`): ferrumctl serve --device cuda answers the openai
# client (tests/parity/gpu_openai.py) on a small random llama with the SmolLM2
# tokenizer, then `ferrumctl bench` at concurrency 1, 16, 64 against
# Llama-3-8B shapes with --load-format dummy.
# MODELS_DIR/llama3-8b-dummy comes from tests/parity/make_dummy_folder.py.
# usage: gpu_engine.sh BIN_DIR MODELS_DIR OUT_DIR
set -u
bin=$1 models=$2 out=$3
mkdir -p "$out"
status=0
source "$(dirname "${BASH_SOURCE[0]}")/wait_health.sh"

python3 - "$out/tiny-chat" "$models/llama3-8b-dummy" <<'PY'
import shutil, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
out, tok = sys.argv[1], sys.argv[2]
cfg = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                  tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
m = LlamaForCausalLM(cfg)
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for n, p in m.named_parameters():
        p.copy_(torch.randn(p.shape, generator=g) * (1.0 if p.ndim == 1 or "embed" in n else p.shape[1] ** -0.5)
                + (1.0 if p.ndim == 1 else 0.0))
m.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(f"{tok}/{f}", f"{out}/{f}")
PY

echo "=== openai client against serve --device cuda"
"$bin/ferrumctl" serve --model "$out/tiny-chat" --device cuda --port 18600 --num-kv-blocks 4096 \
  --max-num-seqs 64 --served-model-name tiny-chat >"$out/serve-tiny.log" 2>&1 &
pid=$!
if ! wait_health 18600; then
  echo "server did not come up"; tail -20 "$out/serve-tiny.log"; status=1
elif ! python3 -c "import openai" 2>/dev/null; then
  echo "SKIP: gpu_openai.py (this machine has no openai package); the server came up"
else
  python3 tests/parity/gpu_openai.py http://127.0.0.1:18600/v1 || status=1
fi
kill -TERM $pid; wait $pid; echo "serve exit $?"; ls /dev/shm | grep -c ferrum || true

echo "=== a KV budget below the weights fails start-up with a clear error"
"$bin/ferrumctl" serve --model "$models/llama3-8b-dummy" --load-format dummy --device cuda --port 18602 \
  --gpu-memory-utilization 0.05 --max-model-len 1024 >"$out/serve-small.log" 2>&1
rc=$?
echo "exit $rc"; grep -iE "error|MiB" "$out/serve-small.log" | tail -3
[ $rc -eq 1 ] || { echo "expected exit 1"; status=1; }

echo "=== ferrumctl bench, llama-3-8b shapes (dummy bf16), 128-token prompts, 256 new tokens"
echo "    (KV pool from the default --gpu-memory-utilization 0.9)"
"$bin/ferrumctl" serve --model "$models/llama3-8b-dummy" --load-format dummy --device cuda --port 18601 \
  --max-num-seqs 64 --max-num-batched-tokens 2048 --max-model-len 1024 \
  --served-model-name llama-3-8b-dummy >"$out/serve-8b.log" 2>&1 &
pid=$!
if wait_health 18601; then
  grep -E "loading weights|loaded weights|device memory|KV|concurrency" "$out/serve-8b.log" | tail -8
  python3 - <<'PY' || status=1
import json, subprocess, torch, urllib.request
m = urllib.request.urlopen("http://127.0.0.1:18601/metrics", timeout=5).read().decode()
total = [l for l in m.splitlines() if l.startswith("ferrum:kv_blocks_total")]
print(total[0] if total else "no ferrum:kv_blocks_total in /metrics")
blocks = int(float(total[0].split()[-1]))
# Llama-3-8B: 32 layers x 8 KV heads x 128 x bf16, K and V, 16 tokens a block
per_block = 32 * 2 * 8 * 128 * 2 * 16
gib = blocks * per_block / 2**30
free, tot = torch.cuda.mem_get_info()
print(f"KV pool {blocks} blocks = {gib:.1f} GiB; device total {tot / 2**30:.1f} GiB, now free {free / 2**30:.1f} GiB")
# 0.9 of the card less 14.96 GiB of weights and a few GiB of activations and CUDA context:
# 55 GiB on an 80 GB card, 110 GiB on a 141 GB one
want = 0.9 * tot / 2**30 - 14.96
assert want - 4 < gib < want, f"KV pool {gib:.1f} GiB not what --gpu-memory-utilization 0.9 leaves ({want:.1f} GiB less activations)"
assert free / tot < 0.2, "the worker did not take 0.9 of the device"
PY
  for spec in 1:8 16:64 64:128; do
    c=${spec%%:*} n=${spec##*:}
    "$bin/ferrumctl" bench --port 18601 --num-prompts "$n" --max-concurrency "$c" --random-input-len 128 \
      --random-output-len 256 --seed "$c" --result-file "$out/bench-c$c.json" 2>&1 | tail -22 || status=1
  done
else
  echo "server did not come up"; tail -20 "$out/serve-8b.log"; status=1
fi
kill -TERM $pid; wait $pid; echo "serve exit $?"
exit $status
