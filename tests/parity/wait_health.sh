# Sourced by the device scripts: wait_health PORT [PID] waits (at most 600
# polls, 0.5 s apart) until the server on 127.0.0.1:PORT answers /health
# with 200; it gives up at once when PID (if given) has exited. The array
# WAIT_IN, when set, is a command prefix that runs the poll elsewhere (in
# a network namespace: WAIT_IN=(ip netns exec NAME)).
wait_health() {
  for _ in $(seq 1 600); do
    ${WAIT_IN[@]+"${WAIT_IN[@]}"} python3 -c \
      "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=1)" 2>/dev/null && return 0
    [ -z "${2:-}" ] || kill -0 "$2" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}
