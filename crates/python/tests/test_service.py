"""``nextok.Service``: the server's API called in process, as a Ray replica calls it.

The answers are ``nextok serve``'s (the same router); the side channel's token ids are the
engine's; a stream cut anywhere and resumed from those ids (``nextok.resume``) gives the
client the same bytes; bad input is a typed error naming the argument; ``nextok.ray`` is the
only module that imports Ray.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import nextok

from conftest import require_data


@pytest.fixture(scope="module")
def svc() -> nextok.Service:
    path = require_data("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return nextok.Service(model=str(path), api_keys=["k1"])


AUTH = [("content-type", "application/json"), ("authorization", "Bearer k1")]


def events(data: bytes) -> list[str]:
    return [e[6:] for e in data.decode().split("\n\n") if e.startswith("data: ")]


def test_the_api_answers_as_nextok_serve(svc: nextok.Service) -> None:
    r = svc.request("GET", "/v1/models", AUTH)
    assert r.status == 200 and r.started is None
    assert json.loads(r.read())["data"][0]["id"] == "SmolLM2-135M-Instruct.Q4_1" == svc.model_id
    # the key is checked, the error has OpenAI's shape
    r = svc.request("GET", "/v1/models")
    assert r.status == 401
    assert json.loads(r.read())["error"]["type"] == "authentication_error"
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12, "seed": 4, "temperature": 0.9}
    r = svc.request("POST", "/v1/chat/completions", AUTH, json.dumps(body).encode())
    assert r.status == 200
    assert r.started is not None and r.started["seed"] == 4 and r.started["n"] == 1
    chunks = list(r)
    out = json.loads(b"".join(c.data for c in chunks))
    # the tokens beside the body are the engine's, as `LLM.chat` gives them
    ids = [t for c in chunks for _, t in c.tokens]
    want = svc.llm.chat([{"role": "user", "content": "Name a colour."}],
                        nextok.SamplingParams(max_tokens=12, seed=4, temperature=0.9))[0].outputs[0]
    assert ids == want.token_ids
    assert out["choices"][0]["message"]["content"] == want.text
    assert [f for c in chunks for f in c.finished] == [0]


def test_a_stream_resumed_from_its_side_tokens_gives_the_same_bytes(svc: nextok.Service) -> None:
    body = {"prompt": "Once upon a time,", "max_tokens": 24, "temperature": 0.8, "n": 2, "stream": True,
            "stream_options": {"include_usage": True}}
    r = svc.request("POST", "/v1/completions", AUTH, json.dumps(body).encode())
    started = r.started
    chunks = list(r)
    full = b"".join(c.data for c in chunks)
    for cut in (1, len(chunks) // 2, len(chunks) - 2):
        tokens: list[list[int]] = [[], []]
        finished: list[int] = []
        for c in chunks[:cut]:
            for seq, t in c.tokens:
                tokens[seq].append(t)
            finished += c.finished
        again = dict(body, seed=started["seed"], nextok={"resume": {
            "tokens": tokens, "id": started["id"], "created": started["created"], "finished": finished}})
        r2 = svc.request("POST", "/v1/completions", AUTH, json.dumps(again).encode())
        assert r2.status == 200
        got = b"".join(c.data for c in chunks[:cut]) + r2.read()

        def per_choice(data: bytes) -> dict:
            out: dict = {}
            for e in events(data):
                if e == "[DONE]":
                    out.setdefault("done", []).append(e)
                    continue
                v = json.loads(e)
                if v.get("usage"):
                    v["usage"].pop("prompt_tokens_details", None)
                out.setdefault(v["choices"][0]["index"] if v["choices"] else "usage", []).append(v)
            return out

        assert per_choice(got) == per_choice(full), cut


def test_bad_input_names_the_argument(svc: nextok.Service) -> None:
    with pytest.raises(nextok.InvalidArgument) as e:
        svc.request("GET", "not a path", AUTH)
    assert e.value.field == "path"
    with pytest.raises(nextok.InvalidArgument) as e:
        svc.request("GET", "/v1/models", [("bad header\n", "x")])
    assert e.value.field == "headers[0]"
    with pytest.raises(nextok.InvalidArgument) as e:
        svc.request("GET", "/v1/models", [("x", "y")] * 101)
    assert e.value.field == "headers"
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok.Service(svc.llm, body_limit=-1)
    assert e.value.field == "body_limit"
    with pytest.raises(nextok.InvalidArgument) as e:
        nextok._nextok.refusal("busy", "x")
    assert e.value.field == "kind"
    # a body over the limit: 413 from the API, the service goes on
    small = nextok.Service(svc.llm, body_limit=64)
    r = small.request("POST", "/v1/completions", AUTH, b"x" * 1000)
    assert r.status == 413
    assert svc.request("GET", "/health").status == 200


def test_refusals_are_nextok_serves() -> None:
    status, headers, body = nextok._nextok.refusal("queue_full", "busy")
    assert status == 429 and ("retry-after", "1") in headers
    assert json.loads(body)["error"] == {"message": "busy", "type": "rate_limit_error", "param": None, "code": "queue_full"}
    status, headers, _ = nextok._nextok.refusal("shutdown", "going")
    assert status == 503 and ("retry-after", "5") in headers


def test_only_nextok_ray_imports_ray() -> None:
    code = "import sys, nextok; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"nextok\[ray\]"):
            import nextok.ray  # noqa: F401


def test_closing_a_response_cancels_its_answer_even_while_a_thread_waits(svc: nextok.Service) -> None:
    import threading
    import time

    body = {"prompt": "Count:", "max_tokens": 3000, "ignore_eos": True, "stream": True, "seed": 2}
    r = svc.request("POST", "/v1/completions", AUTH, json.dumps(body).encode())
    assert r.next_chunk() is not None
    got: list = []
    t = threading.Thread(target=lambda: got.extend(iter(r)))
    t.start()
    deadline = time.time() + 120  # stall guards: the answer has 3,000 tokens to go
    while not got and time.time() < deadline:
        time.sleep(0.01)
    r.close()
    t.join(timeout=120)
    assert not t.is_alive(), "the reading thread still waits after close()"
    assert len(got) < 2000
    while svc.stats()["running_seqs"] and time.time() < deadline:
        time.sleep(0.05)
    assert svc.stats()["running_seqs"] == 0


def test_coalesced_chunks_carry_the_same_bytes_and_tokens(svc: nextok.Service) -> None:
    import time

    body = {"prompt": "List three colours:", "max_tokens": 40, "ignore_eos": True, "stream": True, "seed": 8, "n": 2}

    def read(coalesce: int, wait: bool) -> tuple[bytes, list, list, int]:
        r = svc.request("POST", "/v1/completions", AUTH, json.dumps(body).encode())
        data, toks, fin, n = b"", [], [], 0
        while (c := r.next_chunk(coalesce)) is not None:
            data += c.data
            toks += c.tokens
            fin += c.finished
            n += 1
            if wait and n == 1:
                # a slow reader: the engine finishes the answer before the rest is read
                deadline = time.time() + 300  # a stall guard
                while svc.stats()["running_seqs"] and time.time() < deadline:
                    time.sleep(0.01)
        return data, toks, fin, n

    def norm(data: bytes) -> list:
        out = []
        for e in events(data):
            v = json.loads(e) if e != "[DONE]" else e
            if isinstance(v, dict):
                v.pop("id")
                v.pop("created")
            out.append(v)
        return out

    one = read(1, False)
    many = read(64, True)
    assert (norm(many[0]), many[1], sorted(many[2])) == (norm(one[0]), one[1], sorted(one[2]))
    assert many[3] < one[3], (many[3], one[3])
