#!/usr/bin/env bash
# Builds llama.cpp's own OpenAI-compatible server, `llama-server` (CPU, Release, GGML_NATIVE=ON,
# no CURL/SSL), from the llama-cpp-python sdist's vendor/llama.cpp (pinned as in llama_cpp.sh),
# into <nextok cache>/peers/llama.cpp-<version>-server-build, and prints the binary's path.
# A later run with the binary present only prints it. Used by bench/serve.py --llama-server.
# Not run in CI.
set -euo pipefail
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
PEERS="$NEXTOK_CACHE/peers"
SRC="$PEERS/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
BUILD="$PEERS/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-server-build"
BIN="$BUILD/bin/llama-server"
die() { echo "llama_server.sh: $*" >&2; exit 1; }
say() { echo "==> $*" >&2; }

if [ -x "$BIN" ]; then
  echo "$BIN"
  exit 0
fi
command -v cmake >/dev/null || die "cmake is needed (apt-get install cmake build-essential)"
command -v c++ >/dev/null || die "a C++ compiler is needed (apt-get install build-essential)"
mkdir -p "$PEERS"
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
  SDIST="$PEERS/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  if [ ! -f "$SDIST" ]; then
    say "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist"
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$PEERS"
  fi
  [ -f "$SDIST" ] || die "pip download left no $SDIST"
  rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
  tar -xzf "$SDIST" -C "$SRC.tmp"
  rm -rf "$SRC" && mv "$SRC.tmp/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION" "$SRC" && rm -rf "$SRC.tmp"
fi
LOG="$PEERS/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-server-build.log"
say "building llama-server (log: $LOG); this takes a while"
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
echo "$BIN"
