"""nextok inside vLLM: a pipeline that runs on a vLLM deployment, one machine or a cluster.

Two logits-processor classes, one for each of vLLM's model-runner interfaces:

- ``NextokLogitsProcessor`` for the V2 model runner (``vllm.v1.worker.gpu``; the only runner
  from vLLM 0.34, the default in 0.33): ``add_request(slot, params)`` and
  ``apply(logits, ctx)``;
- ``NextokV1LogitsProcessor`` for the V1 interface (``vllm.v1.sample.logits_processor``; vLLM
  0.33 and earlier): ``update_state(BatchUpdate)`` and ``apply(logits)``.

Register one with ``LLM(model, logits_processors=[NextokLogitsProcessor])`` or
``vllm serve ... --logits-processors nextok.integrations.vllm:NextokLogitsProcessor``, and turn
nextok on per request with ``SamplingParams(extra_args={"nextok": {...}})`` (the OpenAI server's
``vllm_xargs``)::

    {"pipeline": "vllm",          # a preset name or a pipeline object (default "reference")
     "temperature": 0.8, "top_p": 0.95, ...,       # sampling parameters of the preset
     "seed": 7,                   # default: the request's own seed, else a fresh one
     "stop": ["\\n\\n"], "max_tokens": 64, "constraint": {...},   # sampler settings
     "logprobs": 5, "trace": "/path/run.jsonl", "request_id": "r1"}   # step records

A request without ``"nextok"`` is left to vLLM. For a nextok request, the row vLLM samples has
one finite entry, nextok's token, which vLLM's temperature, top-k/top-p and draw then
certainly pick. The random stream is keyed by the request's seed and the token's position,
so a request's tokens do not depend on its batch, its slot, or on being preempted and
admitted again. With ``"trace"``, every step's record (four-layer logprobs of the ``logprobs``
best candidates, support size, pipeline hash) is appended to that JSON-lines file as it is
made, tagged with ``request_id``: vLLM runs processors in its engine process, so records
travel by file.

What stays vLLM's: the model, its numerics, batching, the KV cache, scheduling, detokenising,
and the stages it runs before a logits processor (its own logit bias, penalties, bad words
and structured-output mask: leave those unset and give them to nextok). What becomes
nextok's: the processors and their order, the layers, the random streams, stopping, and the
records. Speculative decoding is not supported with these processors (a draft row raises).

vLLM itself is imported only when one of these classes is first used; the logic lives in
``V2Slots`` and ``V1Slots``, which need only numpy (and torch for GPU tensors).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import numpy as np

from .._errors import InvalidArgument
from .._nextok import Pipeline, Sampler, Vocab
from ._core import SAMPLER_ARGS as _SAMPLER_ARGS
from ._core import HostSequence, force_rows, fresh_seed, to_numpy_rows

_log = logging.getLogger("nextok.integrations.vllm")

__all__ = ["NextokLogitsProcessor", "NextokV1LogitsProcessor", "V2Slots", "V1Slots", "RequestFactory"]

_OWN = ("pipeline", "seed", "logprobs", "trace", "request_id")


def _np(x: Any) -> np.ndarray:
    """A host buffer or tensor as a numpy array (``.np`` of vLLM's host-backed buffers, a
    torch tensor copied to the CPU, or numpy as is)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "np"):
        return np.asarray(x.np)
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    if hasattr(x, "gpu"):
        return _np(x.gpu)
    return np.asarray(x)


def _slot_row(buf: Any, slot: int, length: int) -> list[int]:
    """``buf[slot, :length]`` of a runner buffer, sliced before it leaves the device."""
    if hasattr(buf, "np"):
        return np.asarray(buf.np)[slot, :length].tolist()
    if hasattr(buf, "gpu"):
        buf = buf.gpu
    if hasattr(buf, "detach"):
        return buf[slot, :length].detach().cpu().tolist()
    return np.asarray(buf)[slot, :length].tolist()


def _vocab_for(vllm_config: Any) -> Vocab | int:
    """The vocabulary of the model vLLM serves: ``NEXTOK_VOCAB`` (a tokenizer.json or GGUF
    file) if set, else the tokenizer's ``tokenizer.json`` or the GGUF model file when they are
    local files, else a plain vocabulary of the logits width (ids only: no stop strings or
    constraints)."""
    mc = getattr(vllm_config, "model_config", None)
    size = None
    if mc is not None and hasattr(mc, "get_vocab_size"):
        size = int(mc.get_vocab_size())
    candidates = [os.environ.get("NEXTOK_VOCAB")]
    for attr in ("tokenizer", "model"):
        p = getattr(mc, attr, None) if mc is not None else None
        if isinstance(p, str):
            candidates += [os.path.join(p, "tokenizer.json"), p if p.endswith(".gguf") else None]
    for c in candidates:
        if c and os.path.isfile(c):
            return Vocab.from_file(c, vocab_size=size)
    if size is None:
        raise InvalidArgument(
            "invalid `vllm_config`: cannot tell the vocabulary size; set NEXTOK_VOCAB to a tokenizer.json",
            code="invalid_argument",
            field="vllm_config",
        )
    return size


class _Trace:
    """Appends step records to JSON-lines files, one line per step, shared by every request
    of the process."""

    _lock = threading.Lock()

    @classmethod
    def write(cls, path: str, request_id: Any, seq: HostSequence, start: int) -> None:
        lines = []
        for step in seq.steps[start:]:
            rec = step.record()
            rec["request_id"] = request_id
            lines.append(json.dumps(rec, separators=(",", ":")))
        if lines:
            with cls._lock, open(path, "a", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")


class _Request:
    __slots__ = ("seq", "trace", "request_id", "written", "args", "error", "eos")

    def __init__(self, seq: HostSequence | None, args: dict[str, Any], trace: str | None, request_id: Any) -> None:
        self.seq = seq
        self.args = args
        self.trace = trace
        self.request_id = request_id
        self.written = 0
        self.error: BaseException | None = None
        self.eos: int | None = None  # the vocabulary's EOS, forced on a failed request's rows

    def fail(self, exc: BaseException) -> None:
        """A request nextok cannot go on with ends (its rows are forced to EOS when one is
        known) instead of taking the engine down; the error is logged and traced."""
        self.error = exc
        _log.warning("nextok: request %r stopped: %s", self.request_id, exc)
        if self.trace is not None:
            line = json.dumps({"request_id": self.request_id, "error": str(exc)})
            with _Trace._lock, open(self.trace, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    def after_step(self) -> None:
        if self.trace is not None and self.seq is not None and len(self.seq.steps) > self.written:
            _Trace.write(self.trace, self.request_id, self.seq, self.written)
            self.written = len(self.seq.steps)


class RequestFactory:
    """Reads a request's ``extra_args["nextok"]`` and builds its sampler (one per distinct
    setting, cached) and sequence."""

    def __init__(self, vocab: Vocab | int, max_cached: int = 256) -> None:
        self.vocab = vocab
        eos = vocab.eos_token_ids if isinstance(vocab, Vocab) else []
        self.eos: int | None = eos[0] if eos else None
        self._samplers: dict[str, Sampler] = {}
        self._max = max_cached

    @staticmethod
    def args_of(params: Any) -> dict[str, Any] | None:
        """The ``nextok`` dict of a request's ``SamplingParams``, or ``None``."""
        extra = getattr(params, "extra_args", None)
        if not extra or "nextok" not in extra:
            return None
        args = extra["nextok"]
        if not isinstance(args, dict):
            raise InvalidArgument(
                f"invalid `extra_args.nextok`: expected an object, got {type(args).__name__}",
                code="invalid_argument",
                field="extra_args.nextok",
            )
        return args

    @staticmethod
    def pipeline(args: dict[str, Any]) -> Pipeline:
        """The request's pipeline: its preset built with its sampling parameters, or its
        pipeline object."""
        pipeline = args.get("pipeline", "reference")
        params = {k: v for k, v in args.items() if k not in _OWN and k not in _SAMPLER_ARGS}
        if isinstance(pipeline, str):
            return Pipeline(pipeline, **params)
        if params:
            name = next(iter(params))
            raise InvalidArgument(
                f"invalid `extra_args.nextok.{name}`: sampling parameters go with a preset name, "
                "not with a pipeline object",
                code="invalid_argument",
                field=f"extra_args.nextok.{name}",
            )
        return Pipeline.from_json(pipeline)

    @staticmethod
    def check_own(args: dict[str, Any]) -> None:
        """``logprobs`` and ``seed`` are integers >= 0, ``trace`` a path."""
        trace = args.get("trace")
        if trace is not None and not isinstance(trace, str):
            raise InvalidArgument(
                f"invalid `extra_args.nextok.trace`: expected a file path, got {type(trace).__name__}",
                code="invalid_argument",
                field="extra_args.nextok.trace",
            )
        for name in ("logprobs", "seed"):
            v = args.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise InvalidArgument(
                    f"invalid `extra_args.nextok.{name}`: {v!r} must be an integer >= 0",
                    code="invalid_argument",
                    field=f"extra_args.nextok.{name}",
                )

    def sampler(self, args: dict[str, Any]) -> Sampler:
        """The request's sampler (cached by its settings)."""
        key = json.dumps({k: v for k, v in args.items() if k not in _OWN or k == "pipeline"}, sort_keys=True)
        s = self._samplers.get(key)
        if s is None:
            sampler_args = {k: args[k] for k in _SAMPLER_ARGS if k in args}
            s = Sampler(self.pipeline(args), self.vocab, **sampler_args)
            if len(self._samplers) >= self._max:
                self._samplers.pop(next(iter(self._samplers)))
            self._samplers[key] = s
        return s

    def validate(self, params: Any) -> None:
        """Raises a typed nextok error (a ``ValueError``) for a request whose nextok settings
        are wrong: the pipeline and its parameters, ``logprobs``, ``seed``, and the sampler
        settings on this vocabulary."""
        args = self.args_of(params)
        if args is not None:
            self.check_own(args)
            self.sampler(args)

    def request(self, params: Any) -> _Request | None:
        """A pending request (its sequence is made when its history is known), or ``None`` when
        the request does not use nextok. Settings that fail here fail the request, not the
        caller."""
        try:
            args = self.args_of(params)
        except Exception as exc:  # noqa: BLE001 - one request must not stop the engine
            req = _Request(None, {}, None, None)
            req.eos = self.eos
            req.fail(exc)
            return req
        if args is None:
            return None
        trace = args.get("trace")
        req = _Request(None, args, trace if isinstance(trace, str) else None, args.get("request_id"))
        req.eos = self.eos
        try:
            self.check_own(args)
            self.sampler(args)
        except Exception as exc:  # noqa: BLE001
            req.fail(exc)
        return req

    def start(self, req: _Request, params_seed: Any, prompt_ids: Any, output_ids: Any) -> None:
        args = req.args
        seed = args.get("seed", params_seed)
        if seed is None:
            seed = fresh_seed()
        logprobs = args.get("logprobs")
        if logprobs is None and req.trace is not None:
            logprobs = 0
        req.seq = HostSequence(
            self.sampler(args), seed=seed, prompt_ids=prompt_ids, output_ids=output_ids, logprobs=logprobs
        )


class V2Slots:
    """The V2 model runner's interface over nextok sequences, keyed by slot.

    ``add_request(slot, params)`` takes the slot for a request (the previous occupant is
    forgotten); ``apply(logits, ctx)`` forces every row whose slot holds a nextok request.
    The history (prompt and tokens generated before a preemption) is read from the runner's
    request-state buffers on the slot's first row; later rows follow ``ctx.input_ids`` /
    ``ctx.pos`` (the token fed last and its position).
    """

    def __init__(self, vllm_config: Any, req_states: Any, vocab: Vocab | int | None = None) -> None:
        self.req_states = req_states
        self.factory = RequestFactory(vocab if vocab is not None else _vocab_for(vllm_config))
        self.slots: dict[int, _Request] = {}
        self.seeds: dict[int, Any] = {}

    def validate_params(self, params: Any) -> None:
        self.factory.validate(params)

    def add_request(self, req_idx: int, params: Any) -> bool:
        req = self.factory.request(params)
        if req is None:
            self.slots.pop(req_idx, None)
            return False
        self.slots[req_idx] = req
        self.seeds[req_idx] = getattr(params, "seed", None)
        return True

    def _history(self, slot: int, length: int) -> tuple[list[int], list[int]]:
        rs = self.req_states
        prompt_len = int(_np(rs.prompt_len)[slot])
        tokens = _slot_row(rs.all_token_ids, slot, length)
        return tokens[:prompt_len], tokens[prompt_len:]

    def apply(self, logits: Any, ctx: Any) -> Any:
        if not self.slots:
            return logits
        row_slot = _np(ctx.expanded_idx_mapping)
        local = _np(ctx.expanded_local_pos) if getattr(ctx, "expanded_local_pos", None) is not None else None
        pos = _np(ctx.pos)
        fed = _np(ctx.input_ids)
        rs = self.req_states
        prompt_len = _np(rs.prompt_len)
        prefill_len = _np(rs.prefill_len) if getattr(rs, "prefill_len", None) is not None else prompt_len
        # the rows of nextok requests that sample a token this step
        work: list[tuple[int, _Request]] = []
        for r in range(row_slot.shape[0]):
            slot = int(row_slot[r])
            req = self.slots.get(slot)
            if req is None:
                continue
            length = int(pos[r]) + 1  # tokens in the sequence, the one fed at this row included
            if length < int(prefill_len[slot]):
                continue  # a prompt chunk: vLLM discards this row's token
            if req.error is None:
                try:
                    if local is not None and int(local[r]) != 0:
                        raise InvalidArgument(
                            "speculative decoding is not supported with nextok's logits processor",
                            code="invalid_argument",
                            field="speculative_config",
                        )
                    if req.seq is None:
                        prompt, out = self._history(slot, length)
                        self.factory.start(req, self.seeds.get(slot), prompt, out)
                    else:
                        n_out = length - int(prompt_len[slot])
                        req.seq.sync_tail(n_out, int(fed[r]), lambda s=slot, n=length: self._history(s, n)[1])
                except Exception as exc:  # noqa: BLE001 - one request must not stop the engine
                    req.fail(exc)
            work.append((r, req))
        return _select_and_force(logits, work)


def _select_and_force(logits: Any, work: list[tuple[int, _Request]]) -> Any:
    """Selects nextok's token for each ``(row, request)`` (only those rows leave the device)
    and forces them; a failed request's row is forced to its EOS."""
    if not work:
        return logits
    rows = [r for r, _ in work]
    sub = to_numpy_rows(logits[rows], "logits")
    forced_rows: list[int] = []
    tokens: list[int] = []
    for i, (r, req) in enumerate(work):
        tok = None
        if req.error is None and req.seq is not None:
            try:
                tok = req.seq.select(sub[i])
                req.after_step()
            except Exception as exc:  # noqa: BLE001 - one request must not stop the engine
                req.fail(exc)
        if req.error is not None:
            tok = req.seq.eos_token_id if req.seq is not None else req.eos
        if tok is not None:
            forced_rows.append(r)
            tokens.append(tok)
    force_rows(logits, forced_rows, tokens)
    return logits


class V1Slots:
    """The V1 interface over nextok sequences, keyed by persistent-batch index.

    ``update_state`` applies a ``BatchUpdate`` in vLLM's documented order (removed, added,
    moved; a move is a swap or a one-way move that empties its source); ``apply(logits)``
    forces every row holding a nextok request, after bringing its sequence up to the live
    output-token list vLLM handed over when the request was added.
    """

    def __init__(self, vllm_config: Any, vocab: Vocab | int | None = None) -> None:
        self.factory = RequestFactory(vocab if vocab is not None else _vocab_for(vllm_config))
        self.slots: dict[int, tuple[_Request, Any]] = {}

    def validate_params(self, params: Any) -> None:
        self.factory.validate(params)

    def update_state(self, batch_update: Any) -> None:
        if batch_update is None:
            return
        for i in batch_update.removed:
            self.slots.pop(int(i), None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            req = self.factory.request(params)
            if req is None:
                self.slots.pop(int(index), None)
                continue
            if req.error is None:
                try:
                    self.factory.start(req, getattr(params, "seed", None), prompt_ids, output_ids)
                except Exception as exc:  # noqa: BLE001
                    req.fail(exc)
            self.slots[int(index)] = (req, output_ids)
        for a, b, direction in batch_update.moved:
            a, b = int(a), int(b)
            name = getattr(direction, "name", str(direction))
            ea, eb = self.slots.pop(a, None), self.slots.pop(b, None)
            if name.upper().endswith("SWAP"):
                if ea is not None:
                    self.slots[b] = ea
                if eb is not None:
                    self.slots[a] = eb
            elif ea is not None:
                self.slots[b] = ea

    def apply(self, logits: Any) -> Any:
        if not self.slots:
            return logits
        n_rows = int(logits.shape[0])
        work: list[tuple[int, _Request]] = []
        for r in sorted(self.slots):
            if r >= n_rows:
                continue
            req, live = self.slots[r]
            if req.error is None and req.seq is not None:
                try:
                    req.seq.sync(live)
                except Exception as exc:  # noqa: BLE001 - one request must not stop the engine
                    req.fail(exc)
            work.append((r, req))
        return _select_and_force(logits, work)

    def is_argmax_invariant(self) -> bool:
        return False


def _validate_without_vocab(params: Any) -> None:
    """What can be checked where vLLM validates requests (its front-end process, without the
    model's vocabulary): the pipeline and its parameters, ``logprobs`` and ``seed``. Settings
    that need the vocabulary are checked when the request is added; a failure there ends only
    that request."""
    args = RequestFactory.args_of(params)
    if args is not None:
        RequestFactory.check_own(args)
        RequestFactory.pipeline(args)


_classes: dict[str, type] = {}


def _v2_class() -> type:
    from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as Base

    class NextokLogitsProcessor(Base):  # type: ignore[misc, valid-type]
        """nextok's logits processor for vLLM's V2 model runner (see the module)."""

        def __init__(self, vllm_config: Any, req_states: Any) -> None:
            super().__init__(vllm_config, req_states)
            self._slots = V2Slots(vllm_config, req_states)

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            _validate_without_vocab(sampling_params)

        def add_request(self, req_idx: int, sampling_params: Any) -> bool:
            return self._slots.add_request(req_idx, sampling_params)

        def apply(self, logits: Any, ctx: Any) -> Any:
            return self._slots.apply(logits, ctx)

    # importable (and picklable, for vLLM's engine process) as this module's attribute
    NextokLogitsProcessor.__module__ = __name__
    NextokLogitsProcessor.__qualname__ = "NextokLogitsProcessor"
    return NextokLogitsProcessor


def _v1_class() -> type:
    from vllm.v1.sample.logits_processor import LogitsProcessor as Base

    class NextokV1LogitsProcessor(Base):  # type: ignore[misc, valid-type]
        """nextok's logits processor for vLLM's V1 interface (see the module)."""

        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            self._slots = V1Slots(vllm_config)

        @classmethod
        def validate_params(cls, sampling_params: Any) -> None:
            _validate_without_vocab(sampling_params)

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Any) -> None:
            self._slots.update_state(batch_update)

        def apply(self, logits: Any) -> Any:
            return self._slots.apply(logits)

    NextokV1LogitsProcessor.__module__ = __name__
    NextokV1LogitsProcessor.__qualname__ = "NextokV1LogitsProcessor"
    return NextokV1LogitsProcessor


def __getattr__(name: str) -> Any:
    # the classes subclass vLLM's own base classes, so they are made when first asked for
    makers = {"NextokLogitsProcessor": _v2_class, "NextokV1LogitsProcessor": _v1_class}
    if name in makers:
        if name not in _classes:
            cls = makers[name]()
            _classes[name] = cls
            globals()[name] = cls
        return _classes[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
