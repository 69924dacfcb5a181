#!/usr/bin/env bash
# The Python package's tests (part of scripts/test.sh): a fresh virtual environment with the
# build backend, numpy and pytest (pip, pinned), the package built from this checkout and
# installed into it, then its pytest suite. The build uses the dev profile and the workspace's
# target directory, so the crates `cargo test --workspace` has just built are reused and only
# the extension module itself is compiled again.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m venv "$TMP/venv"
PY="$TMP/venv/bin/python"
"$PY" -m pip install --quiet --disable-pip-version-check \
  "maturin==1.16.0" "numpy==2.4.6" "pytest==9.2.0"
PATH="$TMP/venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile dev" \
  "$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation ./crates/python
# from outside the source tree, so that the installed package is what is tested
cd "$TMP"
"$PY" -m pytest -q -p no:cacheprovider "$ROOT/crates/python/tests"
