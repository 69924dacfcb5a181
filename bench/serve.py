#!/usr/bin/env python3
r"""Serving benchmark: the same streaming workload against `nextok serve` and, optionally,
llama.cpp's `llama-server` on the same GGUF file, in one run.

    python3 bench/serve.py --nextok target/release/nextok --model M.gguf \
        [--llama-server "$(bench/peers/llama_server.sh)"] [--levels 1,4,16,64] [--out FILE] \
        [--nextok-args "--itl-target-ms 100"] [--llama-args=--no-repack]

For each server and each concurrency level C, C client threads send streaming
`/v1/completions` requests (prompts of mixed lengths from a fixed generator, `max_tokens`
fixed, `ignore_eos` so every request generates exactly that many tokens, temperature 0.8, a
seed per request; no two requests share a prompt, so neither server's prompt cache helps)
until `--requests` (default max(2C, 32), so a p99 is not one request) have completed. Reported per level:
requests/s, output tokens/s (completion tokens from the usage chunk, else counted chunks),
p50/p99 time to first token and inter-token latency, and memory: the server's peak resident set
so far (`VmHWM`), and for nextok the KV cache's memory (`nextok_kv_bytes_touched` of `/metrics`,
polled every 0.25 s: every block slot written at least once, alive, in the prefix cache or freed
for reuse; the most the running sequences held, `nextok_kv_bytes_reserved`, beside it) and the
peak against the file size plus that KV cache. Both servers run on 127.0.0.1 on free
ports; every loop is bounded. Each server's standard error goes to a log beside `--out`
(`<out>.<server>.log`). Progress goes to standard error; any failed request, or a server that
does not start, makes the exit status non-zero. Standard library only. Not run in CI.
"""

import argparse
import http.client
import json
import os
import random
import re
import select
import socket
import statistics
import subprocess
import sys
import threading
import time

ME = "serve.py"


def say(msg):
    print(f"{ME}: {msg}", file=sys.stderr, flush=True)


def die(msg):
    print(f"{ME}: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def log_tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


WORDS = ("the a of river mountain quiet city light old green story machine number seven "
         "under over bright slow garden window music letter morning evening paper stone").split()


def prompt(i, lo=20, hi=600):
    r = random.Random(1000 + i)
    n = r.randint(lo, hi) * 3 // 4  # about 4/3 tokens per word
    return " ".join(r.choice(WORDS) for _ in range(max(n, 1)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_health(port, deadline):
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def not_started(name, p, log, why):
    if p.poll() is None:
        p.kill()
        p.wait()
    code, hint = "", ""
    if p.returncode is not None and p.returncode < 0:
        code = f", killed by signal {-p.returncode}"
        if name == "llama-server":
            # as with llama_cpp.sh --no-repack: on a CPU that advertises AMX, llama.cpp's repacked
            # weights can crash at the first use
            hint = "; retry with --llama-args=--no-repack"
    elif p.returncode is not None:
        code = f", exit status {p.returncode}"
    print(log_tail(log), file=sys.stderr, end="")
    die(f"{name} did not start: {why}{code} (log: {log}){hint}")


def start_nextok(binary, model, max_seqs, extra, log):
    cmd = [binary, "serve", "--model", model, "--port", "0", "--max-num-seqs", str(max_seqs)] + extra
    say(f"starting: {' '.join(cmd)} (log: {log})")
    with open(log, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if select.select([p.stdout], [], [], 1.0)[0]:
            line = p.stdout.readline()
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                # keep reading its standard output so that it never blocks on a full pipe
                threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
                return p, int(m.group(1))
    not_started("nextok serve", p, log, "no `listening on` line within 300 s" if p.poll() is None else "it exited")


def start_llama(binary, model, parallel, threads, ctx, extra, log):
    port = free_port()
    cmd = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--parallel",
           str(parallel), "--cont-batching", "-t", str(threads), "-c", str(ctx)] + extra
    say(f"starting: {' '.join(cmd)} (log: {log})")
    with open(log, "w") as err:
        p = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        if wait_health(port, min(deadline, time.time() + 5)):
            return p, port
    not_started("llama-server", p, log, "/health not 200 within 300 s" if p.poll() is None else "it exited")


def one_request(port, i, max_tokens, model_name):
    # every request has its own prompt (i is unique across levels): no prefix cache hits
    body = {"prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0.8, "seed": i, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    if model_name:
        body["model"] = model_name
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    times, usage = [], None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"].get("completion_tokens")
        for ch in ev.get("choices", []):
            if ch.get("text"):
                times.append(time.perf_counter())
    c.close()
    end = time.perf_counter()
    tokens = usage if usage is not None else len(times)
    ttft = (times[0] - t0) if times else end - t0
    itl = [b - a for a, b in zip(times, times[1:])]
    return tokens, ttft, itl


def status_kb(pid, field):
    """A `/proc/<pid>/status` field in kB (`VmHWM:`, `VmRSS:`), or None without one."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def metric(port, name):
    """The value of an unlabelled metric on `/metrics`, or None."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/metrics")
        r = c.getresponse()
        text = r.read().decode(errors="replace")
        c.close()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == name:
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


class KvWatch:
    """Polls nextok's `nextok_kv_bytes_touched` and `nextok_kv_bytes_reserved` every 0.25 s while
    a level runs; keeps the most of each."""

    def __init__(self, port):
        self.port, self.most, self.reserved, self.stop = port, 0.0, 0.0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        for _ in range(4 * 3600):  # bounded: at most an hour of polling
            v = metric(self.port, "nextok_kv_bytes_touched")
            if v is not None:
                self.most = max(self.most, v)
            v = metric(self.port, "nextok_kv_bytes_reserved")
            if v is not None:
                self.reserved = max(self.reserved, v)
            if self.stop.wait(0.25):
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=10)


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run_level(port, level, total, max_tokens, model_name):
    lock = threading.Lock()
    first = 10_000 * level
    nxt = [first]
    total += first
    results, errors = [], []

    def worker():
        while True:
            with lock:
                if nxt[0] >= total:
                    return
                i = nxt[0]
                nxt[0] += 1
            try:
                r = one_request(port, i, max_tokens, model_name)
                with lock:
                    results.append(r)
            except Exception as e:  # reported, counted
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(level)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3600)
    wall = time.perf_counter() - t0
    if any(t.is_alive() for t in threads):
        with lock:
            errors.append("requests still running after 3600 s")
    tokens = sum(r[0] for r in results)
    ttfts = [r[1] for r in results]
    itls = [x for r in results for x in r[2]]
    return {
        "concurrency": level,
        "requests": len(results),
        "errors": len(errors),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(results) / wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2),
        "ttft_p50_s": pct(ttfts, 50),
        "ttft_p99_s": pct(ttfts, 99),
        "itl_p50_s": pct(itls, 50),
        "itl_p99_s": pct(itls, 99),
    }, errors


def levels_arg(text):
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"levels must be positive: {text!r}")
    return levels


def executable(what, path):
    if not path:
        die(f"{what}: empty path (did the command that prints it fail?)")
    if not os.path.isfile(path):
        die(f"{what} {path}: no such file")
    if not os.access(path, os.X_OK):
        die(f"{what} {path}: not executable")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nextok", required=True, help="the nextok binary (a release build)")
    ap.add_argument("--model", required=True, help="the GGUF file both servers load")
    ap.add_argument("--llama-server", help="llama.cpp's llama-server binary (bench/peers/llama_server.sh)")
    ap.add_argument("--nextok-args", default="", help="more `nextok serve` arguments, space-separated")
    ap.add_argument("--llama-args", default="",
                    help="more llama-server arguments, space-separated (e.g. --llama-args=--no-repack)")
    ap.add_argument("--levels", type=levels_arg, default="1,4,16,64", help="concurrency levels (default 1,4,16,64)")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default max(2C, 32); at least C)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="llama-server threads")
    ap.add_argument("--parallel", type=int, default=16, help="llama-server --parallel")
    ap.add_argument("--out", default="target/serve-bench.json")
    a = ap.parse_args()
    levels = a.levels
    if a.requests < 0 or a.max_tokens < 1:
        die("--requests must be >= 0 and --max-tokens >= 1")
    executable("--nextok", a.nextok)
    if not os.path.isfile(a.model):
        die(f"--model {a.model}: no such file")
    if a.llama_server is not None:
        executable("--llama-server", a.llama_server)
    out_dir = os.path.dirname(os.path.abspath(a.out))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        die(f"cannot create {out_dir}: {e}")
    logs = {name: f"{os.path.splitext(a.out)[0]}.{name}.log" for name in ("nextok", "llama.cpp")}
    file_bytes = os.path.getsize(a.model)
    report = {"model": a.model, "model_bytes": file_bytes, "max_tokens": a.max_tokens, "nextok_args": a.nextok_args,
              "llama_args": a.llama_args, "servers": {}}
    servers = [("nextok", lambda: start_nextok(a.nextok, a.model, max(levels), a.nextok_args.split(), logs["nextok"]),
                None)]
    if a.llama_server is not None:
        # each slot gets ctx / parallel tokens: room for the longest prompt and the output
        ctx = a.parallel * (900 + a.max_tokens)
        servers.append(("llama.cpp", lambda: start_llama(a.llama_server, a.model, a.parallel, a.threads, ctx,
                                                         a.llama_args.split(), logs["llama.cpp"]), None))
    failed = []
    for name, start, model_name in servers:
        proc, port = start()
        try:
            say(f"{name}: listening on 127.0.0.1:{port}; warm-up request")
            try:
                one_request(port, 10**6, 4, model_name)  # warm-up, not counted
            except Exception as e:
                print(log_tail(logs[name]), file=sys.stderr, end="")
                die(f"{name}: the warm-up request failed: {e} (log: {logs[name]})")
            rows = []
            for level in levels:
                total = max(a.requests, level) if a.requests else max(2 * level, 32)
                say(f"{name}: {total} requests, {level} at a time, {a.max_tokens} tokens each")
                if name == "nextok":
                    with KvWatch(port) as kv:
                        row, errors = run_level(port, level, total, a.max_tokens, model_name)
                    kv_most = kv.most
                    row["kv_reserved_peak_mb"] = round(kv.reserved / 2**20, 1)
                else:
                    row, errors = run_level(port, level, total, a.max_tokens, model_name)
                    kv_most = None
                hwm = status_kb(proc.pid, "VmHWM:")
                row["rss_peak_mb"] = None if hwm is None else round(hwm / 1024, 1)
                row["kv_peak_mb"] = None if kv_most is None else round(kv_most / 2**20, 1)
                if hwm is not None and kv_most is not None:
                    row["rss_over_file_and_kv"] = round(hwm * 1024 / (file_bytes + kv_most), 3)
                rows.append(row)
                if errors:
                    failed.append(f"{name} C={level}: {len(errors)} of {total} requests failed, first: {errors[0]}")
                elif row["requests"] != total:
                    failed.append(f"{name} C={level}: {row['requests']} of {total} requests finished within the time limit")
                print(f"{name:10} C={level:3} {row['requests_per_s']:7.2f} req/s {row['output_tokens_per_s']:8.1f} tok/s "
                      f"TTFT p50 {row['ttft_p50_s'] or 0:.3f} p99 {row['ttft_p99_s'] or 0:.3f} s  "
                      f"ITL p50 {1000 * (row['itl_p50_s'] or 0):.1f} p99 {1000 * (row['itl_p99_s'] or 0):.1f} ms"
                      f"  errors {row['errors']}"
                      + (f"  peak RSS {row['rss_peak_mb']} MB" if row["rss_peak_mb"] is not None else "")
                      + (f" (KV {row['kv_peak_mb']} MB, of it held by running sequences at most "
                         f"{row['kv_reserved_peak_mb']} MB; / (file + KV) {row['rss_over_file_and_kv']})"
                         if "rss_over_file_and_kv" in row else ""), flush=True)
            report["servers"][name] = rows
        finally:
            say(f"{name}: stopping")
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print("wrote", a.out)
    if failed:
        for f in failed:
            print(f"{ME}: error: {f}", file=sys.stderr)
        die(f"{len(failed)} level(s) had failed requests (server logs: {', '.join(logs[n] for n, _, _ in servers)})")


if __name__ == "__main__":
    main()
