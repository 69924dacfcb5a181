"""The adapters (``nextok.integrations``) with numpy and small fakes that follow each host's
documented interface: transformers' LogitsProcessor and custom_generate, llama-cpp-python's
logits_processor, vLLM's V1 BatchUpdate interface and V2 model runner interface.

The property every test comes back to: a sequence decoded through an adapter gets exactly the
tokens nextok gives it alone (same prompt, seed and logits), whatever the host's batch, slot
moves, prompt chunks or preemptions."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import nextok
from nextok.integrations import llama_cpp as llcpp
from nextok.integrations import transformers as hf
from nextok.integrations import vllm as vl
from nextok.integrations._core import HostSequence

V = 48
EOS = V - 1


def vocab() -> nextok.Vocab:
    # token i is one letter (a..z, then A..V); the last id is EOS
    toks = [bytes([97 + i]) if i < 26 else bytes([65 + i - 26]) for i in range(V - 1)] + [b"</s>"]
    return nextok.Vocab.from_token_bytes(toks, eos_token_ids=[EOS], special_token_ids=[EOS])


def model(history: list[int]) -> np.ndarray:
    """A deterministic stand-in for a model: the logits row is a function of the tokens so far."""
    h = 1469598103934665603
    for t in history:
        h = ((h ^ (t + 1)) * 1099511628211) % (1 << 64)
    row = np.random.default_rng(h).normal(0.0, 2.0, V).astype(np.float32)
    row[EOS] -= 3.0  # sequences are long enough to see several steps
    return row


def solo(sampler: nextok.Sampler, prompt: list[int], seed: int, steps: int) -> list[int]:
    """The tokens nextok gives the sequence alone."""
    state = sampler.new_state(seed=seed, prompt_ids=prompt)
    out: list[int] = []
    while len(out) < steps and not state.finished:
        out.append(sampler.step(model(prompt + out), state).token)
    return out


def one_finite(row: np.ndarray) -> int:
    finite = np.flatnonzero(np.isfinite(row))
    assert finite.shape == (1,), row
    assert row[finite[0]] == 0.0
    return int(finite[0])


PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
SEEDS = [11, 12, 13, 14]


def sampler(**kw: Any) -> nextok.Sampler:
    return nextok.Sampler(nextok.Pipeline("vllm", temperature=0.9, top_p=0.95, presence_penalty=0.3), vocab(), **kw)


# ---------------------------------------------------------------- HostSequence


def test_host_sequence_rebuilds_from_host_tokens_and_draws_as_before():
    s = sampler()
    ref = solo(s, PROMPTS[0], 5, 8)
    seq = HostSequence(s, seed=5, prompt_ids=PROMPTS[0])
    got: list[int] = []
    for i in range(8):
        if i == 3:
            # the host discarded the last step (a prompt chunk) and rolled back: rebuilt
            seq.sync(got[:2])
            got = got[:2]
            got.append(seq.select(model(PROMPTS[0] + got)))
        seq.sync(got)
        got.append(seq.select(model(PROMPTS[0] + got)))
    assert got[:8] == ref[: len(got[:8])]


def test_host_sequence_commits_tokens_the_host_chose():
    s = sampler()
    seq = HostSequence(s, seed=5, prompt_ids=PROMPTS[1])
    forced = 7
    seq.sync([forced])  # teacher forcing
    t = seq.select(model(PROMPTS[1] + [forced]))
    state = s.new_state(seed=5, prompt_ids=PROMPTS[1], output_ids=[forced])
    assert t == s.step(model(PROMPTS[1] + [forced]), state).token


# ---------------------------------------------------------------- transformers


def hf_loop(proc: hf.NextokLogitsProcessor, prompts: list[list[int]], steps: int, pad: int = 0) -> list[list[int]]:
    """transformers' sampling loop in miniature: left-padded input_ids, the processor, argmax."""
    width = max(map(len, prompts))
    ids = np.array([[pad] * (width - len(p)) + p for p in prompts], dtype=np.int64)
    for _ in range(steps):
        scores = np.stack([model(p + ids[i, width:].tolist()) for i, p in enumerate(prompts)])
        out = proc(ids, scores)
        nxt = np.argmax(out, axis=1)
        for i in range(len(prompts)):
            one_finite(out[i])
        ids = np.concatenate([ids, nxt[:, None]], axis=1)
    return [ids[i, width:].tolist() for i in range(len(prompts))]


def test_hf_processor_rows_match_solo_whatever_the_batch():
    s = sampler()
    want = [solo(s, p, sd, 6) for p, sd in zip(PROMPTS, SEEDS)]
    proc = hf.NextokLogitsProcessor(s, seed=SEEDS, pad_token_id=0)
    got = hf_loop(proc, PROMPTS, 6)
    for w, g in zip(want, got):
        assert g[: len(w)] == w
    # the same rows in another batch (reversed, fewer rows) give the same tokens
    proc2 = hf.NextokLogitsProcessor(s, seed=SEEDS[::-1][:3], pad_token_id=0)
    got2 = hf_loop(proc2, PROMPTS[::-1][:3], 6)
    assert got2 == got[::-1][:3]


def test_hf_processor_records_and_preset_arguments():
    proc = hf.NextokLogitsProcessor("vllm", vocab(), temperature=0.9, top_p=0.95, presence_penalty=0.3, seed=3, logprobs=2)
    hf_loop(proc, [PROMPTS[0]], 3)
    seq = proc.sequences[0]
    assert len(seq.steps) == 3
    rec = seq.records()[0]
    assert rec["pipeline_hash"] == proc.sampler.pipeline_hash
    lp = seq.steps[0].logprobs("processed", top=2)
    assert lp.layer == "processed" and len(lp.top) == 2


def test_hf_processor_starts_a_new_generation_and_forces_eos_after_nextok_stops():
    s = sampler(max_tokens=2)
    proc = hf.NextokLogitsProcessor(s, seed=4)
    first = hf_loop(proc, [PROMPTS[2]], 4)[0]
    assert first[:2] == solo(s, PROMPTS[2], 4, 2)
    assert first[2:] == [EOS, EOS]  # nextok ended the sequence at max_tokens: EOS, so the host stops too
    again = hf_loop(proc, [PROMPTS[2]], 4)[0]  # a second generate with the same processor
    assert again == first


def test_hf_processor_bad_input_names_the_argument():
    proc = hf.NextokLogitsProcessor(sampler(), seed=1)
    with pytest.raises(nextok.InvalidArgument) as e:
        proc(np.zeros((2, 3), dtype=np.int64), np.zeros((3, V), dtype=np.float32))
    assert e.value.field == "scores"
    with pytest.raises(nextok.InvalidArgument) as e:
        hf.NextokLogitsProcessor(sampler(), seed=[1, 2])(np.zeros((3, 1), dtype=np.int64), np.zeros((3, V), np.float32))
    assert e.value.field == "seed"
    with pytest.raises(nextok.VocabSizeMismatch):
        proc(np.zeros((1, 1), dtype=np.int64), np.zeros((1, V + 1), dtype=np.float32))
    with pytest.raises(nextok.InvalidArgument) as e:
        hf.NextokLogitsProcessor(sampler(), vocab(), seed=1)
    assert e.value.field == "sampler"


class FakeHFModel:
    """The part of a transformers model ``custom_generate`` uses: ``_sample`` with its documented
    keywords, running processors and stopping criteria as transformers' loop does."""

    def __init__(self, prompts: list[list[int]]) -> None:
        self.prompts = prompts
        self.seen: dict[str, Any] = {}

    def _sample(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer, **kw):
        self.seen = {"processors": list(logits_processor), "criteria": list(stopping_criteria), "kwargs": kw}
        width = input_ids.shape[1]
        unfinished = np.ones(input_ids.shape[0], dtype=bool)
        while unfinished.any():
            scores = np.stack([model(p + input_ids[i, width:].tolist()) for i, p in enumerate(self.prompts)])
            for p in logits_processor:
                scores = p(input_ids, scores)
            nxt = np.where(unfinished, np.argmax(scores, axis=1), generation_config.pad_token_id)
            input_ids = np.concatenate([input_ids, nxt[:, None]], axis=1)
            done = np.zeros_like(unfinished)
            for c in stopping_criteria:
                done |= np.asarray(c(input_ids, scores))
            unfinished &= ~done
        return input_ids


@dataclass
class FakeGenConfig:
    pad_token_id: int = 0
    max_new_tokens: int = 5


def test_hf_custom_generate_runs_the_host_loop_with_nextok_alone():
    s = sampler(max_tokens=5)
    prompts = [PROMPTS[0], PROMPTS[2]]
    fake = FakeHFModel(prompts)
    proc = hf.NextokLogitsProcessor(s, seed=[1, 2], pad_token_id=0)

    def host_penalty(input_ids, scores):  # a host processor: nextok runs the whole step, so it is left out
        raise AssertionError("host processors must not run")

    def host_stop(input_ids, scores):  # a host stopping criterion (max_new_tokens): kept
        return np.array([input_ids.shape[1] >= 4 + 5] * input_ids.shape[0])

    width = max(map(len, prompts))
    ids = np.array([[0] * (width - len(p)) + p for p in prompts])
    out = hf.generate(fake, ids, [host_penalty], [host_stop], FakeGenConfig(), nextok=proc, attention_mask="m")
    assert fake.seen["processors"] == [proc] and fake.seen["kwargs"] == {"attention_mask": "m"}
    assert len(fake.seen["criteria"]) == 2
    for i, (p, sd) in enumerate(zip(prompts, [1, 2])):
        assert out[i, width : width + 5].tolist() == solo(s, p, sd, 5)
    with pytest.raises(nextok.InvalidArgument) as e:
        hf.generate(fake, ids, [], [], FakeGenConfig())
    assert e.value.field == "nextok"


# ---------------------------------------------------------------- llama-cpp-python


def llama_loop(proc: llcpp.NextokLogitsProcessor, prompt: list[int], max_tokens: int) -> list[int]:
    """llama-cpp-python's completion loop in miniature: the processor sees a strided float32
    view of the candidate buffer and ``input_ids`` = prompt + generated; the chain then picks
    the best remaining candidate; EOS ends the completion."""
    out: list[int] = []
    dt = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
    while len(out) < max_tokens:
        cand = np.zeros(V, dtype=dt)
        cand["id"] = np.arange(V)
        cand["logit"] = model(prompt + out)
        view = cand["logit"]  # strided, not contiguous
        assert not view.flags.c_contiguous
        view[:] = proc(np.array(prompt + out, dtype=np.intc), view)
        tok = int(np.argmax(cand["logit"]))
        if tok == EOS:
            break
        out.append(tok)
    return out


def test_llama_cpp_processor_matches_solo_and_follows_completions():
    s = sampler()
    proc = llcpp.NextokLogitsProcessor(s, seed=9, logprobs=1)
    got = llama_loop(proc, PROMPTS[0], 7)
    assert got == [t for t in solo(s, PROMPTS[0], 9, 7) if t != EOS][: len(got)]
    assert len(proc.sequence.steps) >= len(got)
    # the same processor on a second completion starts a new sequence
    assert llama_loop(proc, PROMPTS[0], 7) == got
    assert llama_loop(proc, PROMPTS[1], 5) == [t for t in solo(s, PROMPTS[1], 9, 5) if t != EOS][:5]


def test_llama_cpp_processor_stop_string_ends_the_completion():
    s = sampler()
    ref = solo(s, PROMPTS[3], 2, 10)
    stop = vocab().decode(ref[2:3]).decode()
    got = llama_loop(llcpp.NextokLogitsProcessor(s.pipeline, vocab(), seed=2, stop=[stop]), PROMPTS[3], 10)
    assert got == ref[: ref.index(ref[2]) + 1] or got == ref[: ref.index(ref[2])]


def test_llama_cpp_processor_fails_closed_and_check_raises():
    proc = llcpp.NextokLogitsProcessor(sampler(), seed=1)
    bad = np.zeros(V + 3, dtype=np.float32)  # a row of the wrong length
    out = proc(np.array([1, 2], dtype=np.intc), bad)
    assert one_finite(out) == EOS  # the completion ends instead of sampling on unconstrained
    with pytest.raises(nextok.VocabSizeMismatch):
        proc.check()
    proc.check()  # raised once


# ---------------------------------------------------------------- vLLM: shared


@dataclass
class FakeParams:
    """The fields of vLLM's SamplingParams the processors read."""

    extra_args: dict[str, Any] | None = None
    seed: int | None = None


def nx(**kw: Any) -> FakeParams:
    args = {"pipeline": "vllm", "temperature": 0.9, "top_p": 0.95, "presence_penalty": 0.3}
    args.update(kw)
    seed = args.pop("vllm_seed", None)
    return FakeParams(extra_args={"nextok": args}, seed=seed)


def test_vllm_validate_params_refuses_bad_settings_by_field():
    with pytest.raises(nextok.InvalidParameter) as e:
        vl._validate_without_vocab(nx(top_p=1.5))
    assert e.value.field == "top_p" and isinstance(e.value, ValueError)
    with pytest.raises(nextok.InvalidArgument) as e:
        vl._validate_without_vocab(nx(logprobs=-1))
    assert e.value.field == "extra_args.nextok.logprobs"
    with pytest.raises(nextok.InvalidArgument) as e:
        vl._validate_without_vocab(FakeParams(extra_args={"nextok": [1]}))
    assert e.value.field == "extra_args.nextok"
    vl._validate_without_vocab(FakeParams())  # not a nextok request
    vl._validate_without_vocab(nx(stop=["\n"], constraint={"type": "regex", "pattern": "a+"}))
    with pytest.raises(nextok.InvalidParameter):
        vl.RequestFactory(vocab()).validate(nx(stop_token_ids=[V + 5]))


def reference(i: int, steps: int) -> list[int]:
    return solo(vl.RequestFactory(vocab()).sampler(nx(seed=SEEDS[i]).extra_args["nextok"]), PROMPTS[i], SEEDS[i], steps)


# ---------------------------------------------------------------- vLLM V1


class Move(enum.Enum):
    SWAP = 0
    UNIDIRECTIONAL = 1


@dataclass
class FakeBatchUpdate:
    batch_size: int
    removed: list[int] = field(default_factory=list)
    added: list[tuple[int, FakeParams, list[int], list[int]]] = field(default_factory=list)
    moved: list[tuple[int, int, Move]] = field(default_factory=list)


class V1Runner:
    """vLLM's V1 persistent batch in miniature: slots, live output lists, removals, additions,
    condensing moves and swaps."""

    def __init__(self, proc: vl.V1Slots) -> None:
        self.proc = proc
        self.slot: dict[int, int] = {}  # request -> slot
        self.outputs: dict[int, list[int]] = {}
        self.pending = FakeBatchUpdate(0)

    def add(self, req: int, slot: int, params: FakeParams) -> None:
        out = self.outputs.setdefault(req, [])
        self.slot[req] = slot
        self.pending.added.append((slot, params, PROMPTS[req], out))

    def remove(self, req: int) -> None:
        self.pending.removed.append(self.slot.pop(req))

    def move(self, a: int, b: int, how: Move) -> None:
        inv = {s: r for r, s in self.slot.items()}
        if how is Move.SWAP:
            self.slot[inv[a]], self.slot[inv[b]] = b, a
        else:
            self.slot[inv[a]] = b
        self.pending.moved.append((a, b, how))

    def step(self, discard: set[int] = frozenset()) -> None:
        n = max(self.slot.values()) + 1
        self.pending.batch_size = n
        self.proc.update_state(self.pending)
        self.pending = FakeBatchUpdate(n)
        inv = {s: r for r, s in self.slot.items()}
        logits = np.full((n, V), 0.0, dtype=np.float32)
        for s, r in inv.items():
            logits[s] = model(PROMPTS[r] + self.outputs[r])
        before = logits.copy()
        logits = self.proc.apply(logits)
        for s, r in inv.items():
            if r in discard:  # a prompt chunk: vLLM computes the row and throws the token away
                continue
            self.outputs[r].append(int(np.argmax(logits[s])))
        for s in range(n):
            if s not in inv:
                assert np.array_equal(logits[s], before[s])


def test_vllm_v1_batch_updates_moves_and_preemption_leave_tokens_unchanged():
    proc = vl.V1Slots(None, vocab=vocab())
    run = V1Runner(proc)
    for r in range(3):
        run.add(r, r, nx(seed=SEEDS[r]))
    run.add(3, 3, FakeParams())  # not a nextok request: its row is left alone
    run.step(discard={2})  # request 2's prompt is still being chunked
    run.step()
    run.move(0, 1, Move.SWAP)
    run.step()
    run.remove(1)  # preempted
    run.move(3, 0, Move.UNIDIRECTIONAL)  # condense: the last row fills the hole
    run.step()
    run.step()
    run.add(1, 3, nx(seed=SEEDS[1]))  # admitted again with its outputs so far
    run.step()
    run.step()
    for r in range(3):
        out = run.outputs[r]
        assert out == reference(r, len(out)), r
    assert [len(run.outputs[r]) for r in range(3)] == [7, 5, 6]
    assert proc.is_argmax_invariant() is False


def test_vllm_v1_trace_and_failures_stay_with_their_request(tmp_path):
    trace = tmp_path / "run.jsonl"
    proc = vl.V1Slots(None, vocab=vocab())
    run = V1Runner(proc)
    run.add(0, 0, nx(seed=SEEDS[0], logprobs=2, trace=str(trace), request_id="a"))
    # a constraint this vocabulary cannot satisfy from the first token: only this request ends
    run.add(1, 1, nx(seed=SEEDS[1], constraint={"type": "choice", "choices": []}, request_id="b", trace=str(trace)))
    run.step()
    run.step()
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    steps = [x for x in lines if "error" not in x]
    errors = [x for x in lines if "error" in x]
    assert [x["request_id"] for x in steps] == ["a", "a"]
    assert "pipeline_hash" in steps[0]
    assert errors and errors[0]["request_id"] == "b"
    assert run.outputs[1] == [EOS, EOS]
    assert run.outputs[0] == reference(0, 2)


# ---------------------------------------------------------------- vLLM V2


@dataclass
class FakeReqStates:
    """The V2 runner's per-slot buffers (``LogitsProcRequestState``): numpy stands in for the
    host-backed and device tensors."""

    max_reqs: int
    max_len: int = 64

    def __post_init__(self) -> None:
        self.all_token_ids = np.zeros((self.max_reqs, self.max_len), dtype=np.int32)
        self.prompt_len = np.zeros(self.max_reqs, dtype=np.int32)
        self.prefill_len = np.zeros(self.max_reqs, dtype=np.int32)
        self.total_len = np.zeros(self.max_reqs, dtype=np.int32)


@dataclass
class FakeCtx:
    expanded_idx_mapping: np.ndarray
    expanded_local_pos: np.ndarray
    input_ids: np.ndarray
    pos: np.ndarray


class V2Runner:
    """vLLM's V2 model runner in miniature: slots from a free list, a request re-sent in full on
    resume (prompt plus outputs as its prefill), prompt chunks, rows reordered every step."""

    def __init__(self, proc: vl.V2Slots, rs: FakeReqStates) -> None:
        self.proc, self.rs = proc, rs
        self.slot: dict[int, int] = {}
        self.outputs: dict[int, list[int]] = {}
        self.done_prefill: dict[int, int] = {}
        self.chunk = 2

    def add(self, req: int, slot: int, params: FakeParams) -> None:
        out = self.outputs.setdefault(req, [])
        tokens = PROMPTS[req] + out
        self.rs.all_token_ids[slot, : len(tokens)] = tokens
        self.rs.prompt_len[slot] = len(PROMPTS[req])
        self.rs.prefill_len[slot] = len(tokens)
        self.rs.total_len[slot] = len(tokens)
        self.slot[req] = slot
        self.done_prefill[req] = 0
        self.proc.add_request(slot, params)

    def free(self, req: int) -> None:
        del self.slot[req]

    def step(self, order: list[int]) -> None:
        rows = []
        for req in order:
            s = self.slot[req]
            n = int(self.rs.total_len[s])
            pf = int(self.rs.prefill_len[s])
            if self.done_prefill[req] < pf:  # prefill in chunks of `chunk` tokens
                self.done_prefill[req] = min(pf, self.done_prefill[req] + self.chunk)
                length = self.done_prefill[req]
            else:
                length = n
            rows.append((req, s, length))
        ctx = FakeCtx(
            expanded_idx_mapping=np.array([s for _, s, _ in rows]),
            expanded_local_pos=np.zeros(len(rows), dtype=np.int32),
            input_ids=np.array([self.rs.all_token_ids[s, n - 1] for _, s, n in rows]),
            pos=np.array([n - 1 for _, _, n in rows]),
        )
        logits = np.stack([model(self.rs.all_token_ids[s, :n].tolist()) for _, s, n in rows])
        logits = self.proc.apply(logits, ctx)
        for i, (req, s, n) in enumerate(rows):
            if n < int(self.rs.prefill_len[s]):
                continue  # a chunk: the token is discarded
            tok = int(np.argmax(logits[i]))
            one_finite(logits[i])
            self.outputs[req].append(tok)
            self.rs.all_token_ids[s, n] = tok
            self.rs.total_len[s] = n + 1


def test_vllm_v2_slots_chunks_reordering_and_resume_leave_tokens_unchanged():
    rs = FakeReqStates(4)
    proc = vl.V2Slots(None, rs, vocab=vocab())
    run = V2Runner(proc, rs)
    for r in range(3):
        run.add(r, r, nx(seed=SEEDS[r]))
    assert proc.add_request(3, FakeParams()) is False
    run.step([0, 1, 2])
    run.step([2, 0, 1])
    run.step([1, 2, 0])
    run.free(1)  # preempted: freed, then re-sent in full in another slot
    run.step([0, 2])
    run.add(1, 3, nx(seed=SEEDS[1]))
    run.step([1, 0, 2])
    run.step([0, 1, 2])
    run.step([2, 1, 0])
    for r in range(3):
        out = run.outputs[r]
        assert out and out == reference(r, len(out)), r


def test_vllm_v2_rejects_draft_rows_for_its_requests_only():
    rs = FakeReqStates(2)
    proc = vl.V2Slots(None, rs, vocab=vocab())
    run = V2Runner(proc, rs)
    run.add(0, 0, nx(seed=1))
    run.step([0])
    run.step([0])
    ctx = FakeCtx(np.array([0, 0]), np.array([0, 1]), np.array([5, 6]), np.array([3, 4]))
    logits = np.zeros((2, V), dtype=np.float32)
    proc.apply(logits, ctx)
    req = proc.slots[0]
    assert isinstance(req.error, nextok.InvalidArgument) and req.error.field == "speculative_config"
    assert one_finite(logits[1]) == EOS


def test_vllm_classes_need_vllm_and_say_so():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            vl.NextokLogitsProcessor  # noqa: B018
    else:  # pragma: no cover - where vLLM is installed
        assert vl.NextokLogitsProcessor.__name__ == "NextokLogitsProcessor"
