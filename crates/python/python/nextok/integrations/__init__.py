"""nextok inside other hosts: each adapter makes the host pick nextok's token.

Every adapter takes the host's raw logits row, lets nextok select the token (its processors,
order, layers, per-sequence random stream, stopping and records), and hands back a row with
one finite entry, so the host's own sampler picks that token whatever its settings. The host
keeps its model, numerics, batching and cache.

- ``nextok.integrations.transformers``: ``NextokLogitsProcessor`` for ``generate``'s
  ``logits_processor=``, and ``generate`` for ``custom_generate=``.
- ``nextok.integrations.llama_cpp``: ``NextokLogitsProcessor`` for llama-cpp-python's
  ``logits_processor=``.
- ``nextok.integrations.vllm``: ``NextokLogitsProcessor`` (vLLM's V2 model runner) and
  ``NextokV1LogitsProcessor`` (the V1 interface) for ``logits_processors=`` /
  ``--logits-processors``, with per-request settings in ``extra_args["nextok"]``.

The host packages are imported only when an adapter needs them; ``import nextok`` needs only
numpy.
"""

from __future__ import annotations

__all__ = ["transformers", "llama_cpp", "vllm"]
