#!/usr/bin/env bash
# test_image_cpu: the CPU container image (deploy/image.sh builds it) serves
# the real model as the host build does. It starts the host's
# `ferrumctl serve` and the image (podman, host network, both on loopback,
# the model folder mounted read-only at /models), waits for both /health,
# sends each the same greedy /v1/completions request and wants the same
# text; checks that every process in the container runs as the image's
# non-root user, that the image's HEALTHCHECK (`ferrumctl health`) passes,
# and that SIGTERM (podman stop) drains it to exit status 0.
# Exit 77 (skipped) when podman or the image is missing.
# Environment (ctest sets the first two): FERRUM_MODEL, FERRUM_BUILD_DIR,
# FERRUM_IMAGE (default ferrum:cpu).
set -uo pipefail
image=${FERRUM_IMAGE:-ferrum:cpu}
model=${FERRUM_MODEL:?FERRUM_MODEL: the model file}
bin=${FERRUM_BUILD_DIR:?FERRUM_BUILD_DIR: the build folder}/bin
tokens=16
name=ferrum-test-$$
tmp=$(mktemp -d)
hostpid=

say() { echo "test_image: $*"; }
skip() { say "SKIP: $*"; exit 77; }
fail() {
  say "FAIL: $*"
  echo "--- container log (end)"; podman logs --tail 30 "$name" 2>&1 | grep -v systemd
  echo "--- host server log (end)"; tail -n 30 "$tmp/host.log" 2>/dev/null
  exit 1
}
cleanup() {
  podman rm -f -t 5 "$name" >/dev/null 2>&1
  if [ -n "$hostpid" ] && kill -0 "$hostpid" 2>/dev/null; then
    kill -TERM "$hostpid"
    for _ in $(seq 100); do kill -0 "$hostpid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$hostpid" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

command -v podman >/dev/null || skip "no podman (deploy/image.sh installs it and builds $image)"
podman image exists "$image" || skip "no image $image (deploy/image.sh builds it)"
[ -f "$model" ] || fail "no model $model (deploy/fetch-model.sh fetches it)"
[ -x "$bin/ferrumctl" ] || fail "no $bin/ferrumctl"
say "$image, made $(podman image inspect --format '{{.Created}}' "$image")"

# Two free loopback ports (the kernel's picks, released just before use).
read -r hport cport < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')

# A health check that can fail: nothing listens on a port just released.
"$bin/ferrumctl" health --port "$cport" --timeout 2 >/dev/null 2>&1 && fail "ferrumctl health passed with no server"

"$bin/ferrumctl" serve --model "$model" --host 127.0.0.1 --port "$hport" \
  --rpc "ipc://$tmp/rpc.sock" >"$tmp/host.log" 2>&1 &
hostpid=$!
podman run -d --name "$name" --network host --shm-size 1g \
  -v "$(dirname "$model"):/models:ro" "$image" \
  --model "/models/$(basename "$model")" --host 127.0.0.1 --port "$cport" >"$tmp/run.log" 2>&1 ||
  fail "podman run: $(grep -v systemd "$tmp/run.log")"

# Both ready within 60 s (at most 600 polls, 0.1 s apart).
ready=0 deadline=$((SECONDS + 60))
for _ in $(seq 600); do
  [ $SECONDS -lt $deadline ] || break
  [ "$(podman inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" = true ] || fail "the container stopped"
  kill -0 "$hostpid" 2>/dev/null || fail "the host server exited"
  if "$bin/ferrumctl" health --port "$cport" --timeout 2 >/dev/null 2>&1 &&
    "$bin/ferrumctl" health --port "$hport" --timeout 2 >/dev/null 2>&1; then
    ready=1
    break
  fi
  sleep 0.1
done
[ $ready = 1 ] || fail "not ready within 60 s"

# The same greedy request to both: one line each, the token count, the
# finish reason and the text as JSON.
ask() {
  python3 - "$1" "$(basename "$model")" "$tokens" <<'PY'
import json, sys, urllib.request
port, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
body = {"model": model, "prompt": "The capital of France is", "max_tokens": n, "temperature": 0}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                             {"content-type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    out = json.load(r)
c = out["choices"][0]
print(out["usage"]["completion_tokens"], c["finish_reason"], json.dumps(c["text"]))
PY
}
got=$(ask "$cport") || fail "request to the container failed"
want=$(ask "$hport") || fail "request to the host server failed"
say "container: $got"
say "host:      $want"
read -r n finish text <<<"$got"
[ "$n" = "$tokens" ] && [ "$finish" = length ] || fail "the container gave $n tokens ($finish), asked for $tokens"
[ "$text" != '""' ] || fail "the container's text is empty"
[ "$got" = "$want" ] || fail "the container's answer differs from the host build's"

# Non-root: the id exec gets, and the uid of the container's first process
# and of its children (the worker), read on the host.
uid=$(podman exec "$name" id -u) || fail "podman exec id"
[ "$uid" != 0 ] || fail "the image's user is root"
pid1=$(podman inspect --format '{{.State.Pid}}' "$name")
procs=("$pid1" $(cat /proc/"$pid1"/task/*/children 2>/dev/null))
[ ${#procs[@]} -ge 2 ] || fail "no worker process under the container's ferrumctl (pid $pid1)"
for p in "${procs[@]}"; do
  u=$(awk '/^Uid:/ {print $2}' "/proc/$p/status")
  c=$(cat "/proc/$p/comm")
  [ "$u" = "$uid" ] || fail "$c (pid $p) runs as uid $u, not $uid"
done
say "user $uid for ${#procs[@]} processes: $(for p in "${procs[@]}"; do cat "/proc/$p/comm"; done | tr '\n' ' ')"

# The image's HEALTHCHECK.
podman healthcheck run "$name" >"$tmp/hc.log" 2>&1 || fail "HEALTHCHECK failed: $(grep -v systemd "$tmp/hc.log")"
[ "$(podman inspect --format '{{.State.Health.Status}}' "$name")" = healthy ] || fail "not healthy after the HEALTHCHECK"
say "HEALTHCHECK: $(podman inspect --format '{{(index .State.Health.Log 0).Output}}' "$name")"

# SIGTERM drains and exits 0 (podman stop sends SIGKILL after 60 s: 137).
t0=$(date +%s.%N)
podman stop -t 60 "$name" >/dev/null 2>&1 || fail "podman stop"
t1=$(date +%s.%N)
rc=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$rc" = 0 ] || fail "exit status $rc after SIGTERM"
# the log's last lines reach podman a moment after the exit: look for up to 5 s
drained=0
for _ in $(seq 50); do
  log=$(podman logs "$name" 2>&1) # not piped into grep -q: SIGPIPE under pipefail
  if grep -q 'signal 15: draining' <<<"$log"; then drained=1; break; fi
  sleep 0.1
done
[ $drained = 1 ] || fail "no drain on SIGTERM in the log"
say "SIGTERM: exit status 0 after $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
say "ok"
