#!/usr/bin/env bash
# Records the golden traces (testdata/golden/traces/requests.json) on this machine into
# testdata/golden/traces/<cpu>/ (the CPU's vendor, family and model: `intel-family6-model207`),
# and their fingerprints into the ledger testdata/golden/traces/numerics.json; then replays
# every golden trace at every kernel level this CPU has. Commit what it wrote.
#
# Run it when a change of bits has been declared (the numerics identifier's part bumped, a line
# in the numerics history of docs/semantics.md), and whenever work runs on a CPU kind the set
# lacks (Intel, AMD Zen 4 / Zen 5, an AVX2-only machine). A recording whose steps differ from
# the ledger's under the same identifier is refused: the bits moved without a declaration.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/fetch-testdata.sh
NEXTOK_RECORD_GOLDEN=1 cargo test -p nextok-engine --test golden_traces -- --nocapture \
  golden_traces_replay_at_every_level_and_their_sampler_alone
git status --short testdata/golden/traces
