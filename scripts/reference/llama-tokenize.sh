#!/usr/bin/env bash
# Writes testdata/reference/llama-tokenize.json: the token ids llama.cpp's `llama-tokenize`
# gives for each text of testdata/reference/tokenize-texts.json on each GGUF vocabulary below,
# with special tokens parsed (the tool's default), once with the model's BOS/EOS (the tool's
# default) and once with `--no-bos`. crates/vocab/tests/llama_cpp_ids.rs compares nextok's
# encoder against the committed file; the tests never build llama.cpp.
#
# llama.cpp's source comes from the llama-cpp-python sdist (pinned below; its vendor/llama.cpp),
# downloaded with pip and built with cmake (CPU only, llama-tokenize only) into the nextok cache
# (<cache>/peers, shared with bench/peers/). The GGUF files come from scripts/fetch-testdata.sh,
# which this script runs first. Needs python3, cmake and a C++ compiler (installed with apt-get
# when missing, as bench/peers/ does). Not run in CI.
#
#   scripts/reference/llama-tokenize.sh [-j JOBS]
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS=2

ME="llama-tokenize.sh"
die() { echo "$ME: error: $*" >&2; exit 1; }
say() { echo "$ME: $*" >&2; }
set -E
trap 'rc=$?; echo "$ME: error: line $LINENO: exit $rc from: $BASH_COMMAND" >&2; exit $rc' ERR

while [ $# -gt 0 ]; do
  case "$1" in
    -j) [ $# -ge 2 ] || die "-j needs a value"; JOBS="$2"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
[[ "$JOBS" =~ ^[1-9][0-9]*$ ]] || die "-j must be a positive integer"

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${NEXTOK_TESTDATA:-$REPO/.testdata}"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
PEERS="$NEXTOK_CACHE/peers"
OUT="$REPO/testdata/reference/llama-tokenize.json"
TEXTS="$REPO/testdata/reference/tokenize-texts.json"

# The GGUF files, relative to the test-data directory.
FILES=(
  llama-vocab/ggml-vocab-llama-spm.gguf
  llama-vocab/ggml-vocab-phi-3.gguf
  llama-vocab/ggml-vocab-llama-bpe.gguf
  llama-vocab/ggml-vocab-qwen2.gguf
  llama-vocab/ggml-vocab-qwen35.gguf
  llama-vocab/ggml-vocab-gpt-2.gguf
  llama-vocab/ggml-vocab-starcoder.gguf
  llama-vocab/ggml-vocab-command-r.gguf
  gemma3/gemma-3-270m-q4_k_m.gguf
  smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
)

command -v python3 >/dev/null || die "python3 is needed"
say "fetching the test data (scripts/fetch-testdata.sh)"
NEXTOK_TESTDATA="$DEST" bash "$REPO/scripts/fetch-testdata.sh" >&2

. "$REPO/bench/peers/build_tools.sh"
ensure_build_tools
ensure_llama_src "$PEERS" "$LLAMA_CPP_PYTHON_VERSION"
SRC="$PEERS/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
LLAMA_SRC="$SRC/vendor/llama.cpp"

# The sdist has no git history: llama.cpp's commit is in the release's changelog entry.
LLAMA_COMMIT="$(awk -v v="## [$LLAMA_CPP_PYTHON_VERSION]" '
  index($0, v) == 1 { on = 1; next }
  on && /^## \[/ { exit }
  on && match($0, /llama\.cpp@[0-9a-f]+/) { print substr($0, RSTART + 10, RLENGTH - 10); exit }
' "$SRC/CHANGELOG.md" 2>/dev/null || true)"
[ -n "$LLAMA_COMMIT" ] || LLAMA_COMMIT="unknown"

BUILD="$PEERS/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-tokenize-build"
BIN="$BUILD/bin/llama-tokenize"
if [ -x "$BIN" ]; then
  say "llama-tokenize present: $BIN"
else
  say "building llama-tokenize of llama.cpp $LLAMA_COMMIT into $BUILD (log: $BUILD.log)"
  nice -n 10 cmake -S "$LLAMA_SRC" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_OPENSSL=OFF >"$BUILD.log" 2>&1 ||
    die "cmake configure failed (see $BUILD.log)"
  nice -n 10 cmake --build "$BUILD" --target llama-tokenize -j "$JOBS" >>"$BUILD.log" 2>&1 ||
    die "cmake build failed (see $BUILD.log)"
  [ -x "$BIN" ] || die "the build left no $BIN"
fi

say "tokenizing $(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$TEXTS") texts on ${#FILES[@]} files"
python3 - "$BIN" "$DEST" "$TEXTS" "$OUT" "$LLAMA_CPP_PYTHON_VERSION" "$LLAMA_COMMIT" "${FILES[@]}" <<'PY'
import hashlib, json, os, subprocess, sys, tempfile

binary, dest, texts_path, out, pyver, commit = sys.argv[1:7]
files = sys.argv[7:]
texts = json.load(open(texts_path, encoding="utf-8"))

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

def tokenize(model, text_file, no_bos):
    cmd = [binary, "-m", model, "-f", text_file, "--ids", "--no-escape", "--log-disable"]
    if no_bos:
        cmd.append("--no-bos")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"llama-tokenize.sh: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    line = [l for l in p.stdout.splitlines() if l.startswith("[")]
    if len(line) != 1:
        sys.exit(f"llama-tokenize.sh: unexpected output of {' '.join(cmd)}:\n{p.stdout}")
    return json.loads(line[0])

result = {
    "about": "Token ids printed by llama.cpp's llama-tokenize (special tokens parsed) for "
             "testdata/reference/tokenize-texts.json; made by scripts/reference/llama-tokenize.sh",
    "llama_cpp_python": pyver,
    "llama_cpp_commit": commit,
    "texts_sha256": sha256(texts_path),
    "files": {},
}
with tempfile.TemporaryDirectory() as tmp:
    text_files = []
    for i, t in enumerate(texts):
        p = os.path.join(tmp, f"{i}.txt")
        with open(p, "wb") as f:
            f.write(t.encode("utf-8"))
        text_files.append(p)
    for rel in files:
        model = os.path.join(dest, rel)
        print(f"llama-tokenize.sh: {rel}", file=sys.stderr)
        result["files"][rel] = {
            "sha256": sha256(model),
            "with_special": [tokenize(model, p, False) for p in text_files],
            "without_special": [tokenize(model, p, True) for p in text_files],
        }

with open(out, "w", encoding="utf-8") as f:
    f.write("{\n")
    keys = [k for k in result if k != "files"]
    for k in keys:
        f.write(f"  {json.dumps(k)}: {json.dumps(result[k], ensure_ascii=False)},\n")
    f.write('  "files": {\n')
    for j, (rel, v) in enumerate(result["files"].items()):
        f.write(f"    {json.dumps(rel)}: {{\n      \"sha256\": {json.dumps(v['sha256'])},\n")
        for name in ("with_special", "without_special"):
            rows = ",\n        ".join(json.dumps(r) for r in v[name])
            end = "," if name == "with_special" else ""
            f.write(f"      \"{name}\": [\n        {rows}\n      ]{end}\n")
        f.write("    }" + ("," if j + 1 < len(result["files"]) else "") + "\n")
    f.write("  }\n}\n")
print(f"llama-tokenize.sh: wrote {out}", file=sys.stderr)
PY
