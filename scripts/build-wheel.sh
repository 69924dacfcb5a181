#!/usr/bin/env bash
# Builds the `nextok` Python package as one abi3 wheel (CPython 3.10 and later) for every x86-64
# CPU: the code is compiled for the x86-64 baseline and nextok's kernels choose their instruction
# set (AVX2, AVX-512, VNNI) when the process starts, so a wheel built here runs on any node of a
# cluster, whatever CPU built it. Install it anywhere with `pip install <wheel>`: no Rust
# toolchain is needed there.
#
#   bash scripts/build-wheel.sh [--out DIR] [--profile release|dev]
#
# The wheel goes to DIR (default `dist/`); its path is the last line printed. The build backend
# (maturin, pinned) lives in a virtual environment under `target/`. Cargo's progress is shown:
# the first release build compiles every crate (several minutes on two cores); later builds
# reuse them.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=dist
PROFILE=release
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="${2:?--out needs a directory}"; shift 2 ;;
    --profile) PROFILE="${2:?--profile needs release or dev}"; shift 2 ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
    *) echo "build-wheel.sh: unknown argument $1 (--out DIR, --profile release|dev)" >&2; exit 2 ;;
  esac
done
case "$PROFILE" in release|dev) ;; *) echo "build-wheel.sh: --profile is release or dev, not $PROFILE" >&2; exit 2 ;; esac
if ! command -v cargo >/dev/null 2>&1; then
  echo "build-wheel.sh: cargo is required to build the wheel (install a Rust toolchain with rustup)" >&2
  exit 1
fi
# the workspace's own flags (.cargo/config.toml) target the x86-64 baseline; flags from the
# environment would replace them, and `-C target-cpu=native` there makes a wheel that may not
# start on another CPU
case "${RUSTFLAGS:-}${CARGO_ENCODED_RUSTFLAGS:-}" in
  *target-cpu*|*target-feature*)
    echo "build-wheel.sh: RUSTFLAGS sets the target CPU or its features; unset it so that the wheel runs on every x86-64 CPU" >&2
    exit 2 ;;
esac
# RUSTFLAGS, even empty, replaces every `build.rustflags` of cargo's configuration files: a
# `-C target-cpu=native` in the user's ~/.cargo/config.toml or in a directory above the checkout
# would otherwise make a wheel for this CPU only
export RUSTFLAGS="${RUSTFLAGS:-}"
VENV=target/wheel-venv
if ! "$VENV/bin/python" -m maturin --version 2>/dev/null | grep -q '^maturin 1.16.0$'; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "maturin==1.16.0"
fi
mkdir -p "$OUT"
BEFORE="$(mktemp)"
trap 'rm -f "$BEFORE"' EXIT
ls "$OUT" > "$BEFORE"
"$VENV/bin/python" -m maturin build --manifest-path crates/python/Cargo.toml \
  --profile "$PROFILE" --strip --out "$OUT" >&2
WHEEL="$(ls -t "$OUT"/nextok-*-abi3-*.whl | head -n 1)"
echo "$WHEEL"
