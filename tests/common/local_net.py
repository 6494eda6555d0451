"""Loopback helpers shared by the Python end-to-end tests."""
import http.client
import socket
import time


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_healthy(proc, port, seconds=120):
    """Waits until the server PROC on 127.0.0.1:PORT answers GET /health with
    200 (no API key needed); raises with its stderr if it exits first, or
    after SECONDS."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError("ferrumctl serve exited: %s" % err)
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            ok = c.getresponse().status == 200
            c.close()
            if ok:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("the server did not become healthy in %d s" % seconds)
