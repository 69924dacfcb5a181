"""Bad input from Python raises a typed nextok exception naming the argument — never a
panic, never a silent conversion."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import nextok


@pytest.fixture
def sampler() -> nextok.Sampler:
    return nextok.Sampler(nextok.Pipeline("reference", temperature=0.8, top_p=0.9), 4)


@pytest.fixture
def state(sampler: nextok.Sampler) -> nextok.State:
    return sampler.new_state(seed=1)


GOOD = np.array([1.0, 2.0, 0.5, -1.0], dtype=np.float32)


@contextmanager
def raises(exc: type, field: str | None) -> Iterator[pytest.ExceptionInfo]:
    """Asserts that the block raises ``exc`` (a nextok error) naming ``field``."""
    with pytest.raises(exc) as info:
        yield info
    assert isinstance(info.value, nextok.NextokError)
    assert info.value.field == field, f"{info.value!r}: field {info.value.field!r}, want {field!r}"


def test_float64_is_refused(sampler, state) -> None:
    with raises(nextok.InvalidArgument, "logits") as e:
        sampler.step(GOOD.astype(np.float64), state)
    assert "float32" in str(e.value) and "float64" in str(e.value)
    assert isinstance(e.value, TypeError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("dtype", [np.float16, np.int32, np.int64, np.dtype(">f4")])
def test_other_dtypes_are_refused(sampler, state, dtype) -> None:
    with raises(nextok.InvalidArgument, "logits"):
        sampler.step(GOOD.astype(dtype), state)


def test_a_2d_array_is_not_a_row(sampler, state) -> None:
    with raises(nextok.InvalidArgument, "logits") as e:
        sampler.step(GOOD.reshape(1, 4), state)
    assert "(1, 4)" in str(e.value) or "[1, 4]" in str(e.value)
    with raises(nextok.InvalidArgument, "logits"):
        sampler.step(np.float32(1.0), state)


def test_lists_are_not_silently_converted(sampler, state) -> None:
    with raises(nextok.InvalidArgument, "logits") as e:
        sampler.step([1.0, 2.0, 0.5, -1.0], state)
    assert "list" in str(e.value)


def test_wrong_length(sampler, state) -> None:
    with raises(nextok.VocabSizeMismatch, "logits") as e:
        sampler.step(GOOD[:3].copy(), state)
    assert (e.value.expected, e.value.got) == (4, 3)
    with raises(nextok.VocabSizeMismatch, "logits"):
        sampler.step(np.zeros(0, dtype=np.float32), state)
    assert state.step == 0


@pytest.mark.parametrize("bad,index,value", [(np.nan, 2, "NaN"), (np.inf, 1, "+inf")])
def test_non_finite_logits_name_the_first_index(sampler, state, bad, index, value) -> None:
    x = GOOD.copy()
    x[index] = bad
    with raises(nextok.NonFiniteLogit, "logits") as e:
        sampler.step(x, state)
    assert (e.value.index, e.value.value, e.value.code) == (index, value, "non_finite_logit")
    assert state.step == 0 and state.output_ids == []


def test_minus_inf_masks(sampler, state) -> None:
    x = np.array([-np.inf, 0.0, -np.inf, -np.inf], dtype=np.float32)
    assert sampler.step(x, state).token == 1


def test_all_minus_inf_is_an_empty_support(sampler, state) -> None:
    x = np.full(4, -np.inf, dtype=np.float32)
    with raises(nextok.EmptySupport, "support") as e:
        sampler.step(x, state)
    assert e.value.stage == "raw"
    assert state.step == 0


def test_strided_views_are_refused(sampler, state) -> None:
    wide = np.arange(8, dtype=np.float32)
    with raises(nextok.InvalidArgument, "logits") as e:
        sampler.step(wide[::2], state)
    assert "contiguous" in str(e.value)
    # a contiguous slice is read in place
    assert sampler.step(wide[4:], state).token in range(4)


def test_batch_layouts_are_checked(sampler) -> None:
    states = [sampler.new_state(seed=i) for i in range(2)]
    rows = np.zeros((2, 4), dtype=np.float32)
    with raises(nextok.InvalidArgument, "logits"):
        sampler.step_batch(np.asfortranarray(np.arange(8, dtype=np.float32).reshape(2, 4)), states)
    with raises(nextok.InvalidArgument, "logits"):
        sampler.step_batch(np.zeros((4, 4), dtype=np.float32)[::2], states)
    with raises(nextok.InvalidArgument, "logits"):
        sampler.step_batch(rows.astype(np.float64), states)
    with raises(nextok.InvalidArgument, "logits"):
        sampler.step_batch(rows[0], states)
    with raises(nextok.InvalidArgument, "states"):
        sampler.step_batch(rows, states[:1])
    with raises(nextok.VocabSizeMismatch, "logits"):
        sampler.step_batch(np.zeros((2, 5), dtype=np.float32), states)
    with raises(nextok.InvalidArgument, "states[1]"):
        sampler.step_batch(rows, [states[0], states[0]])
    with raises(nextok.InvalidArgument, "states[1]"):
        sampler.step_batch(rows, [states[0], "not a state"])
    assert [s.step for s in states] == [0, 0]


def test_a_state_of_another_sampler(sampler) -> None:
    other = nextok.Sampler("reference", 4)
    foreign = other.new_state()
    with raises(nextok.InvalidArgument, "state") as e:
        sampler.step(GOOD, foreign)
    assert "another Sampler" in str(e.value)
    with raises(nextok.InvalidArgument, "state"):
        sampler.commit(foreign, 0)
    with raises(nextok.InvalidArgument, "states[0]"):
        sampler.step_batch(GOOD.reshape(1, 4), [foreign])
    with raises(nextok.InvalidArgument, "state"):
        sampler.step(GOOD, object())


def test_bad_token_ids(sampler) -> None:
    with raises(nextok.TokenOutOfRange, "prompt_ids[1]") as e:
        sampler.new_state(prompt_ids=[0, 9])
    assert (e.value.token, e.value.vocab_size) == (9, 4)
    with raises(nextok.InvalidArgument, "prompt_ids[0]"):
        sampler.new_state(prompt_ids=[-1])
    with raises(nextok.InvalidArgument, "prompt_ids[0]"):
        sampler.new_state(prompt_ids=[1.5])
    with raises(nextok.InvalidArgument, "prompt_ids"):
        sampler.new_state(prompt_ids="0 1")
    with raises(nextok.InvalidArgument, "seed"):
        sampler.new_state(seed=-1)
    st = sampler.new_state(prompt_ids=np.array([1, 2], dtype=np.int64))
    assert st.prompt_ids == [1, 2]
    with raises(nextok.TokenOutOfRange, "token"):
        sampler.commit(st, 4)


def test_bad_arguments_of_step(sampler, state) -> None:
    with raises(nextok.InvalidArgument, "logprobs"):
        sampler.step(GOOD, state, logprobs=-1)
    with raises(nextok.InvalidArgument, "logprobs"):
        sampler.step(GOOD, state, logprobs="5")
    with raises(nextok.InvalidParameter, "u"):
        sampler.step(GOOD, state, u=1.0)
    with raises(nextok.InvalidArgument, "u"):
        sampler.step(GOOD, state, u="half")
    step = sampler.step(GOOD, state, logprobs=2)
    with raises(nextok.InvalidArgument, "layer"):
        step.logprobs("final")
    with raises(nextok.InvalidArgument, "top"):
        step.logprobs("raw", top=-3)
    fast = sampler.step(GOOD, state)
    with raises(nextok.NotRecorded, None):
        fast.logprobs()
    with raises(nextok.NotRecorded, None):
        fast.record()
    with raises(nextok.NotRecorded, None):
        _ = fast.support_size


@pytest.mark.parametrize(
    "kwargs,cls,field",
    [
        ({"top_p": 1.5}, nextok.InvalidParameter, "top_p"),
        ({"temperature": -1.0}, nextok.InvalidParameter, "temperature"),
        ({"temperature": float("nan")}, nextok.InvalidParameter, "temperature"),
        ({"topp": 0.5}, nextok.ParseError, "topp"),
        ({"top_k": "ten"}, nextok.ParseError, "top_k"),
        ({"logit_bias": {1: 200.0}}, nextok.InvalidParameter, "logit_bias[1]"),
        ({"constraint": {"type": "json"}}, nextok.InvalidArgument, "constraint"),
        ({"max_tokens": 0}, nextok.InvalidParameter, "max_tokens"),
    ],
)
def test_bad_parameters_name_their_field(kwargs, cls, field) -> None:
    with raises(cls, field):
        nextok.Pipeline("reference", **kwargs)


def test_bad_pipelines() -> None:
    with raises(nextok.InvalidParameter, "preset"):
        nextok.Pipeline("sglang")
    with raises(nextok.InvalidParameter, "processors[0].top_k"):
        nextok.Sampler(nextok.Pipeline.from_json({"format_version": 1, "processors": [{"type": "top_k", "top_k": 0}]}), 4)
    with raises(nextok.ParseError, "pipeline"):
        nextok.Pipeline.from_json("{not json")
    with raises(nextok.InvalidArgument, "pipeline"):
        nextok.Pipeline.from_json(42)
    with raises(nextok.InvalidArgument, "pipeline"):
        nextok.Sampler(3.5, 4)
    with raises(nextok.InvalidArgument, "vocab"):
        nextok.Sampler("reference", "four")
    with raises(nextok.InvalidParameter, "vocab_size"):
        nextok.Sampler("reference", 0)
    with raises(nextok.Contradiction, "min_tokens"):
        nextok.Sampler(nextok.Pipeline(min_tokens=10), nextok.Vocab.plain(4, eos_token_ids=[3]), max_tokens=5)
    with raises(nextok.Contradiction, "stop"):
        nextok.Sampler("reference", 4, stop=["\n"])


def test_constraints_need_bytes_and_must_compile() -> None:
    with raises(nextok.InvalidArgument, "constraint"):
        nextok.Sampler("reference", 4, {"type": "choice", "choices": ["a"]})
    vocab = nextok.Vocab.from_token_bytes([b"a", b"b", b"<eos>"], eos_token_ids=[2], special_token_ids=[2])
    with raises(nextok.ParseError, "constraint.type"):
        nextok.Sampler("reference", vocab, {"type": "nope"})
    with pytest.raises(nextok.ConstraintError) as e:
        nextok.Sampler("reference", vocab, {"type": "regex", "pattern": "(unclosed"})
    assert e.value.field is not None


def test_bad_vocabularies(tmp_path) -> None:
    with raises(nextok.InvalidArgument, "tokens[1]"):
        nextok.Vocab.from_token_bytes([b"a", 7])
    with raises(nextok.TokenOutOfRange, "eos_token_ids[0]"):
        nextok.Vocab.from_token_bytes([b"a"], eos_token_ids=[5])
    with pytest.raises(nextok.VocabError) as e:
        nextok.Vocab.from_file(tmp_path / "missing.json")
    assert e.value.kind == "io"
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{\"model\": 3}")
    with pytest.raises(nextok.VocabError) as e:
        nextok.Vocab.from_file(bad)
    assert e.value.kind in ("parse", "invalid", "unsupported")
    with raises(nextok.InvalidArgument, "data"):
        nextok.Vocab.from_tokenizer_json(3)


def test_explain_requests() -> None:
    with raises(nextok.InvalidArgument, "request"):
        nextok.explain(["logits"])
    with raises(nextok.ParseError, "request"):
        nextok.explain("{")
    with raises(nextok.NonFiniteLogit, "logits") as e:
        nextok.explain({"logits": [1.0, float("nan")]})
    assert e.value.index == 1


def test_a_finished_sequence_refuses_further_steps() -> None:
    s = nextok.Sampler(nextok.Pipeline(temperature=0.0), 3, max_tokens=1)
    st = s.new_state()
    assert s.step(GOOD[:3].copy(), st).finish == "max_tokens"
    assert st.finished and st.finish_reason == "max_tokens"
    with raises(nextok.AlreadyFinished, None) as e:
        s.step(GOOD[:3].copy(), st)
    assert e.value.code == "already_finished"


def test_typed_keyword_arguments() -> None:
    with raises(nextok.InvalidArgument, "ignore_eos"):
        nextok.Sampler("reference", 4, ignore_eos="yes")
    with raises(nextok.InvalidArgument, "preset"):
        nextok.Pipeline(3)
    with raises(nextok.InvalidArgument, "vocab"):
        nextok.Sampler("reference", -4)
    with raises(nextok.InvalidArgument, "size"):
        nextok.Vocab.plain(2.5)
    with raises(nextok.InvalidParameter, "vocab_size"):
        nextok.Vocab.plain(1 << 40)
    with raises(nextok.InvalidParameter, "vocab_size"):
        nextok.Sampler("reference", 1 << 40)
    with raises(nextok.InvalidArgument, "path"):
        nextok.Vocab.from_file(42)
    with raises(nextok.InvalidArgument, "vocab_size"):
        nextok.Vocab.from_tokenizer_json("{}", vocab_size=-1)
    s = nextok.Sampler("reference", 4)
    step = s.step(GOOD, s.new_state(), logprobs=1)
    with raises(nextok.InvalidArgument, "layer"):
        step.logprobs(3)
