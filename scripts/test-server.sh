#!/usr/bin/env bash
# The official `openai` Python package against `nextok serve` on the real default model (from
# the test data), then hostile clients, each on an ephemeral 127.0.0.1 port. The client lives in
# a virtual environment this script creates once under the test-data directory.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${NEXTOK_TESTDATA:-.testdata}"
MODEL="$DATA/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
VENV="$DATA/venv-server"
if [ ! -f "$MODEL" ]; then
  echo "test data $MODEL is missing: run scripts/fetch-testdata.sh" >&2
  exit 1
fi
if ! "$VENV/bin/python" -c "import openai, jsonschema" >/dev/null 2>&1; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    "openai==3.57.0" "jsonschema==4.26.0"
fi
cargo build -p nextok-cli
"$VENV/bin/python" crates/server/tests/openai_client.py target/debug/nextok "$MODEL"
# hostile clients: sizes taken from the input, slow clients, disconnect storms, guessed trace
# ids; the server keeps serving and its memory stays bounded
"$VENV/bin/python" crates/server/tests/hostile_client.py target/debug/nextok "$MODEL"
