#!/usr/bin/env bash
# Configures and builds ferrum into build/ (or $FERRUM_BUILD_DIR).
#   FERRUM_WERROR=ON     warnings are errors (CI)
#   FERRUM_CUDA=ON       also build the CUDA backend (needs nvcc)
#   FERRUM_SANITIZE=...  address;undefined or thread
#   FERRUM_TESTS=ON|OFF  build the test suites (default: ON when Check is
#                        installed, as deploy/setup.sh --test does)
#   FERRUM_BUILD_TARGETS="a b"  only these targets (default: all)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRUM_BUILD_DIR:-$root/build}
tests=${FERRUM_TESTS:-$(pkg-config --exists check 2>/dev/null && echo ON || echo OFF)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=${FERRUM_BUILD_TYPE:-RelWithDebInfo} \
  -DFERRUM_WERROR=${FERRUM_WERROR:-OFF} -DFERRUM_CUDA=${FERRUM_CUDA:-OFF} \
  -DFERRUM_SANITIZE="${FERRUM_SANITIZE:-}" -DFERRUM_TESTS="$tests" >/dev/null
targets=()
for t in ${FERRUM_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j"$(nproc)" ${targets[@]+"${targets[@]}"}
