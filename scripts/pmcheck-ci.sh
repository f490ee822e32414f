#!/usr/bin/env bash
# Runs pmcheck on every persistent index with the CI budget (see
# tools/pmcheck/ci.sh and docs/pmcheck.md): >= 2,000 crash images per index
# single-threaded and more with two threads, the durability lint with zero
# missing flushes allowed, process kills, and every declared fault switch
# must be caught. PMCHECK_CI_SCALE=N multiplies the budgets (long mode).
set -euo pipefail
cd "$(dirname "$0")/.."
exec bash tools/pmcheck/ci.sh "${1:-build}"
