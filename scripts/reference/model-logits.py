"""Runs llama.cpp (through llama-cpp-python) on GGUF models and writes what it computed: for
each prompt, the token ids, the ten highest raw logits after every prompt position, and the
greedy continuation (argmax at every step, EOS not stopped). Called by model-logits.sh with the
virtual environment that holds llama-cpp-python; never run in CI.

    python model-logits.py [--flash-attn-delta | --kv-q8_0] OUT.json LLAMA_CPP_PYTHON_VERSION MODEL.gguf[=PROMPTS.json] ...

A model given alone gets the tiny models' prompt (token ids); PROMPTS.json is a list of texts,
tokenized by llama.cpp itself (BOS added, special tokens parsed). With --flash-attn-delta, each
model's entry also records how far llama.cpp's own logits move when its other attention path
runs (flash attention on): the largest |difference| over the same top-10 entries. With --kv-q8_0,
llama.cpp keeps its KV cache in Q8_0 (`-ctk q8_0 -ctv q8_0`, which needs flash attention on), and
each model's entry records `f16_delta`: how far that moves its logits from its f16 cache (flash
attention on) over the same top-10 entries, and `attn_paths_delta`: how far its f16 logits move
between its two attention paths (flash attention off and on) over those entries.
"""

import hashlib
import json
import os
import sys

import numpy as np
from llama_cpp import Llama

TOP = 10


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tiny_prompt(n, salt, vocab):
    # the prompt of crates/model/tests/families.rs
    return [(i * 37 + salt * 11 + 3) % vocab for i in range(n)]


def top(row):
    idx = np.argsort(-row, kind="stable")[:TOP]
    return [[int(i), float(row[i])] for i in idx]


def run(llm, ids, greedy_steps):
    llm.reset()
    llm.eval(ids)
    n_vocab = llm.n_vocab()
    scores = np.array(llm.scores[: len(ids)], dtype=np.float32).reshape(len(ids), n_vocab)
    rows = [top(r) for r in scores]
    greedy = []
    last = scores[-1]
    for _ in range(greedy_steps):
        t = int(np.argmax(last))
        greedy.append(t)
        llm.eval([t])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    return {"ids": ids, "top": rows, "greedy": greedy}


def load(path, **kw):
    return Llama(
        model_path=path,
        n_ctx=512,
        n_batch=512,
        n_ubatch=512,
        logits_all=True,
        n_threads=1,
        verbose=False,
        **kw,
    )


GGML_TYPE_Q8_0 = 8
KV_Q8_0 = {"flash_attn": True, "type_k": GGML_TYPE_Q8_0, "type_v": GGML_TYPE_Q8_0}


def flash_attn_delta(path, prompts, **kw):
    """The largest |logit| difference over the recorded top-10 entries when llama.cpp runs the
    same prompts with flash attention on (and `kw`)."""
    llm = load(path, flash_attn=True, **kw)
    worst = 0.0
    for p in prompts:
        llm.reset()
        llm.eval(p["ids"])
        rows = np.array(llm.scores[: len(p["ids"])], dtype=np.float32)
        for pos, t in enumerate(p["top"]):
            for i, z in t:
                worst = max(worst, abs(float(rows[pos][i]) - z))
    del llm
    return worst


def rows_of(llm, ids):
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def attn_paths_delta(path, prompts):
    """The largest |logit| difference over the recorded top-10 entries between llama.cpp's f16
    cache with flash attention off and on."""
    off, on = load(path), load(path, flash_attn=True)
    worst = 0.0
    for p in prompts:
        a, b = rows_of(off, p["ids"]), rows_of(on, p["ids"])
        for pos, t in enumerate(p["top"]):
            for i, _ in t:
                worst = max(worst, abs(float(a[pos][i]) - float(b[pos][i])))
    del off, on
    return worst


def main():
    args = sys.argv[1:]
    with_delta = args[:1] == ["--flash-attn-delta"]
    kv_q8 = args[:1] == ["--kv-q8_0"]
    if with_delta or kv_q8:
        args = args[1:]
    out, version, specs = args[0], args[1], args[2:]
    models = []
    for spec in specs:
        path, _, prompts = spec.partition("=")
        llm = load(path, **(KV_Q8_0 if kv_q8 else {}))
        entry = {"file": os.path.basename(path), "sha256": sha256(path), "prompts": []}
        if prompts:
            for text in json.load(open(prompts)):
                ids = llm.tokenize(text.encode(), add_bos=True, special=True)
                r = run(llm, ids, 16)
                r["text"] = text
                entry["prompts"].append(r)
        else:
            for n, salt in [(11, 1), (23, 5)]:
                entry["prompts"].append(run(llm, tiny_prompt(n, salt, llm.n_vocab()), 8))
        del llm
        if with_delta:
            entry["flash_attn_delta"] = flash_attn_delta(path, entry["prompts"])
        if kv_q8:
            entry["kv_cache"] = "q8_0"
            entry["f16_delta"] = flash_attn_delta(path, entry["prompts"])
            entry["attn_paths_delta"] = attn_paths_delta(path, entry["prompts"])
        models.append(entry)
        print(f"model-logits: {path}: {len(entry['prompts'])} prompt(s)", file=sys.stderr)
    doc = {
        "producer": f"llama.cpp (CPU) through llama-cpp-python {version}",
        "logits": "raw logits; `top` holds the ten highest after every prompt position, as [id, logit]",
        "greedy": "argmax continuation after the prompt, EOS not stopped",
        "models": models,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


main()
