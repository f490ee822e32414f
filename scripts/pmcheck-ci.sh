#!/usr/bin/env bash
# Runs pmcheck on every persistent index with the CI budget. Filled in when
# pmcheck lands; a no-op until then.
set -euo pipefail
dir=${1:-build}
if [ ! -x "$dir/bin/pmcheck" ]; then
  echo "pmcheck-ci: $dir/bin/pmcheck not built; skipping" >&2
  exit 0
fi
