#!/usr/bin/env bash
# nextok on a real Ray cluster on this machine (part of scripts/test.sh): `ray start` makes a
# head node and a worker node (node IP 127.0.0.1), `nextok.ray` deploys 2 replicas behind Ray
# Serve's HTTP proxy on an ephemeral 127.0.0.1 port, and crates/server/tests/ray_cluster.py
# checks it against `nextok serve`: the official OpenAI client's suite, 32 concurrent requests
# equal to a single server (their traces replay), a replica and then the worker node killed for
# real, and 429 when every replica is full. Ray (pinned) lives in a virtual environment kept
# under the test-data directory; the nextok wheel is the one scripts/test-wheel.sh built (or is
# built here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
DATA="${NEXTOK_TESTDATA:-.testdata}"
MODEL="$ROOT/$DATA/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
VENV="$ROOT/$DATA/venv-ray"
if [ ! -f "$MODEL" ]; then
  echo "test data $MODEL is missing: run scripts/fetch-testdata.sh" >&2
  exit 1
fi
WHEEL="$(ls "$ROOT"/target/test-wheel/nextok-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$WHEEL" ]; then
  WHEEL="$(bash scripts/build-wheel.sh --out "$ROOT/target/test-wheel" | tail -n 1)"
fi
echo "wheel: $(basename "$WHEEL")"
if ! "$VENV/bin/python" -c "import ray.serve, openai, jsonschema" >/dev/null 2>&1; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "ray[serve]==2.60.0" "openai==3.57.0" "jsonschema==4.26.0" "numpy==2.4.6"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"
cargo build -p nextok-cli
# a stale cluster of an earlier run on this machine would take the nodes' ports and processes
"$VENV/bin/ray" stop --force >/dev/null 2>&1 || true
cd "$(mktemp -d)"
"$VENV/bin/python" "$ROOT/crates/server/tests/ray_cluster.py" "$ROOT/target/debug/nextok" "$MODEL" \
  "$ROOT/crates/server/tests/openai_client.py"
