#!/usr/bin/env bash
# Speculative decoding on a GPU (device machine, repo root, after
# `source .device/env.sh`): Llama-3-8B shapes (dummy bf16) served with no
# speculation, then with a Llama-3.2-1B-shaped dummy draft model proposing
# num_speculative_tokens 4 whose proposals are accepted at the rates of
# FERRUM_SPEC_ACCEPT (random weights accept nothing, so the worker's
# benchmark switch FERRUM_SPEC_FORCE_ACCEPT forces it); `ferrumctl bench`
# at each concurrency of FERRUM_SPEC_CONC (128 in / 256 out), to see the
# batch-1 speedup and where speculation stops paying as the batch grows.
# MODELS_DIR/llama3-8b-dummy and llama3-1b-dummy come from
# tests/parity/make_dummy_folder.py (llama-3-8b, llama-3.2-1b).
# usage: spec_gpu.sh BIN_DIR MODELS_DIR OUT_DIR
set -u
bin=$1 models=$2 out=$3
rates=${FERRUM_SPEC_ACCEPT:-0.5 0.8} concs=${FERRUM_SPEC_CONC:-1 4 16 64}
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/../tests/parity/wait_health.sh"
status=0
for rate in none $rates; do
  spec=() env=()
  if [ "$rate" != none ]; then
    spec=(--speculative-config "{\"model\": \"$models/llama3-1b-dummy\", \"num_speculative_tokens\": 4, \"disable_by_batch_size\": 1000, \"min_acceptance_rate\": 0}")
    env=(FERRUM_SPEC_FORCE_ACCEPT="$rate")
  fi
  echo "=== speculation: ${rate/none/off}${spec:+ (draft llama3-1b-dummy, k 4, acceptance forced at $rate)}"
  env ${env[@]+"${env[@]}"} "$bin/ferrumctl" serve --model "$models/llama3-8b-dummy" --load-format dummy --device cuda \
    --port 18611 --max-num-seqs 64 --max-model-len 1024 --served-model-name l8b ${spec[@]+"${spec[@]}"} \
    >"$out/serve-$rate.log" 2>&1 &
  pid=$!
  if wait_health 18611 $pid; then
    for c in $concs; do
      n=$((c < 4 ? 8 : 2 * c))
      echo "--- concurrency $c, $n prompts"
      "$bin/ferrumctl" bench --port 18611 --num-prompts "$n" --max-concurrency "$c" --random-input-len 128 \
        --random-output-len 256 --seed "$c" --result-file "$out/bench-$rate-c$c.json" 2>&1 |
        grep -E "Failed|Output token|Median TPOT" || status=1
    done
    python3 -c "
import urllib.request
for l in urllib.request.urlopen('http://127.0.0.1:18611/metrics', timeout=5).read().decode().splitlines():
    if l.startswith('ferrum:spec_decode_num_') and '_per_pos' not in l: print(l.split('{')[0], l.split()[-1])"
  else
    echo "server did not come up"; tail -20 "$out/serve-$rate.log"; status=1
  fi
  kill -TERM $pid 2>/dev/null; wait $pid
done
exit $status
