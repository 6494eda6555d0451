#!/usr/bin/env python3
"""Where one step's time goes in a running `ferrumctl serve`.

Runs a command (usually `ferrumctl bench ...`) between two reads of the
server's /metrics and prints, per step of that span:

  interval     wall time of the span / steps the coordinator completed
  round trip   step sent -> last rank's result (ferrum:step_round_trip_seconds_total)
  rank r step  descriptor decoded -> result sent, on rank r (worker_step_seconds_total)
  forward      of it, the forward pass (worker_forward_seconds_total)
  sample       of it, sampling on rank 0, the device's wait included

interval - round trip is the coordinator's share (result in -> next step out);
round trip - rank 0 step is the transport's (ZeroMQ, msgpack, wake-ups).

usage: step_time.py PORT -- COMMAND...
"""
import re
import subprocess
import sys
import time
import urllib.request


def read_metrics(port):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r'ferrum:(\w+)\{([^}]*)\} (\S+)$', line)
        if not m:
            continue
        rank = re.search(r'rank="(\d+)"', m.group(2))
        out[(m.group(1), int(rank.group(1)) if rank else None)] = float(m.group(3))
    return out


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    port = int(sys.argv[1])
    before = read_metrics(port)
    t0 = time.monotonic()
    rc = subprocess.call(sys.argv[3:])
    wall = time.monotonic() - t0
    after = read_metrics(port)
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    steps = d.get(("steps_total", None), 0)
    if steps <= 0:
        sys.exit("no steps ran")
    us = lambda v: "%8.1f us" % (v / steps * 1e6)
    print("steps %d in %.2f s" % (steps, wall))
    print("interval      %s" % us(wall))
    print("round trip    %s" % us(d[("step_round_trip_seconds_total", None)]))
    for r in sorted(k[1] for k in d if k[0] == "worker_steps_total"):
        print("rank %d step   %s  (forward %s, sample %s)" % (
            r, us(d[("worker_step_seconds_total", r)]), us(d[("worker_forward_seconds_total", r)]),
            us(d[("worker_sample_seconds_total", r)])))
    sys.exit(rc)


if __name__ == "__main__":
    main()
