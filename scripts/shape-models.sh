#!/usr/bin/env bash
# Writes GGUF files with the exact hyper-parameters and tensor shapes of the sizes no package
# ships — Llama 3.2 1B and 3B, Llama 3.1 8B, Qwen3 4B — with their families' real tokenizers and
# seeded random weights, quantised by llama.cpp's own `llama-quantize` (Q4_K_M and Q8_0 unless
# --types says otherwise), into <cache>/shapes/. For speed and memory measurements only (`nextok
# bench engine --model <file> --llama-cpp`), never for correctness claims: the weights are noise.
#
#   scripts/shape-models.sh [--types q4_k_m,q8_0] [SHAPE...]     (default: every shape)
#   shapes: llama3.2-1b llama3.2-3b llama3.1-8b qwen3-4b
#
# Each shape is written in F16 first (crates/model/examples/shape_models.rs; 2.5 GB for 1B,
# 16 GB for 8B), quantised, and the F16 file deleted. A file already present is kept. llama.cpp's
# tools are built by bench/peers/llama_cpp.sh when absent. Never run in CI; nothing is committed.
set -euo pipefail

ME="shape-models.sh"
die() { echo "$ME: error: $*" >&2; exit 1; }
say() { echo "$ME: $*" >&2; }
set -E
trap 'rc=$?; echo "$ME: error: line $LINENO: exit $rc from: $BASH_COMMAND" >&2; exit $rc' ERR

ALL=(llama3.2-1b llama3.2-3b llama3.1-8b qwen3-4b)
TYPES="q4_k_m,q8_0"
SHAPES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --types) [ $# -ge 2 ] || die "--types needs a value"; TYPES="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) SHAPES+=("$1"); shift ;;
  esac
done
[ "${#SHAPES[@]}" -gt 0 ] || SHAPES=("${ALL[@]}")
for s in "${SHAPES[@]}"; do
  [[ " ${ALL[*]} " == *" $s "* ]] || die "unknown shape: $s (shapes: ${ALL[*]})"
done
IFS=, read -r -a QTYPES <<<"$TYPES"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
DEST="$NEXTOK_CACHE/shapes"
mkdir -p "$DEST"

# the shapes carry the tokenizers of llama.cpp's vocabulary files (test data)
bash "$REPO/scripts/fetch-testdata.sh" >&2
BIN="$(bash "$REPO/bench/peers/llama_cpp.sh" --print-bin-dir)"
[ -x "$BIN/llama-quantize" ] || die "llama-quantize was not built in $BIN"
(cd "$REPO" && cargo build --quiet --release -p nextok-model --example shape_models)
WRITER="$REPO/target/release/examples/shape_models"

# parameters of each shape in hundreds of millions, and bytes a parameter takes in tenths: the
# disk an F16 copy and the outputs need
declare -A PARAMS=([llama3.2-1b]=13 [llama3.2-3b]=33 [llama3.1-8b]=81 [qwen3-4b]=41)
tenths() { case "$1" in f16) echo 20 ;; q4_k_m|q4_k_s|q4_0|q4_1) echo 6 ;; q5_k_m|q5_k_s|q5_0|q5_1) echo 7 ;; *) echo 11 ;; esac; }

for s in "${SHAPES[@]}"; do
  missing=()
  for q in "${QTYPES[@]}"; do
    [ -f "$DEST/$s-$q.gguf" ] || missing+=("$q")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    say "$s: present"
    continue
  fi
  per=$(tenths f16)
  for q in "${missing[@]}"; do per=$(( per + $(tenths "$q") )); done
  need_gb=$(( (PARAMS[$s] * per + 99) / 100 ))
  free_gb=$(( $(df -Pk "$DEST" | awk 'NR==2 {print $4}') / 1024 / 1024 ))
  if [ "$free_gb" -lt "$need_gb" ]; then
    say "$s: skipped: about $need_gb GB of disk needed in $DEST, $free_gb GB free"
    continue
  fi
  say "$s: writing the F16 file"
  f16="$("$WRITER" "$DEST" "$s")"
  for q in "${missing[@]}"; do
    say "$s: llama-quantize to ${q^^}"
    "$BIN/llama-quantize" "$f16" "$DEST/$s-$q.gguf.part" "${q^^}" "$(nproc)" >"$DEST/$s-$q.log" 2>&1 \
      || die "llama-quantize failed (log: $DEST/$s-$q.log)"
    mv "$DEST/$s-$q.gguf.part" "$DEST/$s-$q.gguf"
  done
  rm -f "$f16"
done
for s in "${SHAPES[@]}"; do
  for q in "${QTYPES[@]}"; do
    if [ -f "$DEST/$s-$q.gguf" ]; then echo "$DEST/$s-$q.gguf"; fi
  done
done
