#!/usr/bin/env bash
# Peer benchmark: llama.cpp's sampler chain beside nextok's sampler, in one process, on the same
# logits rows.
#
# Installs llama-cpp-python (pinned below) into a virtual environment in the nextok cache with
# pip, which builds llama.cpp's `libllama` shared library from source (CPU, GGML_NATIVE=ON),
# then runs `nextok bench sampler --llama-lib <that libllama>`: nextok's floor, naive baseline
# and sampler, and llama.cpp's chain through its C API (no model needed), round-robin per
# iteration. Every argument is passed to `nextok bench sampler` (e.g. --vocab 128256 --real
# --iters 60 --json).
#
# Not run in CI. See bench/peers/README.md.
set -euo pipefail

# The llama-cpp-python release whose llama.cpp is measured (the declarations nextok uses follow
# its llama.h).
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
PEERS="$NEXTOK_CACHE/peers"
VENV="$PEERS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-venv"

die() { echo "llama_sampler.sh: $*" >&2; exit 1; }
say() { echo "==> $*" >&2; }

case "${1:-}" in
  -h|--help)
    sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo
    echo "Environment: NEXTOK_CACHE_DIR / XDG_CACHE_HOME (cache: <nextok cache>/peers),"
    echo "LLAMA_CPP_PYTHON_VERSION (default $LLAMA_CPP_PYTHON_VERSION), LLAMA_LIB (a libllama to use instead)."
    exit 0 ;;
esac

command -v python3 >/dev/null || die "python3 is needed (pip)"

find_lib() { find "$VENV" -name 'libllama.so' -print 2>/dev/null | head -n 1; }

LIB="${LLAMA_LIB:-}"
if [ -z "$LIB" ]; then
  LIB="$(find_lib)"
  if [ -z "$LIB" ]; then
    . "$REPO/bench/peers/build_tools.sh"
    ensure_build_tools
    mkdir -p "$PEERS"
    [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
    say "pip install llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (builds llama.cpp; this takes a while)"
    LOG="$PEERS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-install.log"
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
      "$VENV/bin/pip" install --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >"$LOG" 2>&1 ||
      { tail -n 40 "$LOG" >&2; die "pip install failed (log: $LOG)"; }
    LIB="$(find_lib)"
    [ -n "$LIB" ] || die "no libllama.so in $VENV after the install (log: $LOG)"
  fi
fi
[ -f "$LIB" ] || die "$LIB: no such file"
say "llama.cpp's sampler from $(basename "$(dirname "$LIB")")/$(basename "$LIB")"

NEXTOK="${NEXTOK:-$REPO/target/release/nextok}"
if [ -z "${NEXTOK_NO_BUILD:-}" ]; then
  (cd "$REPO" && cargo build --release -p nextok-cli >&2)
fi
[ -x "$NEXTOK" ] || die "$NEXTOK: not built"

LOAD="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo unknown)"
NCPU="$(nproc 2>/dev/null || echo 1)"
if [ "$LOAD" != unknown ] && awk -v l="$LOAD" -v n="$NCPU" 'BEGIN { exit !(l > n / 2) }'; then
  echo "llama_sampler.sh: warning: load average $LOAD on $NCPU CPUs: the ratios hold better than the times" >&2
fi

exec "$NEXTOK" bench sampler --llama-lib "$LIB" "$@"
