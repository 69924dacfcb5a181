#!/usr/bin/env bash
# The README's test command: the whole workspace's tests (library, shared test vectors through
# the library and through the CLI binary, property tests, doc tests) and a compile of the benches.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --all-targets
cargo test --workspace --doc
