#!/usr/bin/env bash
# The decoding ledger page (`nextok serve`'s `/`) in a real browser: Debian's Chromium, driven by
# Playwright for Python (pinned, in a virtual environment under the test-data directory; its own
# browser download is not used), against the real default model on an ephemeral 127.0.0.1 port.
# Screenshots go to target/page-screenshots/.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${NEXTOK_TESTDATA:-.testdata}"
MODEL="$DATA/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
VENV="$DATA/venv-page"
CHROMIUM="${NEXTOK_CHROMIUM:-/usr/bin/chromium}"
if [ ! -f "$MODEL" ]; then
  echo "test data $MODEL is missing: run scripts/fetch-testdata.sh" >&2
  exit 1
fi
if [ ! -x "$CHROMIUM" ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "$CHROMIUM is missing: install Debian's chromium (apt-get install chromium)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi
if ! "$VENV/bin/python" -c "import playwright.sync_api" >/dev/null 2>&1; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "playwright==1.65.2"
fi
cargo build -p nextok-cli
"$VENV/bin/python" crates/server/tests/page_test.py target/debug/nextok "$MODEL" "$CHROMIUM"
