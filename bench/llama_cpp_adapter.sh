#!/usr/bin/env bash
# The llama-cpp-python adapter end to end: llama-cpp-python (pinned below) built from source
# by pip into a virtual environment in the nextok cache (the one bench/peers/llama_sampler.sh
# uses), the nextok package built from this checkout and installed beside it, then the
# adapter's real-host tests (`pytest -m llama_cpp crates/python/tests/test_hosts.py`) on the
# default model of the test data (scripts/fetch-testdata.sh), and a short comparison of a
# completion's time with and without nextok's processor.
#
#   bash bench/llama_cpp_adapter.sh
#
# Not run in CI (the build of llama.cpp takes many minutes).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ME="llama_cpp_adapter.sh"
die() { echo "$ME: error: $*" >&2; exit 1; }
say() { echo "$ME: $*" >&2; }
set -E
trap 'rc=$?; echo "$ME: error: line $LINENO: exit $rc from: $BASH_COMMAND" >&2; exit $rc' ERR

case "${1:-}" in
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) die "unknown argument: $1 (see --help)" ;;
esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
PEERS="$NEXTOK_CACHE/peers"
VENV="$PEERS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-venv"

command -v python3 >/dev/null || die "python3 is needed"
command -v cargo >/dev/null || die "cargo is needed (the nextok package is built from source)"

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  . "$REPO/bench/peers/build_tools.sh"
  ensure_build_tools
  mkdir -p "$PEERS"
  [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
  LOG="$PEERS/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-install.log"
  say "pip install llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (builds llama.cpp; this takes a while; log: $LOG)"
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 2)" \
    "$VENV/bin/pip" install --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >"$LOG" 2>&1 ||
    { tail -n 40 "$LOG" >&2; die "pip install llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION failed (log: $LOG)"; }
fi

say "installing the nextok package from $REPO/crates/python into $VENV (release build)"
"$VENV/bin/pip" install --quiet --disable-pip-version-check "maturin==1.16.0" "numpy==2.4.6" "pytest==9.2.0"
PATH="$VENV/bin:$PATH" "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation \
  --force-reinstall --no-deps "$REPO/crates/python"

say "fetching the test data (scripts/fetch-testdata.sh)"
bash "$REPO/scripts/fetch-testdata.sh" >&2

say "the adapter's tests on llama-cpp-python $LLAMA_CPP_PYTHON_VERSION"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider -m llama_cpp \
  "$REPO/crates/python/tests/test_hosts.py")

say "a completion with and without nextok's processor (CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
NEXTOK_TESTDATA="${NEXTOK_TESTDATA:-$REPO/.testdata}" "$VENV/bin/python" - <<'PY'
import os, statistics, time
import llama_cpp
from nextok.integrations.llama_cpp import NextokLogitsProcessor

path = os.path.join(os.environ["NEXTOK_TESTDATA"], "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
llm = llama_cpp.Llama(path, n_ctx=512, n_threads=2, verbose=False)
prompt, n = "Once upon a time", 64

def run(with_nextok: bool) -> float:
    kw = {}
    if with_nextok:
        proc = NextokLogitsProcessor.for_llama(llm, "llama.cpp", temperature=0.8, top_p=0.95, seed=1, ignore_eos=True)
        kw["logits_processor"] = llama_cpp.LogitsProcessorList([proc])
    t = time.perf_counter()
    out = llm.create_completion(prompt, max_tokens=n, temperature=0.8, seed=1, **kw)
    dt = time.perf_counter() - t
    return dt / max(1, out["usage"]["completion_tokens"])

times = {False: [], True: []}
for i in range(6):  # alternating, so both see the same machine
    for w in (False, True):
        times[w].append(run(w))
a, b = statistics.median(times[False]), statistics.median(times[True])
print(f"per token: llama.cpp's sampler {a * 1e3:.2f} ms, with nextok's processor {b * 1e3:.2f} ms "
      f"({b / a:.2f}x; V = {llm.n_vocab()})")
PY
