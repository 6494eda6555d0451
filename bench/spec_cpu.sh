#!/usr/bin/env bash
# spec_cpu.sh - speculative decoding on the CPU at batch 1: one
# `ferrumctl serve` per --speculative-config (none first; n-gram k = 4 and
# 8, or the JSON lines of SPEC_CONFIGS, e.g. draft models), then for each
# prompt (prompts that repeat their input) `ferrumctl run` against each
# server in turn, REPEAT (3) rounds, greedy; prints each run's speed (run's
# own stats line: generated tokens over the time after the first) and the
# proposals accepted (the server's /metrics), and the best speed of each
# config (the machine may be shared). docs/bench/speculative.md.
# usage: [REPEAT=3] [SPEC_CONFIGS=$'json\njson'] bench/spec_cpu.sh [MODEL] [MAX_TOKENS]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ctl=${FERRUMCTL:-$root/build/bin/ferrumctl}
model=${1:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
max=${2:-256}
export FERRUM_LOG=${FERRUM_LOG:-info}
code='def area(width, height):
    return width * height

def perimeter(width, height):
    return 2 * (width + height)

def describe(width, height):
    return f"{width} by {height}"

class Rect:
    def __init__(self, width, height):
        self.width = width
        self.height = height
'
prompts=("Rewrite this Python code exactly, keeping every name:

$code"
  "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine, orange, papaya"
  "Extract every function and method name from this code, one per line:

$code")
configs=(""
  '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
  '{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 1}')
if [ -n "${SPEC_CONFIGS:-}" ]; then
  configs=("")
  while IFS= read -r line; do [ -n "$line" ] && configs+=("$line"); done <<<"$SPEC_CONFIGS"
fi
metric() { curl -s "localhost:${ports[$1]}/metrics" | awk -v k="ferrum:$2{" 'index($0, k) == 1 {print $2}'; }
# one server per config, each with its own runtime folder (run finds it there)
ports=() dirs=() pids=()
for i in "${!configs[@]}"; do
  dirs[$i]=$(mktemp -d) ports[$i]=$((20000 + RANDOM % 20000))
  args=(serve --model "$model" --port "${ports[$i]}" --threads "$(nproc)")
  [ -n "${configs[$i]}" ] && args+=(--speculative-config "${configs[$i]}")
  XDG_RUNTIME_DIR=${dirs[$i]} "$ctl" "${args[@]}" 2>/dev/null &
  pids[$i]=$!
  for _ in $(seq 300); do curl -sf "localhost:${ports[$i]}/health" >/dev/null && break; sleep 0.2; done
done
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT
# each prompt: the configs in turn, REPEAT rounds; the best speed of each
for p in "${prompts[@]}"; do
  echo "== ${p:0:50}..."
  for i in "${!configs[@]}"; do best[$i]=0; done
  for _ in $(seq "${REPEAT:-3}"); do
    for i in "${!configs[@]}"; do
      d0=$(metric "$i" spec_decode_num_draft_tokens_total) a0=$(metric "$i" spec_decode_num_accepted_tokens_total)
      n0=$(metric "$i" spec_decode_num_drafts_total)
      line=$(XDG_RUNTIME_DIR=${dirs[$i]} "$ctl" run --model "$model" --prompt "$p" --temperature 0 --max-tokens "$max" \
             2>&1 >/dev/null | grep -o 'generated.*')
      d1=$(metric "$i" spec_decode_num_draft_tokens_total) a1=$(metric "$i" spec_decode_num_accepted_tokens_total)
      n1=$(metric "$i" spec_decode_num_drafts_total)
      tps=$(echo "$line" | grep -o '[0-9.]* tok/s' | cut -d' ' -f1)
      awk -v a="$tps" -v b="${best[$i]}" 'BEGIN {exit !(a > b)}' && best[$i]=$tps
      echo "  ${configs[$i]:-no speculation} | $line | drafts $((${n1%.*} - ${n0%.*})), proposed $((${d1%.*} - ${d0%.*})), accepted $((${a1%.*} - ${a0%.*}))"
    done
  done
  for i in "${!configs[@]}"; do echo "  best: ${configs[$i]:-no speculation}: ${best[$i]} tok/s"; done
done
