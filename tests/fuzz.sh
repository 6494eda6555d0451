#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ (FERRUM_FUZZ: ASan +
# UBSan) and runs each for SECONDS, nproc at a time, seeded from what the
# tree generates: proto_corpus, the formats fixtures (written into
# build/tests/formats-fixtures by deploy/test.sh's formats_fixtures, or
# $FERRUM_FIXTURES), the tokenizer corpus, small tokenizer.json files
# (tests/tokenizer/fuzz_json_seeds.py), request bodies.
#   tests/fuzz.sh SECONDS OUT_DIR [TARGET...]    (default: every fuzz_* target)
# FERRUM_FUZZ_TOKENIZER: the model fuzz_tokenizer also loads (default: the
# default model, where it exists). FERRUM_WERROR=ON: warnings are errors.
# OUT_DIR gets, per target T: T/ (the inputs it found; a later run starts
# from them), T-seeds/, T.log and, for a crash, leak, timeout or failed check,
# its input T-crash-… (-leak-, -timeout-, -oom-). stdout: one line per target,
#   "T: ok (S seeds, N runs, corpus C, cov K)" or "T: FAILED (its input: …)".
# Exit status: 0 all ok, 1 a target failed, 2 set-up or build failed.
set -uo pipefail
if [ $# -lt 2 ] || ! [[ $1 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 SECONDS OUT_DIR [TARGET...]" >&2
  exit 2
fi
secs=$1
mkdir -p "$2" || exit 2
out=$(cd "$2" && pwd)
shift 2
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
fx=${FERRUM_FIXTURES:-$root/build/tests/formats-fixtures}

note() { echo "fuzz: $*" >&2; }

seed() { # DST FILE...: copies each FILE that exists as DST/<its folder>_<its name>
  local dst=$1 f
  shift
  for f in "$@"; do [ -e "$f" ] && cp "$f" "$dst/$(basename "$(dirname "$f")")_$(basename "$f")"; done
}

fuzz_seeds() { # TARGET DST: the tree's seeds for TARGET, if any
  local dst=$2
  case $1 in
    fuzz_proto_*)
      seed "$dst" "$out/proto-seeds/${1#fuzz_proto_}"/* ;; # written once before the targets run
    fuzz_curve_keys) # a key pair file and a list, as ferrumctl keygen writes them
      printf '\0# ferrum CURVE key pair\npublic-key = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"\nsecret-key = "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%%wOTJ%%JR%%cs"\n' >"$dst/pair"
      printf '\1# clients\nYne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID\n\npublic-key = "rq:rM>}U?@Lns47E1%%kR.o@n%%FcmmsL/@{H8]yf7"\n' >"$dst/list" ;;
    fuzz_gguf) seed "$dst" "$fx"/*.gguf ;;
    fuzz_safetensors) seed "$dst" "$fx"/*.safetensors "$fx"/*/*.safetensors ;;
    fuzz_hf_config) seed "$dst" "$fx"/*/config.json ;;
    fuzz_hf_listing) # the first byte picks the pattern (none, Q4_K_M, gguf); then a listing as the Hub sends it
      printf '\0{"id":"org/name","sha":"0123456789abcdef0123456789abcdef01234567","siblings":[{"rfilename":"config.json"},{"rfilename":"model-00001-of-00002.safetensors"},{"rfilename":"model.safetensors.index.json"},{"rfilename":"tokenizer.json"},{"rfilename":"chat_template.jinja"},{"rfilename":"README.md"},{"rfilename":"sub/x.json"}]}' >"$dst/folder"
      printf '\1{"id":"org/name-GGUF","sha":"89abcdef0123456789abcdef0123456789abcdef","siblings":[{"rfilename":"m-Q4_K_M.gguf"},{"rfilename":"m-Q8_0.gguf"},{"rfilename":"../evil.gguf"}]}' >"$dst/gguf" ;;
    fuzz_tokenizer_json)
      seed "$dst" "$fx"/*/tokenizer.json
      python3 tests/tokenizer/fuzz_json_seeds.py "$dst" ;;
    fuzz_http_json) # the first byte picks the API: 0 completions, 1 chat, 2 embeddings (mod 4)
      printf '\0{"model":"smol","prompt":"Hello","max_tokens":16,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":1,"stop":["\\n","."],"stop_token_ids":[2],"stream":true,"stream_options":{"include_usage":true},"n":1,"echo":false,"logprobs":null,"presence_penalty":0.5,"frequency_penalty":0.5,"repetition_penalty":1.1,"ignore_eos":false,"user":"u"}' >"$dst/completions"
      printf '\0{"prompt":[1,2,3],"max_tokens":4,"stop":"x"}' >"$dst/completions-ids"
      printf '\0{"prompt":"a","max_tokens":8,"logit_bias":{"7042":100,"12":-100,"0":2.5},"min_tokens":3,"stop":["."],"include_stop_str_in_output":true,"echo":true}' >"$dst/completions-sampling"
      printf '\0{"prompt":"a b","max_tokens":0,"echo":true,"logprobs":3,"prompt_logprobs":2,"skip_special_tokens":false}' >"$dst/completions-prompt-logprobs"
      printf '\1{"messages":[{"role":"user","content":"x"}],"prompt_logprobs":0,"skip_special_tokens":true}' >"$dst/chat-prompt-logprobs"
      printf '\0{"prompt":["a",[1,2,3],"bc"],"n":2,"best_of":3,"max_tokens":4,"truncate_prompt_tokens":2,"seed":5,"user":"u"}' >"$dst/completions-choices"
      printf '\0{"prompt":"a","top_p":9e-87,"temperature":1e-300}' >"$dst/completions-tiny-floats" # below float's range
      printf '\1{"model":"smol","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]},{"role":"assistant","content":"Hello"},{"role":"user","content":"Again"}],"max_completion_tokens":8,"metadata":{"k":"v"}}' >"$dst/chat"
      printf '\1{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"21"}],"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object"}}}],"tool_choice":"auto","chat_template_kwargs":{"enable_thinking":false}}' >"$dst/chat-tools"
      printf '\1{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object","properties":{"c":{"type":"string"}}}}}],"tool_choice":{"type":"function","function":{"name":"w"}}}' >"$dst/chat-tool-named"
      printf '\1{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"},"b":{"enum":["x",1]}},"required":["a"]}}}}' >"$dst/chat-json-schema"
      printf '\0{"prompt":"a","guided_regex":"(yes|no)\\\\d{2,3}","structured_outputs":null}' >"$dst/completions-regex"
      printf '\0{"prompt":"a","structured_outputs":{"choice":["a.b","c"]}}' >"$dst/completions-choice"
      printf '\2{"model":"smol","input":["Hello",[1,2,3]],"encoding_format":"base64","dimensions":576,"user":"u"}' >"$dst/embeddings"
      printf '\2{"input":"x","truncate_prompt_tokens":4}' >"$dst/embeddings-truncate" ;;
    fuzz_http_tools) # the first byte picks the piece size; then a model's output in each family's format
      printf '\3Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2.5e1]}}\n</tool_call>\n<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>' >"$dst/hermes"
      printf '\1<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": [null, true]}}' >"$dst/llama3"
      printf '\5Sure.[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France"}}][TOOL_CALLS]get_time[ARGS]{"tz": "CET"}' >"$dst/mistral" ;;
    fuzz_http_reason) # the first byte picks the piece size; then a thinking model's output
      printf '\2<think>\nThe user asks 2 + 2.\n</think>\n\nIt is 4.' >"$dst/qwen3"
      printf '\6Okay, so 2 + 2 is 4 </thinking> </think> The answer: 4. </think>' >"$dst/r1"
      printf '\0<thi' >"$dst/cut" ;;
    fuzz_grammar) # the first byte: even a JSON schema, odd a regex; then the schema, a NUL, an output
      printf '\0{"type": "object", "properties": {"name": {"type": "string", "maxLength": 5}, "tags": {"type": "array", "items": {"enum": ["a", 3, null]}, "maxItems": 2}, "pet": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/P"}]}}, "required": ["name"], "$defs": {"P": {"type": "object", "properties": {"kind": {"const": "cat"}}}}}\0{"name": "Bo\\u00e9", "tags": [3, "a"], "pet": {"kind": "cat"}}' >"$dst/schema"
      printf '\0\0{"a": [1, -2.5e3, "x", true, false, null, {"b": {}}]}' >"$dst/object"
      printf '\1^\\(\\d{3}\\) [A-Z][a-z]+( [a-z]+)*(yes|no){1,3}[^\\s,]?$\0(555) Paris yesno' >"$dst/regex" ;;
    fuzz_spec_config) # --speculative-config as vLLM spells it
      printf '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}' >"$dst/ngram"
      printf '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "disable_by_batch_size": 8}' >"$dst/min" ;;
    fuzz_jinja) # the chat templates the tree keeps, and the model's where fetched
      seed "$dst" tests/tokenizer/templates/*.jinja build/tests/jinja-templates/*.jinja ;;
    fuzz_tokenizer) # the first byte picks the tokenizer: 0, 1 built in, 2 the model's
      python3 -c '
import json, os, sys
for i, s in enumerate(json.load(open(sys.argv[1]))):
    for sel in (0, 1, 2):
        with open(os.path.join(sys.argv[2], "%d-%d" % (i, sel)), "wb") as f:
            f.write(bytes([sel]) + s.encode("utf-8", "surrogatepass"))
' tests/tokenizer/corpus.json "$dst" ;;
  esac
  return 0
}

# fuzz_one TARGET: runs it, prints its line; non-zero when it failed.
fuzz_one() {
  local t=$1 corpus=$out/$1 seeds=$out/$1-seeds log=$out/$1.log runs units cov
  rm -rf "$seeds"
  mkdir -p "$corpus" "$seeds"
  fuzz_seeds "$t" "$seeds"
  if build-fuzz/fuzz/"$t" -max_total_time="$secs" -timeout=10 -print_final_stats=1 \
       -artifact_prefix="$out/$t-" "$corpus" "$seeds" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
    units=$(grep -o 'corp: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*$')
    echo "$t: ok ($(ls "$seeds" | wc -l) seeds, $runs runs, corpus ${units:-?}, cov ${cov:-?})"
  else
    tail -n 60 "$log" >&2
    echo "$t: FAILED (its input: $(ls "$out/$t"-crash-* "$out/$t"-leak-* "$out/$t"-timeout-* "$out/$t"-oom-* 2>/dev/null | head -n 1))"
    return 1
  fi
}

if ! cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DFERRUM_FUZZ=ON -DFERRUM_TESTS=ON \
       -DFERRUM_WERROR="${FERRUM_WERROR:-OFF}" >/dev/null; then
  note "configure (clang) failed"
  exit 2
fi
all=($(cmake --build build-fuzz --target help | grep -o '\bfuzz_[a-z0-9_]*' | sort -u))
if [ ${#all[@]} -eq 0 ]; then
  note "no fuzz_* target"
  exit 2
fi
targets=("$@")
[ $# -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  # no pipe into grep -q: under pipefail, grep leaving at the first match
  # kills printf with SIGPIPE, and a listed target read as missing
  if [[ " ${all[*]} " != *" $t "* ]]; then
    note "no target $t (there are: ${all[*]})"
    exit 2
  fi
done
if ! cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}" proto_corpus >&2; then
  note "build failed"
  exit 2
fi
[ -d "$fx" ] || note "no $fx (deploy/test.sh writes it): formats targets start without seeds"
: "${FERRUM_FUZZ_TOKENIZER:=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
if [ -e "$FERRUM_FUZZ_TOKENIZER" ]; then export FERRUM_FUZZ_TOKENIZER; else unset FERRUM_FUZZ_TOKENIZER; fi
# The targets run nproc at a time (each fuzzer is one process on one
# core); their lines print in the targets' order once all are done.
[ -d "$out/proto-seeds" ] || build-fuzz/bin/proto_corpus "$out/proto-seeds" >/dev/null
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n; done
  fuzz_one "$t" >"$out/$t.line" &
done
wait
rc=0
for t in "${targets[@]}"; do
  cat "$out/$t.line"
  grep -q ': ok (' "$out/$t.line" || rc=1
done
exit $rc
