"""``nextok.Service``: the OpenAI-compatible API of ``nextok serve``, called in process.

The same router that ``nextok serve`` puts behind a socket answers here one request at a time:
a method, a path, headers and a body in; a status, headers and the body's chunks out. It is
what a Ray Serve replica runs (``nextok.ray``), so that the API has one implementation
whoever carries the bytes. Beside each chunk of a generation answer come the token ids behind
it, and with the head the answer's id, ``created`` and seed: enough to resume the answer on
another engine with ``nextok.resume`` if this one is lost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ._llm import LLM
from ._nextok import _Response, _Service


@dataclass(frozen=True)
class Chunk:
    """One body chunk, and the ``(sequence, token id)`` pairs selected since the previous one
    (``tokens``) and the sequences that ended (``finished``)."""

    data: bytes
    tokens: list[tuple[int, int]]
    finished: list[int]


class Response:
    """A response: ``status``, ``headers`` (``(name, value)`` pairs), ``started`` (for a
    generation answer ``{"id", "created", "seed", "n"}``, else ``None``), and its chunks by
    iteration (the GIL is released while a chunk is awaited). ``close()`` stops reading and
    cancels the answer."""

    def __init__(self, inner: _Response) -> None:
        self._inner = inner

    @property
    def status(self) -> int:
        return self._inner.status

    @property
    def headers(self) -> list[tuple[str, str]]:
        return self._inner.headers

    @property
    def started(self) -> dict[str, Any] | None:
        return self._inner.started

    def next_chunk(self, coalesce: int = 1) -> Chunk | None:
        """The next chunk, ``None`` after the last. With ``coalesce > 1``, up to that many
        chunks that are ready already come as one (it never waits for more)."""
        c = self._inner.next_chunk(coalesce)
        return None if c is None else Chunk(c[0], c[1], c[2])

    def __iter__(self) -> Iterator[Chunk]:
        while True:
            c = self.next_chunk()
            if c is None:
                return
            yield c

    def read(self) -> bytes:
        """The whole body."""
        return b"".join(c.data for c in self)

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Service:
    """The API over an engine: ``Service(llm)`` for an ``LLM``, or ``Service(model=...,
    **engine_config)`` to load one. ``model_id`` (default: the file's name without
    ``.gguf``, as ``nextok serve``), ``api_keys``, ``body_limit``, ``max_traces``,
    ``max_trace_bytes`` and ``speculative`` (``"ngram:5"``) are ``nextok serve``'s options."""

    def __init__(
        self,
        llm: LLM | None = None,
        *,
        model: str | os.PathLike[str] | None = None,
        model_id: str | None = None,
        api_keys: Sequence[str] = (),
        body_limit: int | None = None,
        max_traces: int | None = None,
        max_trace_bytes: int | None = None,
        speculative: str | None = None,
        **engine_config: Any,
    ) -> None:
        if llm is None:
            llm = LLM(model, **engine_config)
        elif model is not None or engine_config:
            raise TypeError("give either an LLM or a model and its engine settings, not both")
        self.llm = llm
        config: dict[str, Any] = {
            "model_id": model_id,
            "api_keys": list(api_keys),
            "body_limit": body_limit,
            "max_traces": max_traces,
            "max_trace_bytes": max_trace_bytes,
            "speculative": speculative,
        }
        self._svc = _Service(llm._engine, config)

    @property
    def model_id(self) -> str:
        """The model id requests name."""
        return self._svc.model_id

    def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes = b"",
    ) -> Response:
        """Sends one request; returns once its head is ready (the GIL released meanwhile)."""
        return Response(self._svc.request(method, path, list(headers), bytes(body)))

    def stats(self) -> dict[str, int]:
        """The engine's counters and limits now (``running_seqs``, ``waiting_requests``,
        ``kv_bytes_in_use``, ``completion_tokens``, ``max_num_seqs``, ``max_waiting``, ...)."""
        return self._svc.stats()
