#!/usr/bin/env bash
# The Python wheel as a cluster node meets it (part of scripts/test.sh): built once by
# scripts/build-wheel.sh (release), then installed with pip into a fresh virtual environment
# whose PATH has no Rust toolchain (no cargo, no rustc, nothing to compile with), and run there:
# the wheel is abi3 for CPython >= 3.10, built for the x86-64 baseline (its kernels choose their
# level at run time), and generates on the default model exactly the tokens of the `nextok`
# binary built by cargo for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DATA="${NEXTOK_TESTDATA:-.testdata}"
MODEL="$ROOT/$DATA/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$MODEL" ]; then
  echo "test data $MODEL is missing: run scripts/fetch-testdata.sh" >&2
  exit 1
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
# kept in target/test-wheel for scripts/test-ray.sh, which installs the same wheel on its nodes
rm -rf "$ROOT/target/test-wheel"
WHEEL="$(bash scripts/build-wheel.sh --out "$ROOT/target/test-wheel" | tail -n 1)"
echo "wheel: $(basename "$WHEEL")"
case "$(basename "$WHEEL")" in
  nextok-*-cp310-abi3-*.whl) ;;
  *) echo "FAIL: the wheel is not tagged cp310-abi3: $(basename "$WHEEL")" >&2; exit 1 ;;
esac

# the reference: the CLI the tests build, seeded, greedy and sampled
cargo build -p nextok-cli
CLI="$ROOT/target/debug/nextok"
for t in 0 0.8; do
  "$CLI" generate --model "$MODEL" --chat --max-tokens 24 --ignore-eos --temperature "$t" --top-p 0.9 \
    --seed 5 --trace "$TMP/cli-$t.jsonl" "Name three rivers of Europe." >/dev/null 2>&1
done

python3 -m venv "$TMP/venv"
PY="$TMP/venv/bin/python"
# a PATH with nothing on it: pip must install the wheel without compiling anything
mkdir "$TMP/nobin"
if PATH="$TMP/nobin" command -v cargo >/dev/null 2>&1; then
  echo "FAIL: cargo is still reachable" >&2
  exit 1
fi
PATH="$TMP/nobin" "$PY" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
  "numpy==2.4.6" "$WHEEL"
cd "$TMP"
PATH="$TMP/nobin" "$PY" - "$MODEL" "$TMP" <<'EOF'
import json, sys

import nextok

model, tmp = sys.argv[1], sys.argv[2]
info = nextok.build_info()
print("build_info:", info)
assert info["compiled_features"] == "none", (
    f"the wheel was compiled for CPU features {info['compiled_features']!r}: it may not start on "
    "another x86-64 CPU (build it without -C target-cpu)"
)
assert info["version"].startswith(nextok.__version__ + "+"), info
assert info["kernels"] == info["cpu_level"], info

llm = nextok.LLM(model)
for t in ("0", "0.8"):
    with open(f"{tmp}/cli-{t}.jsonl") as f:
        lines = [json.loads(line) for line in f]
    cli = [s["selected"] for s in lines[1:] if "selected" in s]
    (out,) = llm.chat(
        [{"role": "user", "content": "Name three rivers of Europe."}],
        nextok.SamplingParams(max_tokens=24, ignore_eos=True, temperature=float(t), top_p=0.9, seed=5),
    )
    assert list(out.prompt_token_ids) == lines[0]["prompt_ids"], "the prompts differ"
    ids = list(out.outputs[0].token_ids)
    assert len(cli) == 24 and ids == cli, f"temperature {t}: wheel {ids} != CLI {cli}"
    print(f"temperature {t}: {len(ids)} tokens, the same as the CLI's")
print("wheel OK")
EOF
