#!/usr/bin/env bash
# cpu_serve_vs_llamacpp.sh - serving on the CPU, ferrum beside llama.cpp's
# server, same machine, same GGUF, same threads, same client and prompts
# (issue 18): `ferrumctl serve` and `llama-server -np SLOTS` (continuous
# batching) take turns, round after round (the order flips each round), and
# `ferrumctl bench` (random token-id prompts, ignore_eos, streamed) measures
# each at every concurrency of the sweep. Prints the median and spread of
# output tok/s and TTFT p50 per engine and concurrency, and their ratios,
# and draws both engines' latency against throughput into
# OUT/latency-throughput.svg (bench/serve_plot.py).
#
# llama-server is built from the llama.cpp inside the llama-cpp-python source
# release the test venv uses (the same llama.cpp the golden tests compare
# with), into build-llamacpp/, unless LLAMA_SERVER names one.
#
#   bench/cpu_serve_vs_llamacpp.sh [--model GGUF] [--threads N] [--rounds R]
#       [--sweep 1,16] [--num-prompts N] [--input-len L] [--output-len L]
#       [--slots S] [--out DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
threads=$(nproc) rounds=3 sweep=1,16 num_prompts=32 in_len=128 out_len=128 slots=16
out=$root/build/bench-serve-$(date -u +%Y%m%d-%H%M%S)
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2; shift ;;
    --threads) threads=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --sweep) sweep=$2; shift ;;
    --num-prompts) num_prompts=$2; shift ;;
    --input-len) in_len=$2; shift ;;
    --output-len) out_len=$2; shift ;;
    --slots) slots=$2; shift ;;
    --out) out=$2; shift ;;
    *) echo "usage: see the header of $0" >&2; exit 2 ;;
  esac
  shift
done
ferrumctl=$root/build/bin/ferrumctl
python=$root/.venv/bin/python
port_f=18601 port_l=18602
mkdir -p "$out"
note() { echo "cpu_serve: $*" >&2; }

# llama-server from the venv's llama-cpp-python source release.
build_llama_server() {
  local ver dir=$root/build-llamacpp
  ver=$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)')
  if [ ! -x "$dir/bin/llama-server" ]; then
    note "building llama-server from llama-cpp-python $ver's llama.cpp"
    mkdir -p "$dir/src"
    "$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$dir/src"
    tar -xzf "$dir/src/llama_cpp_python-$ver.tar.gz" -C "$dir/src"
    local flags
    eval "flags=($("$root/deploy/llamacpp_flags.sh"))"
    cmake -S "$dir/src/llama_cpp_python-$ver/vendor/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=ON ${flags[@]+"${flags[@]}"} -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF >"$dir/cmake.log"
    cmake --build "$dir/build" -j"$(nproc)" --target llama-server >"$dir/build.log"
    mkdir -p "$dir/bin"
    cp "$dir/build/bin/llama-server" "$dir/bin/"
  fi
  echo "$dir/bin/llama-server"
}
llama_server=${LLAMA_SERVER:-$(build_llama_server)}

wait_up() { # URL PID
  for _ in $(seq 600); do
    curl -sf "$1/health" >/dev/null 2>&1 && curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.2
  done
  return 1
}

stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

run_engine() { # ENGINE ROUND
  local engine=$1 r=$2 pid url
  if [ "$engine" = ferrum ]; then
    url=http://127.0.0.1:$port_f
    "$ferrumctl" serve --model "$model" --host 127.0.0.1 --port $port_f --threads "$threads" \
      --served-model-name bench --rpc "ipc://$out/rpc.sock" >"$out/ferrum-$r.log" 2>&1 &
  else
    url=http://127.0.0.1:$port_l
    # -c: every slot holds a whole request (llama-server splits the context over its slots).
    "$llama_server" -m "$model" --host 127.0.0.1 --port $port_l -t "$threads" -tb "$threads" -np "$slots" \
      -c $(((in_len + out_len + 64) * slots)) -cb --alias bench >"$out/llamacpp-$r.log" 2>&1 &
  fi
  pid=$!
  if ! wait_up "$url" $pid; then
    note "$engine did not come up: $(tail -5 "$out/$engine-$r.log")"
    stop $pid
    return 1
  fi
  note "round $r: $engine (load average $(cut -d' ' -f1 /proc/loadavg))"
  "$ferrumctl" bench --base-url "$url" --model bench --num-prompts "$num_prompts" --random-input-len "$in_len" \
    --random-output-len "$out_len" --seed "$r" --sweep "$sweep" --result-file "$out/$engine-$r.json" \
    >"$out/$engine-$r.txt" 2>&1 || note "$engine bench failed: $(tail -3 "$out/$engine-$r.txt")"
  stop $pid
}

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "model: $model; threads $threads; llama-server -np $slots; $num_prompts prompts, $in_len in / $out_len out"
} | tee "$out/machine.txt"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="ferrum llamacpp"; else order="llamacpp ferrum"; fi
  for e in $order; do run_engine "$e" "$r"; done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/machine.txt"

"$python" - "$out" "$rounds" <<'EOF'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
res = {}  # (engine, concurrency) -> [(out tok/s, ttft p50)]
for e in ("ferrum", "llamacpp"):
    for r in range(1, rounds + 1):
        p = os.path.join(out, "%s-%d.json" % (e, r))
        if not os.path.exists(p):
            continue
        d = json.load(open(p))
        for run in d.get("runs", [d]):
            if run.get("failed", 0):
                print("warning: %s round %d c=%d: %d failed requests" % (e, r, run["max_concurrency"], run["failed"]))
            res.setdefault((e, run["max_concurrency"]), []).append((run["output_throughput"], run["median_ttft_ms"]))
def med(v): return statistics.median(v) if v else float("nan")
def spread(v): return "%.1f-%.1f" % (min(v), max(v)) if v else "-"
print("| concurrency | engine | output tok/s median (spread) | TTFT p50 ms median (spread) |")
print("|---:|---|---:|---:|")
for c in sorted({k[1] for k in res}):
    for e in ("ferrum", "llamacpp"):
        v = res.get((e, c), [])
        print("| %d | %s | %.1f (%s) | %.0f (%s) |" % (c, e, med([x[0] for x in v]), spread([x[0] for x in v]),
                                                     med([x[1] for x in v]), spread([x[1] for x in v])))
for c in sorted({k[1] for k in res}):
    f, l = res.get(("ferrum", c), []), res.get(("llamacpp", c), [])
    if f and l:
        print("c=%d: ferrum/llama.cpp output tok/s %.2fx, TTFT p50 %.2fx (below 1: ferrum answers sooner)" %
              (c, med([x[0] for x in f]) / med([x[0] for x in l]), med([x[1] for x in f]) / med([x[1] for x in l])))
EOF
"$python" "$root/bench/serve_plot.py" "$out" "$out/latency-throughput.svg" \
  --title "$(basename "$model"), $threads threads: ferrum vs llama-server -np $slots" &&
  note "plot: $out/latency-throughput.svg"
