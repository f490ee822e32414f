#!/usr/bin/env bash
# The README's main job (called by scripts/main.sh after setup): builds
# pmbench, the PiBench plugins and pmbench-plot (Release, build/) if needed,
# then runs the default comparison: dram_btree (the baseline, first) and every
# other built index on the same workload (load, then read, insert, update,
# delete, scan and mixed phases), pools in /dev/shm. Prints the side-by-side
# table, and writes results/main.json, results/main.txt (the printed report)
# and PNG charts (results/main.png = throughput; main-timeline.png,
# main-latency.png, main-pmcost.png).
#
# Knobs (environment): PMBENCH_RECORDS (default 1000000), PMBENCH_OPS
# (operations per phase, default 500000), PMBENCH_THREADS (default 1),
# PMBENCH_INDEXES (default "all"), BUILD_DIR (default build). Extra arguments
# are passed to pmbench (e.g. --distribution SELFSIMILAR).
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build}
records=${PMBENCH_RECORDS:-1000000}
ops=${PMBENCH_OPS:-500000}
threads=${PMBENCH_THREADS:-1}
indexes=${PMBENCH_INDEXES:-all}

if [ ! -f "$build/build.ninja" ]; then
  echo "main-job: configuring a Release build in $build/" >&2
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPMINDEX_WERROR=ON >/dev/null
fi
ninja -C "$build" -j"$(nproc)" pmbench pibench_plugins pmbench-plot >&2

mkdir -p results
echo "main-job: indexes: $("$build/bin/pmbench" --list | awk '/^  [a-z]/ && !/\.so$/ {printf "%s ", $1}')" >&2
"$build/bin/pmbench" --index "$indexes" -n "$records" -p "$ops" -t "$threads" \
  --phases read,insert,update,delete,scan,mixed --recovery --json results/main.json "$@" | tee results/main.txt
"$build/bin/pmbench-plot" results/main.json -o results --prefix main >/dev/null
cp results/main-throughput.png results/main.png
echo "main-job: wrote results/main.json, results/main.txt, results/main.png and results/main-*.png" >&2
ls results/main*.png >&2
