#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60): `scripts/fuzz.sh [seconds] [target...]`.
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Seed corpora are built
# from testdata/ into fuzz/corpus/ (git-ignored); crashes land in fuzz/artifacts/<target>/.
# A crash found here becomes a regression test in the normal test suite (CI runs those, not the
# campaign).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(explain_request pipeline_json gbnf_to_lark json_schema tokenizer_json gguf_metadata gguf_model trace_header http_request)
fi

# seed corpora from the repository's test data
python3 - <<'PY'
import json, os, glob, hashlib
root = "fuzz/corpus"
def put(target, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
for f in glob.glob("testdata/vectors/*.json"):
    for case in json.load(open(f)).get("cases", []):
        if "request" in case:
            put("explain_request", json.dumps(case["request"]))
            spec = case["request"].get("params", {}).get("constraint")
            if isinstance(spec, dict) and spec.get("type") == "json_schema":
                put("json_schema", json.dumps(spec["schema"]))
            if isinstance(spec, dict) and spec.get("type") == "gbnf":
                put("gbnf_to_lark", spec["gbnf"])
for f in glob.glob("testdata/golden/pipeline_*.json"):
    put("pipeline_json", open(f).read())
for f in glob.glob("testdata/constraint/json_schema/**/*.json", recursive=True):
    try:
        doc = json.load(open(f))
    except Exception:
        continue
    groups = doc if isinstance(doc, list) else [doc]
    for g in groups:
        if isinstance(g, dict) and "schema" in g:
            put("json_schema", json.dumps(g["schema"]))
        elif isinstance(g, dict):
            put("json_schema", json.dumps(g))
for f in glob.glob("examples/*.schema.json"):
    put("json_schema", open(f).read())
for f in glob.glob("examples/*.gbnf"):
    put("gbnf_to_lark", open(f).read())
for g in ['root ::= "a" | "b" ( "c" [0-9]* )+\n', 'root ::= x{2,5}\nx ::= [^"\\\\] | "\\\\" .\n',
          'root ::= "{" ws "\\"k\\"" ws ":" ws [0-9]+ ws "}"\nws ::= [ \\t\\n]*\n']:
    put("gbnf_to_lark", g)
for f in glob.glob("testdata/golden/*.jsonl"):
    lines = open(f).read().splitlines()
    header = {"nextok_trace": 1, "model_file": "m.gguf", "model_sha256": "00", "requant": "keep",
              "prompt_ids": [1, 2], "params": {"temperature": 0.8, "max_tokens": 4, "seed": 3},
              "pipeline_source": "reference",
              "pipeline": json.load(open("testdata/golden/pipeline_reference.json")),
              "pipeline_hash": "sha256:00", "stop": {"stop_token_ids": [], "max_tokens": 4},
              "seeds": [3], "candidates": 8}
    put("trace_header", "\n".join([json.dumps(header)] + lines) + "\n")
tok = {"version": "1.0", "added_tokens": [{"id": 3, "content": "</s>", "special": True,
       "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}],
       "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
       "trim_offsets": True, "use_regex": True}, "post_processor": None,
       "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
       "use_regex": True},
       "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}
put("tokenizer_json", json.dumps(tok))
for f in glob.glob(".testdata/*/tokenizer.json"):
    data = open(f, "rb").read()
    if len(data) < 1 << 20:
        put("tokenizer_json", data)
for body in [
    {"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
     "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "n": 2, "stop": ["\n"], "seed": 1,
     "logprobs": True, "top_logprobs": 3, "stream": True, "stream_options": {"include_usage": True}},
    {"prompt": "Say", "max_tokens": 4, "logprobs": 2, "logit_bias": {"7": -100}, "top_k": 40,
     "min_p": 0.05, "repetition_penalty": 1.1, "stop_token_ids": [2], "ignore_eos": False},
    {"prompt": [1, 2, 3], "response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "strict": True, "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}},
    {"messages": [{"role": "user", "content": "x"}], "structured_outputs": {"choice": ["yes", "no"]}},
    {"prompt": "x", "guided_regex": "[a-z]+", "nextok": {"pipeline": "vllm", "logprob_layer": "raw",
     "trace": True, "speculative": "ngram:4", "spec_acceptance": "rejection"}},
    {"prompt": "x", "nextok_pipeline": {"format_version": 1, "processors": [], "selector": {"type": "greedy"}}},
]:
    put("http_request", json.dumps(body))
for f in glob.glob(".testdata/*/*.gguf"):
    put("gguf_metadata", open(f, "rb").read(1 << 16))
# whole small model files of every family and format (llama.cpp quantised them)
for f in glob.glob("testdata/tiny-quant/*.gguf"):
    put("gguf_model", open(f, "rb").read())
PY
# and the Gemma 3 model with the optional keys llama.cpp reads (layer pattern, local rotary
# base, logit soft-cap)
seeds="$(mktemp -d)"
cargo run --quiet --release -p nextok-model --example tiny_models -- "$seeds" --keys >/dev/null
mkdir -p fuzz/corpus/gguf_model
cp "$seeds"/*.gguf fuzz/corpus/gguf_model/
rm -rf "$seeds"

for t in "${targets[@]}"; do
  echo "== $t ($secs s)"
  max_len=65536
  # whole model files: the tiny models are up to 666 KB
  [ "$t" = gguf_model ] && max_len=700000
  cargo +nightly fuzz run -O --fuzz-dir fuzz "$t" "fuzz/corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=4096 -timeout=20 -max_len="$max_len" 2>&1 \
    | grep -E "^#[0-9]+ +DONE|stat::number_of_executed_units|ERROR|SUMMARY|panicked|Done [0-9]+ runs" || true
done
