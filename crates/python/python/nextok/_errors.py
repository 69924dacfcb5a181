"""The exceptions nextok raises.

Every typed error of the Rust core arrives as an instance of one of these classes, with the
error's machine-readable ``code`` (``"invalid_parameter"``, ``"empty_support"``, ...) and the
``field`` it names (``"top_p"``, ``"logits"``, ``"prompt_ids[3]"``, ...), plus the kind's own
details as attributes (``index`` and ``value`` of a non-finite logit, ``stage`` of an empty
support, ``token`` and ``vocab_size`` of an id out of range, ...).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "NextokError",
    "InvalidParameter",
    "Contradiction",
    "ParseError",
    "TokenOutOfRange",
    "InvalidArgument",
    "InvalidLogits",
    "NonFiniteLogit",
    "VocabSizeMismatch",
    "EmptySupport",
    "AlreadyFinished",
    "ConstraintError",
    "VocabError",
    "EngineError",
    "NotRecorded",
    "ReplayMismatch",
]


class NextokError(Exception):
    """Base class of every nextok error.

    Attributes:
        message: the error's text (also ``str(exc)``).
        code: the machine-readable code of the Rust error (``"invalid_parameter"``, ...).
        field: the parameter, argument or request field at fault, when there is one.
    """

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.field = field
        self.details = details
        for name, value in details.items():
            setattr(self, name, value)


class InvalidParameter(NextokError, ValueError):
    """A parameter is outside its domain (``top_p`` outside (0, 1], ...); ``field`` names it."""


class Contradiction(InvalidParameter):
    """Two settings contradict each other (an empty allowed set, ``min_tokens > max_tokens``
    while the stop tokens are hidden, a constraint without a grammar mask, ...)."""


class ParseError(InvalidParameter):
    """A pipeline, parameter set or request could not be read: an unknown parameter name, a
    value of the wrong type; ``field`` is the path that failed."""


class TokenOutOfRange(InvalidParameter):
    """A token id is outside ``0..vocab_size``; has ``token`` and ``vocab_size``."""


class InvalidArgument(NextokError, ValueError, TypeError):
    """An argument from Python has the wrong type, shape, dtype or layout (a float64 array,
    a 2-D array where one row is expected, a strided view, a state of another sampler, ...);
    ``field`` names the argument."""


class InvalidLogits(NextokError, ValueError):
    """The logits row cannot be used; ``field`` is ``"logits"``."""


class NonFiniteLogit(InvalidLogits):
    """A logit is NaN or +inf; ``index`` is the first such index, ``value`` ``"NaN"`` or
    ``"+inf"``. (-inf is allowed: it masks the token.)"""


class VocabSizeMismatch(InvalidLogits):
    """The logits row's length is not the vocabulary size; has ``expected`` and ``got``."""


class EmptySupport(NextokError):
    """No token is left to select after the processor ``stage``; the selector was not called
    and the state is unchanged."""


class AlreadyFinished(NextokError):
    """The sequence has already finished; no further step is allowed."""


class ConstraintError(NextokError):
    """A structured-output constraint failed to compile or refused a token; ``code`` is the
    constraint engine's."""


class VocabError(NextokError):
    """A vocabulary could not be loaded; ``kind`` is ``"io"``, ``"parse"``, ``"invalid"`` or
    ``"unsupported"`` and ``source`` names the file."""


class EngineError(NextokError):
    """The engine could not run a request (too large, queue full, model failure, shutdown)."""


class ReplayMismatch(NextokError):
    """A replayed trace did not give the recorded steps bit for bit (or was recorded with
    another model, quantisation or pipeline); the message names the first difference."""


class NotRecorded(NextokError):
    """A recorded value (logprobs, support size, step record) was asked of a step that was not
    recorded: pass ``logprobs=N`` to ``Sampler.step``."""
