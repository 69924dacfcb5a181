"""step_batch: a row's token does not depend on its batch."""

from __future__ import annotations

import time

import numpy as np

import nextok

from conftest import share_while

V = 1000


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 3.0, size=(n, V)).astype(np.float32)


def sampler() -> nextok.Sampler:
    return nextok.Sampler(nextok.Pipeline("vllm", temperature=1.3, top_k=200, top_p=0.95, presence_penalty=0.5), V)


def test_a_rows_token_does_not_depend_on_its_batch() -> None:
    s = sampler()
    logits = rows(16, 1)
    # alone: each row with its own state, one step at a time, for 4 steps
    alone = []
    for i in range(16):
        st = s.new_state(seed=100 + i, prompt_ids=[i, i + 1])
        alone.append([s.step(logits[i], st).token for _ in range(4)])
    # in one batch of 16
    states = [s.new_state(seed=100 + i, prompt_ids=[i, i + 1]) for i in range(16)]
    batched = [[] for _ in range(16)]
    for _ in range(4):
        for i, step in enumerate(s.step_batch(logits, states)):
            batched[i].append(step.token)
    assert batched == alone
    # in other batches: reversed, and split in uneven pieces beside unrelated rows
    order = list(range(15, -1, -1))
    states = [s.new_state(seed=100 + i, prompt_ids=[i, i + 1]) for i in range(16)]
    by_row = {i: [] for i in range(16)}
    noise = rows(3, 2)
    for _ in range(4):
        for lo, hi in [(0, 5), (5, 6), (6, 16)]:
            idx = order[lo:hi]
            extra = [s.new_state(seed=9000 + k) for k in range(3)]
            batch = np.concatenate([logits[idx], noise])
            steps = s.step_batch(batch, [states[i] for i in idx] + extra)
            for i, step in zip(idx, steps):
                by_row[i].append(step.token)
    assert [by_row[i] for i in range(16)] == alone
    # the tokens are not all the same (the test would not notice a batch-dependent draw)
    assert len({t for r in alone for t in r}) > 8


def test_batch_states_advance_like_single_steps() -> None:
    s = sampler()
    logits = rows(3, 3)
    a = [s.new_state(seed=i) for i in range(3)]
    b = [st.copy() for st in a]
    s.step_batch(logits, a)
    for i in range(3):
        s.step(logits[i], b[i])
    assert [x.summary() for x in a] == [y.summary() for y in b]
    assert [x.output_ids for x in a] == [y.output_ids for y in b]


def test_an_empty_batch() -> None:
    s = sampler()
    assert s.step_batch(np.zeros((0, V), dtype=np.float32), []) == []


def test_a_failing_row_names_itself_and_keeps_the_others() -> None:
    s = sampler()
    logits = rows(3, 4)
    logits[1, 7] = np.nan
    states = [s.new_state(seed=i) for i in range(3)]
    try:
        s.step_batch(logits, states)
    except nextok.NonFiniteLogit as e:
        assert e.row == 1 and e.index == 7 and e.field == "logits"
        assert e.steps[1] is None
        assert [st.step for st in states] == [1, 0, 1]
        alone = [s.new_state(seed=i) for i in (0, 2)]
        assert [e.steps[0].token, e.steps[2].token] == [s.step(logits[i], st).token for i, st in zip((0, 2), alone)]
    else:
        raise AssertionError("a NaN row must fail")


def test_the_gil_is_released_while_rows_are_stepped() -> None:
    """A Python thread runs while one long batch is stepped."""
    s = sampler()
    base = rows(64, 5)
    states = [s.new_state(seed=i) for i in range(64)]
    t0 = time.perf_counter()
    s.step_batch(base, states)
    reps = max(1, int(0.5 / (time.perf_counter() - t0)) + 1)  # a call of about half a second
    big = np.tile(base, (reps, 1))
    many = [s.new_state(seed=i) for i in range(len(big))]
    share = share_while(lambda: s.step_batch(big, many))
    assert share > 0.1, f"the counting thread ran {share:.1%} of the time"
