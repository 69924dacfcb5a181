"""nextok: a decoding runtime for language models.

A row of raw logits in, the next token out — and exactly how: every step keeps the raw
logits, the processed logits, the candidate support and the selection distribution apart,
and every logprob is labelled with its layer. This package runs the same Rust core as the
``nextok`` command line tool and server: the sampler level (``Pipeline``, ``Vocab``,
``Sampler``) for logits you compute, and the engine level (``LLM``, ``SamplingParams``) shaped
like vLLM's offline API.

>>> import numpy as np, nextok
>>> pipeline = nextok.Pipeline("reference", temperature=0.8, top_p=0.8)
>>> sampler = nextok.Sampler(pipeline, 3)
>>> state = sampler.new_state(seed=7)
>>> step = sampler.step(np.array([2.0, 1.5, 0.5], dtype=np.float32), state, logprobs=2)
>>> step.token in (0, 1), step.support_size
(True, 2)
"""

from __future__ import annotations

from ._errors import (
    AlreadyFinished,
    ConstraintError,
    Contradiction,
    EmptySupport,
    EngineError,
    InvalidArgument,
    InvalidLogits,
    InvalidParameter,
    NextokError,
    NonFiniteLogit,
    NotRecorded,
    ParseError,
    ReplayMismatch,
    TokenOutOfRange,
    VocabError,
    VocabSizeMismatch,
)
from ._llm import LLM, CompletionOutput, Logprob, RequestOutput, SamplingParams, StreamOutput, replay
from ._service import Chunk, Response, Service
from ._nextok import (
    FORMAT_VERSION,
    PRESETS,
    Logprobs,
    Pipeline,
    Sampler,
    State,
    Step,
    Vocab,
    __version__,
    build_info,
    explain,
)

__all__ = [
    "LLM",
    "Service",
    "Response",
    "Chunk",
    "SamplingParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "StreamOutput",
    "replay",
    "FORMAT_VERSION",
    "PRESETS",
    "Logprobs",
    "Pipeline",
    "Sampler",
    "State",
    "Step",
    "Vocab",
    "__version__",
    "explain",
    "build_info",
    "AlreadyFinished",
    "ConstraintError",
    "Contradiction",
    "EmptySupport",
    "EngineError",
    "InvalidArgument",
    "InvalidLogits",
    "InvalidParameter",
    "NextokError",
    "NonFiniteLogit",
    "NotRecorded",
    "ParseError",
    "ReplayMismatch",
    "TokenOutOfRange",
    "VocabError",
    "VocabSizeMismatch",
]
