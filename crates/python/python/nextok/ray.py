"""nextok on Ray Serve: replicas of the engine behind one OpenAI-compatible endpoint.

Each replica (``NextokReplica``) holds one engine in process and answers HTTP requests with
``nextok.Service``, the router of ``nextok serve`` called without a socket: the API has one
implementation. The ingress (``NextokIngress``) parses nothing of it: it forwards the method,
path, headers and body to a replica and streams the bytes back, keeping for itself what the
replica sends beside them (the answer's seed and the token ids behind each chunk). With
those, when a replica is lost mid-answer, the ingress resumes the answer on another replica
(``nextok.resume``): the client's bytes are those of the uninterrupted answer, as a
request's tokens depend only on the model file, the prompt, the pipeline, the seed and the
position.

Routing (``PrefixAffinityRouter``, Ray Serve's request-router API): requests whose prompts
start alike go to the same replica (rendezvous hashing of the prompt's first characters), so
its prefix cache serves them, unless that replica holds more requests than the least loaded
by ``imbalance``; then the least loaded takes it. When every replica is full and the queue
too, the client gets the 429 with ``Retry-After`` that ``nextok serve`` gives.

From a shell::

    serve run nextok.ray:app model=/models/qwen2.5-1.5b-q4_k_m.gguf num_replicas=2
    python -m nextok.ray --model /models/qwen2.5-1.5b-q4_k_m.gguf --num-replicas 2

From Python::

    from ray import serve
    import nextok.ray
    serve.run(nextok.ray.build_app(model="...", num_replicas=2), route_prefix="/")

See ``docs/distributed.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator, Sequence

try:
    import ray
    from ray import serve
except ImportError as e:  # the extra is not installed
    raise ImportError("nextok.ray needs Ray Serve: pip install 'nextok[ray]' (or 'ray[serve]')") from e
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ._nextok import refusal
from ._service import Service

__all__ = [
    "NextokReplica",
    "NextokIngress",
    "PrefixAffinityRouter",
    "build_app",
    "app",
    "routing_key",
]

log = logging.getLogger("nextok.ray")

#: Characters of the prompt the routing key is made of.
PREFIX_CHARS = 256

#: Attempts of one request on replicas that fail (the first included).
MAX_ATTEMPTS = 4

#: Body chunks that are ready at once a replica sends as one item.
COALESCE = 64

#: Trace ids whose replica the ingress remembers (the most recent).
TRACES_REMEMBERED = 4096

#: Request headers forwarded to a replica (hop-by-hop headers and Ray's own stay behind).
FORWARDED = {"authorization", "content-type", "accept", "content-length"}


def routing_key(body: bytes, chars: int = PREFIX_CHARS) -> str | None:
    """The prompt's first ``chars`` characters (chat messages' roles and texts, or the
    completion prompt), the key that sends requests sharing a prefix to the same replica;
    ``None`` when the body has no prompt (the replica's answer says what is wrong)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    out: list[str] = []
    size = 0
    msgs = obj.get("messages")
    if isinstance(msgs, list):
        for m in msgs:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            parts = [content] if isinstance(content, str) else []
            if isinstance(content, list):
                parts = [p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            for piece in [str(m.get("role", "")), "\x00", *parts, "\x01"]:
                out.append(piece)
                size += len(piece)
            if size >= chars:
                break
    elif isinstance(obj.get("prompt"), str):
        out.append(obj["prompt"])
    elif isinstance(obj.get("prompt"), list):
        out.append(",".join(str(x) for x in obj["prompt"][:chars]))
    text = "".join(out)[:chars]
    return text or None


def _rank(key: str, replica: str) -> int:
    """Rendezvous hashing: the replica with the highest rank for a key is its home."""
    h = hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


class PrefixAffinityRouter(RequestRouter):
    """Sends a request to the replica its prompt prefix hashes to (rendezvous hashing over the
    running replicas, so a replica added or lost moves only its own keys), unless that replica
    holds more than ``imbalance`` requests beyond the least loaded, or is full: then the least
    loaded (the base router's choice among all). Requests without a key go to the least
    loaded. A request pinned to a replica (a trace it stores) goes there.

    Requests are matched to the replica chosen for them (Ray's default out-of-order routing;
    a FIFO mixin would hand a replica chosen for one request to the oldest waiting one)."""

    def initialize_state(self, imbalance: int = 4, **kwargs: Any) -> None:
        self._imbalance = int(imbalance)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        key = pin = None
        if pending_request is not None:
            key = pending_request.kwargs.get("routing_key")
            pin = pending_request.kwargs.get("pin")
        if pin:
            # a request that only one replica can answer (a trace it stores)
            pinned = [r for r in candidate_replicas if r.replica_id.unique_id == pin]
            if pinned:
                return [pinned]
        if not key or len(candidate_replicas) < 2:
            return [candidate_replicas]
        ranked = sorted(candidate_replicas, key=lambda r: _rank(key, r.replica_id.unique_id), reverse=True)
        home = ranked[0]
        cache = self._replica_queue_len_cache
        queues = [cache.get(r.replica_id) for r in candidate_replicas]
        known = [q for q in queues if q is not None]
        home_q = cache.get(home.replica_id)
        if home_q is not None and known and home_q - min(known) > getattr(self, "_imbalance", 4):
            return [candidate_replicas]
        return [[home], ranked[1:]]


def _metrics():
    """The replica's gauges in Ray's metrics (exported as ``ray_nextok_*``, one series per
    replica: a dashboard sums them)."""
    from ray.util.metrics import Gauge

    names = {
        "running_seqs": "Sequences the replica's engine is running.",
        "waiting_requests": "Requests waiting for admission in the replica's engine.",
        "kv_bytes_in_use": "KV cache bytes the replica's engine holds.",
        "prompt_tokens": "Prompt tokens the replica's engine admitted since it started.",
        "cached_prompt_tokens": "Prompt tokens served from the replica's prefix cache since it started.",
        "completion_tokens": "Tokens the replica's engine generated since it started.",
        "preemptions": "Requests the replica's engine preempted since it started.",
    }
    return {k: Gauge(f"nextok_{k}", description=d, tag_keys=("replica",)) for k, d in names.items()}


class NextokReplica:
    """One engine and its API (``nextok.Service``) in a Ray Serve replica."""

    def __init__(
        self,
        model: str | None,
        model_id: str | None,
        engine_config: dict[str, Any],
        service_config: dict[str, Any],
    ) -> None:
        self.service = Service(model=model, model_id=model_id, **service_config, **engine_config)
        stats = self.service.stats()
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
        except Exception:  # outside a replica (tests of the class itself)
            self.replica = f"pid-{os.getpid()}"
        # each answer in flight waits for its next chunk on a thread (the GIL released)
        self._pool = ThreadPoolExecutor(
            max_workers=stats["max_num_seqs"] + 16, thread_name_prefix="nextok-replica"
        )
        self._gauges = _metrics()
        self._last_export = 0.0

    def _export(self) -> None:
        now = time.monotonic()
        if now - self._last_export < 1.0:
            return
        self._last_export = now
        s = self.service.stats()
        for k, g in self._gauges.items():
            g.set(s[k], tags={"replica": self.replica})

    def record_routing_stats(self) -> dict[str, Any]:
        """What Ray's routers see of this replica (its engine's counters)."""
        self._export()
        return self.service.stats()

    async def handle(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        routing_key: str | None = None,
        pin: str | None = None,
    ) -> AsyncIterator[Any]:
        """Answers one request: first ``("head", status, headers, started, replica)``, then
        each body chunk as ``("data", bytes, tokens, finished)``."""
        loop = asyncio.get_running_loop()
        resp = await loop.run_in_executor(self._pool, self.service.request, method, path, headers, body)
        self._export()
        try:
            yield ("head", resp.status, resp.headers, resp.started, self.replica)
            while True:
                # what is ready goes as one item: fewer Ray messages when streams are many
                c = await loop.run_in_executor(self._pool, resp.next_chunk, COALESCE)
                if c is None:
                    break
                yield ("data", c.data, c.tokens, c.finished)
        finally:
            resp.close()
            self._export()

    async def stats(self) -> dict[str, Any]:
        """The engine's counters, and which replica this is."""
        s = self.service.stats()
        s["replica"] = self.replica
        s["pid"] = os.getpid()
        s["node_id"] = ray.get_runtime_context().get_node_id()
        return s


class _Counters:
    """The ingress's own counters, for its ``/metrics``."""

    def __init__(self) -> None:
        self.requests = 0
        self.retried = 0
        self.resumed = 0
        self.refused = 0
        self.failed = 0

    def text(self) -> str:
        rows = [
            ("nextok_ingress_requests_total", "Requests the ingress forwarded.", self.requests),
            ("nextok_ingress_retried_total", "Requests sent again whole after their replica was lost before any byte reached the client.", self.retried),
            ("nextok_ingress_resumed_total", "Streams resumed on another replica after theirs was lost mid-answer.", self.resumed),
            ("nextok_ingress_refused_total", "Requests refused with 429 because every replica and the queue were full.", self.refused),
            ("nextok_ingress_failed_total", "Requests that failed after every attempt.", self.failed),
        ]
        out = []
        for name, help_, v in rows:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name} {v}"]
        return "\n".join(out) + "\n"


def _with_seed_and_resume(body: bytes, seed: int | None, resume: dict[str, Any] | None) -> bytes:
    """The request again, with the seed its first replica drew and what to resume from."""
    obj = json.loads(body)
    if seed is not None:
        obj["seed"] = seed
    if resume is not None:
        flat = any(isinstance(k, str) and k.startswith("nextok_") for k in obj)
        if flat:
            obj["nextok_resume"] = resume
        else:
            if not isinstance(obj.get("nextok"), dict):
                obj["nextok"] = {}
            obj["nextok"]["resume"] = resume
    return json.dumps(obj).encode()


class NextokIngress:
    """The endpoint: forwards each request to a replica and streams its bytes back; retries a
    request whose replica was lost before any byte reached the client, resumes a stream whose
    replica was lost after."""

    def __init__(self, replicas: Any, body_limit: int = 4 << 20) -> None:
        self._replicas = replicas
        self._body_limit = body_limit
        self._counters = _Counters()
        # which replica stores each trace (the most recent ones): `GET /v1/traces/{id}` goes there
        self._traces: "OrderedDict[str, str]" = OrderedDict()

    async def _read_body(self, request: Request) -> tuple[bytes, bool]:
        """The body, at most ``body_limit`` bytes (``True`` when it was longer: the replica then
        gets only its declared length and answers 413 as ``nextok serve`` does)."""
        buf = bytearray()
        async for part in request.stream():
            buf += part
            if len(buf) > self._body_limit:
                return b"", True
        return bytes(buf), False

    def _remember_trace(self, trace_id: str | None, replica: str) -> None:
        if not trace_id:
            return
        self._traces[trace_id] = replica
        while len(self._traces) > TRACES_REMEMBERED:
            self._traces.popitem(last=False)

    async def _answer(
        self,
        method: str,
        path: str,
        headers: list[tuple[str, str]],
        body: bytes,
        key: str | None,
        pin: str | None = None,
    ) -> AsyncIterator[tuple]:
        """The answer's head, then its chunks, across replicas lost on the way."""
        sent = 0  # chunks that reached the client
        head: tuple | None = None
        started: dict[str, Any] | None = None
        tokens: list[list[int]] = []
        finished: list[int] = []
        current = body
        last_error = "no replica answered"
        for attempt in range(MAX_ATTEMPTS):
            try:
                gen = self._replicas.options(stream=True).handle.remote(
                    method, path, headers, current, routing_key=key, pin=pin
                )
                async for item in gen:
                    if item[0] == "head":
                        if head is None:
                            head = item
                            started = item[3]
                            if started is not None:
                                tokens = [[] for _ in range(int(started["n"]))]
                                self._remember_trace(started.get("trace_id"), item[4])
                            yield ("head", item[1], item[2])
                        elif item[1] != 200:
                            # the resumed request was refused: the client hears why, in the stream
                            rest = b"".join([c[1] async for c in gen if c[0] == "data"])
                            yield ("data", b"data: " + rest.strip() + b"\n\ndata: [DONE]\n\n")
                            return
                        continue
                    _, data, toks, fin = item
                    for seq, tid in toks:
                        if seq < len(tokens):
                            tokens[seq].append(tid)
                    finished.extend(fin)
                    sent += 1
                    yield ("data", data)
                return
            except BackPressureError:
                if head is None:
                    self._counters.refused += 1
                    status, hdrs, rbody = refusal(
                        "queue_full", "every replica is busy and the queue is full; retry shortly"
                    )
                    yield ("head", status, hdrs)
                    yield ("data", rbody)
                    return
                last_error = "every replica is busy"
                await asyncio.sleep(0.5 * (attempt + 1))
            except (ray.exceptions.RayError, serve.exceptions.RayServeException) as e:
                last_error = f"{type(e).__name__}: {e}"
                log.warning("nextok.ray: a replica was lost (attempt %d): %s", attempt + 1, last_error)
            # the replica was lost: again elsewhere, with the seed it drew; from the tokens
            # already sent when the client has part of a stream
            if started is None:
                current = body
                self._counters.retried += 1
            elif sent == 0:
                current = _with_seed_and_resume(body, started["seed"], None)
                self._counters.retried += 1
            else:
                resume = {
                    "tokens": tokens,
                    "id": started["id"],
                    "created": started["created"],
                    "finished": sorted(set(finished)),
                }
                current = _with_seed_and_resume(body, started["seed"], resume)
                self._counters.resumed += 1
            await asyncio.sleep(0.2 * attempt)
        self._counters.failed += 1
        status, hdrs, rbody = refusal("shutdown", f"the request failed on {MAX_ATTEMPTS} replicas ({last_error})")
        if head is None:
            yield ("head", status, hdrs)
            yield ("data", rbody)
        else:
            yield ("data", b"data: " + rbody + b"\n\ndata: [DONE]\n\n")

    async def __call__(self, request: Request) -> Response:
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.url.path == "/metrics":
            # the endpoint's own counters (each replica's engine metrics are in Ray's metrics)
            return Response(self._counters.text(), media_type="text/plain; version=0.0.4")
        self._counters.requests += 1
        headers = [(k, v) for k, v in request.headers.items() if k.lower() in FORWARDED]
        body, too_large = await self._read_body(request)
        if too_large:
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
            headers.append(("content-length", str(self._body_limit + 1)))
        key = routing_key(body) if request.method == "POST" else None
        pin = None
        if request.url.path.startswith("/v1/traces/"):
            pin = self._traces.get(request.url.path[len("/v1/traces/"):])
        answer = self._answer(request.method, path, headers, body, key, pin)
        first = await answer.__anext__()
        _, status, hdrs = first
        out_headers = {k: v for k, v in hdrs if k.lower() not in ("content-length", "transfer-encoding")}
        if any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in hdrs):

            async def rest() -> AsyncIterator[bytes]:
                async for item in answer:
                    yield item[1]

            return StreamingResponse(rest(), status_code=status, headers=out_headers)
        data = b"".join([item[1] async for item in answer])
        return Response(data, status_code=status, headers=out_headers)


def build_app(
    model: str | None = None,
    *,
    num_replicas: int | str = 1,
    autoscaling: dict[str, Any] | None = None,
    num_cpus: float = 1,
    resources: dict[str, float] | None = None,
    model_id: str | None = None,
    api_keys: Sequence[str] = (),
    router: str = "prefix",
    imbalance: int = 4,
    max_queued_requests: int | None = None,
    runtime_env: dict[str, Any] | None = None,
    ingress_on_head: bool = True,
    **engine_config: Any,
):
    """A Ray Serve application: ``num_replicas`` replicas of the engine on ``model`` (or
    ``"auto"``: autoscaling between ``autoscaling["min_replicas"]`` and
    ``["max_replicas"]`` on ongoing requests), each with ``num_cpus`` CPUs for its threads
    (and Ray ``resources``, to place replicas on chosen nodes), behind one ingress. ``router`` is ``"prefix"`` (``PrefixAffinityRouter``) or ``"ray"``
    (Ray Serve's default, power of two choices). Each replica takes at most its engine's
    ``max_num_seqs`` requests at once; ``max_queued_requests`` more may wait for one (default:
    as many again), past that the client gets 429 with ``Retry-After``. The ingress runs on the
    head node (``ingress_on_head``), beside the HTTP proxy: a worker node lost takes replicas
    with it, never the requests' bookkeeping. Other keywords set the engine (``max_num_seqs``, ``kv_budget_bytes``, ...), as for ``nextok.LLM``."""
    max_num_seqs = int(engine_config.get("max_num_seqs", 64))
    options: dict[str, Any] = {
        "max_ongoing_requests": max_num_seqs,
        "max_queued_requests": max_queued_requests if max_queued_requests is not None else max_num_seqs,
        "ray_actor_options": {
            "num_cpus": num_cpus,
            **({"resources": dict(resources)} if resources else {}),
            **({"runtime_env": runtime_env} if runtime_env else {}),
        },
        # a replica that stops answering is replaced
        "health_check_period_s": 2,
        "health_check_timeout_s": 30,
        "graceful_shutdown_timeout_s": 5,
    }
    if num_replicas == "auto" or autoscaling is not None:
        a = {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": max(1, max_num_seqs // 2)}
        a.update(autoscaling or {})
        options["autoscaling_config"] = a
    else:
        options["num_replicas"] = int(num_replicas)
    if router == "prefix":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=PrefixAffinityRouter,
            request_router_kwargs={"imbalance": imbalance},
        )
    elif router != "ray":
        raise ValueError(f"router: {router!r} is not 'prefix' or 'ray'")
    replica = serve.deployment(NextokReplica, name="NextokReplica").options(**options)
    ingress = serve.deployment(NextokIngress, name="NextokIngress").options(
        max_ongoing_requests=max(1000, 4 * max_num_seqs),
        ray_actor_options={
            "num_cpus": 0,
            # Ray's marker of the head node
            **({"resources": {"node:__internal_head__": 0.001}} if ingress_on_head else {}),
            **({"runtime_env": runtime_env} if runtime_env else {}),
        },
    )
    service_config = {"api_keys": list(api_keys)}
    return ingress.bind(replica.bind(model, model_id, engine_config, service_config))


def _value(v: str) -> Any:
    """A ``serve run`` argument's value: an integer, a float, a boolean or a string."""
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v


def app(args: dict[str, str]):
    """The application builder ``serve run nextok.ray:app key=value ...`` calls:
    ``build_app``'s keywords as ``key=value`` (``api_keys`` comma-separated)."""
    kw = {k: _value(v) if isinstance(v, str) else v for k, v in args.items()}
    if isinstance(kw.get("api_keys"), str):
        kw["api_keys"] = [x for x in kw["api_keys"].split(",") if x]
    if "model" in kw:
        kw["model"] = str(kw["model"])
    return build_app(**kw)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m nextok.ray``: starts (or joins) a Ray cluster and serves the endpoint."""
    p = argparse.ArgumentParser(prog="python -m nextok.ray", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file, or a model name nextok knows")
    p.add_argument("--num-replicas", default="1", help="a number, or 'auto'")
    p.add_argument("--num-cpus", type=float, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--address", default=None, help="a running cluster's address (default: start one)")
    p.add_argument("--router", default="prefix", choices=["prefix", "ray"])
    p.add_argument("--max-num-seqs", type=int, default=None)
    a = p.parse_args(argv)
    if a.address:
        ray.init(address=a.address)
    else:
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False)
    serve.start(proxy_location="HeadOnly", http_options={"host": a.host, "port": a.port})
    engine = {} if a.max_num_seqs is None else {"max_num_seqs": a.max_num_seqs}
    n: int | str = a.num_replicas if a.num_replicas == "auto" else int(a.num_replicas)
    serve.run(
        build_app(a.model, num_replicas=n, num_cpus=a.num_cpus, router=a.router, **engine),
        name="nextok",
        route_prefix="/",
        blocking=True,
    )


if __name__ == "__main__":
    main()
