"""nextok inside HF transformers' ``generate``.

``NextokLogitsProcessor`` is a ``LogitsProcessor``: put it in ``logits_processor=`` and every
row's next token is the one nextok selects from the model's raw scores, with each row's own
random stream (a row's tokens do not depend on its batch) and nextok's step records beside
the host's outputs. ``generate`` is a decoding loop for ``model.generate(custom_generate=...)``
that runs the whole step with nextok's per-row states and stops each row on nextok's finish
(EOS, stop tokens and strings, ``max_tokens``, a constraint accepting).

What stays the host's: the model and its numerics, batching and padding, the KV cache, and
``generate``'s own outputs. What becomes nextok's: the processors, their order, the layers,
the random streams, stopping, and the records. Put nextok's processor last, or alone: any
processor after it sees a row with one finite entry; ``do_sample`` and the host's
temperature, top-k and top-p then pick that entry whatever they are.

>>> import nextok                                                          # doctest: +SKIP
>>> from nextok.integrations.transformers import NextokLogitsProcessor      # doctest: +SKIP
>>> proc = NextokLogitsProcessor("vllm", vocab=model.config.vocab_size,
...                              temperature=0.8, top_p=0.95, seed=[7, 8])  # doctest: +SKIP
>>> out = model.generate(**batch, logits_processor=[proc], do_sample=False) # doctest: +SKIP
>>> proc.sequences[0].records()                                             # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import InvalidArgument
from .._nextok import Pipeline, Sampler, Vocab
from ._core import HostSequence, build_sampler, force_rows, to_numpy_rows

__all__ = ["NextokLogitsProcessor", "generate"]

def _seeds(seed: int | Sequence[int] | None, rows: int) -> list[int | None]:
    if seed is None or isinstance(seed, (int, np.integer)):
        return [None if seed is None else int(seed)] * rows
    seeds = [int(s) for s in seed]
    if len(seeds) != rows:
        raise InvalidArgument(
            f"invalid `seed`: {len(seeds)} seeds for a batch of {rows} rows",
            code="invalid_argument",
            field="seed",
        )
    return seeds


def _strip_left(ids: list[int], pad: int | None) -> list[int]:
    if pad is None:
        return ids
    i = 0
    while i < len(ids) and ids[i] == pad:
        i += 1
    return ids[i:]


class NextokLogitsProcessor:
    """A transformers ``LogitsProcessor`` that makes ``generate`` pick nextok's token.

    Args:
        sampler: a ``nextok.Sampler``; or a preset name (``"reference"``, ``"hf"``, ``"vllm"``,
            ``"llama.cpp"``) built with ``params``; or a ``Pipeline`` / pipeline JSON.
        vocab: with a pipeline, the vocabulary: a ``nextok.Vocab`` (stop strings and
            constraints need token bytes) or the model's logits width
            (``model.config.vocab_size``).
        seed: one seed for every row, or one per row (a row's tokens depend only on its
            prompt and seed, not on its batch). ``None``: a fresh seed per row, kept in the
            records.
        logprobs: record every step with the ``N`` best candidates' logprobs in every layer
            (``sequences[i].steps``, ``sequences[i].records()``).
        pad_token_id: left padding to drop from the prompt (penalties do not count it).
        eos_token_id: the token forced once nextok's sequence has ended (default: the
            vocabulary's first EOS), so that ``generate`` stops the row too.
        **params: sampling parameters (``temperature``, ``top_p``, ...) and sampler settings
            (``stop``, ``max_tokens``, ``constraint``, ...) when ``sampler`` is a preset name.

    A new generation starts whenever the batch size or length is not the one the previous
    call leads to, so one processor can serve several ``generate`` calls in turn (not at once).
    """

    def __init__(
        self,
        sampler: Sampler | Pipeline | str | dict[str, Any] | None = "reference",
        vocab: Vocab | int | None = None,
        *,
        seed: int | Sequence[int] | None = None,
        logprobs: int | None = None,
        pad_token_id: int | None = None,
        eos_token_id: int | None = None,
        **params: Any,
    ) -> None:
        self.sampler = build_sampler(sampler, vocab, params)
        self.seed = seed
        self.logprobs = logprobs
        self.pad_token_id = pad_token_id
        self.eos_token_id = eos_token_id
        self.sequences: list[HostSequence] = []
        self._prompt_len = 0
        self._next_len = -1

    def reset(self) -> None:
        """Forgets the current generation; the next call starts a new one."""
        self.sequences = []
        self._next_len = -1

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        ids = np.asarray(input_ids.cpu() if hasattr(input_ids, "cpu") else input_ids)
        if ids.ndim != 2:
            raise InvalidArgument(
                f"invalid `input_ids`: expected (batch, length), got {ids.ndim} dimensions",
                code="invalid_argument",
                field="input_ids",
            )
        rows = to_numpy_rows(scores)
        batch, length = ids.shape
        if rows.shape[0] != batch:
            raise InvalidArgument(
                f"invalid `scores`: {rows.shape[0]} rows for {batch} sequences",
                code="invalid_argument",
                field="scores",
            )
        if length != self._next_len or len(self.sequences) != batch:
            seeds = _seeds(self.seed, batch)
            self._prompt_len = length
            self.sequences = [
                HostSequence(
                    self.sampler,
                    seed=seeds[i],
                    prompt_ids=_strip_left(ids[i].tolist(), self.pad_token_id),
                    logprobs=self.logprobs,
                    eos_token_id=self.eos_token_id,
                )
                for i in range(batch)
            ]
        tokens: list[int] = []
        forced: list[int] = []
        for i, seq in enumerate(self.sequences):
            seq.sync(ids[i, self._prompt_len :])
            tok = seq.select(rows[i])
            if tok is not None:
                forced.append(i)
                tokens.append(tok)
        self._next_len = length + 1
        out = scores.clone() if hasattr(scores, "clone") else np.array(scores, dtype=np.float32, copy=True)
        force_rows(out, forced, tokens)
        return out


class _NextokStop:
    """A stopping criterion: a row stops when nextok's sequence has ended."""

    def __init__(self, proc: NextokLogitsProcessor) -> None:
        self.proc = proc

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        done = [s.finished for s in self.proc.sequences] or [False] * int(input_ids.shape[0])
        if isinstance(input_ids, np.ndarray):
            return np.array(done, dtype=bool)
        import torch

        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def _find_processor(logits_processor: Any, model_kwargs: dict[str, Any], nextok: Any) -> NextokLogitsProcessor:
    if nextok is None:
        nextok = model_kwargs.pop("nextok", None)
    if nextok is None:
        nextok = next((p for p in (logits_processor or []) if isinstance(p, NextokLogitsProcessor)), None)
    if not isinstance(nextok, NextokLogitsProcessor):
        raise InvalidArgument(
            "invalid `nextok`: pass nextok=NextokLogitsProcessor(...) to generate, or put one in logits_processor",
            code="invalid_argument",
            field="nextok",
        )
    return nextok


def generate(
    model: Any,
    input_ids: Any,
    logits_processor: Any = None,
    stopping_criteria: Any = None,
    generation_config: Any = None,
    synced_gpus: bool = False,
    streamer: Any = None,
    nextok: NextokLogitsProcessor | None = None,
    nextok_streamer: Any = None,
    **model_kwargs: Any,
) -> Any:
    """The decoding step for ``model.generate(custom_generate=generate, nextok=processor)``
    (transformers 4.56 and later take a callable here).

    nextok runs the whole sampling step: the host's own logits processors and warpers
    (repetition penalty, temperature, top-k, ... from the call or the model's
    ``generation_config``) are left out, and express themselves as nextok parameters instead;
    every row's token is nextok's, and a row stops when nextok's sequence ends (EOS, stop
    tokens and strings, ``max_tokens``, a constraint accepting) or when a host stopping
    criterion (``max_new_tokens``, ...) says so. The host's loop does the rest (model,
    cache, padding of finished rows), and its return value is returned: the sequences, or
    the output object when ``return_dict_in_generate`` is set. The processor may also be
    given in ``logits_processor``. transformers 4.57 and later no longer hand ``streamer`` to
    a callable: pass it as ``nextok_streamer=``.
    """
    proc = _find_processor(logits_processor, model_kwargs, nextok)
    pad = getattr(generation_config, "pad_token_id", None)
    if proc.pad_token_id is None and pad is not None:
        proc.pad_token_id = int(pad if not isinstance(pad, (list, tuple)) else pad[0])
    proc.reset()
    # the list types are the host's own; built the way it builds them
    processors = type(logits_processor)([proc]) if logits_processor is not None else [proc]
    if stopping_criteria is not None:
        criteria = type(stopping_criteria)([*stopping_criteria, _NextokStop(proc)])
    else:
        criteria = [_NextokStop(proc)]
    return model._sample(
        input_ids,
        logits_processor=processors,
        stopping_criteria=criteria,
        generation_config=generation_config,
        synced_gpus=synced_gpus,
        streamer=streamer if streamer is not None else nextok_streamer,
        **model_kwargs,
    )
