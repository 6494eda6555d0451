"""`ferrumctl serve` on 127.0.0.1 for the Python end-to-end tests: a private
runtime folder (XDG_RUNTIME_DIR), a free port, its log in the folder, a
bounded wait for /health, plain HTTP requests, and a SIGTERM stop."""
import http.client
import json
import os
import signal
import subprocess
import time

from local_net import free_port
from temp_dir import temp_dir


class LocalServer:
    def __init__(self, ferrumctl, args, prefix="ferrum-test-", ready_s=120):
        """Starts `ferrumctl serve --port P ARGS` and waits until /health says 200."""
        self.dir = temp_dir(prefix)
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "serve.log"), "w+")
        self.proc = subprocess.Popen([ferrumctl, "serve", "--port", str(self.port), *args], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=dict(os.environ, XDG_RUNTIME_DIR=self.dir))
        self.wait_healthy(ready_s)

    def wait_healthy(self, seconds):
        deadline = time.time() + seconds
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("server exited: " + self.log_text()[-3000:])
            try:
                if self.request("GET", "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("server not healthy in %d s: %s" % (seconds, self.log_text()[-3000:]))

    def log_text(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def request(self, method, path, body=None, timeout=120, headers=None):
        """(status, body bytes); a dict or list body is sent as JSON, bytes or
        str as they are; headers are added to the JSON content type."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=dict({"Content-Type": "application/json"}, **(headers or {})))
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def json(self, method, path, body=None, timeout=120):
        """(status, the body parsed as JSON, or its text when it is not JSON)."""
        status, data = self.request(method, path, body, timeout)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data.decode()

    def openai(self, timeout=120, api_key="none"):
        """The official openai client on this server."""
        import openai
        return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % self.port, api_key=api_key, timeout=timeout,
                             max_retries=0)

    def worker_pids(self):
        """pids of the ferrum-worker children, by rank."""
        out = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if ppid == self.proc.pid and b"--rank" in argv:
                out[int(argv[argv.index(b"--rank") + 1])] = int(d)
        return out

    def stop(self, seconds=60):
        """SIGTERM (drain), then SIGKILL after seconds; the exit status
        (negative: the signal that ended it)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return self.proc.returncode
