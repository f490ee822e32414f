#!/usr/bin/env bash
# Compares two builds of pmindex with the same pmbench command, run
# alternately (A B A B ...), and prints each run's throughput ratios against
# dram_btree (median of per-round ratios, same run), so the two libraries are
# compared through same-run ratios, never through absolute times.
# Each side runs with LD_LIBRARY_PATH=DIR/lib: pmbench finds
# libpmindex_internal.so through its RUNPATH, which names the directory it was
# built in, so a build directory copied aside (the usual way to keep the "old"
# side) would otherwise run the library of the newer build.
#   scripts/ab-builds.sh OLD_BUILD_DIR NEW_BUILD_DIR PAIRS [pmbench options...]
# Example (the restructure's check):
#   scripts/ab-builds.sh ../old/build build 3 --index dram_btree,fptree,fptree_single,ptree,fastfair,nvc_hashmap \
#     -n 1000000 -p 1000000 --phases read,insert,update,delete,scan
set -euo pipefail
old=$1 new=$2 pairs=$3
shift 3
for i in $(seq 1 "$pairs"); do
  for side in old new; do
    dir=$old; [ "$side" = new ] && dir=$new
    echo "== pair $i: $side ($dir)"
    LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$dir/bin/pmbench" "$@" --no_progress | sed -n '/^throughput ratio against dram_btree/,/^$/p'
  done
done
