#!/usr/bin/env bash
# Writes the llama.cpp references for the model families:
#
# * testdata/reference/families.llamacpp.json — the tiny seeded model of every family
#   (llama, qwen2, qwen3, gemma3, phi3; written by `cargo run -p nextok-model --example
#   tiny_models`, the same files crates/model/tests/families.rs builds, identified by SHA-256):
#   the ten highest raw logits after every position of two prompts and an 8-token greedy
#   continuation;
# * testdata/reference/families-vocab.llamacpp.json — the same tiny models carrying their
#   families' real tokenizers (`tiny_models --real-vocab`: Llama 3, Qwen 2, Gemma 3, Phi-3 from
#   the test data): the texts of testdata/reference/tiny-vocab-prompts.json tokenized by
#   llama.cpp, the ten highest raw logits after every position, a 16-token greedy continuation;
# * testdata/reference/gemma-3-270m.llamacpp.json — the real Gemma 3 270M Q4_K_M file
#   (scripts/fetch-testdata.sh): the prompts of testdata/reference/gemma-prompts.json tokenized
#   by llama.cpp, the ten highest raw logits after every position, a 16-token greedy continuation;
# * with --large, testdata/reference/qwen2.5-coder.llamacpp.json — the real Qwen2.5-Coder 0.5B
#   and 1.5B Instruct Q4_K_M files (`scripts/fetch-testdata.sh --large`): the prompts of
#   testdata/reference/qwen-prompts.json the same way, and how far llama.cpp's own logits move
#   between its two attention paths (`flash_attn_delta`, the bound the tests allow).
#
# llama.cpp runs through llama-cpp-python (pinned below), built from source by pip into a
# virtual environment in the nextok cache (<cache>/peers, the one bench/peers/llama_sampler.sh
# uses). Not run in CI: the tests compare against the committed files.
#
#   scripts/reference/model-logits.sh [--large]
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ME="model-logits.sh"
die() { echo "$ME: error: $*" >&2; exit 1; }
say() { echo "$ME: $*" >&2; }
set -E
trap 'rc=$?; echo "$ME: error: line $LINENO: exit $rc from: $BASH_COMMAND" >&2; exit $rc' ERR

LARGE=0
case "${1:-}" in
  -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --large) LARGE=1 ;;
  "") ;;
  *) die "unknown argument: $1 (see --help)" ;;
esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${NEXTOK_TESTDATA:-$REPO/.testdata}"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
VENV="$NEXTOK_CACHE/peers/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-venv"

command -v python3 >/dev/null || die "python3 is needed"
command -v cargo >/dev/null || die "cargo is needed (to write the tiny models)"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  say "installing llama-cpp-python $LLAMA_CPP_PYTHON_VERSION into $VENV (builds llama.cpp from source; this takes a while)"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check numpy \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2 || die "pip install llama-cpp-python failed"
fi

say "fetching the test data (scripts/fetch-testdata.sh)"
if [ "$LARGE" = 1 ]; then
  NEXTOK_TESTDATA="$DEST" bash "$REPO/scripts/fetch-testdata.sh" --large >&2
else
  NEXTOK_TESTDATA="$DEST" bash "$REPO/scripts/fetch-testdata.sh" >&2
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
say "writing the tiny models"
(cd "$REPO" && cargo run --quiet -p nextok-model --example tiny_models -- "$TMP") >"$TMP/list"
mapfile -t TINY <"$TMP/list"
[ "${#TINY[@]}" -gt 0 ] || die "no tiny model was written"

say "running llama.cpp on ${#TINY[@]} tiny models"
"$VENV/bin/python" "$REPO/scripts/reference/model-logits.py" \
  "$REPO/testdata/reference/families.llamacpp.json" "$LLAMA_CPP_PYTHON_VERSION" "${TINY[@]}"
say "writing the tiny models with their real tokenizers"
(cd "$REPO" && cargo run --quiet -p nextok-model --example tiny_models -- "$TMP/vocab" --real-vocab) >"$TMP/list-vocab"
mapfile -t TINY_VOCAB <"$TMP/list-vocab"
[ "${#TINY_VOCAB[@]}" -gt 0 ] || die "no tiny model with a real tokenizer was written"
PROMPTS="$REPO/testdata/reference/tiny-vocab-prompts.json"
say "running llama.cpp on ${#TINY_VOCAB[@]} tiny models with real tokenizers"
"$VENV/bin/python" "$REPO/scripts/reference/model-logits.py" \
  "$REPO/testdata/reference/families-vocab.llamacpp.json" "$LLAMA_CPP_PYTHON_VERSION" \
  "${TINY_VOCAB[@]/%/=$PROMPTS}"
say "running llama.cpp on Gemma 3 270M"
"$VENV/bin/python" "$REPO/scripts/reference/model-logits.py" \
  "$REPO/testdata/reference/gemma-3-270m.llamacpp.json" "$LLAMA_CPP_PYTHON_VERSION" \
  "$DEST/gemma3/gemma-3-270m-q4_k_m.gguf=$REPO/testdata/reference/gemma-prompts.json"
say "running llama.cpp with a q8_0 KV cache on SmolLM2 and Gemma 3 270M"
"$VENV/bin/python" "$REPO/scripts/reference/model-logits.py" --kv-q8_0 \
  "$REPO/testdata/reference/kv-q8_0.llamacpp.json" "$LLAMA_CPP_PYTHON_VERSION" \
  "$DEST/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf=$REPO/testdata/reference/gemma-prompts.json" \
  "$DEST/gemma3/gemma-3-270m-q4_k_m.gguf=$REPO/testdata/reference/gemma-prompts.json"
if [ "$LARGE" = 1 ]; then
  say "running llama.cpp on Qwen2.5-Coder 0.5B and 1.5B"
  QWEN="$DEST/qwen2.5-coder"
  "$VENV/bin/python" "$REPO/scripts/reference/model-logits.py" --flash-attn-delta \
    "$REPO/testdata/reference/qwen2.5-coder.llamacpp.json" "$LLAMA_CPP_PYTHON_VERSION" \
    "$QWEN/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf=$REPO/testdata/reference/qwen-prompts.json" \
    "$QWEN/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf=$REPO/testdata/reference/qwen-prompts.json"
  say "wrote testdata/reference/qwen2.5-coder.llamacpp.json"
fi
say "wrote testdata/reference/families.llamacpp.json, families-vocab.llamacpp.json, gemma-3-270m.llamacpp.json and kv-q8_0.llamacpp.json"
