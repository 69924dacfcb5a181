#!/usr/bin/env bash
# JSON-schema coverage on the maskbench subset beside the repository (../shared/maskbench-dev):
# in three configurations (strict in schema order, relaxed in any property order, strict in any
# order), how many schemas compile, how every valid and invalid instance (compact and
# `json.dumps` spellings, the real Llama-3 tokenizer) fares against the mask and the
# post-generation validator, and the per-keyword table (schemas using it; handled by the mask,
# by post-validation, unchecked, or refused). The test asserts the targets (relaxed: at least
# 97 % compile and, over every schema, at least 99 % of the valid instances pass the mask; no
# valid instance lost, no invalid one accepted).
#
# Usage: scripts/schema-coverage.sh [SAMPLE]   (check every SAMPLE-th schema; default 1: all)
# The suite itself (scripts/test.sh) checks every 10th schema.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d ../shared/maskbench-dev ]; then
  echo "../shared/maskbench-dev is absent: nothing to measure" >&2
  exit 1
fi
bash scripts/fetch-testdata.sh
NEXTOK_MASKBENCH_SAMPLE="${1:-1}" cargo test -p nextok-constraint --test json_schema_suite \
  -- --nocapture --exact maskbench_dev_subset
