#!/usr/bin/env python3
"""Soak test: `ferrumctl serve` (the real model, CPU) under streams, random
cancels, worker kills and slow clients, for a fixed time. Everything is on
loopback; every loop is bounded in count and time.

usage: soak.py FERRUMCTL MODEL [--minutes 10] [--clients 16] [--kill-every 45]

Prints requests, failures, truncated streams, and the server's and worker's
RSS and open fds at the start and the end (docs/bench/reliability.md).
A request fails when it gets a 5xx, a connection error, or a stream that
ends without a finish_reason chunk and [DONE]; canceled requests (the client
hangs up on purpose) and 503s while a worker restarts are counted apart."""
import argparse, http.client, json, os, random, signal, socket, subprocess, sys, tempfile, threading, time

def proc_stats(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) // 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))

def worker_pid(serve_pid):
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    st = f.read().split(")")[-1].split()
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    cmd = f.read()
                if int(st[1]) == serve_pid and b"ferrum-worker" in cmd:
                    return int(p)
            except OSError:
                pass
    return None

class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {"ok": 0, "failed": 0, "truncated": 0, "canceled": 0, "unavailable": 0, "slow_cut": 0}
        self.errors = []
    def add(self, k, why=None):
        with self.lock:
            self.c[k] += 1
            if why and len(self.errors) < 20:
                self.errors.append(why)

def one_request(port, counts, rng):
    stream = rng.random() < 0.7
    cancel_after = rng.randint(1, 6) if stream and rng.random() < 0.2 else None
    body = {"model": "soak", "messages": [{"role": "user", "content": rng.choice(
        ["Hi", "Name three colors.", "What is 2+2?", "Write a line about the sea.", "x " * rng.randint(1, 400)])}],
        "max_tokens": rng.randint(4, 48), "stream": stream, "temperature": 0.7, "seed": rng.randint(0, 1 << 30)}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        r = conn.getresponse()
        if r.status == 503:
            r.read(); counts.add("unavailable"); return
        if r.status != 200:
            counts.add("failed", f"status {r.status}: {r.read()[:200]!r}"); return
        if not stream:
            j = json.loads(r.read())
            ok = j["choices"][0].get("finish_reason") in ("stop", "length")
            counts.add("ok" if ok else "failed", None if ok else f"no finish_reason: {j}")
            return
        finish, done, chunks = None, False, 0
        while True:
            line = r.fp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                done = True
                break
            chunks += 1
            obj = json.loads(data)
            if "error" in obj:
                finish = "error"
            elif obj.get("choices") and obj["choices"][0].get("finish_reason"):
                finish = obj["choices"][0]["finish_reason"]
            if cancel_after and chunks >= cancel_after:
                conn.sock.shutdown(socket.SHUT_RDWR)
                counts.add("canceled")
                return
        if done and finish in ("stop", "length"):
            counts.add("ok")
        elif done and finish == "error":
            counts.add("unavailable")  # ended server-side with an error object: told, not lost
        else:
            counts.add("truncated", f"stream ended: finish {finish}, [DONE] {done}, {chunks} chunks")
    except (OSError, http.client.HTTPException, ValueError) as e:
        counts.add("failed", f"{type(e).__name__}: {e}")
    finally:
        conn.close()

def client_loop(port, counts, deadline, seed):
    rng = random.Random(seed)
    while time.time() < deadline:
        one_request(port, counts, rng)

def slow_client(port, counts, deadline):
    """Sends one header byte every 2 s: the server must cut it (its request
    deadline), not hold a slot for ever."""
    while time.time() < deadline:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        t0 = time.time()
        try:
            for b in b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
                s.send(bytes([b]))
                time.sleep(2)
                if time.time() > deadline:
                    break
        except OSError:
            counts.add("slow_cut")
        finally:
            s.close()
        if time.time() - t0 > 120:
            counts.add("failed", "a slow client held its connection over 120 s")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ferrumctl"); ap.add_argument("model")
    ap.add_argument("--minutes", type=float, default=10); ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--slow", type=int, default=8); ap.add_argument("--kill-every", type=float, default=45)
    a = ap.parse_args()
    rt = tempfile.mkdtemp(prefix="ferrum-soak-")
    env = dict(os.environ, XDG_RUNTIME_DIR=rt, FERRUM_LOG="warn")
    port = 18700 + os.getpid() % 500
    log = open(os.path.join(rt, "serve.log"), "w")
    srv = subprocess.Popen([a.ferrumctl, "serve", "--model", a.model, "--port", str(port),
                            "--max-num-seqs", "32", "--restart-backoff-max", "2000", "--served-model-name", "soak"], env=env, stdout=log, stderr=log)
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", "/health")
            if c.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    else:
        sys.exit("server did not come up")
    wp = worker_pid(srv.pid)
    start = {"serve": proc_stats(srv.pid), "worker": proc_stats(wp)}
    counts, kills = Counts(), 0
    deadline = time.time() + a.minutes * 60
    threads = [threading.Thread(target=client_loop, args=(port, counts, deadline, i)) for i in range(a.clients)]
    threads += [threading.Thread(target=slow_client, args=(port, counts, deadline)) for _ in range(a.slow)]
    for t in threads:
        t.start()
    next_kill = time.time() + a.kill_every
    while time.time() < deadline:
        time.sleep(1)
        if time.time() >= next_kill:
            wp = worker_pid(srv.pid)
            if wp:
                os.kill(wp, signal.SIGKILL); kills += 1
            next_kill = time.time() + a.kill_every * random.uniform(0.5, 1.5)
        if srv.poll() is not None:
            counts.add("failed", f"serve exited with {srv.returncode}"); break
    for t in threads:
        t.join(timeout=180)
    time.sleep(3)  # the last restart settles
    wp = worker_pid(srv.pid)
    end = {"serve": proc_stats(srv.pid), "worker": proc_stats(wp) if wp else (0, 0)}
    srv.send_signal(signal.SIGTERM)
    rc = srv.wait(timeout=60)
    c = counts.c
    total = c["ok"] + c["failed"] + c["truncated"] + c["canceled"] + c["unavailable"]
    print(f"minutes {a.minutes}, clients {a.clients}, slow clients {a.slow}, worker kills {kills}")
    print(f"requests {total}: ok {c['ok']}, canceled by the client {c['canceled']}, "
          f"unavailable/told (503 or error chunk) {c['unavailable']}, failed {c['failed']}, truncated {c['truncated']}; "
          f"slow clients cut {c['slow_cut']}")
    for k in ("serve", "worker"):
        print(f"{k}: RSS {start[k][0]} -> {end[k][0]} MiB, fds {start[k][1]} -> {end[k][1]}")
    print(f"serve exit {rc}")
    for e in counts.errors:
        print("  ", e)
    sys.exit(0 if c["failed"] == 0 and c["truncated"] == 0 and rc == 0 else 1)

if __name__ == "__main__":
    main()
