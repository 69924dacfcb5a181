#!/usr/bin/env bash
# Peer benchmark: llama.cpp on the same GGUF file that nextok runs, on the CPU.
#
# Gets llama.cpp's source from the llama-cpp-python sdist (pinned below; its vendor/llama.cpp is
# llama.cpp's source), builds llama-bench, llama-batched-bench and llama-quantize with cmake
# (Release, GGML_NATIVE=ON, CPU only) into a cache directory, then measures:
#   - llama-bench: pp512 and tg128 (batch 1), -r repetitions, JSON output;
#   - llama-batched-bench: npl 1,4,16,64 parallel sequences, 128 prompt + 64 generated tokens
#     each: aggregate prompt (S_PP) and generation (S_TG) tokens/s;
# on the model as given and (unless --no-q8) on a copy re-quantised to Q8_0 with llama-quantize
# (the peer of nextok's `--requant q8_0`). Writes one JSON summary and prints a table.
#
# `nextok bench engine --llama-cpp` runs the tools itself, pair by pair with nextok: it asks this
# script for them with --print-bin-dir and --print-q8-model (each prints one path on standard
# output and nothing else).
#
# Not run in CI. See bench/peers/README.md.
set -euo pipefail

# The llama-cpp-python release whose vendored llama.cpp is measured.
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"

ME="llama_cpp.sh"
die() { echo "$ME: error: $*" >&2; exit 1; }
say() { echo "$ME: $*" >&2; }
# Any failure not handled below still says where it happened.
set -E
trap 'rc=$?; echo "$ME: error: line $LINENO: exit $rc from: $BASH_COMMAND" >&2; exit $rc' ERR

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NEXTOK_CACHE="${NEXTOK_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nextok}"
PEERS="$NEXTOK_CACHE/peers"
DEFAULT_MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

MODEL=""
OUT="$REPO/target/peers/llama_cpp.json"
REPS=3
THREADS=2
Q8=1
REPACK=1
NPL="1,4,16,64"
NPP=128
NTG=64
BATCH=512

usage() {
  cat <<EOF
usage: bench/peers/llama_cpp.sh [options]

  --model PATH     GGUF model (default: $DEFAULT_MODEL_FILE from the nextok cache or .testdata/)
  --out PATH       JSON summary (default: target/peers/llama_cpp.json)
  -r, --reps N     llama-bench repetitions (default: $REPS)
  -t, --threads N  threads (default: $THREADS)
  --q8 / --no-q8   also measure a copy re-quantised to Q8_0 (default: on)
  --no-repack      turn llama.cpp's extra buffer types (weight repacking, AMX) off, for CPUs
                   that advertise an instruction set that then traps
  --build-only     build the tools (llama-bench, llama-batched-bench, llama-quantize) and stop
  --print-bin-dir  build the tools if needed, print the directory holding them and stop
  --print-q8-model make the model's Q8_0 copy if needed (llama-quantize), print its path and
                   stop
  -h, --help       this text

Environment: NEXTOK_CACHE_DIR / XDG_CACHE_HOME (cache: <nextok cache>/peers),
LLAMA_CPP_PYTHON_VERSION (default $LLAMA_CPP_PYTHON_VERSION).
EOF
}

# need_value "$@": dies unless the option in $1 has a value in $2
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --model) need_value "$@"; MODEL="$2"; shift 2 ;;
    --model=*) MODEL="${1#*=}"; shift ;;
    --out) need_value "$@"; OUT="$2"; shift 2 ;;
    --out=*) OUT="${1#*=}"; shift ;;
    -r|--reps) need_value "$@"; REPS="$2"; shift 2 ;;
    -t|--threads) need_value "$@"; THREADS="$2"; shift 2 ;;
    --q8) Q8=1; shift ;;
    --no-q8) Q8=0; shift ;;
    --no-repack) REPACK=0; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    --print-bin-dir) BUILD_ONLY=1; PRINT_BIN_DIR=1; shift ;;
    --print-q8-model) PRINT_Q8=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1 (see --help)" ;;
  esac
done
[[ "$REPS" =~ ^[1-9][0-9]*$ ]] || die "--reps must be a positive integer"
[[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || die "--threads must be a positive integer"

command -v python3 >/dev/null || die "python3 is needed (pip download, JSON)"

# ---------------------------------------------------------------------------------------------
# The model
if [ "${BUILD_ONLY:-0}" = 1 ]; then
  :
elif [ -z "$MODEL" ]; then
  if [ -d "$NEXTOK_CACHE" ]; then
    say "looking for $DEFAULT_MODEL_FILE in $NEXTOK_CACHE"
    MODEL="$(find "$NEXTOK_CACHE" -path "$PEERS" -prune -o -type f -name "$DEFAULT_MODEL_FILE" -print -quit)" ||
      die "cannot search $NEXTOK_CACHE for $DEFAULT_MODEL_FILE (pass --model PATH)"
  fi
  if [ -z "$MODEL" ] && [ -f "$REPO/.testdata/smollm2/$DEFAULT_MODEL_FILE" ]; then
    MODEL="$REPO/.testdata/smollm2/$DEFAULT_MODEL_FILE"
  fi
  if [ -z "$MODEL" ]; then
    die "no $DEFAULT_MODEL_FILE in $NEXTOK_CACHE nor .testdata/smollm2/: fetch nextok's default model first with
    cargo run --release -p nextok-cli -- generate \"hi\" --max-tokens 1
or pass --model PATH"
  fi
fi
if [ "${BUILD_ONLY:-0}" != 1 ]; then
  [ -f "$MODEL" ] || die "model $MODEL: no such file"
  MODEL="$(cd "$(dirname "$MODEL")" && pwd)/$(basename "$MODEL")"
  say "model: $MODEL"
fi

# ---------------------------------------------------------------------------------------------
# Build tools
. "$REPO/bench/peers/build_tools.sh"
ensure_build_tools

# ---------------------------------------------------------------------------------------------
# Source: the llama-cpp-python sdist
SRC="$PEERS/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
ensure_llama_src "$PEERS" "$LLAMA_CPP_PYTHON_VERSION"
LLAMA_SRC="$SRC/vendor/llama.cpp"

# The sdist has no git history: take llama.cpp's commit from the release's changelog entry.
LLAMA_COMMIT=""
if [ -f "$SRC/CHANGELOG.md" ]; then
  LLAMA_COMMIT="$(awk -v v="## [$LLAMA_CPP_PYTHON_VERSION]" '
    index($0, v) == 1 { on = 1; next }
    on && /^## \[/ { exit }
    on && match($0, /llama\.cpp@[0-9a-f]+/) { print substr($0, RSTART + 10, RLENGTH - 10); exit }
  ' "$SRC/CHANGELOG.md")" || die "cannot read $SRC/CHANGELOG.md"
fi
if [ -z "$LLAMA_COMMIT" ]; then
  say "warning: no llama.cpp commit for $LLAMA_CPP_PYTHON_VERSION in $SRC/CHANGELOG.md: recording \"unknown\""
  LLAMA_COMMIT="unknown"
fi

# ---------------------------------------------------------------------------------------------
# Build
BUILD="$PEERS/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-build"
BIN="$BUILD/bin"
TARGETS=(llama-bench llama-batched-bench llama-quantize)
have_bins() { local t; for t in "${TARGETS[@]}"; do [ -x "$BIN/$t" ] || return 1; done; }
if have_bins; then
  say "llama.cpp $LLAMA_COMMIT (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION): binaries present in the cache"
else
  BUILD_LOG="$PEERS/llama.cpp-$LLAMA_CPP_PYTHON_VERSION-build.log"
  say "building ${TARGETS[*]} of llama.cpp $LLAMA_COMMIT (llama-cpp-python $LLAMA_CPP_PYTHON_VERSION) into $BUILD; this takes a while (log: $BUILD_LOG)"
  start=$SECONDS
  {
    cmake -S "$LLAMA_SRC" -B "$BUILD" \
      -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=ON \
      -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF \
      -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_COMMIT="$LLAMA_COMMIT" &&
    cmake --build "$BUILD" --config Release --target "${TARGETS[@]}" -j 2
  } >"$BUILD_LOG" 2>&1 || { tail -n 40 "$BUILD_LOG" >&2; die "build failed (log: $BUILD_LOG)"; }
  have_bins || die "build finished without ${TARGETS[*]} in $BIN (log: $BUILD_LOG)"
  say "built in $(( SECONDS - start )) s"
fi
if [ "${BUILD_ONLY:-0}" = 1 ]; then
  say "tools in $BIN"
  if [ "${PRINT_BIN_DIR:-0}" = 1 ]; then echo "$BIN"; fi
  exit 0
fi

# run LOG CMD...: run CMD with its stderr in LOG; on failure show the log's end and stop
# (a crash names its signal and, with repacking on, suggests --no-repack: on a CPU that advertises
# AMX the repacked weights' kernels can crash at the first use, with an empty log)
run() {
  local log="$1" rc=0 why hint=""; shift
  "$@" 2>"$log" || rc=$?
  [ "$rc" -ne 0 ] || return 0
  tail -n 30 "$log" >&2
  why="exit status $rc"
  if [ "$rc" -gt 128 ]; then
    why="killed by SIG$(kill -l "$rc" 2>/dev/null || echo "$(( rc - 128 ))")"
    [ "$REPACK" -eq 0 ] || hint="; retry with --no-repack"
  fi
  die "$(basename "$1") failed ($why): $* (log: $log)$hint"
}

# ensure_q8 LOG: sets Q8_MODEL to the model's copy re-quantised to Q8_0 by llama-quantize (kept in
# <nextok cache>/peers/models/, named by the source's SHA-256), making it first if missing
ensure_q8() {
  local log="$1" src_sha
  src_sha="$(sha256sum "$MODEL" | cut -d' ' -f1)" || die "cannot hash $MODEL"
  Q8_MODEL="$PEERS/models/$(basename "$MODEL" .gguf).requant-Q8_0.${src_sha:0:12}.gguf"
  [ ! -f "$Q8_MODEL" ] || return 0
  say "re-quantising to Q8_0 with llama-quantize into $Q8_MODEL"
  mkdir -p "$(dirname "$Q8_MODEL")" "$(dirname "$log")" || die "cannot create $(dirname "$Q8_MODEL")"
  run "$log" "$BIN/llama-quantize" --allow-requantize "$MODEL" "$Q8_MODEL.tmp" Q8_0 "$THREADS" >/dev/null
  mv "$Q8_MODEL.tmp" "$Q8_MODEL" || die "cannot move $Q8_MODEL.tmp to $Q8_MODEL"
}

if [ "${PRINT_Q8:-0}" = 1 ]; then
  ensure_q8 "$PEERS/models/quantize.log"
  echo "$Q8_MODEL"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# Measurements
OUT_DIR="$(dirname "$OUT")"
WORK="$OUT_DIR/llama_cpp.d"
rm -rf "$WORK" && mkdir -p "$WORK" || die "cannot create $WORK"

# (help text captured first: `grep -q` on a pipe would end the writer early, and pipefail fail it)
BB_JSONL=0
# (--help may exit non-zero: only its text matters)
BB_HELP="$("$BIN/llama-batched-bench" --help 2>&1 || true)"
case "$BB_HELP" in *--output-format*jsonl*) BB_JSONL=1 ;; esac

bench_repack=()
bb_repack=()
if [ "$REPACK" -eq 0 ]; then
  bench_repack=(--repack 0)
  bb_repack=(--no-repack)
fi

# Each sequence gets its own n_ctx / n_seq_max slice of the KV cache, padded to 256 cells.
MAX_NPL="${NPL##*,}"
CTX=$(( MAX_NPL * ( (NPP + NTG + 255) / 256 * 256 ) ))

# Benchmarks on a busy machine mean little (llama.cpp's OpenMP threads spin): say so, and record it.
LOAD_BEFORE="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo unknown)"
NCPU="$(nproc 2>/dev/null || echo 1)"
if [ "$LOAD_BEFORE" != unknown ] && awk -v l="$LOAD_BEFORE" -v n="$NCPU" 'BEGIN { exit !(l > n / 2) }'; then
  say "warning: load average $LOAD_BEFORE on $NCPU CPUs: the numbers will be low and noisy"
fi

VARIANTS=()
measure() { # NAME MODEL
  local name="$1" model="$2"
  VARIANTS+=("$name=$model")
  say "[$name] llama-bench pp512 + tg128, $THREADS threads, $REPS repetitions"
  run "$WORK/$name.bench.log" "$BIN/llama-bench" -m "$model" -p 512 -n 128 -t "$THREADS" \
    -r "$REPS" -o json "${bench_repack[@]}" >"$WORK/$name.bench.json"
  say "[$name] llama-batched-bench npl $NPL, pp $NPP, tg $NTG, ctx $CTX"
  local fmt=()
  if [ "$BB_JSONL" -eq 1 ]; then fmt=(--output-format jsonl); fi
  run "$WORK/$name.batched.log" "$BIN/llama-batched-bench" -m "$model" -c "$CTX" \
    -b "$BATCH" -ub "$BATCH" -npp "$NPP" -ntg "$NTG" -npl "$NPL" -t "$THREADS" -tb "$THREADS" \
    "${fmt[@]}" "${bb_repack[@]}" >"$WORK/$name.batched.out"
}

measure "$(basename "$MODEL" .gguf)" "$MODEL"

if [ "$Q8" -eq 1 ]; then
  ensure_q8 "$WORK/quantize.log"
  measure "requant-q8_0" "$Q8_MODEL"
fi

# ---------------------------------------------------------------------------------------------
# Summary
say "writing $OUT"
python3 - "$OUT" "$WORK" "$LLAMA_CPP_PYTHON_VERSION" "$LLAMA_COMMIT" "$THREADS" "$REPS" \
  "$NPP" "$NTG" "$CTX" "$BATCH" "$REPACK" "$LOAD_BEFORE" "$NCPU" "$NPL" "${VARIANTS[@]}" <<'PY'
import hashlib, json, os, re, sys

out, work, pyver, commit, threads, reps, npp, ntg, ctx, batch, repack, load, ncpu, npl = sys.argv[1:15]
variants = [v.split("=", 1) for v in sys.argv[15:]]
want_npl = [int(n) for n in npl.split(",")]

def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

def fail(msg):
    print(f"llama_cpp.sh: {msg}", file=sys.stderr)
    sys.exit(1)

def bench(name):
    path = os.path.join(work, f"{name}.bench.json")
    text = open(path).read()
    try:
        rows = json.loads(text[text.index("["):])
    except ValueError as e:
        fail(f"{path}: not llama-bench JSON ({e})")
    got = {"info": rows[0] if rows else {}}
    for r in rows:
        if r.get("n_prompt") == 512 and r.get("n_gen") == 0:
            got["pp512"] = r
        elif r.get("n_prompt") == 0 and r.get("n_gen") == 128:
            got["tg128"] = r
    for k in ("pp512", "tg128"):
        if k not in got:
            fail(f"{path}: no {k} row")
    return got

def batched(name):
    path = os.path.join(work, f"{name}.batched.out")
    rows = []
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows.append({"npl": r["pl"], "pp": r["pp"], "tg": r["tg"],
                         "pp_tps": r["speed_pp"], "tg_tps": r["speed_tg"]})
        else:
            # markdown table: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 10 and re.fullmatch(r"\d+", cells[0] or "x"):
                rows.append({"npl": int(cells[2]), "pp": int(cells[0]), "tg": int(cells[1]),
                             "pp_tps": float(cells[5]), "tg_tps": float(cells[7])})
    if [r["npl"] for r in rows] != want_npl:
        fail(f"{path}: llama-batched-bench rows for npl {[r['npl'] for r in rows]}, expected {want_npl}")
    return rows

summary = {
    "peer": "llama.cpp",
    "llama_cpp_python_version": pyver,
    "llama_cpp_commit": commit,
    "threads": int(threads),
    "repetitions": int(reps),
    "repack": repack == "1",
    "cpus": int(ncpu),
    "loadavg_before": load,
    "loadavg_after": open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "unknown",
    "batched": {"npp": int(npp), "ntg": int(ntg), "ctx": int(ctx), "batch": int(batch), "ubatch": int(batch)},
    "variants": [],
}
for name, model in variants:
    b = bench(name)
    info = b["info"]
    summary.setdefault("build_commit", info.get("build_commit"))
    summary.setdefault("build_number", info.get("build_number"))
    summary.setdefault("cpu_info", info.get("cpu_info"))
    summary["variants"].append({
        "name": name,
        "model_file": os.path.basename(model),
        "model_sha256": sha256(model),
        "model_type": info.get("model_type"),
        "model_size": info.get("model_size"),
        "pp512_tps": round(b["pp512"]["avg_ts"], 2),
        "pp512_stddev": round(b["pp512"].get("stddev_ts", 0.0), 2),
        "tg128_tps": round(b["tg128"]["avg_ts"], 2),
        "tg128_stddev": round(b["tg128"].get("stddev_ts", 0.0), 2),
        "batched": [{"npl": r["npl"], "pp_tps": round(r["pp_tps"], 2), "tg_tps": round(r["tg_tps"], 2)}
                    for r in batched(name)],
    })

tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
os.replace(tmp, out)

print()
print(f"llama.cpp {commit} (llama-cpp-python {pyver}), {threads} threads, {summary.get('cpu_info') or '?'}")
print(f"load average before/after: {summary['loadavg_before']} / {summary['loadavg_after']} on {ncpu} CPUs")
for v in summary["variants"]:
    print()
    print(f"{v['name']}  ({v['model_type']}, sha256 {v['model_sha256'][:16]}…)")
    print(f"  pp512  {v['pp512_tps']:9.2f} ± {v['pp512_stddev']:.2f} t/s")
    print(f"  tg128  {v['tg128_tps']:9.2f} ± {v['tg128_stddev']:.2f} t/s")
    print(f"  {'npl':>5} {'prompt t/s':>12} {'gen t/s':>10}   (batched: {npp} prompt + {ntg} generated tokens per sequence)")
    for r in v["batched"]:
        print(f"  {r['npl']:>5} {r['pp_tps']:12.2f} {r['tg_tps']:10.2f}")
print()
print(f"summary: {out}")
PY
