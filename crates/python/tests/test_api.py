"""The sampler-level API: pipelines, vocabularies, states, steps, logprobs and records."""

from __future__ import annotations

import copy
import doctest
import json
import math

import numpy as np
import pytest

import nextok

from conftest import require_data

HAND = np.array([2.0, 1.5, 0.5], dtype=np.float32)


def test_the_package_docstring_example_runs() -> None:
    failures, tried = doctest.testmod(nextok, raise_on_error=False)
    assert tried > 0 and failures == 0


def test_the_hand_computation() -> None:
    """000 §3.9: support {A, B}, probabilities 0.593 / 0.407, B selected at u = 0.63."""
    p = nextok.Pipeline("reference", temperature=0.8, top_p=0.8, presence_penalty=0.1, frequency_penalty=0.2)
    s = nextok.Sampler(p, 3)
    st = s.new_state()
    for t in (0, 0, 1):
        assert s.commit(st, t) is None
    step = s.step(HAND, st, logprobs=5, u=0.63)
    assert step.token == 1 and step.support_size == 2 and step.finish is None
    sel = dict(step.logprobs("selection").top)
    assert sorted(sel) == [0, 1]
    assert round(math.exp(sel[0]), 3) == 0.593 and round(math.exp(sel[1]), 3) == 0.407
    assert step.logprobs("selection").logprob == sel[1]
    assert st.output_ids == [0, 0, 1, 1] and st.step == 4


def test_pipeline_identity() -> None:
    p = nextok.Pipeline("vllm", temperature=0.7, top_p=0.9, top_k=40)
    assert p.preset == "vllm"
    assert p.hash.startswith("sha256:") and len(p.hash) == 7 + 64
    q = nextok.Pipeline.from_json(p.to_json())
    assert q.hash == p.hash and q.preset is None and q == p.from_json(json.loads(p.to_json()))
    assert [x["type"] for x in p.processors] == [x["type"] for x in json.loads(p.to_json())["processors"]]
    assert nextok.Pipeline("vllm", temperature=0.7, top_p=0.9, top_k=40) == p
    assert nextok.Pipeline("hf", temperature=0.7) != p
    # the same hash as the Rust side reports for the same request
    out = nextok.explain({"logits": [1.0, 2.0], "pipeline": "vllm", "params": {"temperature": 0.7, "top_p": 0.9, "top_k": 40}})
    assert out["pipeline_hash"] == p.hash
    assert set(nextok.PRESETS) == {"reference", "hf", "vllm", "llama.cpp"}
    for name in nextok.PRESETS:
        assert nextok.Pipeline(name).preset in (name,)


def test_seeds_make_streams() -> None:
    s = nextok.Sampler(nextok.Pipeline(temperature=1.0, seed=5), 50)
    x = np.random.default_rng(0).normal(size=50).astype(np.float32)

    def run(seed=None) -> list[int]:
        st = s.new_state(seed=seed)
        return [s.step(x, st).token for _ in range(20)]

    assert run() == run(5) == run(5)
    assert run(5) != run(6)
    assert s.new_state().seed == 5


def test_recorded_step_and_record() -> None:
    s = nextok.Sampler(nextok.Pipeline("reference", temperature=0.9, top_k=3), 6)
    st = s.new_state(seed=3, prompt_ids=[1, 2])
    x = np.array([0.1, 2.0, 1.0, 3.0, -1.0, 0.5], dtype=np.float32)
    step = s.step(x, st, logprobs=2)
    rec = step.record()
    assert rec["selected"] == step.token and rec["support_size"] == step.support_size == 3
    assert rec["pipeline_hash"] == s.pipeline_hash
    assert [c["id"] for c in rec["candidates"]] == [3, 1]  # the two best, canonical order
    assert rec["state_after"]["output_len"] == 1 and rec["state_before"]["prompt_len"] == 2
    assert rec["rng"]["seed"] == 3 and rec["rng"]["counter"] == 0
    for layer in ("raw", "processed", "selection"):
        lp = step.logprobs(layer)
        assert lp.layer == layer and lp.token == step.token and len(lp) == 2
        assert [t for t, _ in lp.top] == [3, 1]
        assert lp.logprob <= 0
    assert len(step.logprobs("raw", top=1).top) == 1
    raw = step.logprobs("raw")
    ref = x.astype(np.float64) - np.log(np.exp(x.astype(np.float64)).sum())
    assert abs(raw.top[0][1] - ref[3]) < 1e-6
    # the selected token's logprobs exist even outside the recorded candidates
    st2 = s.new_state(seed=11)
    for _ in range(30):
        stp = s.step(x, st2, logprobs=0)
        assert stp.logprobs("raw").top == []
        assert abs(stp.logprobs("raw").logprob - ref[stp.token]) < 1e-6
        assert math.isfinite(stp.logprobs("selection").logprob)


def test_recorded_and_plain_steps_agree() -> None:
    s = nextok.Sampler(nextok.Pipeline("llama.cpp", temperature=0.9), 300)
    x = np.random.default_rng(1).normal(0, 2, size=300).astype(np.float32)
    a, b = s.new_state(seed=9), s.new_state(seed=9)
    assert [s.step(x, a).token for _ in range(10)] == [s.step(x, b, logprobs=3).token for _ in range(10)]


def test_explain_does_not_change_the_state() -> None:
    s = nextok.Sampler(nextok.Pipeline(temperature=0.8, top_p=0.8), 3)
    st = s.new_state()
    before = st.summary()
    ex = s.explain(HAND, st, u=0.5)
    assert st.summary() == before
    assert len(ex["tokens"]) == 3 and ex["support"] == [0, 1]
    assert s.step(HAND, st, u=0.5).token == ex["selected"]


def test_state_copies_fork() -> None:
    s = nextok.Sampler(nextok.Pipeline(temperature=1.0), 20)
    x = np.zeros(20, dtype=np.float32)
    st = s.new_state(seed=1)
    s.step(x, st)
    fork, deep = st.copy(), copy.deepcopy(st)
    t = [s.step(x, st).token for _ in range(5)]
    assert [s.step(x, fork).token for _ in range(5)] == t == [s.step(x, deep).token for _ in range(5)]


def test_stop_conditions() -> None:
    vocab = nextok.Vocab.from_token_bytes([b"a", b"b", b"\n", b"<eos>"], eos_token_ids=[3], special_token_ids=[3])
    greedy = nextok.Pipeline(temperature=0.0)
    x_eos = np.array([0, 0, 0, 5], dtype=np.float32)
    s = nextok.Sampler(greedy, vocab)
    st = s.new_state()
    step = s.step(x_eos, st)
    assert (step.token, step.finish) == (3, "eos")
    s = nextok.Sampler(greedy, vocab, ignore_eos=True, max_tokens=2)
    st = s.new_state()
    assert s.step(x_eos, st).finish is None and s.step(x_eos, st).finish == "max_tokens"
    s = nextok.Sampler(greedy, vocab, stop="b\n")
    st = s.new_state()
    assert s.step(np.array([0, 5, 0, 0], dtype=np.float32), st).finish is None
    step = s.step(np.array([0, 0, 5, 0], dtype=np.float32), st)
    assert step.finish == "stop_string" and step.finish_details["pattern"] == 0
    s = nextok.Sampler(greedy, vocab, stop_token_ids=[1])
    assert s.step(np.array([0, 5, 0, 0], dtype=np.float32), s.new_state()).finish == "stop_token"
    assert s.stop["stop_token_ids"] == [1]
    # the pipeline's request-level parameters are the sampler's defaults
    s = nextok.Sampler(nextok.Pipeline(temperature=0.0, max_tokens=1, stop_token_ids=[0]), vocab)
    assert s.stop["max_tokens"] == 1 and s.stop["stop_token_ids"] == [0]


def test_constraint() -> None:
    names = ['{"ok":', "true", "false", "}", "<eos>", " "]
    vocab = nextok.Vocab.from_token_bytes(names, eos_token_ids=[4], special_token_ids=[4])
    spec = {"type": "choice", "choices": ['{"ok":true}', '{"ok":false}']}
    s = nextok.Sampler(nextok.Pipeline(temperature=0.0), vocab, spec)
    assert any(p["type"] == "grammar_mask" for p in s.pipeline.processors)
    assert s.pipeline.hash == s.pipeline_hash != nextok.Pipeline(temperature=0.0).hash
    st = s.new_state()
    x = np.array([1.0, 2.0, 0.5, 0.3, 3.0, 2.5], dtype=np.float32)
    out = []
    while not st.finished:
        out.append(s.step(x, st).token)
    # the default grammar policy (only_end) finishes once nothing but EOS may follow
    assert vocab.decode(out) == b'{"ok":true}'
    assert st.finish_reason == "grammar_accepted"
    # resumed after '{"ok":true', only '}' is left (any grammar policy)
    cont = nextok.Sampler(nextok.Pipeline(temperature=0.0), vocab, spec, grammar_policy="continue")
    st = cont.new_state(output_ids=out[:2])
    step = cont.step(x, st, logprobs=6)
    assert step.token == 3 and step.support_size == 1
    # the constraint given as JSON text
    s2 = nextok.Sampler(nextok.Pipeline(temperature=0.0), vocab, json.dumps(spec))
    assert s2.pipeline_hash == s.pipeline_hash
    # a token the constraint refuses is not committed
    st = s.new_state()
    with pytest.raises(nextok.NextokError):
        s.commit(st, 3)
    assert st.output_ids == []


def test_vocab_from_token_bytes() -> None:
    v = nextok.Vocab.from_token_bytes([b"\xe2\x82", b"\xac", "é"], eos_token_ids=[2])
    assert len(v) == v.size == 3 and v.has_bytes and v.eos_token_ids == [2]
    assert v.decode([0, 1, 2]) == "€é".encode()
    assert v.token_bytes(2) == "é".encode()
    p = nextok.Vocab.plain(7, special_token_ids=[6, 5])
    assert not p.has_bytes and p.special_token_ids == [5, 6]


def test_vocab_from_a_real_tokenizer() -> None:
    path = require_data("llama3/tokenizer.json")
    v = nextok.Vocab.from_file(path)
    assert v.size >= 128000 and v.eos_token_ids and v.special_token_ids
    assert v.token_bytes(v.eos_token_ids[0]).startswith(b"<|")
    again = nextok.Vocab.from_tokenizer_json(path.read_bytes())
    assert again.size == v.size and again.eos_token_ids == v.eos_token_ids
    s = nextok.Sampler(nextok.Pipeline(temperature=0.7, top_p=0.9), v, stop=["\n\n"])
    x = np.random.default_rng(0).normal(0, 3, size=v.size).astype(np.float32)
    step = s.step(x, s.new_state(seed=1), logprobs=5)
    assert 0 <= step.token < v.size and 1 <= step.support_size < v.size


def test_vocab_from_a_gguf_file() -> None:
    path = require_data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    v = nextok.Vocab.from_file(path)
    assert v.size == 49152 and v.eos_token_ids
    assert v.decode([v.eos_token_ids[0]]).startswith(b"<|")


def test_a_sampler_without_a_vocab_takes_its_size_from_the_first_row() -> None:
    """`Sampler(pipeline)`: plain tokens, as many as the first row has, exactly as if given."""
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(12, 1000)).astype(np.float32)
    params = dict(temperature=0.9, top_p=0.9, presence_penalty=0.3, seed=11)
    lazy = nextok.Sampler(nextok.Pipeline("reference", **params))
    sized = nextok.Sampler(nextok.Pipeline("reference", **params), 1000)
    assert lazy.vocab_size is None and lazy.vocab is None
    assert lazy.pipeline_hash == sized.pipeline_hash
    # states made (and committed to) before the size is known
    a = lazy.new_state(prompt_ids=[5, 999], output_ids=[3])
    b = sized.new_state(prompt_ids=[5, 999], output_ids=[3])
    assert lazy.commit(a, 4) is None and sized.commit(b, 4) is None
    for row in rows[:6]:
        sa, sb = lazy.step(row, a, logprobs=3), sized.step(row, b, logprobs=3)
        assert sa.token == sb.token
        assert sa.record() == sb.record()
    assert lazy.vocab_size == 1000
    # a state made after the size is known, and a batch step
    c, d = lazy.new_state(seed=5), sized.new_state(seed=5)
    assert [s.token for s in lazy.step_batch(rows[6:8], [a, c])] == [
        s.token for s in sized.step_batch(rows[6:8], [b, d])
    ]
    # every later row has the first row's length
    with pytest.raises(nextok.VocabSizeMismatch):
        lazy.step(rows[8, :999].copy(), a)
    assert a.step == 9


def test_a_sampler_without_a_vocab_checks_ids_at_the_first_row() -> None:
    lazy = nextok.Sampler("reference")
    early = lazy.new_state(prompt_ids=[1, 5000])
    committed = lazy.new_state()
    lazy.commit(committed, 4000)
    row = np.zeros(1000, dtype=np.float32)
    with pytest.raises(nextok.TokenOutOfRange) as e:
        lazy.step(row, early)
    assert e.value.field == "prompt_ids[1]"
    assert early.step == 0 and early.prompt_ids == [1, 5000]
    with pytest.raises(nextok.TokenOutOfRange) as e:
        lazy.step_batch(row[None, :], [committed])
    assert e.value.field == "output_ids[0]"
    # a state whose ids fit still steps; ids after the first row are checked as usual
    fine = lazy.new_state(prompt_ids=[1])
    assert lazy.step(row, fine).token < 1000
    with pytest.raises(nextok.TokenOutOfRange):
        lazy.new_state(prompt_ids=[1000])
    with pytest.raises(nextok.TokenOutOfRange):
        lazy.commit(fine, 1000)
    # the pipeline's own ids are checked at the first row too, naming the field
    biased = nextok.Sampler(nextok.Pipeline("reference", logit_bias={"4000": 1.0}))
    with pytest.raises(nextok.TokenOutOfRange) as e:
        biased.step(row, biased.new_state())
    assert e.value.field == "processors[1].logit_bias[4000]"
    assert biased.vocab_size is None


def test_a_sampler_without_a_vocab_refuses_what_needs_token_bytes() -> None:
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok.Sampler("reference", None, {"type": "regex", "pattern": "a+"})
    assert e.value.field == "constraint"
    with pytest.raises(nextok.Contradiction) as e:
        nextok.Sampler("reference", stop=["\n"])
    assert e.value.field == "stop"
    # every check that does not need the size is made at once
    with pytest.raises(nextok.InvalidParameter) as e:
        nextok.Sampler("reference", max_tokens=0)
    assert e.value.field == "max_tokens"


def test_json_schema_property_order() -> None:
    """`options.property_order`: "any" takes an object's keys in any order, "schema" in the schema's."""
    names = ['{"a":1', ',"b":2', '{"b":2', ',"a":1', "}", "<eos>"]
    vocab = nextok.Vocab.from_token_bytes(names, eos_token_ids=[5], special_token_ids=[5])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
    # b first: 2, 3, 4, then EOS
    x = np.array([0.0, 0.0, 3.0, 2.0, 1.0, 0.5], dtype=np.float32)
    outputs = {}
    for order in ("any", "schema"):
        spec = {"type": "json_schema", "schema": schema, "options": {"property_order": order}}
        s = nextok.Sampler(nextok.Pipeline(temperature=0.0), vocab, spec)
        st = s.new_state()
        out = []
        while not st.finished and len(out) < 8:
            out.append(s.step(x, st).token)
        outputs[order] = vocab.decode(out)
    assert outputs["any"] == b'{"b":2,"a":1}'
    assert outputs["schema"] == b'{"a":1,"b":2}'
    with pytest.raises(nextok.InvalidParameter):
        spec = {"type": "json_schema", "schema": schema, "options": {"property_order": "sorted"}}
        nextok.Sampler(nextok.Pipeline(temperature=0.0), vocab, spec)
