"""What every adapter shares: one host sequence kept in step with a nextok state, rows forced
to nextok's token, and conversions between the host's arrays and numpy.

The hosts (transformers, llama-cpp-python, vLLM) hand over raw logits and later tell which
token they appended. An adapter selects nextok's token from the row and hands back a row with
one finite entry, so whatever the host's own sampler does with it (greedy, top-k, temperature,
multinomial), it appends nextok's token. Nothing here imports a host package.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import InvalidArgument
from .._nextok import Pipeline, Sampler, State, Step, Vocab

__all__ = ["HostSequence", "force_rows", "to_numpy_rows", "make_sampler", "build_sampler", "fresh_seed", "SAMPLER_ARGS"]


def fresh_seed() -> int:
    """A seed from the operating system's random source, for requests that give none (the
    seed is kept in the sequence's state and step records, so the run can still be replayed)."""
    return int.from_bytes(os.urandom(8), "little")


def make_sampler(
    sampler: Sampler | Pipeline | str | dict[str, Any] | None,
    vocab: Vocab | int | None,
    *,
    field: str = "sampler",
    **sampler_args: Any,
) -> Sampler:
    """``sampler`` as is, or a ``Sampler`` of a pipeline (a ``Pipeline``, a preset name or
    pipeline JSON) over ``vocab`` (a ``Vocab`` or a size)."""
    if isinstance(sampler, Sampler):
        if vocab is not None or sampler_args:
            raise InvalidArgument(
                f"invalid `{field}`: a Sampler already has its vocabulary and stop settings; "
                "pass a pipeline to give them here",
                code="invalid_argument",
                field=field,
            )
        return sampler
    if vocab is None:
        raise InvalidArgument(
            "invalid `vocab`: a pipeline needs a vocabulary (a nextok.Vocab or the logits row length)",
            code="invalid_argument",
            field="vocab",
        )
    return Sampler(sampler if sampler is not None else "reference", vocab, **sampler_args)


def to_numpy_rows(scores: Any, field: str = "scores") -> np.ndarray:
    """A C-contiguous 2-D float32 numpy array of ``scores`` (a numpy array, or a torch tensor on
    any device in any float dtype). A float32 numpy array or CPU tensor is not copied."""
    if isinstance(scores, np.ndarray):
        arr = scores
    elif hasattr(scores, "detach") and hasattr(scores, "cpu"):
        # a torch tensor: float32 on the CPU, as the sampler reads it
        t = scores.detach()
        if str(getattr(t, "dtype", "")) != "torch.float32":
            t = t.float()
        arr = t.cpu().numpy()
    else:
        raise InvalidArgument(
            f"invalid `{field}`: expected a numpy array or a torch tensor, got {type(scores).__name__}",
            code="invalid_argument",
            field=field,
        )
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2:
        raise InvalidArgument(
            f"invalid `{field}`: expected 1 or 2 dimensions, got {arr.ndim}", code="invalid_argument", field=field
        )
    if arr.dtype != np.float32 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr


def force_rows(scores: Any, rows: Sequence[int], tokens: Sequence[int]) -> None:
    """In place: each row in ``rows`` becomes ``-inf`` everywhere but ``0.0`` at its token.
    Works on numpy arrays and torch tensors alike (both index with lists)."""
    if not rows:
        return
    rows = list(rows)
    scores[rows] = float("-inf")
    scores[rows, list(tokens)] = 0.0


def _ids(values: Any, field: str) -> list[int]:
    if values is None:
        return []
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        raise InvalidArgument(
            f"invalid `{field}`: expected a sequence of token ids", code="invalid_argument", field=field
        ) from None


# the keywords a Sampler takes besides the pipeline and vocabulary
SAMPLER_ARGS = (
    "constraint",
    "stop",
    "stop_token_ids",
    "max_tokens",
    "ignore_eos",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "grammar_policy",
)


def _split(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    sampler_args = {k: params.pop(k) for k in SAMPLER_ARGS if k in params}
    return params, sampler_args


def build_sampler(
    sampler: Sampler | Pipeline | str | dict[str, Any] | None, vocab: Vocab | int | None, params: dict[str, Any]
) -> Sampler:
    """A ``Sampler``: ``sampler`` as is, or a preset name built with ``params`` (sampling
    parameters and sampler settings mixed, as the adapters take them), or a ``Pipeline`` /
    pipeline JSON over ``vocab``."""
    params, sampler_args = _split(dict(params))
    if isinstance(sampler, str) or sampler is None:
        sampler = Pipeline(sampler or "reference", **params)
    elif params:
        raise InvalidArgument(
            f"invalid `{next(iter(params))}`: sampling parameters go with a preset name, "
            "not with a Pipeline or Sampler",
            code="invalid_argument",
            field=next(iter(params)),
        )
    return make_sampler(sampler, vocab, **sampler_args)


class HostSequence:
    """One sequence of a host, decoded by nextok.

    It holds a nextok ``State`` and follows the host's list of generated tokens. Before each
    step, tokens the host appended that nextok has not seen are committed (teacher forcing);
    when the host's list does not continue nextok's (a step the host discarded, as for a
    prompt chunk; a request preempted and admitted again; a sequence rolled back), the state
    is rebuilt from the prompt and the host's tokens. The random stream is keyed by the
    position in the sequence, so a rebuilt state draws exactly as the first one did.
    ``logprobs=N`` records every step (``steps``, ``records()``).
    """

    __slots__ = ("sampler", "state", "seed", "prompt_ids", "logprobs", "steps", "eos_token_id", "_seen", "_last", "_pos")

    def __init__(
        self,
        sampler: Sampler,
        *,
        seed: int | None = None,
        prompt_ids: Any = None,
        output_ids: Any = None,
        logprobs: int | None = None,
        eos_token_id: int | None = None,
    ) -> None:
        self.sampler = sampler
        self.seed = fresh_seed() if seed is None else int(seed)
        self.prompt_ids = _ids(prompt_ids, "prompt_ids")
        self.logprobs = logprobs
        self.steps: list[Step] = []
        # the output position of each recorded step
        self._pos: list[int] = []
        if eos_token_id is None:
            vocab = sampler.vocab
            eos = vocab.eos_token_ids if vocab is not None else []
            eos_token_id = eos[0] if eos else None
        self.eos_token_id = eos_token_id
        self._rebuild(_ids(output_ids, "output_ids"))

    def _rebuild(self, output_ids: list[int]) -> None:
        self.state: State = self.sampler.new_state(seed=self.seed, prompt_ids=self.prompt_ids, output_ids=output_ids)
        # how many of the host's generated tokens this state has taken in, and the last one
        self._seen = len(output_ids)
        self._last = output_ids[-1] if output_ids else -1
        keep = sum(1 for p in self._pos if p < self._seen)
        del self.steps[keep:]
        del self._pos[keep:]

    def sync(self, host_output_ids: Sequence[int]) -> None:
        """Brings the state up to the host's generated tokens (see the class)."""
        n = self._seen
        if len(host_output_ids) < n or (n > 0 and int(host_output_ids[n - 1]) != self._last):
            self._rebuild(_ids(host_output_ids, "output_ids"))
            return
        for t in host_output_ids[n:]:
            self._take(int(t))

    def sync_tail(self, n_outputs: int, last_token: int, history: Any) -> None:
        """Like ``sync`` when the host tells only how many tokens it has generated and the last
        one; ``history()`` gives them all, and is called only when they do not follow on."""
        if n_outputs == self._seen and (n_outputs == 0 or last_token == self._last):
            return
        if n_outputs == self._seen + 1:
            self._take(int(last_token))
            return
        self._rebuild(_ids(history(), "output_ids"))

    def _take(self, t: int) -> None:
        if not self.state.finished:
            self.sampler.commit(self.state, t)
        # past nextok's end the host pads or appends; those tokens are only counted
        self._seen += 1
        self._last = t

    def select(self, row: np.ndarray) -> int | None:
        """nextok's token for ``row`` (a 1-D float32 array), committed to the state; when the
        sequence has already finished, its EOS token (``None`` when none is known)."""
        if self.state.finished:
            return self.eos_token_id
        step = self.sampler.step(row, self.state, logprobs=self.logprobs)
        if self.logprobs is not None:
            self.steps.append(step)
            self._pos.append(self._seen)
        self._seen += 1
        self._last = step.token
        return step.token

    @property
    def finished(self) -> bool:
        """Whether nextok's sequence has ended (EOS, a stop token or string, ``max_tokens``, the
        constraint accepting)."""
        return self.state.finished

    def records(self) -> list[dict[str, Any]]:
        """The step records of the recorded steps (``logprobs=N``), as trace lines hold them."""
        return [s.record() for s in self.steps]
