#!/usr/bin/env bash
# Multi-node tensor parallelism, emulated on one 2-GPU machine (device
# machine, repo root, after `source .device/env.sh`): TP=2 with rank 1 as a
# remote worker (`serve --remote-workers 1`, `ferrum-worker --connect
# tcp://127.0.0.1:PORT --device cuda:1`) and NCCL kept off peer memory and
# shared memory (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: its socket
# transport, as between hosts), against single-node TP=2 on the same
# dummy Llama-3-8B weights: the same greedy text, and decode speed
# (`ferrumctl bench`, concurrency 1) side by side.
# usage: gpu_remote.sh BIN_DIR MODELS_DIR OUT_DIR
set -u
bin=$1 models=$2 out=$3
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
model=$models/llama3-8b-dummy
prompts=("The capital of France is" "def fibonacci(n):" "Once upon a time")
common=(--model "$model" --load-format dummy --device cuda --tensor-parallel-size 2 --max-model-len 512
        --gpu-memory-utilization 0.5 --served-model-name llama-3-8b-dummy)
status=0

source "$(dirname "${BASH_SOURCE[0]}")/wait_health.sh"

run_case() { # NAME PORT: greedy texts and a bench into OUT/NAME.*
  local name=$1 port=$2
  for p in "${prompts[@]}"; do
    "$bin/ferrumctl" submit --rpc "ipc://$out/$name.sock" --prompt "$p" --ignore-eos --max-tokens 32 2>/dev/null
    echo "---"
  done >"$out/$name.txt"
  "$bin/ferrumctl" bench --port "$port" --num-prompts 4 --max-concurrency 1 --random-input-len 128 \
    --random-output-len 128 2>&1 | grep -E "Successful|throughput|TPOT" | tee "$out/$name.bench"
}

echo "=== single node: TP=2 over NVLink"
"$bin/ferrumctl" serve "${common[@]}" --port 18701 --rpc "ipc://$out/local.sock" >"$out/local.log" 2>&1 &
pid=$!
if wait_health 18701 $pid; then run_case local 18701; else echo "local server did not come up"; tail -20 "$out/local.log"; status=1; fi
kill -TERM $pid; wait $pid

echo "=== two 'hosts': rank 1 remote over tcp://127.0.0.1, NCCL over sockets"
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
"$bin/ferrumctl" serve "${common[@]}" --port 18702 --rpc "ipc://$out/remote.sock" \
  --worker-endpoint tcp://127.0.0.1:18703 --remote-workers 1 >"$out/remote.log" 2>&1 &
pid=$!
"$bin/ferrum-worker" --connect tcp://127.0.0.1:18703 --rank 1 --world-size 2 --device cuda:1 >"$out/worker1.log" 2>&1 &
wpid=$!
if wait_health 18702 $pid; then run_case remote 18702; else echo "remote server did not come up"; tail -20 "$out/remote.log"; tail -20 "$out/worker1.log"; status=1; fi
grep -E "custom all-reduce|via NET|remote worker" "$out/remote.log" "$out/worker1.log" | head -6
kill -TERM $pid; wait $pid
kill $wpid 2>/dev/null; wait $wpid 2>/dev/null

if cmp -s "$out/local.txt" "$out/remote.txt" && [ -s "$out/local.txt" ]; then
  echo "greedy text: SAME ($(grep -c -- --- "$out/local.txt") prompts)"
else
  echo "greedy text: DIFFERENT"; diff "$out/local.txt" "$out/remote.txt" | head -20; status=1
fi
exit $status
