#!/usr/bin/env bash
# Everything the GPU machine checks in one call (see docs/bench/gpu.md):
#   1. CUDA ops vs the CPU backend, weight upload (tests/gpu)
#   2. CPU kernel tests on the AVX-512 path, when the host has it
#   3. whole-model parity with transformers (tests/parity/hf_parity.py), and
#      /v1/embeddings with sentence-transformers / transformers (embed_parity.py)
#   4. CPU vs CUDA greedy tokens on quantized models of real shapes (dummy weights), on
#      GPTQ / AWQ int4 checkpoints (tests/parity/gpu_gptq.py) and on FP8 ones
#      (tests/parity/gpu_fp8_ckpt.py)
#   5. Llama-3-8B-shaped decode / prefill throughput (bench/model_bench, bf16 dummy)
# usage (device machine, repo root): source .device/env.sh && tests/parity/device_check.sh BUILD_DIR OUT_DIR
set -uo pipefail
# FERRUM_CHECKS picks steps (default: ops,avx512,parity,cross,bench).
build=$1 out=$2
checks=${FERRUM_CHECKS:-ops,avx512,parity,cross,bench}
want() { [[ ",$checks," == *",$1,"* ]]; }
mkdir -p "$out"
status=0
step() { echo; echo "=== $*"; }

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
if want ops; then
step "cuda ops"
for t in test_cuda_ops test_cuda_weights; do
  echo "--- $t"; "$build/tests/$t" 2>&1 | tail -25 || status=1
done
fi

if want avx512; then
step "cpu kernels, avx512 path"
if grep -q avx512bw /proc/cpuinfo; then
  for t in test_kernels_ops; do FERRUM_CPU_ISA=avx512 "$build/tests/$t" 2>&1 | tail -3 || status=1; done
else
  echo "no AVX-512 on this host"
fi
fi

if want parity; then
step "transformers parity"
python3 tests/parity/hf_parity.py "$build/bin/run_model" "$out/parity" --devices cuda,cpu || status=1
step "embeddings parity (BERT via sentence-transformers, Qwen3 mean / last via transformers)"
python3 tests/parity/embed_parity.py "$build/bin/ferrumctl" "$out/embed-parity" --devices cpu,cuda || status=1
fi

if want cross; then
step "cpu vs cuda, quantized dummy weights of SmolLM2-135M and Qwen3-0.6B shapes (q4_k_m: llama.cpp's Q4_K / Q6_K mix)"
ids=$(python3 -c "import random; random.seed(3); print(','.join(str(random.randrange(100, 40000)) for _ in range(40)))")
for spec in smollm2-135m:q4_0 smollm2-135m:q4_1 smollm2-135m:q5_0 smollm2-135m:q5_1 smollm2-135m:q8_0 qwen3-0.6b:q4_k qwen3-0.6b:q5_k qwen3-0.6b:q6_k qwen3-0.6b:q4_k_m smollm2-135m:i4g; do
  name=${spec%%:*} type=${spec##*:}
  a=$("$build/bin/run_model" --dummy "$name" --type "$type" --device cpu --ids "$ids" --greedy 24)
  b=$("$build/bin/run_model" --dummy "$name" --type "$type" --device cuda --ids "$ids" --greedy 24)
  python3 tests/parity/compare_greedy.py "$spec" "$a" "$b" || status=1
done
step "cpu vs cuda, GPTQ / AWQ int4 checkpoints (tests/golden/make_gptq.py)"
python3 tests/parity/gpu_gptq.py "$build/bin/run_model" "$out/gptq" || status=1
step "FP8 checkpoints: cuda runs the files' bytes and scales, and follows the cpu (tests/golden/make_fp8.py)"
python3 tests/parity/gpu_fp8_ckpt.py "$build/bin/run_model" "$out/fp8" || status=1
fi

if want bench; then
step "llama-3-8b bf16 dummy: prefill 2048, decode batch 1 and 64 (prompt 128, 256 new tokens)"
"$build/bin/model_bench" --dummy llama-3-8b --device cuda --prefill 2048 --prompt 128 --gen 257 --batch 1,64 --repeat 3 \
  2>&1 | tee "$out/bench-llama3-8b.txt" || status=1
FERRUM_NO_GRAPHS=1 "$build/bin/model_bench" --dummy llama-3-8b --device cuda --prefill 0 --prompt 128 --gen 65 --batch 1,64 \
  2>&1 | tee "$out/bench-llama3-8b-nographs.txt" | grep decode || status=1
fi
exit $status
