"""The engine level (``nextok.LLM``, vLLM-shaped) on the real default model from the test
data: outputs, batch invariance, ``n`` and seeds, logprobs by layer, stop strings,
constraints, errors, the GIL released while the engine works, 16 threads at once, chat,
streaming, traces and their replay, Ctrl-C, and the same run as the command-line tool."""

from __future__ import annotations

import json

import pytest

import nextok

from conftest import require_data, share_while

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,"]


@pytest.fixture(scope="module")
def llm() -> nextok.LLM:
    path = require_data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return nextok.LLM(path, max_num_seqs=8)


def tokens(outs: list[nextok.RequestOutput]) -> list[list[list[int]]]:
    return [[o.token_ids for o in r.outputs] for r in outs]


def test_request_outputs_are_vllm_shaped(llm: nextok.LLM) -> None:
    params = nextok.SamplingParams(temperature=0.0, max_tokens=8)
    (r,) = llm.generate(PROMPTS[0], params)
    assert isinstance(r, nextok.RequestOutput) and r.finished
    assert r.prompt == PROMPTS[0] and r.prompt_token_ids == llm.encode(PROMPTS[0])
    assert r.pipeline_hash.startswith("sha256:") and r.usage["prompt_tokens"] == len(r.prompt_token_ids)
    (o,) = r.outputs
    assert isinstance(o, nextok.CompletionOutput) and o.index == 0
    assert 1 <= len(o.token_ids) <= 8 and r.usage["completion_tokens"] == len(o.token_ids)
    assert o.text and o.finish_reason in ("stop", "length")
    assert (o.finish_reason == "length") == (len(o.token_ids) == 8)
    assert o.logprobs is None and o.cumulative_logprob is None
    # alone, the prompt goes in one forward pass with the first token, then one pass per token
    assert r.metrics["forward_passes"] == len(o.token_ids)
    # greedy decoding is deterministic, and token ids are a prompt too
    (again,) = llm.generate({"prompt_token_ids": r.prompt_token_ids}, params)
    assert again.outputs[0].token_ids == o.token_ids and again.prompt is None


def test_a_requests_tokens_do_not_depend_on_its_batch(llm: nextok.LLM) -> None:
    params = nextok.SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=10)
    together = llm.generate(PROMPTS, params)
    alone = [llm.generate(p, params)[0] for p in PROMPTS]
    assert tokens(together) == tokens(alone)
    reordered = llm.generate(PROMPTS[::-1], params)
    assert tokens(reordered) == tokens(alone)[::-1]


def test_n_sequences_use_consecutive_seeds(llm: nextok.LLM) -> None:
    (r,) = llm.generate(PROMPTS[1], nextok.SamplingParams(n=3, temperature=1.0, seed=40, max_tokens=8))
    assert r.seeds == [40, 41, 42] and [o.index for o in r.outputs] == [0, 1, 2]
    (single,) = llm.generate(PROMPTS[1], nextok.SamplingParams(temperature=1.0, seed=41, max_tokens=8))
    assert r.outputs[1].token_ids == single.outputs[0].token_ids


@pytest.mark.parametrize("layer", ["raw", "processed", "selection"])
def test_logprobs_carry_their_layer(llm: nextok.LLM, layer: str) -> None:
    params = nextok.SamplingParams(temperature=0.8, top_k=20, seed=3, max_tokens=6, logprobs=3, logprob_layer=layer)
    (o,) = llm.generate(PROMPTS[0], params)[0].outputs
    assert o.logprob_layer == layer and len(o.logprobs) == len(o.token_ids)
    total = 0.0
    for t, lp in zip(o.token_ids, o.logprobs):
        assert t in lp and 1 <= len(lp) <= 4 and all(v.logprob <= 0.0 for v in lp.values())
        assert isinstance(lp[t], nextok.Logprob) and lp[t].decoded_token is not None
        # ranks 1, 2, 3 for the candidates, best first
        ranked = sorted((v.rank, v.logprob) for v in lp.values() if v.rank is not None)
        assert [r for r, _ in ranked] == list(range(1, len(ranked) + 1))
        assert [x for _, x in ranked] == sorted((x for _, x in ranked), reverse=True)
        total += lp[t].logprob
    assert o.cumulative_logprob == pytest.approx(total)


def test_stop_strings(llm: nextok.LLM) -> None:
    greedy = nextok.SamplingParams(temperature=0.0, max_tokens=16)
    (full,) = llm.generate(PROMPTS[2], greedy)[0].outputs
    assert len(full.text) > 4
    stop = full.text[2:4]
    (cut,) = llm.generate(PROMPTS[2], nextok.SamplingParams(temperature=0.0, max_tokens=16, stop=[stop]))[0].outputs
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert stop not in cut.text and full.text.startswith(cut.text)


def test_a_constraint(llm: nextok.LLM) -> None:
    choices = ["yes", "no"]
    params = nextok.SamplingParams(
        temperature=0.7, seed=5, max_tokens=8, constraint={"type": "choice", "choices": choices}
    )
    for r in llm.generate(["Is the sky blue? Answer:", "Is fire cold? Answer:"], params):
        (o,) = r.outputs
        assert o.text in choices and o.finish_reason == "stop"


def test_bad_requests_name_their_field(llm: nextok.LLM) -> None:
    with pytest.raises(nextok.InvalidParameter) as e:
        nextok.SamplingParams(top_p=2.0)
    assert e.value.field == "top_p"
    with pytest.raises(nextok.ParseError) as e:
        nextok.SamplingParams(temprature=0.5)
    assert e.value.field == "temprature"
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok.SamplingParams(n=0)
    assert e.value.field == "n"
    with pytest.raises(nextok.InvalidArgument) as e:
        llm.generate(42)
    assert e.value.field == "prompts"
    with pytest.raises(nextok.InvalidArgument) as e:
        llm.generate(["a", "b"], [nextok.SamplingParams()])
    assert e.value.field == "sampling_params"
    with pytest.raises(nextok.NextokError) as e:
        llm.generate({"prompt_token_ids": [llm.vocab_size + 5]})
    assert e.value.field is not None and "prompt" in e.value.field
    with pytest.raises(nextok.ConstraintError):
        llm.generate("x", nextok.SamplingParams(constraint={"type": "regex", "pattern": "(open"}))


def test_bad_engines() -> None:
    path = require_data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok.LLM(path, max_num_sequences=4)
    assert e.value.field == "max_num_sequences"
    with pytest.raises(nextok.InvalidParameter) as e:
        nextok.LLM(path, max_num_seqs=0)
    assert e.value.field == "max_num_seqs"
    with pytest.raises(nextok.InvalidParameter) as e:
        nextok.LLM(path, itl_target_ms=600_001)
    assert e.value.field == "itl_target_ms"
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok.LLM(str(path) + ".missing")
    assert e.value.field == "model"
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok.LLM(path, requant="q2")
    assert e.value.field == "requant"
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok.LLM(path, kv_cache_type="q4_0")
    assert e.value.field == "kv_cache_type" and "f16, q8_0" in str(e.value)
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok.LLM(path, kv_cache_type=8)
    assert e.value.field == "kv_cache_type"


def test_a_q8_0_cache_records_its_type_and_replays_only_on_its_own(llm: nextok.LLM) -> None:
    path = require_data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    q8 = nextok.LLM(path, max_num_seqs=4, kv_cache_type="q8_0")
    params = nextok.SamplingParams(temperature=0.8, seed=5, max_tokens=12, trace=True)
    (r,) = q8.generate(PROMPTS[0], params)
    header = json.loads(r.trace.splitlines()[0])
    assert header["kv_cache"] == "q8_0"
    assert q8.replay(r.trace) == len(r.outputs[0].token_ids)
    # the same request on the f16 cache: its own trace says so, and neither replays on the other
    (f,) = llm.generate(PROMPTS[0], params)
    assert json.loads(f.trace.splitlines()[0])["kv_cache"] == "f16"
    for engine, trace in ((llm, r.trace), (q8, f.trace)):
        with pytest.raises(nextok.ReplayMismatch) as e:
            engine.replay(trace)
        assert e.value.field == "kv_cache"


def test_the_gil_is_released_while_the_engine_works(llm: nextok.LLM) -> None:
    params = nextok.SamplingParams(temperature=0.0, max_tokens=24)
    share = share_while(lambda: llm.generate(PROMPTS, params))
    assert share > 0.1, f"the counting thread ran {share:.1%} of the time"


def test_sixteen_python_threads_each_get_their_solo_tokens(llm: nextok.LLM) -> None:
    import threading

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    params = [nextok.SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=6) for i in range(16)]
    solo = [llm.generate(p, sp)[0].outputs[0].token_ids for p, sp in zip(prompts, params)]
    got: list[list[int] | None] = [None] * 16
    start = threading.Barrier(16)

    def run(i: int) -> None:
        start.wait(timeout=60)
        got[i] = llm.generate(prompts[i], params[i])[0].outputs[0].token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == solo


def test_chat_renders_the_template_and_answers(llm: nextok.LLM) -> None:
    conv = [{"role": "user", "content": "Say hello."}]
    params = nextok.SamplingParams(temperature=0.0, max_tokens=8)
    (r,) = llm.chat(conv, params)
    # the same as the chat prompt rendered by the engine and sent as ids: the template ran
    assert r.outputs[0].text and len(r.prompt_token_ids) > len(llm.encode("Say hello."))
    (again,) = llm.generate({"prompt_token_ids": r.prompt_token_ids}, params)
    assert again.outputs[0].token_ids == r.outputs[0].token_ids
    two = llm.chat([conv, [{"role": "user", "content": "Count to three."}]], params)
    assert len(two) == 2 and two[0].outputs[0].token_ids == r.outputs[0].token_ids
    with pytest.raises(nextok.InvalidArgument) as e:
        llm.chat([{"role": "user"}], params)
    assert e.value.field == "messages[0]"


def test_stream_yields_the_tokens_generate_gives(llm: nextok.LLM) -> None:
    params = nextok.SamplingParams(temperature=0.8, seed=5, max_tokens=10, logprobs=2, logprob_layer="processed")
    (r,) = llm.generate(PROMPTS[1], params)
    events = list(llm.stream(PROMPTS[1], params))
    toks = [e for e in events if e.token_id is not None]
    assert [e.token_id for e in toks] == r.outputs[0].token_ids
    assert "".join(e.text for e in events) == r.outputs[0].text
    assert all(e.logprob_layer == "processed" and e.token_id in e.logprobs for e in toks)
    assert events[-1].token_id is None and events[-1].finish_reason == r.outputs[0].finish_reason
    # leaving early cancels the request; the engine goes on serving
    long = llm.stream(PROMPTS[0], nextok.SamplingParams(temperature=0.8, seed=1, max_tokens=400, ignore_eos=True))
    next(long)
    long.close()
    assert llm.generate(PROMPTS[1], params)[0].outputs[0].token_ids == r.outputs[0].token_ids


def test_trace_replays_bit_for_bit_and_an_edit_is_caught(llm: nextok.LLM, tmp_path) -> None:
    params = nextok.SamplingParams(n=2, temperature=0.9, top_p=0.9, seed=21, max_tokens=6, trace=True)
    (r,) = llm.generate(PROMPTS[2], params)
    lines = r.trace.splitlines()
    header = json.loads(lines[0])
    assert header["seeds"] == [21, 22] and header["pipeline_hash"] == r.pipeline_hash
    steps = sum(len(o.token_ids) for o in r.outputs)
    assert len(lines) == 1 + steps
    assert llm.replay(r.trace) == steps
    path = tmp_path / "run.jsonl"
    path.write_text(r.trace)
    assert nextok.replay(str(path), llm) == steps
    edited = lines[:2] + [lines[2].replace('"raw_logits_digest":"x64:', '"raw_logits_digest":"x64:0', 1)] + lines[3:]
    with pytest.raises(nextok.ReplayMismatch) as e:
        llm.replay("\n".join(edited) + "\n")
    assert "raw_logits_digest" in str(e.value) and e.value.code == "replay_mismatch"
    with pytest.raises(nextok.InvalidParameter) as e:
        llm.replay("not a trace")
    assert e.value.field == "trace"
    # the first divergence as data: where, which field, both values
    edited = lines[:3] + [lines[3].replace('"selected":', '"selected":1', 1)] + lines[4:]
    with pytest.raises(nextok.ReplayMismatch) as e:
        llm.replay("\n".join(edited) + "\n")
    assert (e.value.sequence, e.value.step, e.value.line) == (0, 2, 4)
    assert e.value.field == "selected" and json.loads(e.value.now) == json.loads(lines[3])["selected"]


def test_a_trace_of_other_numerics_is_refused_and_its_sampler_replays_alone(llm: nextok.LLM) -> None:
    params = nextok.SamplingParams(temperature=0.9, top_p=0.9, seed=4, max_tokens=4, trace=True, trace_logits=True)
    (r,) = llm.generate(PROMPTS[1], params)
    lines = r.trace.splitlines()
    header = json.loads(lines[0])
    assert header["raw_logits"] is True and header["numerics"].startswith("nx1 ")
    assert json.loads(lines[1])["raw_logits"]["len"] == llm.vocab_size
    steps = len(r.outputs[0].token_ids)
    assert llm.replay(r.trace) == steps
    assert llm.replay(r.trace, sampler_only=True) == steps
    # another build's model numerics: refused before the model runs, naming both builds ...
    header["numerics"] = header["numerics"].replace("graph.llama=", "graph.llama=8")
    header["nextok_version"] = "0.0.2+gabc"
    other = json.dumps(header) + "\n" + "\n".join(lines[1:]) + "\n"
    with pytest.raises(nextok.ReplayMismatch) as e:
        llm.replay(other)
    assert e.value.code == "numerics_differ" and e.value.recorded_version == "0.0.2+gabc"
    assert e.value.numerics == json.loads(lines[0])["numerics"] and "graph.llama: 8" in str(e.value)
    # ... while its sampler still replays on the stored logits
    assert nextok.replay(other, llm, sampler_only=True) == steps
    # a trace without stored logits cannot replay its sampler alone
    (plain,) = llm.generate(PROMPTS[1], nextok.SamplingParams(seed=4, max_tokens=2, trace=True))
    with pytest.raises(nextok.ReplayMismatch) as e:
        llm.replay(plain.trace, sampler_only=True)
    assert e.value.field == "raw_logits"
    with pytest.raises(nextok.NextokError) as e:
        llm.generate(PROMPTS[1], nextok.SamplingParams(max_tokens=2, trace_logits=True))
    assert e.value.field == "trace_logits"


def test_ctrl_c_cancels_a_running_generate(tmp_path) -> None:
    """SIGINT while ``generate`` waits raises KeyboardInterrupt within a few engine iterations
    (the wait checks for signals every 100 ms), not when the request would have ended, and the
    engine serves the next request.

    Bounded in work, not seconds: a second stream beside the request gets one token per engine
    iteration, so its tokens count the iterations run between the signal and the interrupt."""
    import signal
    import subprocess
    import sys

    path = require_data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    script = tmp_path / "interrupt.py"
    # A runner started in the background by a non-interactive shell hands SIGINT down ignored,
    # and Python then leaves it ignored; an interactive user's Python turns it into
    # KeyboardInterrupt, which is what this test is about.
    script.write_text(
        "import signal, sys, threading, nextok\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"llm = nextok.LLM({str(path)!r})\n"
        "ticks, at_signal, stop = [0], [], threading.Event()\n"
        "def count():\n"
        "    s = llm.stream('Hi', nextok.SamplingParams(max_tokens=6000, ignore_eos=True))\n"
        "    for e in s:\n"
        "        ticks[0] += 1\n"
        "        if stop.is_set():\n"
        "            break\n"
        "    s.close()\n"
        "def signalled():\n"
        "    sys.stdin.readline()\n"
        "    at_signal.append(ticks[0])\n"
        "counter = threading.Thread(target=count)\n"
        "reader = threading.Thread(target=signalled)\n"
        "counter.start()\n"
        "reader.start()\n"
        "print('generating', flush=True)\n"
        "try:\n"
        "    r = llm.generate('Once upon a time', nextok.SamplingParams(max_tokens=3000, ignore_eos=True))\n"
        "    print(f'finished {len(r[0].outputs[0].token_ids)} tokens', flush=True)\n"
        "except KeyboardInterrupt:\n"
        "    reader.join(timeout=300)\n"
        "    print(f'interrupted {ticks[0] - at_signal[0]}', flush=True)\n"
        "stop.set()\n"
        "counter.join(timeout=300)\n"
        "out = llm.generate('Hi', nextok.SamplingParams(temperature=0.0, max_tokens=3))\n"
        "print('after', len(out[0].outputs[0].token_ids), flush=True)\n"
    )
    p = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline().strip() == "generating"
        import time

        time.sleep(1.5)  # lets the call reach its wait (not a bound: a late start only counts less)
        p.stdin.write("signal\n")
        p.stdin.flush()
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=600)  # a stall guard
    finally:
        if p.poll() is None:
            p.kill()
    lines = out.split()
    assert "interrupted" in lines, out
    # a few iterations per 100 ms check; the request's remaining ~3,000 when it is not seen
    assert int(lines[lines.index("interrupted") + 1]) < 500, out
    assert lines[-2:] == ["after", "3"]


def _nextok_binary() -> str | None:
    """The CLI the test command builds (``target/debug/nextok``; ``NEXTOK_BIN`` overrides)."""
    import os

    from conftest import REPO

    env = os.environ.get("NEXTOK_BIN")
    if env:
        return env
    target = os.environ.get("CARGO_TARGET_DIR", str(REPO / "target"))
    for profile in ("debug", "release"):
        p = os.path.join(target, profile, "nextok")
        if os.path.isfile(p):
            return p
    return None


def test_generate_equals_the_cli_and_each_replays_the_others_trace(llm: nextok.LLM, tmp_path) -> None:
    """``LLM.generate`` and ``nextok generate`` with the same seed and parameters give the same
    text, and the same step records line for line: each replays the other's trace."""
    import subprocess

    from conftest import in_ci

    exe = _nextok_binary()
    if exe is None:
        if in_ci():
            pytest.fail("the nextok binary is missing (CI is set): cargo build -p nextok-cli")
        pytest.skip("the nextok binary is not built here (cargo build -p nextok-cli, or set NEXTOK_BIN)")
    prompt = "Once upon a time"
    params = nextok.SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12, trace=True)
    (r,) = llm.generate(prompt, params)
    trace = tmp_path / "cli.jsonl"
    out = subprocess.run(
        [exe, "generate", "--model", llm.model_path, "--temperature", "0.8", "--top-p", "0.9", "--seed", "7",
         "--max-tokens", "12", "--trace", str(trace), prompt],
        capture_output=True, text=True, timeout=300, check=True,
    )
    assert out.stdout.strip() == r.outputs[0].text.strip()
    cli = trace.read_text().splitlines()
    mine = r.trace.splitlines()
    assert cli[1:] == mine[1:]  # every step record, byte for byte
    assert json.loads(cli[0])["pipeline_hash"] == json.loads(mine[0])["pipeline_hash"]
    assert llm.replay(str(trace)) == len(r.outputs[0].token_ids)
    mine_file = tmp_path / "python.jsonl"
    mine_file.write_text(r.trace)
    subprocess.run([exe, "replay", "--model", llm.model_path, str(mine_file)], capture_output=True, text=True,
                   timeout=300, check=True)
