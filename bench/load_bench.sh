#!/usr/bin/env bash
# Weight loading on the GPU: how fast a safetensors folder reaches the device
# and how soon `serve` is ready. usage: load_bench.sh BIN_DIR MODEL_DIR [RUNS]
#   BIN_DIR holds ferrumctl and ferrum-worker (a CUDA build); MODEL_DIR a
#   folder such as bench/make_weights.py writes (16 GB for Llama-3-8B).
# For each way of reading (mmap: FERRUM_LOAD_MMAP=1, the file's mapping
# copied into the pinned ring; uring: io_uring reads into it), RUNS times
# (default 2): `ferrumctl run` of 8 greedy tokens, printing the loader's
# lines (GiB/s over the weights, seconds for the whole load) and a hash of
# the text (the same for both ways), then the seconds
# from `ferrumctl serve` to its first /health 200. The page cache is warm
# after the first read; COLD=1 drops it before each run (root, and
# /proc/sys/vm/drop_caches writable).
set -u
bin=$1 model=$2 runs=${3:-2}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../tests/parity/wait_health.sh"
drop() { [ "${COLD:-0}" = 1 ] && { sync; echo 3 > /proc/sys/vm/drop_caches || echo "cannot drop the page cache"; }; }
cat "$model"/*.safetensors > /dev/null # into the page cache once
for mode in mmap uring; do
  mm=0; [ $mode = mmap ] && mm=1
  for r in $(seq 1 "$runs"); do
    drop
    echo "== $mode run $r"
    FERRUM_LOG=debug FERRUM_LOAD_MMAP=$mm "$bin/ferrumctl" run --model "$model" --device cuda --prompt hi --max-tokens 8 \
      --temperature 0 2>&1 >/tmp/load_bench_$mode.txt | grep -E "loaded|weight staging" | sed 's/^.*\] //'
    echo "greedy text: $(md5sum < /tmp/load_bench_$mode.txt | cut -c1-12)"
  done
  drop
  t0=$(date +%s.%N)
  FERRUM_LOAD_MMAP=$mm "$bin/ferrumctl" serve --model "$model" --device cuda --port 18611 >/tmp/load_bench_serve.log 2>&1 &
  pid=$!
  if wait_health 18611 $pid; then
    echo "$mode: serve ready after $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }") s"
  else
    echo "$mode: serve did not start"; tail -5 /tmp/load_bench_serve.log
  fi
  kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null
done
