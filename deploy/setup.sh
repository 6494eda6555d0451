#!/usr/bin/env bash
# Installs everything ferrum's build and tests need on Debian 12 (as root),
# creates the test virtual environment in .venv/ and fetches the default model
# into models/. Safe to run again: every step is skipped when already done.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

debs=(build-essential cmake pkg-config git clang libclang-rt-14-dev
      libzmq3-dev libmsgpack-dev check libsubunit-dev libpcre2-dev
      liburing-dev libmicrohttpd-dev libjansson-dev libpng-dev
      python3 python3-venv python3-dev)
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
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
if ! .venv/bin/python -c 'import llama_cpp, gguf, tokenizers, numpy, openai, jinja2' 2>/dev/null; then
  .venv/bin/pip install -q --upgrade pip
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    .venv/bin/pip install -q -r deploy/requirements-test.txt
fi

"$root/deploy/fetch-model.sh"
echo "setup: ok" >&2
