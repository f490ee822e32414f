#!/usr/bin/env bash
# Runs pmcheck on every persistent index with the CI budget (see
# tools/pmcheck/ci.sh and docs/pmcheck.md): >= 2,000 crash images per index
# single-threaded and more with two threads, the durability lint with zero
# missing flushes allowed, process kills, and every declared fault switch
# must be caught. PMCHECK_CI_SCALE=N multiplies the budgets;
#   scripts/pmcheck-ci.sh --long [build-dir]
# is the long mode: scale 13 (unless PMCHECK_CI_SCALE is set), at least
# 100,000 crash images per index (ci.sh prints the totals per index).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --long ]; then
  shift
  export PMCHECK_CI_SCALE=${PMCHECK_CI_SCALE:-13}
fi
exec bash tools/pmcheck/ci.sh "${1:-build}"
