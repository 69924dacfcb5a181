#!/usr/bin/env python3
"""nextok on a real Ray cluster on this machine (`nextok.ray`), against `nextok serve`.

Usage: ray_cluster.py NEXTOK_BINARY MODEL.gguf OPENAI_CLIENT_SCRIPT

Starts a Ray head node and a worker node with `ray start` (node IP 127.0.0.1, each in its own
process group), deploys `nextok.ray.build_app` with 2 replicas (one per node) behind Ray
Serve's HTTP proxy on an ephemeral 127.0.0.1 port, and a single `nextok serve` beside it. Then:

- the official `openai` client's suite (the script that runs against `nextok serve`) against
  the Ray endpoint;
- 32 concurrent seeded requests through Ray equal to the same requests to `nextok serve`,
  and their traces (fetched through Ray) replay with `nextok replay`;
- each replica's engine counters in Ray's metrics export (`ray_nextok_*`, one series each);
- a replica killed (SIGKILL) while it streams: every stream completes, each client's bytes
  equal to its uninterrupted run (from `nextok serve`), none lost or duplicated;
- the worker node killed (its process group, SIGKILL): Ray brings its replica back on the
  head node and requests keep being served meanwhile;
- autoscaling (the application deployed again, 1 to 2 replicas): under load a second replica
  comes, and no more;
- every replica full (the application deployed again with one replica running 2 requests):
  the client gets `nextok serve`'s 429 with `Retry-After`.

Every wait is bounded; all traffic goes to 127.0.0.1. Prints `N passed, M failed`.
"""

import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import Server  # noqa: E402

BIN, MODEL, OPENAI_SUITE = sys.argv[1], sys.argv[2], sys.argv[3]
# Ray's token authentication, with a token of this run's own (every node, driver and worker
# inherits it): Ray's own services listen on every interface whatever the node IP says
os.environ["RAY_AUTH_MODE"] = "token"
os.environ["RAY_AUTH_TOKEN"] = __import__("secrets").token_hex(32)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
KEY = "ray-key-" + str(os.getpid())
OTHER_KEY = "ray-other-" + str(os.getpid())
APP = "nextok"
START_SECONDS = 240


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_bin():
    return os.path.join(os.path.dirname(sys.executable), "ray")


class Node:
    """`ray start --block` in its own process group: killed for real with `kill()`."""

    def __init__(self, args, log_name):
        self.log = tempfile.NamedTemporaryFile(prefix=f"nextok-{log_name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [ray_bin(), "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats", *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        )

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass

    def tail(self, n=3000):
        with open(self.log.name, errors="replace") as f:
            return f.read()[-n:]


def wait_for(what, check, seconds):
    """Polls `check()` until it is truthy, for at most `seconds` (a stall guard)."""
    deadline = time.time() + seconds
    last = None
    while time.time() < deadline:
        try:
            v = check()
            if v:
                return v
        except Exception as e:  # not ready yet
            last = e
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {seconds} s ({last})")


def http(base, method, path, body=None, key=KEY, timeout=300):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    if key:
        req.add_header("authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def stream_events(base, path, body, key=KEY, on_event=None, timeout=300):
    """A streamed request: the `data:` payloads in order (`on_event(i)` after each)."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("content-type", "application/json")
    req.add_header("authorization", "Bearer " + key)
    out = []
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.status == 200, r.status
        buf = b""
        while True:
            part = r.read1(65536)
            if not part:
                break
            buf += part
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b"data: "):
                    out.append(ev[6:].decode())
                    if on_event:
                        on_event(len(out))
    return out


def per_choice(events):
    """Each choice's events in order, with the usage's `cached_tokens` (the serving engine's
    prefix cache) and the answer's `id`/`created` (one server's numbering) left out."""
    out = {}
    for e in events:
        if e == "[DONE]":
            out.setdefault("done", []).append(e)
            continue
        v = json.loads(e)
        v.pop("id", None)
        v.pop("created", None)
        if "usage" in v and v["usage"]:
            v["usage"].pop("prompt_tokens_details", None)
        if isinstance(v.get("nextok"), dict):
            v["nextok"].pop("trace_id", None)
        key = v["choices"][0]["index"] if v.get("choices") else "usage"
        out.setdefault(key, []).append(json.dumps(v, sort_keys=True))
    return out


# ---- the cluster ---------------------------------------------------------------------------

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.util.state import list_actors  # noqa: E402

import nextok.ray as nray  # noqa: E402

GCS_PORT = free_port()
HTTP_PORT = free_port()
DASHBOARD_PORT = free_port()
METRICS_PORTS = (free_port(), free_port())
ADDRESS = f"127.0.0.1:{GCS_PORT}"
head = Node(
    [
        "--head",
        f"--port={GCS_PORT}",
        "--num-cpus=4",
        '--resources={"nextok_replica": 2}',
        # (its state API lists the replicas' processes; it listens on 127.0.0.1)
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={DASHBOARD_PORT}",
        f"--metrics-export-port={METRICS_PORTS[0]}",
    ],
    "ray-head",
)
worker = None
SERVER = None
BASE = f"http://127.0.0.1:{HTTP_PORT}"


def replicas():
    """The live replica actors: (pid, node id, actor name)."""
    acts = list_actors(
        address=f"http://127.0.0.1:{DASHBOARD_PORT}",
        filters=[("class_name", "=", f"ServeReplica:{APP}:NextokReplica"), ("state", "=", "ALIVE")],
        limit=100,
    )
    # (an actor of a node just lost may still be listed alive for a while)
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    return [(a.pid, a.node_id, a.name) for a in acts if a.node_id in alive]


def setup():
    global worker, SERVER
    wait_for("the head node", lambda: subprocess.run(
        [ray_bin(), "status", f"--address={ADDRESS}"], capture_output=True, timeout=60).returncode == 0, START_SECONDS)
    worker = Node(
        [f"--address={ADDRESS}", "--num-cpus=2", '--resources={"nextok_replica": 1}',
         f"--metrics-export-port={METRICS_PORTS[1]}"],
        "ray-worker",
    )
    ray.init(address=ADDRESS, logging_level="WARNING", log_to_driver=False)
    wait_for("two nodes", lambda: len([n for n in ray.nodes() if n["Alive"]]) == 2, START_SECONDS)
    # the proxy on the head node only (nodes on one machine would share its port), as
    # docs/distributed.md's examples
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": HTTP_PORT})
    app = nray.build_app(
        MODEL,
        num_replicas=2,
        num_cpus=1,
        resources={"nextok_replica": 1},
        api_keys=[KEY, OTHER_KEY],
        max_num_seqs=48,
    )
    serve.run(app, name=APP, route_prefix="/", blocking=False)
    wait_for("the endpoint", lambda: http(BASE, "GET", "/health", key=None)[0] == 200, START_SECONDS)
    wait_for("two replicas", lambda: len(replicas()) == 2, START_SECONDS)
    SERVER = Server(BIN, MODEL, "--api-key", KEY)


# ---- tests ---------------------------------------------------------------------------------


def test_replicas_spread_over_both_nodes():
    nodes = {n for _, n, _ in replicas()}
    assert len(nodes) == 2, replicas()


def test_the_openai_suite_through_ray():
    env = {**os.environ, "NEXTOK_OPENAI_ENDPOINT": BASE, "NEXTOK_OPENAI_KEYS": f"{KEY},{OTHER_KEY}"}
    r = subprocess.run([sys.executable, OPENAI_SUITE, BIN, MODEL], env=env, capture_output=True, text=True, timeout=1800)
    sys.stderr.write("".join("  | " + l + "\n" for l in r.stderr.splitlines() if l.startswith(("ok", "FAIL", "  "))))
    assert r.returncode == 0, r.stdout + r.stderr[-6000:]
    print("  " + r.stdout.strip().splitlines()[-1], file=sys.stderr)


def request_body(i, stream, trace=False):
    prompts = ["The capital of France is", "Once upon a time,", "List three colours:", "def fibonacci(n):"]
    if i % 2:
        b = {"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": prompts[i % 4]}]}
        path = "/v1/chat/completions"
    else:
        b = {"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": prompts[i % 4]}
        path = "/v1/completions"
    b.update({"max_tokens": 16 + i % 8, "temperature": 0.8, "seed": 1000 + i, "top_p": 0.95, "stream": stream})
    if stream:
        b["stream_options"] = {"include_usage": True}
    if trace:
        b["nextok"] = {"trace": True}
    return path, b


def test_32_concurrent_requests_equal_a_single_server_and_their_traces_replay():
    def through(base, i):
        path, b = request_body(i, stream=i % 4 == 0, trace=True)
        if b["stream"]:
            evs = stream_events(base, path, b)
            return per_choice(evs), None
        status, _, text = http(base, "POST", path, b)
        assert status == 200, text
        v = json.loads(text)
        tid = v["nextok"]["trace_id"]
        c = v["choices"][0]
        return c.get("text", c.get("message", {}).get("content")), tid

    with cf.ThreadPoolExecutor(max_workers=32) as pool:
        ray_out = list(pool.map(lambda i: through(BASE, i), range(32), timeout=900))
    with cf.ThreadPoolExecutor(max_workers=32) as pool:
        one_out = list(pool.map(lambda i: through(SERVER.base, i), range(32), timeout=900))
    for i in range(32):
        assert ray_out[i][0] == one_out[i][0], (i, ray_out[i][0], one_out[i][0])
    # the traces, fetched through Ray from the replica that stored each, replay
    def fetch(i, tid):
        status, _, text = http(BASE, "GET", "/v1/traces/" + tid)
        assert status == 200, (i, status, text[:300])
        return i, text

    def replay(i, text):
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            f.write(text)
        rep = subprocess.run([BIN, "replay", f.name, "--model", MODEL], capture_output=True, text=True, timeout=300)
        os.unlink(f.name)
        assert rep.returncode == 0, (i, rep.stderr[-2000:])
        return 1

    # fetched 8 at a time: each goes to the replica that stored it, whatever else is routed
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        traces = list(pool.map(lambda x: fetch(*x), [(i, t) for i, (_, t) in enumerate(ray_out) if t], timeout=900))
    with cf.ThreadPoolExecutor(max_workers=2) as pool:
        replayed = sum(pool.map(lambda x: replay(*x), traces, timeout=900))
    assert replayed == 24, replayed
    print(f"  32 requests equal; {replayed} traces replayed", file=sys.stderr)


def test_each_replicas_engine_metrics_are_in_rays_metrics():
    # each node's metrics export, scraped as Prometheus would: one series per replica
    def series():
        found = {}
        for port in METRICS_PORTS:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("ray_nextok_completion_tokens{"):
                        replica = line.split('replica="', 1)[1].split('"', 1)[0]
                        found[replica] = float(line.rsplit(" ", 1)[1])
        return found if len(found) == 2 and all(v > 0 for v in found.values()) else None

    found = wait_for("the replicas' metrics in Ray's export", series, 120)
    print(f"  ray_nextok_completion_tokens: {found}", file=sys.stderr)


def long_stream_body(i):
    return "/v1/chat/completions", {
        "messages": [{"role": "user", "content": f"Tell me a long story about the number {i}."}],
        "max_tokens": 160, "temperature": 0.9, "seed": 500 + i, "stream": True, "n": 1 + (i == 0),
        "ignore_eos": True, "logprobs": i % 3 == 0, "top_logprobs": 2 if i % 3 == 0 else None,
        "stream_options": {"include_usage": True},
    }


def ingress_counter(name):
    status, _, text = http(BASE, "GET", "/metrics", key=None)
    assert status == 200, text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError("no " + name)


def test_a_replica_killed_mid_stream_loses_nothing():
    n = 8
    want = {}
    for i in range(n):
        path, b = long_stream_body(i)
        want[i] = per_choice(stream_events(SERVER.base, path, {k: v for k, v in b.items() if v is not None}))
    resumed0 = ingress_counter("nextok_ingress_resumed_total")
    progress = [0] * n
    got = {}
    errors = {}

    def run(i):
        path, b = long_stream_body(i)

        def seen(k):
            progress[i] = k

        try:
            got[i] = per_choice(stream_events(BASE, path, {k: v for k, v in b.items() if v is not None}, on_event=seen))
        except Exception as e:  # reported below
            errors[i] = repr(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    wait_for("every stream under way", lambda: all(p >= 10 for p in progress) or errors, 300)
    victims = replicas()
    assert len(victims) == 2, victims
    # the head node's replica (its replacement goes back there: the worker node's slot is taken)
    head_node = [nd["NodeID"] for nd in ray.nodes() if nd["Alive"] and nd.get("Resources", {}).get("nextok_replica") == 2.0]
    pid = [p for p, nd, _ in victims if nd in head_node][0]
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=900)
    assert not errors, errors
    assert len(got) == n
    for i in range(n):
        assert got[i] == want[i], f"stream {i} differs from its uninterrupted run"
        assert got[i]["done"] == ["[DONE]"]
    resumed = ingress_counter("nextok_ingress_resumed_total") - resumed0
    assert resumed >= 1, "no stream was resumed: the killed replica served none"
    wait_for("the killed replica replaced", lambda: len(replicas()) == 2 and pid not in [p for p, _, _ in replicas()], 300)
    print(f"  {resumed:.0f} of {n} streams resumed on the other replica", file=sys.stderr)


def test_the_worker_node_killed_its_replica_comes_back_on_the_head():
    nodes = {nd for _, nd, _ in replicas()}
    assert len(nodes) == 2, replicas()
    head_node = [nd["NodeID"] for nd in ray.nodes() if nd["Alive"] and nd.get("Resources", {}).get("nextok_replica") == 2.0]
    assert head_node, ray.nodes()
    worker.kill()
    served = 0
    deadline = time.time() + 300
    while time.time() < deadline:
        path, b = request_body(served, stream=False)
        status, _, text = http(BASE, "POST", path, b)
        assert status == 200, (status, text[:500])
        served += 1
        live = replicas()
        if len(live) == 2 and all(nd == head_node[0] for _, nd, _ in live) and served >= 4:
            break
        time.sleep(0.5)
    live = replicas()
    assert len(live) == 2 and all(nd == head_node[0] for _, nd, _ in live), live
    print(f"  {served} requests served while the replica moved", file=sys.stderr)


def test_every_replica_full_answers_429_with_retry_after():
    # the application again, small: one replica running 2 requests, 1 more waiting for it
    serve.delete(APP)
    wait_for("the application deleted", lambda: not replicas(), START_SECONDS)
    serve.run(
        nray.build_app(MODEL, num_replicas=1, num_cpus=1, resources={"nextok_replica": 1},
                       api_keys=[KEY, OTHER_KEY], max_num_seqs=2, max_queued_requests=1),
        name=APP, route_prefix="/", blocking=False,
    )
    wait_for("the small application", lambda: len(replicas()) == 1 and http(BASE, "GET", "/health", key=None)[0] == 200, START_SECONDS)
    body = {"prompt": "Count:", "max_tokens": 300, "ignore_eos": True, "stream": True, "seed": 1}
    statuses = []
    lock = threading.Lock()
    release = threading.Event()

    def hold(i):
        req = urllib.request.Request(BASE + "/v1/completions", data=json.dumps(body).encode(), method="POST")
        req.add_header("content-type", "application/json")
        req.add_header("authorization", "Bearer " + KEY)
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                with lock:
                    statuses.append((r.status, None, None))
                # the stream keeps its place until the others have their answers
                release.wait(timeout=120)
        except urllib.error.HTTPError as e:
            with lock:
                statuses.append((e.code, e.headers.get("retry-after"), e.read().decode()))
        except Exception as e:
            with lock:
                statuses.append((0, None, repr(e)))

    threads = [threading.Thread(target=hold, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    # the running and the refused answer at once; at most one waits for a place
    wait_for("the answers", lambda: len(statuses) >= 7, 300)
    release.set()
    for t in threads:
        t.join(timeout=300)
    refused = [s for s in statuses if s[0] == 429]
    others = [s for s in statuses if s[0] not in (200, 429)]
    assert not others, others[:3]
    assert refused and any(s[0] == 200 for s in statuses), statuses
    code, retry, text = refused[0]
    assert retry == "1", refused[0]
    err = json.loads(text)["error"]
    # the body `nextok serve` gives for its own full queue
    assert err["code"] == "queue_full" and err["type"] == "rate_limit_error", err
    print(f"  {len(refused)} of 8 refused with 429", file=sys.stderr)


def test_autoscaling_adds_a_replica_under_load_within_its_bounds():
    # the application again, autoscaled from scratch: 1 to 2 replicas, 2 ongoing requests each
    # as the target (an update would keep the running replicas' count)
    serve.delete(APP)
    wait_for("the application deleted", lambda: not replicas(), START_SECONDS)
    serve.run(
        nray.build_app(MODEL, num_replicas="auto", num_cpus=1, resources={"nextok_replica": 1},
                       api_keys=[KEY, OTHER_KEY], max_num_seqs=8,
                       autoscaling={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2,
                                    "upscale_delay_s": 1, "downscale_delay_s": 600, "look_back_period_s": 2,
                                    "metrics_interval_s": 0.5}),
        name=APP, route_prefix="/", blocking=False,
    )
    wait_for("one replica", lambda: len(replicas()) == 1 and http(BASE, "GET", "/health", key=None)[0] == 200, START_SECONDS)
    stop = threading.Event()
    failures = []

    def load(i):
        # long streams, one after another, until the test has seen what it waits for
        while not stop.is_set():
            path, b = "/v1/completions", {"prompt": f"Count to {i}:", "max_tokens": 200, "ignore_eos": True,
                                          "stream": True, "seed": i}
            try:
                stream_events(BASE, path, b, timeout=300)
            except Exception as e:
                failures.append(repr(e))
                return

    threads = [threading.Thread(target=load, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        wait_for("a second replica", lambda: len(replicas()) == 2, 180)
        time.sleep(5)
        assert len(replicas()) == 2, "more replicas than max_replicas"
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=600)
    assert not failures, failures[:3]
    print("  1 -> 2 replicas under 8 streams", file=sys.stderr)


TESTS = [
    test_replicas_spread_over_both_nodes,
    test_the_openai_suite_through_ray,
    test_32_concurrent_requests_equal_a_single_server_and_their_traces_replay,
    test_each_replicas_engine_metrics_are_in_rays_metrics,
    test_a_replica_killed_mid_stream_loses_nothing,
    test_the_worker_node_killed_its_replica_comes_back_on_the_head,
    # (these deploy the application again: autoscaled, then small)
    test_autoscaling_adds_a_replica_under_load_within_its_bounds,
    test_every_replica_full_answers_429_with_retry_after,
]


def main():
    passed = failed = 0
    only = [x for x in os.environ.get("NEXTOK_RAY_TEST", "").split(",") if x]
    try:
        setup()
        for t in TESTS:
            if only and not any(o in t.__name__ for o in only):
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
    except Exception:
        failed += 1
        print("FAIL setup", file=sys.stderr)
        traceback.print_exc()
        print("head node log (tail):\n" + head.tail(), file=sys.stderr)
    finally:
        try:
            serve.shutdown()
        except Exception:
            pass
        try:
            ray.shutdown()
        except Exception:
            pass
        if worker is not None:
            worker.kill()
        head.kill()
        subprocess.run([ray_bin(), "stop", "--force"], capture_output=True, timeout=120)
        if SERVER is not None:
            SERVER.close()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
