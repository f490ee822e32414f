#!/usr/bin/env bash
# The main job: installs dependencies, builds pmindex (Release), and runs the
# default benchmark comparison (every built index plus dram_btree, pool in
# /dev/shm), printing a side-by-side table and writing results/main.json and
# PNG charts under results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh release >/dev/null
exec bash scripts/main-job.sh "$@"
