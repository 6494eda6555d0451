#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU machine (device machine, repo root, after
# `source .device/env.sh`); results in docs/bench/tensor-parallel.md:
#   1. the all-reduce (bench/allreduce_bench) at every size of
#      FERRUM_TP_SIZES above 1: its results checked (--check), then timed
#      per message size, NCCL alone and with the one-shot all-reduce for
#      small sizes, eager and inside a CUDA graph;
#   2. greedy tokens against transformers at each size (gpu_tp.py);
#   3. Llama-3-8B shapes (dummy bf16; FERRUM_TP_MODEL names another folder,
#      such as llama3-70b-dummy): `ferrumctl bench` at each size, concurrency
#      1, 16, 64 and 256 (FERRUM_TP_BENCH picks "c:n:in:out" runs), each with
#      where a step's time goes (bench/step_time.py).
# FERRUM_TP_SIZES defaults to "1 2". MODELS_DIR/llama3-8b-dummy (and
# llama3-70b-dummy) come from tests/parity/make_dummy_folder.py.
# usage: gpu_tp.sh BIN_DIR MODELS_DIR OUT_DIR [STEPS (default allreduce,parity,bench)]
set -u
bin=$1 models=$2 out=$3 steps=${4:-allreduce,parity,bench}
sizes=${FERRUM_TP_SIZES:-1 2} model=${FERRUM_TP_MODEL:-llama3-8b-dummy}
want() { [[ ",$steps," == *",$1,"* ]]; }
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
status=0
source "$(dirname "${BASH_SOURCE[0]}")/wait_health.sh"

nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m | head -4

if want allreduce; then
  for n in $sizes; do
    [ "$n" -gt 1 ] || continue
    echo "=== all-reduce, $n ranks: results against the sum in rank order, fused with add_rms_norm against the two ops"
    "$bin/allreduce_bench" --device cuda --ranks "$n" --check 1 || status=1
    echo "=== all-reduce, $n ranks: NCCL alone"
    FERRUM_CUSTOM_AR=0 "$bin/allreduce_bench" --device cuda --ranks "$n" --iters 400 | tee "$out/allreduce$n-nccl.md" || status=1
    echo "=== all-reduce, $n ranks: one-shot over peer memory up to 512 KiB, NCCL above (the default)"
    "$bin/allreduce_bench" --device cuda --ranks "$n" --iters 400 | tee "$out/allreduce$n.md" || status=1
  done
fi

if want parity; then
  echo "=== greedy tokens against transformers, TP = $sizes"
  python3 tests/parity/gpu_tp.py "$bin/ferrumctl" "$models/llama3-8b-dummy" "$out/parity" $sizes || status=1
fi

if want bench; then
  for tp in $sizes; do
    echo "=== $model (dummy bf16), tensor-parallel size $tp"
    "$bin/ferrumctl" serve --model "$models/$model" --load-format dummy --device cuda \
      --tensor-parallel-size "$tp" --port 18601 --max-num-seqs 256 --max-num-batched-tokens 2048 \
      --max-model-len 1024 --served-model-name "$model" >"$out/serve-tp$tp.log" 2>&1 &
    pid=$!
    if wait_health 18601 $pid; then
      grep -E "tensor parallel|KV budget|memory:" "$out/serve-tp$tp.log" | head -6
      for spec in ${FERRUM_TP_BENCH:-1:8:128:256 16:64:128:256 64:128:128:256 256:1000:512:256}; do
        IFS=: read -r c n lin lout <<<"$spec"
        echo "--- tp $tp: concurrency $c, $n prompts, $lin in / $lout out"
        python3 bench/step_time.py 18601 -- \
          "$bin/ferrumctl" bench --port 18601 --num-prompts "$n" --max-concurrency "$c" --random-input-len "$lin" \
          --random-output-len "$lout" --seed "$c" --result-file "$out/bench-tp$tp-c$c.json" 2>&1 |
          grep -E "Successful|Failed|throughput|TPOT|TTFT|^steps|^interval|^round|^rank" || status=1
      done
    else
      echo "server did not come up"; tail -30 "$out/serve-tp$tp.log"; status=1
    fi
    kill -TERM $pid 2>/dev/null; wait $pid; echo "serve exit $?"
  done
fi
exit $status
