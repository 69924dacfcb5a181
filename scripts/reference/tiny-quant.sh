#!/usr/bin/env bash
# Writes the quantised tiny models and llama.cpp's reference on them:
#
# * testdata/tiny-quant/<family>-<type>.gguf — the tiny seeded F32 model of every family
#   (llama, qwen2, qwen3, gemma3, phi3; written by `cargo run -p nextok-model --example
#   tiny_models`) quantised by llama.cpp's own `llama-quantize` to Q8_0, Q4_0, Q5_1, Q4_1, Q5_0,
#   F16 and BF16, with its default choice per tensor (norms stay F32; the output matrix gets
#   Q8_0, as its rows of 64 are too short for the Q6_K it would pick);
# * testdata/tiny-quant/<family>-e256-<type>.gguf — one-layer models of every family whose rows
#   hold 256 values (`tiny_models --wide`), quantised to Q4_K_M and Q5_K_M (Q4_K, Q5_K and
#   Q6_K matrices, llama-quantize's mixes);
# * testdata/reference/families-quant.llamacpp.json — what llama.cpp computed on those files
#   (scripts/reference/model-logits.py, as for families.llamacpp.json): the ten highest raw
#   logits after every position of two prompts and an 8-token greedy continuation, per file,
#   identified by SHA-256, and how far llama.cpp's own logits move with flash attention on
#   (`flash_attn_delta`).
#
# llama-quantize is built from the llama-cpp-python sdist (pinned below) into the nextok cache
# (<cache>/peers, the build bench/peers/llama_cpp.sh makes) when absent; llama.cpp runs through
# llama-cpp-python in the virtual environment scripts/reference/model-logits.sh uses. Not run
# in CI: crates/model/tests/llama_cpp_logits.rs compares against the committed files.
#
#   scripts/reference/tiny-quant.sh
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
TYPES=(Q8_0 Q4_0 Q5_1 Q4_1 Q5_0 F16 BF16)
TYPES_WIDE=(Q4_K_M Q5_K_M)
ME="tiny-quant.sh"
die() { echo "$ME: error: $*" >&2; exit 1; }
say() { echo "$ME: $*" >&2; }
set -E
trap 'rc=$?; echo "$ME: error: line $LINENO: exit $rc from: $BASH_COMMAND" >&2; exit $rc' ERR

case "${1:-}" in
  -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "unknown argument: $1 (see --help)" ;;
esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
PEERS="$NEXTOK_CACHE/peers"
VENV="$PEERS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-venv"
OUT_DIR="$REPO/testdata/tiny-quant"
OUT_JSON="$REPO/testdata/reference/families-quant.llamacpp.json"

command -v python3 >/dev/null || die "python3 is needed"
command -v cargo >/dev/null || die "cargo is needed (to write the tiny models)"

# ---------------------------------------------------------------------------------------------
# llama-cpp-python (as model-logits.sh installs it)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import llama_cpp, numpy" 2>/dev/null; then
  say "installing llama-cpp-python $LLAMA_CPP_PYTHON_VERSION into $VENV (builds llama.cpp from source; this takes a while)"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check numpy \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2 || die "pip install llama-cpp-python failed"
fi

# ---------------------------------------------------------------------------------------------
# llama-quantize (in the build bench/peers/llama_cpp.sh makes, with its options)
BUILD="$PEERS/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-build"
QUANTIZE="$BUILD/bin/llama-quantize"
if [ -x "$QUANTIZE" ]; then
  say "llama-quantize present: $QUANTIZE"
else
  say "building llama.cpp's tools (bench/peers/llama_cpp.sh --build-only)"
  LLAMA_CPP_PYTHON_VERSION="$LLAMA_CPP_PYTHON_VERSION" bash "$REPO/bench/peers/llama_cpp.sh" --build-only >&2
  [ -x "$QUANTIZE" ] || die "the build left no $QUANTIZE"
fi

# ---------------------------------------------------------------------------------------------
# The tiny F32 models, quantised
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
say "writing the tiny models"
(cd "$REPO" && nice -n 10 cargo run --quiet -p nextok-model --example tiny_models -- "$TMP/f32") >"$TMP/list"
mapfile -t TINY <"$TMP/list"
[ "${#TINY[@]}" -gt 0 ] || die "no tiny model was written"
(cd "$REPO" && nice -n 10 cargo run --quiet -p nextok-model --example tiny_models -- "$TMP/wide" --wide) >"$TMP/list-wide"
mapfile -t WIDE <"$TMP/list-wide"
[ "${#WIDE[@]}" -gt 0 ] || die "no wide tiny model was written"

mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/*.gguf
QUANT=()
for model in "${TINY[@]}" "${WIDE[@]}"; do
  # tiny-<family>-<layers>l-w<window>[-fused][-e256].gguf
  base="$(basename "$model" .gguf)"
  family="${base#tiny-}"
  family="${family%%-*}"
  types=("${TYPES[@]}")
  if [[ "$base" == *-e256 ]]; then
    family="$family-e256"
    types=("${TYPES_WIDE[@]}")
  fi
  for type in "${types[@]}"; do
    out="$OUT_DIR/$family-${type,,}.gguf"
    log="$TMP/$family-$type.log"
    nice -n 10 "$QUANTIZE" "$model" "$out.part" "$type" 1 >"$log" 2>&1 ||
      { tail -n 30 "$log" >&2; die "llama-quantize $type failed on $model"; }
    mv "$out.part" "$out"
    # the type of every tensor written, counted from llama-quantize's log ("9 q4_0, 5 f32, ...")
    kinds="$(awk '/^\[ *[0-9]+\/ *[0-9]+\]/ {
      if (match($0, /converting to [A-Za-z0-9_]+/)) t = substr($0, RSTART + 14, RLENGTH - 14)
      else if (match($0, /type = *[A-Za-z0-9_]+/)) { t = substr($0, RSTART, RLENGTH); sub(/type = */, "", t) }
      else next
      n[t]++
    } END { for (t in n) s = s (s ? ", " : "") n[t] " " t; print s }' "$log")"
    say "$(basename "$out"): $(stat -c %s "$out") bytes; tensors: $kinds"
    QUANT+=("$out")
  done
done
say "testdata/tiny-quant: ${#QUANT[@]} files, $(du -cb "${QUANT[@]}" | tail -n 1 | cut -f1) bytes"

say "running llama.cpp on ${#QUANT[@]} quantised tiny models"
"$VENV/bin/python" "$REPO/scripts/reference/model-logits.py" --flash-attn-delta \
  "$OUT_JSON" "$LLAMA_CPP_PYTHON_VERSION" "${QUANT[@]}"
say "wrote testdata/tiny-quant/ and testdata/reference/families-quant.llamacpp.json"
