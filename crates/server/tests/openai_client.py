#!/usr/bin/env python3
"""The official `openai` Python package against `nextok serve` on the real default model.

Usage: openai_client.py NEXTOK_BINARY MODEL.gguf

Starts the server on an ephemeral 127.0.0.1 port (with an API key), then checks chat and
completions, streaming and not, n=2, seed reproducibility (also against `nextok generate`),
stop strings, logprobs, JSON-schema answers, vLLM parameters and structured outputs through
`extra_body`, every bad field's 400 and its `param`, a client that disconnects mid-stream
(the metrics show its cache freed), 64 concurrent streams equal to their solo runs, traces that
`nextok replay` accepts, `/v1/explain`, and a SIGTERM that exits 0. Every loop is bounded in
count and time; all traffic goes to 127.0.0.1. Prints `N passed, M failed`.
"""

import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

import jsonschema
import openai
from openai import OpenAI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_harness import Endpoint, Server, run_tests  # noqa: E402

BIN, MODEL = sys.argv[1], sys.argv[2]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
KEY = "test-key-" + str(os.getpid())
OTHER_KEY = "other-key-" + str(os.getpid())

# NEXTOK_OPENAI_ENDPOINT: the same suite against an endpoint already serving this model with
# the keys in NEXTOK_OPENAI_KEYS (comma-separated: the test's, another's), such as nextok on
# Ray Serve; the tests that read one server process's metrics say they are skipped
ENDPOINT = os.environ.get("NEXTOK_OPENAI_ENDPOINT")
if ENDPOINT:
    KEY, OTHER_KEY = os.environ["NEXTOK_OPENAI_KEYS"].split(",")[:2]
try:
    SERVER = Endpoint(ENDPOINT) if ENDPOINT else Server(BIN, MODEL, "--api-key", KEY, "--api-key", OTHER_KEY)
except RuntimeError as e:
    print(e, file=sys.stderr)
    print("0 passed, 1 failed")
    sys.exit(1)
base = SERVER.base
proc = SERVER.proc

client = OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=300)
MODEL_ID = None

PROMPTS = [
    "The capital of France is",
    "Once upon a time,",
    "List three colours:",
    "def fibonacci(n):",
]
PERSON = json.load(open(os.path.join(ROOT, "examples", "person.schema.json")))


def http(method, path, body=None, key=KEY):
    """A raw request with the test's key; returns (status, headers, text)."""
    return SERVER.http(method, path, body, key=key)


def metric(name):
    return SERVER.metric(name)


def chat(content, **kw):
    return client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": content}], **kw
    )


def stream_text(s):
    """Text per choice index, finish reasons, and the usage chunk of a chat or completions stream."""
    texts, finish, usage = {}, {}, None
    for chunk in s:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            piece = c.delta.content if hasattr(c, "delta") else c.text
            texts[c.index] = texts.get(c.index, "") + (piece or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, usage


# ---- tests ---------------------------------------------------------------------------------

def test_models_and_health():
    global MODEL_ID
    models = client.models.list().data
    assert len(models) == 1
    MODEL_ID = models[0].id
    assert MODEL_ID == "SmolLM2-135M-Instruct.Q4_1", MODEL_ID
    assert http("GET", "/health", key=None)[0] == 200


def test_api_key():
    status, headers, text = http("GET", "/v1/models", key=None)
    assert status == 401, status
    assert json.loads(text)["error"]["type"] == "authentication_error"
    bad = OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0, timeout=30)
    try:
        bad.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as e:
        assert e.status_code == 401


def test_chat_streaming_and_not():
    kw = dict(max_tokens=16, temperature=0.7, seed=3)
    r = chat("What is the capital of France?", **kw)
    text = r.choices[0].message.content
    assert text, r
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    s = chat("What is the capital of France?", stream=True, stream_options={"include_usage": True}, **kw)
    texts, finish, usage = stream_text(s)
    assert texts == {0: text}, (texts, text)
    assert finish[0] == r.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens


def test_completions_streaming_and_not():
    kw = dict(model=MODEL_ID, prompt="Once upon a time,", max_tokens=12, temperature=0.8, seed=9)
    r = client.completions.create(**kw)
    text = r.choices[0].text
    assert text
    s = client.completions.create(stream=True, **kw)
    texts, finish, usage = stream_text(s)
    assert texts == {0: text}
    assert usage is None  # not asked for
    assert finish[0] == r.choices[0].finish_reason


def test_n2_equals_single_runs():
    r = chat("Name an animal.", n=2, max_tokens=10, temperature=1.0, seed=40)
    assert len(r.choices) == 2
    for i, c in enumerate(r.choices):
        solo = chat("Name an animal.", max_tokens=10, temperature=1.0, seed=40 + i)
        assert c.message.content == solo.choices[0].message.content, (i, c, solo)


def test_seed_reproducible_and_equal_to_the_cli():
    kw = dict(max_tokens=16, temperature=0.9, top_p=0.95, seed=7)
    a = chat("Tell me a fact about the sea.", **kw).choices[0].message.content
    b = chat("Tell me a fact about the sea.", **kw).choices[0].message.content
    assert a == b
    cli = subprocess.run(
        [BIN, "generate", "--chat", "Tell me a fact about the sea.", "--model", MODEL,
         "--max-tokens", "16", "--temperature", "0.9", "--top-p", "0.95", "--seed", "7"],
        capture_output=True, text=True, timeout=300,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == a + "\n", (cli.stdout, a)


def test_stop_string():
    kw = dict(model=MODEL_ID, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    words = full.split()
    assert len(words) >= 3, full
    stop = " " + words[2]
    cut = full.index(stop)
    r = client.completions.create(stop=[stop], **kw)
    assert r.choices[0].text == full[:cut], (r.choices[0].text, full, stop)
    assert r.choices[0].finish_reason == "stop"
    r = client.completions.create(stop=stop, extra_body={"include_stop_str_in_output": True}, **kw)
    assert r.choices[0].text == full[: cut + len(stop)]


def test_logprobs():
    # greedy: the support is the selected token alone, the best raw candidate
    r = chat("Say hello.", max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert len(e.top_logprobs) == 1
        assert e.top_logprobs[0].token == e.token
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-9 and e.logprob <= 0
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    # sampled: the three best of the support, in the raw layer by default
    r = chat("Say hello.", max_tokens=8, temperature=1.0, seed=8, logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert len(e.top_logprobs) == 3
        values = [t.logprob for t in e.top_logprobs]
        assert values == sorted(values, reverse=True), values
        assert e.logprob <= values[0] + 1e-9
    assert r.model_extra["nextok"]["logprob_layer"] == "raw"
    # another layer, named in the answer
    r = chat("Say hello.", max_tokens=4, temperature=0.8, seed=1, logprobs=True, top_logprobs=2,
             extra_body={"nextok": {"logprob_layer": "selection"}})
    assert r.model_extra["nextok"]["logprob_layer"] == "selection"
    # completions: logprobs = N
    r = client.completions.create(model=MODEL_ID, prompt="The sky is", max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(len(t) <= 2 for t in lp.top_logprobs)


def test_json_schema_answer_validates():
    r = chat(
        "Give me a person as JSON with name, age and city.",
        max_tokens=200, temperature=0.7, seed=5,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    c = r.choices[0]
    assert c.finish_reason == "stop", c
    jsonschema.validate(json.loads(c.message.content), PERSON)
    r = chat("Give me a JSON object.", max_tokens=100, temperature=0, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        json.loads(r.choices[0].message.content)


def test_json_schema_in_any_property_order():
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = chat("Give me a person as JSON with name, age and city.", max_tokens=200, temperature=0.7,
             seed=5, response_format=rf, extra_body={"nextok": {"property_order": "any"}})
    c = r.choices[0]
    if c.finish_reason == "stop":
        jsonschema.validate(json.loads(c.message.content), PERSON)
    report = r.model_extra["nextok"]["schema"]
    assert report["property_order"] == "any" and report["objects_any_order"] >= 1, report
    expect_400("nextok.property_order",
               lambda: chat("x", max_tokens=5, response_format=rf,
                            extra_body={"nextok": {"property_order": "sorted"}}))


def test_vllm_extra_body_and_structured_outputs():
    r = chat("Is the sky blue? Answer yes or no.", max_tokens=5, temperature=0.5, seed=2,
             extra_body={"structured_outputs": {"choice": ["yes", "no"]}, "top_k": 20, "min_p": 0.05,
                         "repetition_penalty": 1.1})
    assert r.choices[0].message.content in ("yes", "no"), r
    r = client.completions.create(model=MODEL_ID, prompt="A three-digit number:", max_tokens=8, temperature=0.8,
                                  seed=4, extra_body={"guided_regex": "[0-9]{3}"})
    assert re.fullmatch("[0-9]{3}", r.choices[0].text), r
    r = client.completions.create(model=MODEL_ID, prompt="Pick:", max_tokens=8, temperature=0.8, seed=4,
                                  extra_body={"guided_choice": ["alpha", "beta"]})
    assert r.choices[0].text in ("alpha", "beta")
    r = client.completions.create(model=MODEL_ID, prompt="JSON:", max_tokens=60, temperature=0.5, seed=4,
                                  extra_body={"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}}})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].text)["a"], int)
    # min_tokens and ignore_eos: exactly max_tokens tokens
    r = client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=6, temperature=0,
                                  extra_body={"ignore_eos": True, "min_tokens": 6, "stop_token_ids": []})
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"


def expect_400(param, call):
    try:
        call()
    except openai.BadRequestError as e:
        assert e.status_code == 400
        body = e.body if isinstance(e.body, dict) else {}
        body = body.get("error", body)
        assert body.get("param") == param, (param, body)
        assert body.get("type") == "invalid_request_error", body
        return
    raise AssertionError("no 400 for " + param)


def test_each_bad_field_is_a_400_naming_it():
    m = [{"role": "user", "content": "hi"}]
    c = lambda **kw: client.chat.completions.create(model=MODEL_ID, messages=kw.pop("messages", m), max_tokens=4, **kw)
    expect_400("temperature", lambda: c(temperature=-1))
    expect_400("top_p", lambda: c(top_p=2))
    expect_400("n", lambda: c(n=0))
    expect_400("presence_penalty", lambda: c(presence_penalty=5))
    expect_400("top_logprobs", lambda: c(logprobs=True, top_logprobs=50))
    expect_400("seed", lambda: c(seed=-3))
    expect_400("stop[0]", lambda: c(stop=[""]))
    expect_400("logit_bias.x", lambda: c(logit_bias={"x": 1}))
    expect_400("messages[0].role", lambda: c(messages=[{"role": "robot", "content": "x"}]))
    expect_400("response_format.json_schema.schema",
               lambda: c(response_format={"type": "json_schema", "json_schema": {"name": "x"}}))
    expect_400("guided_regex", lambda: c(extra_body={"guided_regex": "("}))
    expect_400("structured_outputs.choice", lambda: c(extra_body={"structured_outputs": {"choice": []}}))
    expect_400("top_k", lambda: c(extra_body={"top_k": "many"}))
    expect_400("frobnicate", lambda: c(extra_body={"frobnicate": 1}))
    expect_400("nextok.pipeline", lambda: c(extra_body={"nextok": {"pipeline": "fastest"}}))
    expect_400("max_tokens", lambda: client.completions.create(model=MODEL_ID, prompt="x", max_tokens=100000))
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404


def test_disconnect_mid_stream_frees_the_cache():
    if ENDPOINT:
        print("  SKIPPED: reads one server process's /metrics (the endpoint's replicas each have theirs)", file=sys.stderr)
        return
    before_499 = 0.0
    status, _, text = http("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith('nextok_requests_total{endpoint="chat_completions",status="499"}'):
            before_499 = float(line.split()[1])
    s = chat("Write a very long story.", max_tokens=2000, temperature=0.8, seed=1, stream=True,
             extra_body={"ignore_eos": True})
    n = 0
    for _ in s:
        n += 1
        if n >= 10:
            break
    assert n == 10
    assert metric("nextok_running_sequences") == 1
    assert metric("nextok_kv_bytes_reserved") > 0
    s.close()
    # freed within a few engine iterations of the disconnect, not at its 2,000 tokens: bounded
    # in iterations; the wall clock is only a stall guard
    it0 = metric("nextok_engine_iterations_total")
    deadline = time.time() + 300
    while True:
        if metric("nextok_running_sequences") == 0 and metric("nextok_kv_bytes_reserved") == 0:
            break
        assert time.time() < deadline, "the cancelled stream's cache was not freed"
        time.sleep(0.1)
    iterations = metric("nextok_engine_iterations_total") - it0
    assert iterations < 16, f"the stream ran {iterations:.0f} iterations past its disconnect"
    deadline = time.time() + 300  # a stall guard
    while True:
        status, _, text = http("GET", "/metrics")
        got = [float(l.split()[1]) for l in text.splitlines()
               if l.startswith('nextok_requests_total{endpoint="chat_completions",status="499"}')]
        if got and got[0] == before_499 + 1:
            break
        assert time.time() < deadline, "no 499 counted"
        time.sleep(0.1)


def test_64_concurrent_streams_equal_their_solo_runs():
    def params(i):
        return dict(model=MODEL_ID, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=8, temperature=0.8, seed=100 + i)

    def run_stream(i):
        s = client.completions.create(stream=True, **params(i))
        texts, finish, _ = stream_text(s)
        return texts.get(0, ""), finish.get(0)

    t0 = time.time()
    with cf.ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(run_stream, range(64), timeout=600))
    took = time.time() - t0
    assert all(f in ("stop", "length") for _, f in results), results
    for i in range(64):
        solo = client.completions.create(**params(i)).choices[0].text
        assert results[i][0] == solo, (i, results[i][0], solo)
    print(f"  64 concurrent streams in {took:.1f} s", file=sys.stderr)


def test_trace_replays():
    r = client.completions.create(model=MODEL_ID, prompt="List three colours:", max_tokens=8, temperature=0.8,
                                  seed=12, extra_body={"nextok": {"trace": True, "pipeline": "vllm"}, "top_k": 40})
    tid = r.model_extra["nextok"]["trace_id"]
    # 128 random bits, readable only with the key that made it
    assert re.fullmatch(r"trace-[0-9a-f]{32}", tid), tid
    status, _, _ = http("GET", "/v1/traces/" + tid, key=OTHER_KEY)
    assert status == 404, status
    status, headers, text = http("GET", "/v1/traces/" + tid)
    assert status == 200, (status, text)
    lines = text.strip().split("\n")
    assert len(lines) == 1 + r.usage.completion_tokens
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write(text)
    rep = subprocess.run([BIN, "replay", f.name, "--model", MODEL], capture_output=True, text=True, timeout=300)
    os.unlink(f.name)
    assert rep.returncode == 0, rep.stderr
    assert "replay ok" in rep.stderr


def test_speculative_per_request():
    # an answer that copies its prompt (the chat template written out, as `generate` takes it)
    copy = ("<|im_start|>user\nRepeat this list exactly, one item per line:\napple pie\nbanana bread\n"
            "cherry tart\ndate cake\nelderberry jam\nfig roll<|im_end|>\n<|im_start|>assistant\n")
    kw = dict(model=MODEL_ID, prompt=copy, max_tokens=30, temperature=0.6, seed=9)
    plain = client.completions.create(**kw)
    fast = client.completions.create(**kw, extra_body={"nextok": {"speculative": "ngram:4"}})
    # exact mode: plain decoding's tokens
    assert fast.choices[0].text == plain.choices[0].text
    sp = fast.model_extra["nextok"]["speculative"]
    assert sp["max_draft"] == 4 and sp["acceptance"] == "exact", sp
    assert "speculative" not in plain.model_extra["nextok"]
    # rejection mode: its trace records the rule and replays
    r = client.completions.create(**kw, extra_body={
        "nextok_speculative": "ngram", "nextok_spec_acceptance": "rejection", "nextok_trace": True})
    status, _, text = http("GET", "/v1/traces/" + r.model_extra["nextok"]["trace_id"])
    assert status == 200, text
    lines = [json.loads(l) for l in text.strip().split("\n")]
    assert lines[0]["speculative"]["acceptance"] == "rejection", lines[0]
    marks = [l["draft"] for l in lines[1:] if "draft" in l]
    assert marks and all(m["rule"] == "rejection" for m in marks), marks
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.write(text)
    rep = subprocess.run([BIN, "replay", f.name, "--model", MODEL], capture_output=True, text=True, timeout=300)
    os.unlink(f.name)
    assert rep.returncode == 0, rep.stderr
    expect_400("nextok.speculative", lambda: client.completions.create(
        **kw, extra_body={"nextok": {"speculative": "ngram:99"}}))
    # this server has no draft model
    expect_400("nextok.speculative", lambda: client.completions.create(
        **kw, extra_body={"nextok": {"speculative": "model:3"}}))
    expect_400("nextok.spec_acceptance", lambda: client.completions.create(
        **kw, extra_body={"nextok": {"spec_acceptance": "rejection"}}))
    expect_400("nextok_spec_acceptance", lambda: client.completions.create(
        **kw, extra_body={"nextok_speculative": "ngram", "nextok_spec_acceptance": "often"}))


def test_explain():
    req = json.load(open(os.path.join(ROOT, "examples", "hand_computation.json")))
    status, _, text = http("POST", "/v1/explain", req)
    assert status == 200, text
    out = json.loads(text)
    assert out["selected"] == 1 and out["support"] == [0, 1], out
    req["selector"] = {"u": 1.5}
    status, _, text = http("POST", "/v1/explain", req)
    assert status == 400 and json.loads(text)["error"]["param"] == "selector.u", text


TESTS = [
    test_models_and_health,
    test_api_key,
    test_chat_streaming_and_not,
    test_completions_streaming_and_not,
    test_n2_equals_single_runs,
    test_seed_reproducible_and_equal_to_the_cli,
    test_stop_string,
    test_logprobs,
    test_json_schema_answer_validates,
    test_json_schema_in_any_property_order,
    test_vllm_extra_body_and_structured_outputs,
    test_speculative_per_request,
    test_each_bad_field_is_a_400_naming_it,
    test_disconnect_mid_stream_frees_the_cache,
    test_64_concurrent_streams_equal_their_solo_runs,
    test_trace_replays,
    test_explain,
]


def main():
    test_models_and_health.always = True
    return run_tests(TESTS, SERVER, "NEXTOK_SERVER_TEST")


if __name__ == "__main__":
    sys.exit(main())
