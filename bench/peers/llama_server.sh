#!/usr/bin/env bash
# Builds llama.cpp's own OpenAI-compatible server, `llama-server` (CPU, Release, GGML_NATIVE=ON,
# no CURL/SSL), from the llama-cpp-python sdist's vendor/llama.cpp (pinned as in llama_cpp.sh),
# into <nextok cache>/peers/llama.cpp-<version>-server-build, and prints the binary's path.
# A later run with the binary present only prints it. Used by bench/serve.py --llama-server.
# Progress and errors go to standard error; standard output is the path alone.
# Not run in CI.
set -euo pipefail
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"

ME="llama_server.sh"
die() { echo "$ME: error: $*" >&2; exit 1; }
say() { echo "$ME: $*" >&2; }
# Any failure not handled below still says where it happened.
set -E
trap 'rc=$?; echo "$ME: error: line $LINENO: exit $rc from: $BASH_COMMAND" >&2; exit $rc' ERR

case "${1:-}" in
  "") ;;
  -h|--help)
    sed -n '2,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo
    echo "Environment: NEXTOK_CACHE_DIR / XDG_CACHE_HOME (cache: <nextok cache>/peers),"
    echo "LLAMA_CPP_PYTHON_VERSION (default $LLAMA_CPP_PYTHON_VERSION)."
    exit 0 ;;
  *) die "unknown argument: $1 (it takes none; see --help)" ;;
esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
PEERS="$NEXTOK_CACHE/peers"
SRC="$PEERS/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
BUILD="$PEERS/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-server-build"
BIN="$BUILD/bin/llama-server"

if [ -x "$BIN" ]; then
  say "llama-server present in the cache"
  echo "$BIN"
  exit 0
fi
say "no llama-server in $BUILD yet: building it"
command -v python3 >/dev/null || die "python3 is needed (pip download)"
. "$REPO/bench/peers/build_tools.sh"
ensure_build_tools
ensure_llama_src "$PEERS" "$LLAMA_CPP_PYTHON_VERSION"
LOG="$PEERS/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-server-build.log"
say "building llama-server of llama-cpp-python $LLAMA_CPP_PYTHON_VERSION's llama.cpp; this takes a while (log: $LOG)"
start=$SECONDS
{
  cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON &&
  cmake --build "$BUILD" --config Release --target llama-server -j 2
} >"$LOG" 2>&1 || { tail -n 40 "$LOG" >&2; die "build failed (log: $LOG)"; }
[ -x "$BIN" ] || die "the build left no $BIN (log: $LOG)"
say "built in $(( SECONDS - start )) s"
echo "$BIN"
