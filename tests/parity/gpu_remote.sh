#!/usr/bin/env bash
# Multi-node tensor parallelism, emulated on one 2-GPU machine (device
# machine, as root, repo root, after `source .device/env.sh`). Two "hosts"
# are two network namespaces joined by a veth pair (where `ip` and `unshare`
# exist; else both stay on loopback): the coordinator and rank 0 (GPU 0) in
# one, rank 1 (GPU 1) in the other with its own mount namespace and an empty
# /dev/shm (`ferrum-worker --connect tcp://10.214.0.1:PORT --device cuda:1`).
# The worker socket uses CURVE keys from `ferrumctl keygen`; NCCL is kept
# off peer memory and shared memory (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1:
# its socket transport over the veth, as between hosts). Against
# single-node TP=2 on the same dummy Llama-3-8B weights: the same greedy
# text, and decode speed (`ferrumctl bench`, concurrency 1) side by side.
# usage: gpu_remote.sh BIN_DIR MODELS_DIR OUT_DIR
set -u
bin=$1 models=$2 out=$3
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
model=$models/llama3-8b-dummy
common=(--model "$model" --load-format dummy --device cuda --tensor-parallel-size 2 --max-model-len 512
        --gpu-memory-utilization 0.5 --served-model-name llama-3-8b-dummy)
status=0
here=$(dirname "${BASH_SOURCE[0]}")
source "$here/wait_health.sh"

# run_case NAME PORT: greedy texts and a bench into OUT/NAME.*, run in host A
run_case() {
  "${in_a[@]}" env bin="$bin" out="$out" name="$1" port="$2" bash -c '
    for p in "The capital of France is" "def fibonacci(n):" "Once upon a time"; do
      "$bin/ferrumctl" submit --rpc "ipc://$out/$name.sock" --prompt "$p" --ignore-eos --max-tokens 32 2>/dev/null
      echo "---"
    done >"$out/$name.txt"
    "$bin/ferrumctl" bench --port "$port" --num-prompts 4 --max-concurrency 1 --random-input-len 128 \
      --random-output-len 128 2>&1 | grep -E "Successful|throughput|TPOT" | tee "$out/$name.bench"'
}

in_a=() in_b=()
echo "=== single node: TP=2 over NVLink"
"$bin/ferrumctl" serve "${common[@]}" --port 18701 --rpc "ipc://$out/local.sock" >"$out/local.log" 2>&1 &
pid=$!
if wait_health 18701 $pid; then run_case local 18701; else echo "local server did not come up"; tail -20 "$out/local.log"; status=1; fi
kill -TERM $pid; wait $pid

echo "=== two 'hosts': rank 1 remote over tcp:// with CURVE, NCCL over sockets"
for k in server worker; do rm -f "$out/$k.key" "$out/$k.pub"; "$bin/ferrumctl" keygen --out "$out/$k" >/dev/null; done
cp "$out/worker.pub" "$out/clients"
addr=127.0.0.1 ifname=lo shm=""
{ ip netns del fr-host-a; ip netns del fr-host-b; } 2>/dev/null # left by a run that was killed
if command -v ip >/dev/null && command -v unshare >/dev/null && ip netns add fr-host-a 2>/dev/null; then
  ip netns add fr-host-b && ip link add fr-va type veth peer name fr-vb &&
    ip link set fr-va netns fr-host-a && ip link set fr-vb netns fr-host-b &&
    ip -n fr-host-a addr add 10.214.0.1/30 dev fr-va && ip -n fr-host-b addr add 10.214.0.2/30 dev fr-vb &&
    ip -n fr-host-a link set fr-va up && ip -n fr-host-b link set fr-vb up &&
    ip -n fr-host-a link set lo up && ip -n fr-host-b link set lo up || status=1
  in_a=(ip netns exec fr-host-a) in_b=(ip netns exec fr-host-b unshare --mount)
  addr=10.214.0.1 ifname=fr-v shm="mount -t tmpfs tmpfs /dev/shm &&"
  echo "hosts: network namespaces fr-host-a (coordinator, rank 0) and fr-host-b (rank 1, its own /dev/shm)"
else
  echo "hosts: no network namespaces here, both on loopback"
fi
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=$ifname NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
"${in_a[@]}" "$bin/ferrumctl" serve "${common[@]}" --port 18702 --rpc "ipc://$out/remote.sock" \
  --worker-endpoint "tcp://$addr:18703" --remote-workers 1 --curve-key "$out/server.key" \
  --curve-clients "$out/clients" >"$out/remote.log" 2>&1 &
pid=$!
"${in_b[@]}" sh -c "$shm exec \"\$0\" \"\$@\"" "$bin/ferrum-worker" --connect "tcp://$addr:18703" --rank 1 \
  --world-size 2 --device cuda:1 --curve-key "$out/worker.key" --server-key "$out/server.pub" >"$out/worker1.log" 2>&1 &
wpid=$!
WAIT_IN=("${in_a[@]}")
if wait_health 18702 $pid; then run_case remote 18702; else
  echo "remote server did not come up"; tail -20 "$out/remote.log"; tail -20 "$out/worker1.log"; status=1
fi
grep -E "custom all-reduce|via NET|remote worker|NET/Socket : Using|nNodes" "$out/remote.log" "$out/worker1.log" | head -8
kill -TERM $pid; wait $pid
kill $wpid 2>/dev/null; wait $wpid 2>/dev/null
[ ${#in_a[@]} -eq 0 ] || { ip netns del fr-host-a; ip netns del fr-host-b; }

if cmp -s "$out/local.txt" "$out/remote.txt" && [ -s "$out/local.txt" ]; then
  echo "greedy text: SAME ($(grep -c -- --- "$out/local.txt") prompts)"
else
  echo "greedy text: DIFFERENT"; diff "$out/local.txt" "$out/remote.txt" | head -20; status=1
fi
exit $status
