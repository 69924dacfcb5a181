"""Type stubs of the ``nextok._nextok`` extension module (re-exported by ``nextok``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__version__: str
PRESETS: list[str]
FORMAT_VERSION: int

Layer = Literal["raw", "processed", "selection"]
FinishName = Literal["eos", "stop_token", "stop_string", "grammar_accepted", "max_tokens"]

class Pipeline:
    """A decoding pipeline: processors in order and a selector, hashed.

    ``Pipeline(preset="reference", **params)`` builds a preset (``"reference"``, ``"hf"``,
    ``"vllm"``, ``"llama.cpp"``) from sampling parameters under their OpenAI / vLLM names.
    """

    def __init__(self, preset: str = "reference", **params: Any) -> None: ...
    @staticmethod
    def from_json(pipeline: str | dict[str, Any]) -> Pipeline:
        """A pipeline from its JSON form; errors name the failing path."""
    @property
    def hash(self) -> str:
        """``sha256:`` and the SHA-256 of the canonical JSON."""
    @property
    def preset(self) -> str | None:
        """The preset's name, or ``None`` for a pipeline given as JSON."""
    @property
    def processors(self) -> list[dict[str, Any]]:
        """The processors in order, as dicts."""
    @property
    def selector(self) -> dict[str, Any]:
        """The selector as a dict."""
    @property
    def params(self) -> dict[str, Any]:
        """The sampling parameters a preset was built from."""
    def to_json(self) -> str:
        """The canonical JSON text (what the hash covers)."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

class Vocab:
    """A vocabulary: size, EOS ids, special ids and (unless plain) every token's exact bytes."""

    @staticmethod
    def from_file(
        path: str | os.PathLike[str], *, vocab_size: int | None = None, eos_token_ids: Iterable[int] | None = None
    ) -> Vocab:
        """Loads a ``tokenizer.json`` or a GGUF file (told apart by the GGUF magic)."""
    @staticmethod
    def from_tokenizer_json(
        data: str | bytes, *, vocab_size: int | None = None, eos_token_ids: Iterable[int] | None = None
    ) -> Vocab:
        """Loads a ``tokenizer.json`` given as text or bytes."""
    @staticmethod
    def from_token_bytes(
        tokens: Iterable[bytes | str],
        *,
        eos_token_ids: Iterable[int] | None = None,
        special_token_ids: Iterable[int] | None = None,
    ) -> Vocab:
        """A vocabulary from the exact bytes of every token, by id."""
    @staticmethod
    def plain(
        size: int, *, eos_token_ids: Iterable[int] | None = None, special_token_ids: Iterable[int] | None = None
    ) -> Vocab:
        """A vocabulary of ``size`` tokens known only by id."""
    @property
    def size(self) -> int:
        """Number of token ids."""
    def __len__(self) -> int: ...
    @property
    def eos_token_ids(self) -> list[int]:
        """End-of-sequence ids, ascending."""
    @property
    def special_token_ids(self) -> list[int]:
        """Special/control ids, ascending."""
    @property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence id, when known."""
    @property
    def has_bytes(self) -> bool:
        """Whether every token's bytes are known."""
    def token_bytes(self, id: int) -> bytes:
        """The exact bytes of token ``id``."""
    def name(self, id: int) -> str | None:
        """The token's name as the file spells it."""
    def decode(self, ids: Iterable[int]) -> bytes:
        """The concatenated bytes of ``ids``."""

class State:
    """One sequence's decoder state; belongs to the ``Sampler`` that made it."""

    @property
    def step(self) -> int:
        """Steps taken so far."""
    @property
    def prompt_ids(self) -> list[int]:
        """The prompt ids."""
    @property
    def output_ids(self) -> list[int]:
        """The tokens selected or committed so far."""
    @property
    def seed(self) -> int:
        """The random stream's key."""
    @property
    def finished(self) -> bool:
        """Whether the sequence has finished."""
    @property
    def finish_reason(self) -> FinishName | None:
        """Why the sequence finished, or ``None``."""
    def summary(self) -> dict[str, Any]:
        """The state summary of step records."""
    def copy(self) -> State:
        """An independent copy (a fork)."""
    def __copy__(self) -> State: ...
    def __deepcopy__(self, memo: Any) -> State: ...

class Logprobs:
    """Logprobs of one layer: the selected token's and the best final candidates'."""

    @property
    def layer(self) -> Layer:
        """``"raw"``, ``"processed"`` or ``"selection"``."""
    @property
    def token(self) -> int:
        """The selected token."""
    @property
    def logprob(self) -> float:
        """The selected token's logprob in this layer."""
    @property
    def top(self) -> list[tuple[int, float]]:
        """``(token id, logprob)`` of the best final candidates, in canonical order."""
    def __len__(self) -> int: ...

class Step:
    """The outcome of one step."""

    @property
    def token(self) -> int:
        """The selected token id."""
    @property
    def finish(self) -> FinishName | None:
        """Why this token ended the sequence, or ``None``."""
    @property
    def finish_details(self) -> dict[str, Any] | None:
        """The finish reason with its details."""
    @property
    def u(self) -> float | None:
        """The categorical selector's ``u``, when one was used."""
    @property
    def recorded(self) -> bool:
        """Whether the step was recorded (``logprobs=N``)."""
    @property
    def support_size(self) -> int:
        """The final support's size (recorded steps only)."""
    def logprobs(self, layer: Layer = "raw", top: int | None = None) -> Logprobs:
        """The logprobs of ``layer`` (recorded steps only)."""
    def record(self) -> dict[str, Any]:
        """The step record, as a trace line holds it (recorded steps only)."""

class Sampler:
    """A compiled pipeline for one vocabulary, stop settings and optional constraint.

    With ``vocab=None`` the vocabulary is that many plain tokens as the first logits row has;
    every later row must have that length.
    """

    def __init__(
        self,
        pipeline: Pipeline | str | dict[str, Any],
        vocab: Vocab | int | None = None,
        constraint: dict[str, Any] | str | None = None,
        *,
        stop: str | Sequence[str] | None = None,
        stop_token_ids: Iterable[int] | None = None,
        max_tokens: int | None = None,
        ignore_eos: bool | None = None,
        include_stop_str_in_output: bool | None = None,
        skip_special_tokens: bool | None = None,
        grammar_policy: Literal["stop_on_accept", "only_end", "continue"] | None = None,
    ) -> None: ...
    def new_state(
        self,
        seed: int | None = None,
        prompt_ids: Iterable[int] | None = None,
        output_ids: Iterable[int] | None = None,
    ) -> State:
        """A fresh state for a sequence."""
    def step(
        self,
        logits: npt.NDArray[np.float32],
        state: State,
        *,
        logprobs: int | None = None,
        u: float | None = None,
    ) -> Step:
        """One step on a 1-D float32 row (read without copying); commits to ``state``."""
    def step_batch(self, logits: npt.NDArray[np.float32], states: Sequence[State]) -> list[Step]:
        """Steps every row of a 2-D float32 array with the GIL released."""
    def commit(self, state: State, token: int) -> FinishName | None:
        """Commits ``token`` without a logits row; returns the finish reason, if any."""
    def explain(self, logits: npt.NDArray[np.float32], state: State, *, u: float | None = None) -> dict[str, Any]:
        """The step ``state`` would take, with a ledger row per token; ``state`` is unchanged."""
    @property
    def pipeline(self) -> Pipeline:
        """The pipeline this sampler runs."""
    @property
    def pipeline_hash(self) -> str:
        """The pipeline hash."""
    @property
    def vocab_size(self) -> int | None:
        """The logits row length (``None`` for ``vocab=None`` until the first row)."""
    @property
    def vocab(self) -> Vocab | None:
        """The ``Vocab`` given, if one was."""
    @property
    def stop(self) -> dict[str, Any]:
        """The stop settings in force."""
    def _time_rust_steps(self, logits: npt.NDArray[np.float32], state: State, iterations: int) -> float: ...

def explain(request: dict[str, Any] | str) -> dict[str, Any]:
    """``nextok explain --json`` on a request dict or JSON text."""

def build_info() -> dict[str, str]:
    """This build and this CPU: ``version``, ``compiled_features`` (``none`` for the portable
    build), ``cpu_level`` (the best kernel level the CPU supports) and ``kernels`` (the level in
    use)."""

class _Engine:
    """The engine behind ``nextok.LLM``."""

    def __init__(self, model: str | None, requant: str | None, config: dict[str, Any] | None) -> None: ...
    def generate(self, requests: Sequence[tuple[str | Sequence[int], dict[str, Any]]]) -> list[dict[str, Any]]: ...
    def stream(self, prompt: Any, spec: dict[str, Any]) -> _Stream: ...
    def replay(self, text: str, sampler_only: bool = False) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    @property
    def model_path(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...

class _Stream:
    """One request's events (``LLM.stream``); dropping it or ``close()`` cancels the request."""

    def __iter__(self) -> _Stream: ...
    def __next__(self) -> dict[str, Any]: ...
    def close(self) -> None: ...
    @property
    def seeds(self) -> list[int]: ...
    @property
    def prompt_token_ids(self) -> list[int]: ...
    @property
    def pipeline_hash(self) -> str: ...

class _Service:
    """The OpenAI-compatible API of ``nextok serve`` over an ``_Engine``, called in process."""

    def __init__(self, engine: _Engine, config: dict[str, Any] | None = None) -> None: ...
    @property
    def model_id(self) -> str: ...
    def request(self, method: str, path: str, headers: list[tuple[str, str]] = ..., body: bytes = ...) -> _Response: ...
    def stats(self) -> dict[str, int]: ...

class _Response:
    """One response of ``_Service.request``."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> list[tuple[str, str]]: ...
    @property
    def started(self) -> dict[str, Any] | None: ...
    def next_chunk(self, coalesce: int = 1) -> tuple[bytes, list[tuple[int, int]], list[int]] | None: ...
    def close(self) -> None: ...

def refusal(kind: str, message: str) -> tuple[int, list[tuple[str, str]], bytes]:
    """The answer ``nextok serve`` gives when it cannot take a request (``queue_full``: 429,
    ``shutdown``: 503, with ``Retry-After``), as ``(status, headers, body)``."""
