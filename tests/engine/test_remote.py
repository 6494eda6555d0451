#!/usr/bin/env python3
"""test_remote.py - a remote worker over tcp:// with CURVE, end to end.

Two network namespaces the test creates, joined by a veth pair: the
coordinator (`ferrumctl serve --remote-workers 1`) and its clients live in
one ("host C", 10.213.N.1), the worker in the other ("host W", 10.213.N.2)
with its own mount namespace and an empty /dev/shm, so it cannot see the
coordinator's shared memory: its block tables come in the step descriptors.
Every tcp:// socket uses CURVE keys from `ferrumctl keygen`.

What is checked, on the real SmolLM2:
- the remote worker gives the same greedy text as a local worker (a plain
  `ferrumctl serve` in host C), for several prompts, also with a prompt
  that hits the prefix cache;
- a client whose key is not in --curve-clients is refused, so is one
  without CURVE; a server asked to bind a non-loopback tcp:// address
  without keys refuses to start;
- the remote worker killed mid-generation and started again: the request
  finishes with the reference text (recomputed; the prefix cache forgot
  the blocks of the pool that died).

Needs root (network namespaces); exit 77 (skip) without it or without the
model. Run: FERRUMCTL=build/bin/ferrumctl FERRUM_MODEL=models/... python test_remote.py
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

FERRUMCTL = os.environ.get("FERRUMCTL", "")
WORKER = os.path.join(os.path.dirname(FERRUMCTL), "ferrum-worker")
MODEL = os.environ.get("FERRUM_MODEL", "")
NET = 10 + os.getpid() % 240  # 10.213.NET.0/30: one per run
NS_C, NS_W = "frc%d" % os.getpid(), "frw%d" % os.getpid()
ADDR_C = "10.213.%d.1" % NET
RPC, WEP = "tcp://%s:5555" % ADDR_C, "tcp://%s:5556" % ADDR_C
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
           "The capital of France is"]  # the last one again: a prefix-cache hit
N_OUT = 24


def sh(*args, check=True, **kw):
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=60, **kw)


def netns_setup():
    sh("ip", "netns", "add", NS_C)
    sh("ip", "netns", "add", NS_W)
    va, vb = "frva%d" % NET, "frvb%d" % NET
    sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
    sh("ip", "link", "set", va, "netns", NS_C)
    sh("ip", "link", "set", vb, "netns", NS_W)
    sh("ip", "-n", NS_C, "addr", "add", ADDR_C + "/30", "dev", va)
    sh("ip", "-n", NS_W, "addr", "add", "10.213.%d.2/30" % NET, "dev", vb)
    for ns, dev in ((NS_C, va), (NS_W, vb)):
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def netns_teardown():
    for ns in (NS_C, NS_W):
        sh("ip", "netns", "del", ns, check=False)


class Remote(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ferrum-remote-")
        for name in ("server", "worker", "client", "stranger"):
            sh(FERRUMCTL, "keygen", "--out", os.path.join(cls.dir, name))
        with open(os.path.join(cls.dir, "clients"), "w") as f:
            for name in ("worker", "client"):
                with open(os.path.join(cls.dir, name + ".pub")) as pub:
                    f.write(pub.read())
        netns_setup()
        cls.procs = []
        cls.reference = cls.local_reference()
        cls.serve = cls.start([FERRUMCTL, "serve", "--model", MODEL, "--no-http", "--rpc", RPC, "--worker-endpoint",
                               WEP, "--remote-workers", "1", "--curve-key", cls.key("server.key"), "--curve-clients",
                               cls.key("clients"), "--max-model-len", "512", "--threads", "2"], "serve.log")
        cls.worker = cls.start_worker()
        cls.wait_ready()

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in cls.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        netns_teardown()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def key(cls, name):
        return os.path.join(cls.dir, name)

    @classmethod
    def start(cls, argv, log, ns=NS_C):
        env = dict(os.environ, XDG_RUNTIME_DIR=cls.dir)
        with open(cls.key(log), "a") as out:
            p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=out, stderr=subprocess.STDOUT, env=env)
        cls.procs.append(p)
        return p

    @classmethod
    def start_worker(cls):
        """ferrum-worker in host W (--coordinator, the other name of --connect): its own mount
        namespace, an empty /dev/shm."""
        cmd = "mount -t tmpfs tmpfs /dev/shm && exec %s --coordinator %s --rank 0 --world-size 1 --curve-key %s " \
              "--server-key %s" % (WORKER, WEP, cls.key("worker.key"), cls.key("server.pub"))
        return cls.start(["unshare", "--mount", "sh", "-c", cmd], "worker.log", ns=NS_W)

    @classmethod
    def log(cls, name):
        with open(cls.key(name)) as f:
            return f.read()

    @classmethod
    def submit(cls, prompt, keys=("server.pub", "client.key"), timeout=180):
        argv = ["ip", "netns", "exec", NS_C, FERRUMCTL, "submit", "--rpc", RPC, "--prompt", prompt, "--ignore-eos",
                "--max-tokens", str(N_OUT), "--temperature", "0"]
        if keys:
            argv += ["--server-key", cls.key(keys[0]), "--curve-key", cls.key(keys[1])]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, XDG_RUNTIME_DIR=cls.dir))

    @classmethod
    def wait_ready(cls, seconds=120):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if cls.serve.poll() is not None:
                raise AssertionError("serve exited: " + cls.log("serve.log")[-3000:])
            if "ready: RPC" in cls.log("serve.log"):
                return
            time.sleep(0.2)
        raise AssertionError("not ready in %d s: %s\n%s" % (seconds, cls.log("serve.log")[-2000:],
                                                              cls.log("worker.log")[-2000:]))

    @classmethod
    def local_reference(cls):
        """The same prompts on a plain server with its own (local) worker."""
        sock = "ipc://%s/local.sock" % cls.dir
        p = cls.start([FERRUMCTL, "serve", "--model", MODEL, "--no-http", "--rpc", sock, "--max-model-len", "512",
                       "--threads", "2"], "local.log")
        out = []
        try:
            for prompt in PROMPTS:
                r = None
                for _ in range(600):  # up to 60 s for the server to come up
                    r = subprocess.run(["ip", "netns", "exec", NS_C, FERRUMCTL, "submit", "--rpc", sock, "--prompt",
                                        prompt, "--ignore-eos", "--max-tokens", str(N_OUT), "--temperature", "0"],
                                       capture_output=True, text=True, timeout=180)
                    if r.returncode == 0:
                        break
                    time.sleep(0.1)
                assert r.returncode == 0, r.stderr + cls.log("local.log")[-2000:]
                out.append(r.stdout)
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)
        return out

    def test_1_same_tokens_as_a_local_worker(self):
        for prompt, ref in zip(PROMPTS, self.reference):
            r = self.submit(prompt)
            self.assertEqual(r.returncode, 0, r.stderr + self.log("serve.log")[-2000:])
            self.assertEqual(r.stdout, ref, prompt)
            self.assertGreater(len(r.stdout.strip()), 10)
        self.assertIn("remote worker 0 joined", self.log("serve.log"))

    def test_2_unknown_clients_are_refused(self):
        r = self.submit(PROMPTS[0], keys=("server.pub", "stranger.key"), timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("refused this client's key", r.stderr)
        r = self.submit(PROMPTS[0], keys=None, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("handshake", r.stderr)
        self.assertIn("refused a CURVE connection", self.log("serve.log"))

    def test_3_no_keys_no_wide_tcp(self):
        r = subprocess.run(["ip", "netns", "exec", NS_C, FERRUMCTL, "serve", "--model", MODEL, "--no-http", "--rpc",
                            "tcp://%s:5557" % ADDR_C], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, XDG_RUNTIME_DIR=tempfile.mkdtemp(dir=self.dir)))
        self.assertEqual(r.returncode, 1)
        self.assertIn("--curve-key", r.stderr)

    def test_4_killed_worker_loses_nothing(self):
        n_out = 400  # about 4 s on two cores: the kill lands mid-generation
        argv = ["ip", "netns", "exec", NS_C, FERRUMCTL, "submit", "--rpc", RPC, "--prompt", PROMPTS[1],
                "--ignore-eos", "--max-tokens", str(n_out), "--temperature", "0", "--server-key",
                self.key("server.pub"), "--curve-key", self.key("client.key")]
        env = dict(os.environ, XDG_RUNTIME_DIR=self.dir)
        ref = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)
        self.assertEqual(ref.returncode, 0, ref.stderr)
        job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(1.0)
        pids = [int(p) for p in sh("pgrep", "-f", "ferrum-worker --coordinator " + WEP, check=False).stdout.split()]
        self.assertTrue(pids, "no remote worker to kill")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        type(self).worker = self.start_worker()
        out, err = job.communicate(timeout=240)
        self.assertEqual(job.returncode, 0, err + self.log("serve.log")[-2000:])
        self.assertEqual(len(ref.stdout.split()) > 100, True, ref.stdout)
        self.assertEqual(out, ref.stdout)
        log = self.log("serve.log")
        self.assertTrue("said hello again" in log or "went silent" in log, log[-2000:])
        self.assertEqual(log.count("remote worker 0 joined"), 2, log[-2000:])


if __name__ == "__main__":
    if not FERRUMCTL or not os.path.exists(MODEL):
        print("skip: FERRUMCTL and FERRUM_MODEL needed", file=sys.stderr)
        sys.exit(77)
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        print("skip: network namespaces need root, ip (iproute2) and unshare", file=sys.stderr)
        sys.exit(77)
    unittest.main(verbosity=2)
