#!/usr/bin/env python3
r"""nextok on Ray Serve (`nextok.ray`), measured beside `nextok serve` in one run.

    python bench/ray_serve.py overhead --nextok target/release/nextok --model M.gguf [--levels 1,16,64]
    python bench/ray_serve.py routing --model M.gguf [--families 8 --per-family 8 --prefix-words 450]

Run with a Python that has `ray[serve]` and the nextok wheel (scripts/test-ray.sh keeps one in
`.testdata/venv-ray`). A local Ray cluster is started in process (node IP 127.0.0.1, Ray Serve's
proxy on a free 127.0.0.1 port).

`overhead`: the streaming workload of bench/serve.py (prompts of mixed lengths, no shared
prefix, `ignore_eos`, fixed `max_tokens`) at each concurrency level C, first against
`nextok serve` alone, then through Ray with one replica of the same model, level by level;
output tokens/s and p50 time to first token, and the ratios.

`routing`: 2 replicas; `--families` prompt families, each a long shared prefix and a short
question of its own, `--per-family` requests each, sent in a shuffled order by 8 clients;
once with `nextok.ray`'s prefix-affinity router, once with Ray Serve's default
(power of two choices). Reported: the prefix-cache hit rate (cached prompt tokens / prompt
tokens, from each answer's usage) and p50/p99 time to first token.

Every loop is bounded; progress goes to standard error, a JSON summary to standard output.
Not run in CI.
"""

import argparse
import http.client
import json
import os
import random
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve as serve_bench  # noqa: E402  (bench/serve.py)


def say(msg):
    print(f"ray_serve.py: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ray(http_port):
    import ray
    from ray import serve

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": http_port})
    return serve


def deploy(serve, app, port):
    serve.run(app, name="nextok", route_prefix="/", blocking=False)
    if not serve_bench.wait_health(port, time.time() + 600):
        raise SystemExit("the Ray endpoint did not become healthy")


def overhead(a):
    import nextok.ray as nray

    levels = [int(x) for x in a.levels.split(",")]
    proc, sport = serve_bench.start_nextok(a.nextok, a.model, a.max_num_seqs, [], a.log + ".serve.log")
    rport = free_port()
    serve = start_ray(rport)
    deploy(serve, nray.build_app(a.model, num_replicas=1, num_cpus=1, max_num_seqs=a.max_num_seqs), rport)
    rows = []
    try:
        for c in levels:
            total = max(2 * c, a.min_requests)
            out = {}
            for name, port in (("serve", sport), ("ray", rport)):
                say(f"C={c}: {name}, {total} requests of {a.max_tokens} tokens")
                t0 = time.perf_counter()
                res, errs = serve_bench.run_level(port, c, total, a.max_tokens, None)
                if errs:
                    raise SystemExit(f"{name} C={c}: {len(errs)} requests failed: {errs[:3]}")
                out[name] = res
                say(f"  {name}: {json.dumps(res)} ({time.perf_counter() - t0:.1f} s)")
            rows.append({"C": c, **out})
    finally:
        serve.shutdown()
        proc.terminate()
    for r in rows:
        s, y = r["serve"], r["ray"]
        r["tokens_per_s_ratio"] = y["output_tokens_per_s"] / s["output_tokens_per_s"]
        r["ttft_p50_ratio"] = y["ttft_p50_s"] / s["ttft_p50_s"]
    return rows


FAMILY_WORDS = ("policy contract engine river garden report market museum harbour orchestra "
                "forest railway library clinic factory theatre").split()


def family_prefix(f, words):
    r = random.Random(7000 + f)
    topic = FAMILY_WORDS[f % len(FAMILY_WORDS)]
    body = " ".join(r.choice(serve_bench.WORDS) for _ in range(words))
    return f"You answer questions about the {topic} document below.\n\n{body}\n\n"


def one(port, prompt, seed):
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0.8, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:300]!r}")
    ttft, usage = None, None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"]
        # the first token's chunk (its text may be held back, as a partial character)
        if ttft is None and ev.get("choices"):
            ttft = time.perf_counter() - t0
    c.close()
    return ttft, usage["prompt_tokens"], usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)


def routing_run(port, a):
    jobs = [(f, q) for f in range(a.families) for q in range(a.per_family)]
    random.Random(11).shuffle(jobs)
    prefixes = [family_prefix(f, a.prefix_words) for f in range(a.families)]
    lock = threading.Lock()
    results, errors = [], []
    it = iter(enumerate(jobs))

    def worker():
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            i, (f, q) = nxt
            try:
                r = one(port, prefixes[f] + f"Question {q}: what is item {q * 7 + f}?", 100 + i)
                with lock:
                    results.append(r)
            except Exception as e:
                with lock:
                    errors.append(str(e))

    threads = [threading.Thread(target=worker) for _ in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3600)
    if errors:
        raise SystemExit(f"{len(errors)} requests failed: {errors[:3]}")
    ttfts = [r[0] * 1e3 for r in results]
    prompt = sum(r[1] for r in results)
    cached = sum(r[2] for r in results)
    return {
        "requests": len(results),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt,
        "ttft_p50_ms": statistics.median(ttfts),
        "ttft_p99_ms": serve_bench.pct(ttfts, 99),
    }


def routing(a):
    import nextok.ray as nray

    port = free_port()
    serve = start_ray(port)
    rows = {}
    try:
        for router in ("prefix", "ray"):
            deploy(serve, nray.build_app(a.model, num_replicas=2, num_cpus=0.5, router=router,
                                         max_num_seqs=a.max_num_seqs), port)
            say(f"router {router}: {a.families} families x {a.per_family} requests")
            rows[router] = routing_run(port, a)
            say(f"  {json.dumps(rows[router])}")
            serve.delete("nextok")
    finally:
        serve.shutdown()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--nextok", required=True)
    o.add_argument("--model", required=True)
    o.add_argument("--levels", default="1,16,64")
    o.add_argument("--max-tokens", type=int, default=64)
    o.add_argument("--min-requests", type=int, default=16)
    o.add_argument("--max-num-seqs", type=int, default=64)
    o.add_argument("--log", default="/tmp/nextok-ray-bench")
    r = sub.add_parser("routing")
    r.add_argument("--model", required=True)
    r.add_argument("--families", type=int, default=8)
    r.add_argument("--per-family", type=int, default=8)
    r.add_argument("--prefix-words", type=int, default=450)
    r.add_argument("--clients", type=int, default=8)
    r.add_argument("--max-num-seqs", type=int, default=64)
    a = p.parse_args()
    out = overhead(a) if a.what == "overhead" else routing(a)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
