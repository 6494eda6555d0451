#!/usr/bin/env bash
# Sets up the test tools too (deploy/setup.sh --test), builds, and runs every
# test (the README's second command; CI runs it too). Extra arguments go to
# ctest (e.g. -L kv).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/deploy/setup.sh" --test
FERRUM_TESTS=ON "$root/deploy/build.sh"
cd "${FERRUM_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j2 --timeout 1200 "$@"
