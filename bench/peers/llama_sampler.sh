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

ME="llama_sampler.sh"
die() { echo "$ME: error: $*" >&2; exit 1; }
say() { echo "$ME: $*" >&2; }
# Any failure not handled below still says where it happened.
set -E
trap 'rc=$?; echo "$ME: error: line $LINENO: exit $rc from: $BASH_COMMAND" >&2; exit $rc' ERR

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
PEERS="$NEXTOK_CACHE/peers"
VENV="$PEERS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-venv"

case "${1:-}" in
  -h|--help)
    sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo
    echo "Environment: NEXTOK_CACHE_DIR / XDG_CACHE_HOME (cache: <nextok cache>/peers),"
    echo "LLAMA_CPP_PYTHON_VERSION (default $LLAMA_CPP_PYTHON_VERSION), LLAMA_LIB (a libllama to use instead),"
    echo "NEXTOK (the nextok binary; default: the release build, built first unless NEXTOK_NO_BUILD is set)."
    exit 0 ;;
esac

command -v python3 >/dev/null || die "python3 is needed (pip)"

# The first libllama.so in the venv, or nothing (also when the venv does not exist yet).
find_lib() {
  [ -d "$VENV" ] || return 0
  find "$VENV" -name 'libllama.so' -print -quit || die "cannot search $VENV for libllama.so"
}

LIB="${LLAMA_LIB:-}"
if [ -n "$LIB" ]; then
  say "LLAMA_LIB: $LIB"
  [ -f "$LIB" ] || die "LLAMA_LIB=$LIB: no such file"
else
  say "looking for libllama.so in $VENV"
  LIB="$(find_lib)"
  if [ -z "$LIB" ]; then
    say "no libllama.so yet: installing llama-cpp-python $LLAMA_CPP_PYTHON_VERSION into $VENV"
    . "$REPO/bench/peers/build_tools.sh"
    ensure_build_tools
    mkdir -p "$PEERS" || die "cannot create $PEERS"
    if [ ! -x "$VENV/bin/pip" ]; then
      say "creating the virtual environment $VENV"
      python3 -m venv "$VENV" ||
        die "python3 -m venv $VENV failed (Debian/Ubuntu: apt-get install python3-venv)"
      [ -x "$VENV/bin/pip" ] || die "python3 -m venv left no $VENV/bin/pip"
    fi
    LOG="$PEERS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-install.log"
    say "pip install llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (builds llama.cpp; this takes a while; log: $LOG)"
    start=$SECONDS
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
      "$VENV/bin/pip" install --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >"$LOG" 2>&1 ||
      { tail -n 40 "$LOG" >&2; die "pip install llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed (log: $LOG)"; }
    say "pip install done in $(( SECONDS - start )) s"
    LIB="$(find_lib)"
    [ -n "$LIB" ] || die "no libllama.so in $VENV after the install (log: $LOG)"
  fi
  [ -f "$LIB" ] || die "$LIB: no such file"
fi
say "llama.cpp's sampler from $LIB"

TARGET_DIR="${CARGO_TARGET_DIR:-target}"
case "$TARGET_DIR" in /*) ;; *) TARGET_DIR="$REPO/$TARGET_DIR" ;; esac
NEXTOK="${NEXTOK:-$TARGET_DIR/release/nextok}"
if [ -z "${NEXTOK_NO_BUILD:-}" ]; then
  command -v cargo >/dev/null || die "cargo is needed to build nextok (or set NEXTOK and NEXTOK_NO_BUILD=1)"
  say "building nextok (cargo build --release -p nextok-cli)"
  (cd "$REPO" && cargo build --release -p nextok-cli >&2) || die "cargo build --release -p nextok-cli failed"
fi
[ -x "$NEXTOK" ] || die "$NEXTOK: not built (set NEXTOK to the nextok binary)"

LOAD="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo unknown)"
NCPU="$(nproc 2>/dev/null || echo 1)"
if [ "$LOAD" != unknown ] && awk -v l="$LOAD" -v n="$NCPU" 'BEGIN { exit !(l > n / 2) }'; then
  say "warning: load average $LOAD on $NCPU CPUs: the ratios hold better than the times"
fi

say "running: $NEXTOK bench sampler --llama-lib $LIB $*"
exec "$NEXTOK" bench sampler --llama-lib "$LIB" "$@"
