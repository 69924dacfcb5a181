"""nextok inside llama-cpp-python.

``NextokLogitsProcessor`` is a ``logits_processor`` for ``Llama.__call__``,
``create_completion``, ``create_chat_completion`` and ``generate``: each call gets the raw row
of the token being chosen and hands back a row with one finite entry, nextok's token, which
llama.cpp's own sampler chain (penalties, top-k, top-p, min-p, temperature, the draw, or
greedy) then certainly selects. When nextok's sequence ends (a stop string, ``max_tokens``,
a constraint accepting) the row is forced to EOS, so the completion ends there too.

What stays the host's: the model, its numerics, its KV and prompt cache, detokenisation.
What becomes nextok's: processors and their order, the layers, the random stream, stopping,
and the step records (``processor.sequence``).

llama-cpp-python prints and ignores an exception raised in a processor and samples on. This
processor fails closed instead: on an error it forces EOS and keeps the exception in
``processor.error``; ``processor.check()`` raises it. Do not pass ``logit_bias`` with
``logits_processor`` (llama-cpp-python then drops every processor); give ``logit_bias`` to
nextok instead.

>>> from llama_cpp import Llama, LogitsProcessorList                     # doctest: +SKIP
>>> from nextok.integrations.llama_cpp import NextokLogitsProcessor      # doctest: +SKIP
>>> llm = Llama("model.gguf")                                            # doctest: +SKIP
>>> proc = NextokLogitsProcessor.for_llama(llm, "llama.cpp", temperature=0.8, seed=7)  # doctest: +SKIP
>>> out = llm("Once upon a time", max_tokens=32, logits_processor=LogitsProcessorList([proc]))  # doctest: +SKIP
>>> proc.check(); proc.sequence.state.output_ids                          # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._nextok import Pipeline, Sampler, Vocab
from ._core import HostSequence, build_sampler

__all__ = ["NextokLogitsProcessor"]


class NextokLogitsProcessor:
    """A llama-cpp-python logits processor that makes llama.cpp pick nextok's token.

    Args:
        sampler: a ``nextok.Sampler``, or a preset name built with ``params``, or a
            ``Pipeline`` / pipeline JSON.
        vocab: with a pipeline, the vocabulary: a ``nextok.Vocab`` (``Vocab.from_file`` on the
            same GGUF file) or the row length (``llm.n_vocab()``).
        seed: the sequence's seed (``None``: a fresh one, kept in the records).
        logprobs: record every step with the ``N`` best candidates in every layer.
        eos_token_id: the token forced once nextok's sequence has ended (default: the
            vocabulary's first EOS).
        **params: sampling parameters and sampler settings when ``sampler`` is a preset name.

    One processor follows one completion at a time. A call whose tokens do not continue the
    previous call's starts a new sequence (the whole ``input_ids`` is then its prompt), so the
    same processor can be passed to several completions in turn.
    """

    def __init__(
        self,
        sampler: Sampler | Pipeline | str | dict[str, Any] | None = "reference",
        vocab: Vocab | int | None = None,
        *,
        seed: int | None = None,
        logprobs: int | None = None,
        eos_token_id: int | None = None,
        **params: Any,
    ) -> None:
        self.sampler = build_sampler(sampler, vocab, params)
        self.seed = seed
        self.logprobs = logprobs
        self.eos_token_id = eos_token_id
        self.sequence: HostSequence | None = None
        self.error: BaseException | None = None
        self._prompt_len = 0
        self._next_len = -1

    @classmethod
    def for_llama(cls, llm: Any, sampler: Any = "reference", **kwargs: Any) -> NextokLogitsProcessor:
        """A processor for a ``llama_cpp.Llama``: the vocabulary is read from the model's GGUF
        file (token bytes, EOS) and sized to ``llm.n_vocab()``."""
        if isinstance(sampler, Sampler):
            return cls(sampler, **kwargs)
        vocab = Vocab.from_file(llm.model_path, vocab_size=int(llm.n_vocab()))
        return cls(sampler, vocab, **kwargs)

    def check(self) -> None:
        """Raises the error a call met (llama-cpp-python would have swallowed it)."""
        if self.error is not None:
            err, self.error = self.error, None
            raise err

    def __call__(self, input_ids: Any, scores: Any) -> np.ndarray:
        try:
            return self._call(input_ids, scores)
        except Exception as exc:
            self.error = exc
            eos = self.eos_token_id
            if eos is None and self.sequence is not None:
                eos = self.sequence.eos_token_id
            if eos is None:
                raise
            out = np.full(np.shape(scores), -np.inf, dtype=np.float32)
            out[eos] = 0.0
            return out

    def _call(self, input_ids: Any, scores: Any) -> np.ndarray:
        ids = np.asarray(input_ids).reshape(-1)
        n = ids.shape[0]
        if self.sequence is None or n != self._next_len:
            self._prompt_len = n
            self.sequence = HostSequence(
                self.sampler,
                seed=self.seed,
                prompt_ids=ids,
                logprobs=self.logprobs,
                eos_token_id=self.eos_token_id,
            )
        # the host's row is a strided view of its candidate buffer: one contiguous copy
        row = np.ascontiguousarray(scores, dtype=np.float32)
        self.sequence.sync(ids[self._prompt_len :])
        token = self.sequence.select(row)
        self._next_len = n + 1
        if token is None:
            return row
        out = np.full(row.shape, -np.inf, dtype=np.float32)
        out[token] = 0.0
        return out
