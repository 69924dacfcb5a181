"""The engine level, shaped like vLLM's offline API: ``LLM``, ``SamplingParams``,
``RequestOutput`` and ``CompletionOutput``.

>>> import nextok                                                  # doctest: +SKIP
>>> llm = nextok.LLM("model.gguf", max_num_seqs=16)                # doctest: +SKIP
>>> params = nextok.SamplingParams(temperature=0.8, seed=7)        # doctest: +SKIP
>>> outs = llm.generate(["Once upon a time"], params)              # doctest: +SKIP
>>> outs[0].outputs[0].text                                        # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._errors import InvalidArgument
from ._nextok import Pipeline, _Engine

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob", "StreamOutput", "replay"]

# parameters that are not sampling parameters of the request (``SamplingParams`` keeps them
# apart)
_OWN = ("n", "logprobs", "logprob_layer", "pipeline", "constraint", "trace", "trace_logits")


class SamplingParams:
    """A request's sampling parameters under vLLM's names, checked when made.

    ``n`` sequences (sequence ``i`` uses ``seed + i``); ``logprobs=N`` reports the selected
    token's and the ``N`` best final candidates' logprobs in ``logprob_layer`` (``"raw"``,
    ``"processed"`` or ``"selection"``); ``pipeline`` is a preset name (default
    ``"reference"``), a ``Pipeline`` or pipeline JSON; ``constraint`` a structured-output
    constraint (``{"type": "json_schema", "schema": {...}}``, ...). Everything else is a
    sampling parameter (``temperature``, ``top_p``, ``top_k``, ``min_p``, ``max_tokens``,
    ``stop``, ``stop_token_ids``, ``seed``, ``presence_penalty``, ...). As in vLLM,
    ``max_tokens`` defaults to 16. ``trace=True`` (or a number of candidates per step, default
    8) returns the request's trace in ``RequestOutput.trace``: the JSON lines ``nextok generate
    --trace`` writes, which ``nextok replay`` and ``LLM.replay`` check bit for bit. With
    ``trace_logits=True`` every step also stores its raw logits, compressed (about 3 bytes a
    vocabulary entry a step: ~150 KB a step for a 49,152-token vocabulary), so
    ``replay(..., sampler_only=True)`` checks the sampler, the constraint and the stop
    conditions without the model. Parameters are readable as attributes.
    """

    def __init__(
        self,
        n: int = 1,
        *,
        logprobs: int | None = None,
        logprob_layer: str = "raw",
        pipeline: str | Pipeline | dict[str, Any] = "reference",
        constraint: dict[str, Any] | None = None,
        trace: bool | int = False,
        trace_logits: bool = False,
        **params: Any,
    ) -> None:
        params.setdefault("max_tokens", 16)
        if trace is True:
            trace = 8
        elif trace is False or trace is None:
            trace = None
        elif not isinstance(trace, int) or trace < 0:
            raise InvalidArgument(
                f"invalid `trace`: {trace!r} must be a bool or a number of candidates >= 0",
                code="invalid_argument",
                field="trace",
            )
        if trace is not None and logprobs is not None:
            trace = max(trace, logprobs)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidArgument(f"invalid `n`: {n!r} must be an integer >= 1", code="invalid_argument", field="n")
        if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs < 0):
            raise InvalidArgument(
                f"invalid `logprobs`: {logprobs!r} must be an integer >= 0", code="invalid_argument", field="logprobs"
            )
        if logprob_layer not in ("raw", "processed", "selection"):
            raise InvalidArgument(
                f"invalid `logprob_layer`: {logprob_layer!r} is not raw, processed or selection",
                code="invalid_argument",
                field="logprob_layer",
            )
        # checked now, as the engine will build it
        if isinstance(pipeline, str):
            checked = Pipeline(pipeline, **params)
            pipeline_spec: Any = pipeline
        else:
            checked = pipeline if isinstance(pipeline, Pipeline) else Pipeline.from_json(pipeline)
            pipeline_spec = checked.to_json() if isinstance(pipeline, Pipeline) else pipeline
            if isinstance(pipeline_spec, str):
                import json

                pipeline_spec = json.loads(pipeline_spec)
        self.n = n
        self.logprobs = logprobs
        self.logprob_layer = logprob_layer
        self.pipeline = pipeline_spec
        self.constraint = constraint
        self.trace = trace
        self.trace_logits = trace_logits
        self.params = dict(params)
        self.pipeline_hash = None if constraint is not None else checked.hash

    def __getattr__(self, name: str) -> Any:
        params = self.__dict__.get("params", {})
        if name in params:
            return params[name]
        raise AttributeError(name)

    def _spec(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "n": self.n,
            "logprobs": self.logprobs,
            "logprob_layer": self.logprob_layer,
            "pipeline": self.pipeline,
            "constraint": self.constraint,
            "trace": self.trace,
            "trace_logits": self.trace_logits,
        }

    def __repr__(self) -> str:
        extra = {k: getattr(self, k) for k in _OWN if getattr(self, k) not in (None, 1, "raw", "reference", False)}
        inner = ", ".join(f"{k}={v!r}" for k, v in {**extra, **self.params}.items())
        return f"SamplingParams({inner})"


@dataclass
class Logprob:
    """One token's logprob, as vLLM reports it: ``logprob`` in the output's
    ``logprob_layer``, ``rank`` among that step's reported candidates (1 = best; ``None`` for a
    selected token outside them) and the token's text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def _logprob_map(m: dict[int, Any] | None) -> dict[int, Logprob] | None:
    if m is None:
        return None
    return {k: Logprob(*v) for k, v in m.items()}


@dataclass
class CompletionOutput:
    """One generated sequence (vLLM's ``CompletionOutput``)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    """Per token, ``{id: Logprob}`` for the selected token and the best candidates."""
    finish_reason: str | None
    stop_reason: int | str | None = None
    logprob_layer: str | None = None
    """The layer of ``logprobs`` and ``cumulative_logprob`` (nextok labels every logprob)."""


@dataclass
class RequestOutput:
    """A finished request (vLLM's ``RequestOutput``), with nextok's ``pipeline_hash``,
    ``seeds``, ``usage`` and ``metrics``."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True
    pipeline_hash: str = ""
    seeds: list[int] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    trace: str | None = None
    """The request's trace (``SamplingParams(trace=True)``): JSON lines, a header then every
    step record, as ``nextok generate --trace`` writes them."""


@dataclass
class StreamOutput:
    """One event of ``LLM.stream``: a token of sequence ``index`` (``token_id``, ``text`` that
    can be shown now, its ``logprob`` and ``logprobs`` when asked for), or the end of that
    sequence (``token_id`` is ``None``, ``text`` is what was held back, ``finish_reason`` and
    ``stop_reason`` are set)."""

    index: int
    token_id: int | None
    text: str
    logprob: float | None = None
    logprobs: dict[int, Logprob] | None = None
    logprob_layer: str | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


def _prompts(prompts: Any) -> list[tuple[Any, str | None]]:
    """(prompt for the engine, prompt text) for each of ``prompts``."""

    def one(p: Any, where: str) -> tuple[Any, str | None]:
        if isinstance(p, str):
            return p, p
        if isinstance(p, dict):
            if "prompt_token_ids" in p:
                return list(p["prompt_token_ids"]), None
            if "prompt" in p and isinstance(p["prompt"], str):
                return p["prompt"], p["prompt"]
        raise InvalidArgument(
            f"invalid `{where}`: a prompt is a string, {{'prompt': str}} or {{'prompt_token_ids': [...]}}, "
            f"got {type(p).__name__}",
            code="invalid_argument",
            field=where,
        )

    if isinstance(prompts, (str, dict)):
        return [one(prompts, "prompts")]
    if isinstance(prompts, Sequence):
        return [one(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    raise InvalidArgument(
        f"invalid `prompts`: expected a prompt or a list of prompts, got {type(prompts).__name__}",
        code="invalid_argument",
        field="prompts",
    )


def _per_prompt(sampling_params: Any, n: int) -> list[SamplingParams]:
    """``sampling_params`` (one for all, or one per prompt) as one per prompt, checked."""
    if sampling_params is None:
        sampling_params = SamplingParams()
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    per = list(sampling_params)
    if len(per) != n:
        raise InvalidArgument(
            f"invalid `sampling_params`: {len(per)} for {n} prompts",
            code="invalid_argument",
            field="sampling_params",
        )
    for i, sp in enumerate(per):
        if not isinstance(sp, SamplingParams):
            raise InvalidArgument(
                f"invalid `sampling_params[{i}]`: expected nextok.SamplingParams, got {type(sp).__name__}",
                code="invalid_argument",
                field=f"sampling_params[{i}]",
            )
    return per


def _outputs(items: list[tuple[Any, str | None]], raw: list[dict[str, Any]]) -> list[RequestOutput]:
    out = []
    for (_, text), r in zip(items, raw):
        outputs = []
        for o in r.pop("outputs"):
            if o["logprobs"] is not None:
                o["logprobs"] = [_logprob_map(m) for m in o["logprobs"]]
            outputs.append(CompletionOutput(**o))
        out.append(RequestOutput(prompt=text, outputs=outputs, **r))
    return out


class LLM:
    """A model and nextok's engine (continuous batching, prefix cache, forks for ``n``), shaped
    like ``vllm.LLM``.

    ``model`` is ``None`` (the default model, SmolLM2-135M-Instruct, fetched once), a GGUF
    file's path, or a model name nextok knows. ``requant="q8_0"`` re-quantises 4/5-bit
    matrices at load. Other keywords set the engine (``max_num_seqs``, ``max_batch_tokens``,
    ``prefill_chunk_tokens``, ``itl_target_ms``, ``kv_budget_bytes``, ``max_waiting``, ``prefix_cache_entries``,
    ``default_max_tokens``, ``max_tokens_limit``, ``constraint_cache_bytes``,
    ``parse_special_in_messages``, ``kv_cache_type``: ``"f16"``, the default, or ``"q8_0"``, which
    stores the KV cache in GGML's Q8_0 blocks, 56 % of the memory, like llama.cpp's
    ``--cache-type-k q8_0 --cache-type-v q8_0``; traces record it).
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, *, requant: str | None = None, **engine_config: Any) -> None:
        self._engine = _Engine(None if model is None else os.fspath(model), requant, engine_config)

    @property
    def model_path(self) -> str:
        """The model file."""
        return self._engine.model_path

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary size."""
        return self._engine.vocab_size

    def encode(self, text: str) -> list[int]:
        """Text → token ids, as a text prompt is tokenised."""
        return self._engine.encode(text)

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Runs every prompt (a string, ``{"prompt": str}`` or ``{"prompt_token_ids": [...]}``,
        or a list of them) with ``sampling_params`` (one for all, or one per prompt) as one
        batch, the GIL released while the engine works; returns one ``RequestOutput`` per
        prompt, in order. A request's tokens do not depend on what else runs beside it."""
        items = _prompts(prompts)
        per = _per_prompt(sampling_params, len(items))
        raw = self._engine.generate([(p, sp._spec()) for (p, _), sp in zip(items, per)])
        return _outputs(items, raw)

    def chat(
        self,
        messages: Sequence[dict[str, str]] | Sequence[Sequence[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Like ``vllm.LLM.chat``: one conversation (a list of ``{"role", "content"}`` dicts)
        or a list of them, each rendered with the model's own chat template and answered as
        the assistant's turn; run as one batch, one ``RequestOutput`` per conversation."""
        if isinstance(messages, Sequence) and messages and isinstance(messages[0], dict):
            convs: list[Any] = [messages]
        elif isinstance(messages, Sequence) and not isinstance(messages, (str, bytes)):
            convs = list(messages)
        else:
            raise InvalidArgument(
                f"invalid `messages`: expected a list of messages or of conversations, got {type(messages).__name__}",
                code="invalid_argument",
                field="messages",
            )
        per = _per_prompt(sampling_params, len(convs))
        raw = self._engine.generate([(c, {**sp._spec(), "chat": True}) for c, sp in zip(convs, per)])
        return _outputs([(c, None) for c in convs], raw)

    def stream(
        self,
        prompt: Any,
        sampling_params: SamplingParams | None = None,
        *,
        chat: bool = False,
    ) -> Iterator[StreamOutput]:
        """Runs one prompt (or, with ``chat=True``, one conversation) and yields its tokens as
        the engine selects them (``StreamOutput``), then each sequence's end. The GIL is
        released while waiting; Ctrl-C, or closing the generator early, cancels the request
        and frees its cache. Other requests keep running beside it."""
        sp = sampling_params if sampling_params is not None else SamplingParams()
        if not isinstance(sp, SamplingParams):
            raise InvalidArgument(
                f"invalid `sampling_params`: expected nextok.SamplingParams, got {type(sp).__name__}",
                code="invalid_argument",
                field="sampling_params",
            )
        if chat:
            item: Any = list(prompt)
        else:
            item = _prompts(prompt)
            if len(item) != 1:
                raise InvalidArgument(
                    "invalid `prompt`: stream takes one prompt", code="invalid_argument", field="prompt"
                )
            item = item[0][0]
        stream = self._engine.stream(item, {**sp._spec(), "chat": chat})
        try:
            for ev in stream:
                kind = ev.pop("type")
                if kind == "token":
                    ev["logprobs"] = _logprob_map(ev["logprobs"])
                    yield StreamOutput(**ev)
                elif kind == "finish":
                    yield StreamOutput(token_id=None, **ev)
        finally:
            stream.close()

    def replay(self, trace: str | os.PathLike[str], *, sampler_only: bool = False) -> int:
        """Runs a trace's request again on this model and compares every step record bit for
        bit (``nextok replay``); returns the number of steps that matched, or raises
        ``ReplayMismatch`` naming the first difference (its ``sequence``, ``step``, ``line``,
        ``field``, and the ``recorded`` and ``now`` values as JSON text). A trace recorded by a
        build of other numerics is refused before the model runs (``code ==
        "numerics_differ"``, with ``recorded_version``, ``recorded_numerics``, ``version`` and
        ``numerics``). With ``sampler_only=True`` the stored raw logits of a trace recorded with
        ``trace_logits=True`` go through the sampler, the constraint and the stop conditions
        alone (``nextok replay --sampler-only``): the model does not run, and only the
        sampler's numerics must be the trace's. ``trace`` is the JSON-lines text
        (``RequestOutput.trace``) or a path to a trace file."""
        return self._engine.replay(_trace_text(trace), sampler_only)


def _trace_text(trace: str | os.PathLike[str]) -> str:
    if isinstance(trace, os.PathLike) or (isinstance(trace, str) and "\n" not in trace and os.path.isfile(trace)):
        with open(trace, encoding="utf-8") as f:
            return f.read()
    if not isinstance(trace, str):
        raise InvalidArgument(
            f"invalid `trace`: expected the trace's text or a path, got {type(trace).__name__}",
            code="invalid_argument",
            field="trace",
        )
    return trace


def replay(
    trace: str | os.PathLike[str],
    model: str | os.PathLike[str] | LLM | None = None,
    *,
    sampler_only: bool = False,
) -> int:
    """Checks a trace: loads ``model`` (an ``LLM``, a GGUF path or model name; default: the
    default model) and replays the trace on it (``LLM.replay``; ``sampler_only`` replays the
    sampler alone on the trace's stored raw logits). Returns the number of steps that matched
    bit for bit."""
    llm = model if isinstance(model, LLM) else LLM(model)
    return llm.replay(trace, sampler_only=sampler_only)
