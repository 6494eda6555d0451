#!/usr/bin/env bash
# test_dockerfile_lint: hadolint (the test venv's, deploy/requirements-test.txt)
# finds nothing at warning level or above in deploy/docker/Dockerfile.*,
# with deploy/docker/.hadolint.yaml's settings. First it lints a Dockerfile
# with known faults and wants them reported, so that a hadolint that passes
# everything cannot pass this test.
# Exit 77 (skipped) without the venv's hadolint (deploy/setup.sh --test).
# Environment (ctest sets both): FERRUM_SOURCE_DIR, FERRUM_PYTHON.
set -uo pipefail
src=${FERRUM_SOURCE_DIR:?FERRUM_SOURCE_DIR: the source tree}
hadolint=$(dirname "${FERRUM_PYTHON:?FERRUM_PYTHON: the test venv python}")/hadolint
[ -x "$hadolint" ] || { echo "SKIP: no $hadolint (deploy/setup.sh --test installs it)"; exit 77; }
config=$src/deploy/docker/.hadolint.yaml
"$hadolint" --version

# Known faults: no tag (DL3006), apt lists kept (DL3009), cd in RUN (DL3003).
bad=$(printf 'FROM debian\nRUN apt-get update && apt-get install -y --no-install-recommends gcc\nRUN cd /tmp && make\n' |
  "$hadolint" --config "$config" --no-color - 2>&1)
for rule in DL3006 DL3009 DL3003; do
  grep -q "$rule" <<<"$bad" || { echo "FAIL: hadolint missed $rule in a faulty Dockerfile:"; echo "$bad"; exit 1; }
done

files=("$src"/deploy/docker/Dockerfile.*)
[ -e "${files[0]}" ] || { echo "FAIL: no deploy/docker/Dockerfile.*"; exit 1; }
if "$hadolint" --config "$config" --no-color "${files[@]}"; then
  echo "hadolint: ${#files[@]} Dockerfiles clean: ${files[*]#"$src"/}"
else
  echo "FAIL: hadolint's findings above"
  exit 1
fi
