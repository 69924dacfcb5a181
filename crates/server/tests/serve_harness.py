"""Shared by the server's Python tests: start `nextok serve` on an ephemeral 127.0.0.1 port,
raw HTTP requests, the server's metrics and resident memory. Every wait is bounded."""

import json
import os
import re
import select
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

STARTUP_SECONDS = 180


class Server:
    """A running `nextok serve`: `base` URL, `proc`, and its log file."""

    def __init__(self, binary, model, *args):
        self.log = tempfile.NamedTemporaryFile(prefix="nextok-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [binary, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.base = None
        deadline = time.time() + STARTUP_SECONDS
        while time.time() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            if ready:
                line = self.proc.stdout.readline()
                m = re.search(r"listening on (http://127\.0\.0\.1:(\d+))", line)
                if m:
                    self.base = m.group(1)
                    self.port = int(m.group(2))
                    break
        if self.base is None:
            self.proc.kill()
            raise RuntimeError("the server did not start: " + self.log_tail())

    def log_tail(self, n=4000):
        with open(self.log.name, errors="replace") as f:
            return f.read()[-n:]

    def http(self, method, path, body=None, key=None, timeout=120, raw=None, headers=None):
        """A request; returns (status, headers, text). `body` is sent as JSON, `raw` as is."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("content-type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        if key:
            req.add_header("authorization", "Bearer " + key)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read().decode()

    def metric(self, name):
        status, _, text = self.http("GET", "/metrics")
        assert status == 200, status
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError("no metric " + name)

    def rss_mb(self):
        """Resident memory of the server process in MiB (from /proc), or None without /proc."""
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024.0
        except OSError:
            return None
        return None

    def stop(self, timeout=60):
        """SIGTERM, then the exit code (None if it had to be killed)."""
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            return None

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


class Endpoint(Server):
    """An endpoint already serving (started by the caller, who also stops it): the same
    requests as to a `Server`, no process of its own."""

    def __init__(self, base):
        self.base = base.rstrip("/")
        self.port = int(self.base.rsplit(":", 1)[1])
        self.proc = None
        self.stop_name = "still_serving_after_the_suite"

    def log_tail(self, n=4000):
        return "(the endpoint's logs are its own)"

    def rss_mb(self):
        return None

    def stop(self, timeout=60):
        """Still serving: `/health` answers 200 (the caller stops the endpoint)."""
        status, _, _ = self.http("GET", "/health")
        return 0 if status == 200 else status

    def close(self):
        pass


def nested_schema(kind, depth):
    """A JSON schema nesting `depth` levels of `items`, `additionalProperties` or `properties`
    (each `properties` step is two levels of the schema's own JSON) around an integer."""
    s = {"type": "integer"}
    for i in range(depth):
        if kind == "items":
            s = {"type": "array", "items": s}
        elif kind == "additionalProperties":
            s = {"type": "object", "additionalProperties": s}
        else:
            s = {"type": "object", "properties": {f"k{i}": s}, "required": [f"k{i}"]}
    return s


def run_tests(tests, server, only_env):
    """Runs `tests` in order (all, or those whose name contains $`only_env`), then SIGTERM:
    prints one line per test and `N passed, M failed`; returns the exit code."""
    import sys
    import traceback

    passed = failed = 0
    only = os.environ.get(only_env)
    try:
        for t in tests:
            if only and only not in t.__name__ and not getattr(t, "always", False):
                continue
            t0 = time.time()
            try:
                t()
                passed += 1
                print(f"ok   {t.__name__} ({time.time() - t0:.1f} s)", file=sys.stderr)
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}", file=sys.stderr)
                traceback.print_exc()
        code = server.stop()
        name = getattr(server, "stop_name", "sigterm_exits_0")
        if code == 0:
            passed += 1
            print(f"ok   {name}", file=sys.stderr)
        else:
            failed += 1
            print(f"FAIL {name} (exit {code})", file=sys.stderr)
    finally:
        if failed:
            print("server log (tail):\n" + server.log_tail(), file=sys.stderr)
        server.close()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
