"""The shared test vectors (testdata/vectors/) run from Python, two ways.

* ``nextok.explain(request)`` — ``nextok explain --json`` — must give what each case expects
  (selected token, support, the numeric maps, stage sizes, or the error's code and field).
* The sampler level — ``Pipeline``, ``Vocab``, ``Sampler``, ``new_state`` with the history as
  ``output_ids``, ``explain`` and a recorded ``step`` — must give the same expectations, and exactly
  the same token, support and logprobs (every layer, every candidate) as the Rust side's
  explain output for the same request.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import nextok

from conftest import VECTORS, load_cases, row

CASES = load_cases()

# the exception class of each core error code
CLASS = {
    "invalid_parameter": nextok.InvalidParameter,
    "contradiction": nextok.Contradiction,
    "parse": nextok.ParseError,
    "token_out_of_range": nextok.TokenOutOfRange,
    "non_finite_logit": nextok.NonFiniteLogit,
    "vocab_size_mismatch": nextok.VocabSizeMismatch,
    "empty_support": nextok.EmptySupport,
    "already_finished": nextok.AlreadyFinished,
}

# fields that a pipeline given as an object leaves to the sampler and the state
REQUEST_LEVEL = {
    "max_tokens",
    "stop_token_ids",
    "stop",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "ignore_eos",
    "seed",
    "grammar_policy",
}


def test_the_vectors_are_there() -> None:
    assert len(list(VECTORS.glob("*.json"))) >= 5
    assert len(CASES) >= 40


def id_of(req: dict, ref: object) -> int:
    if isinstance(ref, int):
        return ref
    names = req.get("tokens")
    if names is not None:
        return names.index(ref)
    return int(ref)  # type: ignore[arg-type]


def rounded(x: float, d: int) -> float:
    """Half away from zero, as the Rust runner rounds."""
    s = 10.0**d
    return math.copysign(math.floor(abs(x) * s + 0.5), x) / s if math.isfinite(x) else x


def num(v: object) -> float:
    return -math.inf if v == "-inf" else float(v)  # type: ignore[arg-type]


def check_expect(ctx: str, req: dict, exp: dict, selected: int, support: list[int], rows: list[dict], stages: list[dict]) -> None:
    """The case's expectations against one path's results (rows: one ledger row per token)."""
    if "selected" in exp:
        assert selected == id_of(req, exp["selected"]), f"{ctx}: selected"
    if "support" in exp:
        assert support == sorted(id_of(req, t) for t in exp["support"]), f"{ctx}: support"
    d = exp.get("decimals", 3)
    for key in ("selection_prob", "initial_prob", "processed_logit", "raw_logprob", "processed_logprob"):
        for tok, want in exp.get(key, {}).items():
            got = num(rows[id_of(req, tok)][key])
            assert rounded(got, d) == rounded(float(want), d), f"{ctx}: {key}[{tok}] = {got}, want {want}"
    recorded = [(s["stage"], s["support_size"]) for s in stages]
    at = 0
    for name, size in exp.get("stage_sizes", []):
        rest = recorded[at:]
        assert (name, size) in rest, f"{ctx}: stage {name}={size} not in order in {recorded}"
        at += rest.index((name, size)) + 1


def python_fields(field: str) -> set[str]:
    """The names the sampler level gives a request field (its arguments are not nested)."""
    names = {field}
    if field.startswith("params."):
        names.add(field[len("params.") :])
    if field == "pipeline":
        names.add("preset")
    if field == "selector.u":
        names.add("u")
    if field.startswith("selected_ids["):
        names.add("output_ids[" + field[len("selected_ids[") :])
    return names


@pytest.mark.parametrize("ctx,case", CASES, ids=[c[0] for c in CASES])
def test_explain_matches_the_vector(ctx: str, case: dict) -> None:
    req, exp = case["request"], case["expect"]
    if "error" in exp:
        err = exp["error"]
        with pytest.raises(nextok.NextokError) as info:
            nextok.explain(req)
        e = info.value
        if err["code"] in CLASS:
            assert isinstance(e, CLASS[err["code"]]), f"{ctx}: {type(e).__name__}: {e}"
        assert e.code == err["code"], f"{ctx}: {e}"
        assert e.field == err.get("field"), f"{ctx}: {e}"
        return
    out = nextok.explain(req)
    check_expect(ctx, req, exp, out["selected"], out["support"], out["tokens"], out["record"]["stages"])


def sampler_path(req: dict) -> tuple[nextok.Sampler, nextok.State, np.ndarray, float | None]:
    """Builds the request's sampler and state through the sampler-level API; the history
    (``selected_ids``) is the state's ``output_ids``."""
    logits = row(req["logits"])
    params = dict(req.get("params", {}))
    constraint = params.pop("constraint", None)
    pipeline = req.get("pipeline", "reference")
    sampler_kwargs = {}
    seed = None
    if isinstance(pipeline, dict):
        extra = set(params) - REQUEST_LEVEL
        if extra:
            pytest.skip(f"sampling parameters beside a pipeline object: {sorted(extra)}")
        seed = params.pop("seed", None)
        sampler_kwargs = params
        p = nextok.Pipeline.from_json(pipeline)
    else:
        p = nextok.Pipeline(pipeline, **params)
    eos = req.get("eos_token_ids", [])
    special = req.get("special_token_ids", [])
    names = req.get("tokens")
    if names is not None:
        vocab = nextok.Vocab.from_token_bytes([n.encode() for n in names], eos_token_ids=eos, special_token_ids=special)
    else:
        vocab = nextok.Vocab.plain(len(logits), eos_token_ids=eos, special_token_ids=special)
    sampler = nextok.Sampler(p, vocab, constraint, **sampler_kwargs)
    selector = req.get("selector") or {}
    u = selector.get("u")
    if selector.get("seed") is not None:
        seed = selector["seed"]
    state = sampler.new_state(seed=seed, prompt_ids=req.get("prompt_ids", []), output_ids=req.get("selected_ids", []))
    return sampler, state, logits, u


@pytest.mark.parametrize("ctx,case", CASES, ids=[c[0] for c in CASES])
def test_sampler_level_matches_the_rust_side(ctx: str, case: dict) -> None:
    req, exp = case["request"], case["expect"]
    if "error" in exp:
        err = exp["error"]
        with pytest.raises(nextok.NextokError) as info:
            sampler, state, logits, u = sampler_path(req)
            sampler.step(logits, state, logprobs=len(logits), u=u)
        e = info.value
        if err["code"] in CLASS:
            assert isinstance(e, CLASS[err["code"]]), f"{ctx}: {type(e).__name__}: {e}"
        assert e.code == err["code"], f"{ctx}: {e}"
        if err.get("field") is None:
            assert e.field is None, f"{ctx}: {e}"
        else:
            assert e.field in python_fields(err["field"]), f"{ctx}: field {e.field!r}: {e}"
        return
    rust = nextok.explain(req)
    by_id = [{k: v for k, v in r.items() if k != "token"} for r in rust["tokens"]]
    assert [r["id"] for r in by_id] == list(range(len(req["logits"]))), ctx
    sampler, state, logits, u = sampler_path(req)
    assert sampler.pipeline_hash == rust["pipeline_hash"], ctx
    ledger = sampler.explain(logits, state, u=u)
    before = state.summary()
    step = sampler.step(logits, state, logprobs=len(logits), u=u)
    rec = step.record()
    support = sorted(c["id"] for c in rec["candidates"])
    # the expectations, on the sampler level's own results
    check_expect(ctx, req, exp, step.token, support, ledger["tokens"], rec["stages"])
    # and exactly the Rust side's token, support, stage sizes and logprobs
    assert step.token == rust["selected"] == ledger["selected"], ctx
    assert support == rust["support"] == ledger["support"], ctx
    assert step.support_size == len(rust["support"]), ctx
    assert rec["stages"] == rust["record"]["stages"], ctx
    assert rec["candidates"] == rust["record"]["candidates"], ctx
    assert rec["state_before"] == before == rust["record"]["state_before"], ctx
    assert ledger["tokens"] == by_id, ctx
    for layer in ("raw", "processed", "selection"):
        lp = step.logprobs(layer)
        want = by_id[step.token][f"{layer}_logprob"]
        assert lp.logprob == num(want), f"{ctx}: {layer} logprob of the selected token"
        assert [t for t, _ in lp.top] == [c["id"] for c in rust["record"]["candidates"]], ctx
        for t, v in lp.top:
            assert v == num(by_id[t][f"{layer}_logprob"]), f"{ctx}: {layer}[{t}]"
    # the selection layer is a distribution over the support
    probs = [math.exp(v) for _, v in step.logprobs("selection").top]
    assert abs(sum(probs) - 1.0) < 1e-6, ctx
