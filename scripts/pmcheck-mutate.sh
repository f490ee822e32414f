#!/usr/bin/env bash
# Mutation testing of pmcheck (issue 19; not part of CI: it rebuilds once
# per mutation). Each mutation deletes one persist step from a scratch copy
# of the sources, rebuilds pmcheck there, runs a pmcheck budget on the
# affected target and records whether pmcheck reported anything:
#   scripts/pmcheck-mutate.sh [--list] [--only ID[,ID...]] [--max N] [--spread N] [--scratch DIR] [PATH...]
#   scripts/pmcheck-mutate.sh --runtime [--list] [--spread N] [--only ...] [BUILD_DIR]
# --runtime: no rebuild. The deletion mutations (one pm::Flush or pm::Fence
# call deleted) are made in the model instead: the clean line's recording
# (--site-counts) lists every flush and fence call site each target reaches
# in its own code (by return address; symbolised with addr2line), and each
# mutation runs the budget with --drop-site SITE, which records the run as
# if that call were deleted (also in recorded recoveries). A call inside
# an inlined helper is one site per caller. Swaps and StorePersist
# mutations need the source mode.
# --spread N takes N sites evenly spaced over the whole list (every index,
# the allocator and recovery code get their share).
# PATHs (default: the persistent indexes' and src/pm's non-test sources)
# are searched for one-line persist statements. Mutation kinds:
#   flush    a `Flush(...);` statement deleted
#   fence    a `Fence();` statement deleted
#   persist  a `Persist(...);` statement deleted
#   storep   `StorePersist(a, b);` made `StoreAtomic(a, b);` (flush and fence dropped)
#   swap     two adjacent persist statements swapped
# Results go to stdout, one tab-separated line per mutation:
#   ID  FILE:LINE  KIND  TARGET  caught|survived|build-error  [first failure]
# then a summary. A survivor is either a blind spot of the checker or a
# redundant persist (equivalent mutation); telling them apart is manual:
# read the mutated line and the persist order in the file's header comment.
# Statements inside `if (!PMINDEX_FAULT(...))` are mutated like any other.
# Budget per mutation (PMCHECK_MUTATE_SCALE multiplies it): the target's
# clean line (300 ops, 2000 images, lint fatal), a small key space (30 keys,
# 1000 images), key sweeps (24 keys, 1000 images) and, for concurrent
# targets, two threads (600 images); FAST & FAIR also a sweep with
# merge_below=1, NVC-Hashmap a 200-key lint-only line, the allocator a
# 12-chunk pool (seed 1, 3000 images);
# every line adds 600 fence-window images (--window-images: every window
# shape in turn, rarest first).
# Equivalent mutations: tools/pmcheck/mutate-equivalent.txt lists deleted
# call sites (runtime mode: kind, function and optionally the site) that change nothing a crash
# can observe, each with its reason; a survivor listed there is reported as
# "equivalent" and left out of the score.
# PMCHECK_MUTATE_PCT (default 100) scales the image budgets down for a
# quick counting run (e.g. 30: 600, 300 and 180 images, 180 window images).
set -uo pipefail
cd "$(dirname "$0")/.."
src=$PWD
# The scratch copy lives inside the tree (build-mutate/, ignored by git and
# left out of the copy) so that with ccache's base_dir at the tree both
# builds compile the same relative paths: the scratch build's first
# compile of each file is a cache hit when the tree was built with
# CCACHE_BASEDIR set to it.
scratch=$src/build-mutate
equiv=$src/tools/pmcheck/mutate-equivalent.txt
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$src}
list=0
only=""
max=0
spread=0
runtime=0
paths=()
while [ $# -gt 0 ]; do
  case $1 in
    --list) list=1 ;;
    --only) only=$2; shift ;;
    --max) max=$2; shift ;;
    --spread) spread=$2; shift ;;
    --runtime) runtime=1 ;;
    --scratch) scratch=$2; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 0 ;;
    *) paths+=("$1") ;;
  esac
  shift
done
given=${#paths[@]}
[ ${#paths[@]} -eq 0 ] && paths=(src/fptree src/fastfair src/nvc_hashmap src/nvtree src/wbtree src/pm)
scale=${PMCHECK_MUTATE_SCALE:-1}
pct=${PMCHECK_MUTATE_PCT:-100}
img() { echo $(( $1 * scale * pct / 100 )); }

# The pmcheck target a source file is checked with.
target_of() {
  case $1 in
    src/fptree/*) echo fptree ;;
    src/fastfair/*) echo fastfair ;;
    src/nvc_hashmap/*) echo nvc_hashmap ;;
    src/nvtree/*) echo nvtree ;;
    src/wbtree/*) echo wbtree ;;
    src/pm/pmwcas*) echo pmwcas ;;
    src/pm/*) echo allocator ;;
    *) echo "" ;;
  esac
}
params_of() {
  case $1 in
    fptree) echo "--param leaf_size=8 --param inner_size=3" ;;
    fastfair) echo "--param node_size=256" ;;
    nvc_hashmap) echo "--param initial_buckets=16" ;;
    nvtree) echo "--param leaf_size=4 --param inner_size=2" ;;
    wbtree) echo "--param leaf_size=4 --param inner_size=3" ;;
    allocator) echo "--keys 24" ;;
  esac
}

# Mutation sites: "FILE LINE KIND" (swap: LINE is the first of the pair).
sites() {
  local f
  for f in $(find "${paths[@]}" -name '*.cc' -o -name '*.h' | grep -v -e '_test' -e 'test_util' | sort); do
    [ -z "$(target_of "$f")" ] && continue
    awk -v f="$f" '
      function kind(s) {
        if (s ~ /^[ \t]*(if \(!PMINDEX_FAULT\([^)]*\)\) )?(pm::)?StorePersist\(.*\);[ \t]*(\/\/.*)?$/) return "storep"
        if (s ~ /^[ \t]*(if \(!PMINDEX_FAULT\([^)]*\)\) )?(pm::)?Persist\(.*\);[ \t]*(\/\/.*)?$/) return "persist"
        if (s ~ /^[ \t]*(if \(!PMINDEX_FAULT\([^)]*\)\) )?(pm::)?Flush\(.*\);[ \t]*(\/\/.*)?$/) return "flush"
        if (s ~ /^[ \t]*(if \(!PMINDEX_FAULT\([^)]*\)\) )?(pm::)?Fence\(\);[ \t]*(\/\/.*)?$/) return "fence"
        return ""
      }
      { k = kind($0); if (k != "") print f, NR, k; if (k != "" && prev != "" && NR == prevnr + 1) print f, prevnr, "swap"; prev = k; prevnr = NR }
    ' "$f"
  done
}


check() {  # check <target> [extra args]: prints the first failure and returns 1 if pmcheck reported anything
  local t=$1 p out
  shift
  local extra=("$@")
  p=$(params_of "$t")
  local lines=("--ops $((300 * scale)) --images $(img 2000) --lint $p")
  [ "$t" != allocator ] && lines+=("--keys 30 --ops $((400 * scale)) --images $(img 1000) --lint $p")
  # Key sweeps (--sweep): whole-range ascending and descending runs reach
  # root growth, leaf deletion, merges and root collapse many times.
  [ "$t" != allocator ] && lines+=("--sweep --keys 24 --ops $((192 * scale)) --images $(img 1000) --lint $p")
  [ "$t" != fptree ] || lines+=("--ops $((300 * scale)) --images $(img 1000) --lint --param leaf_size=8 --param update=flip")
  # FAST & FAIR merging only emptied nodes (merge_below=1): the descending
  # removes of the sweep merge empty right leaves, whose merge appends no
  # records (the separator delete's fence is the last before the commit).
  [ "$t" != fastfair ] || lines+=("--sweep --keys 24 --ops $((192 * scale)) --images $(img 1000) --lint $p --param merge_below=1")
  # FAST & FAIR merges on two threads under PCT schedules, lint only: a
  # remove whose reclaim waits for the other thread returns right after
  # DoMerge's Unlinked tag clear (ci.sh's "2 threads merges lint" line).
  [ "$t" != fastfair ] || lines+=("--threads 2 --keys 30 --ops $((400 * scale)) --pct 4 --schedules 10 --points none --lint $p")
  # A pool of 12 chunks: runs are reclaimed and their chunks reformatted for
  # another class (Refill's bitmap persist over a used bitmap). The seed is
  # pinned and the images are not scaled by PMCHECK_MUTATE_PCT (about a
  # second): the CI line of the fault pm.run.skip_bitmap_persist.
  # NVC-Hashmap over 200 keys (lint only: the recording and the window
  # images): the bucket table doubles, eager batches (InitBatch) run, and
  # inserts of present keys return right after one.
  [ "$t" != nvc_hashmap ] || lines+=("--keys 200 --ops $((300 * scale)) --points none --lint $p")
  [ "$t" != allocator ] || lines+=("--keys 40 --param max_chunks=12 --ops $((1000 * scale)) --seed 1 --images $((3000 * scale)) --lint")
  "$bin" --index "$t" --threads 2 --points none --ops 1 2>&1 | grep -q "is not concurrent" ||
    lines+=("--threads 2 --ops $((150 * scale)) --images $(img 600) --lint $p")
  for l in "${lines[@]}"; do
    # shellcheck disable=SC2086
    out=$("$bin" --index "$t" $l --window-images "$(img 600)" --images-per-point 3 --stop-after 1 --timeout 10 "${extra[@]}" 2>/dev/null)
    if [ $? -ne 0 ]; then
      echo "$out" | grep -m1 '^FAIL' | cut -c1-160
      return 1
    fi
  done
  return 0
}

# Runtime mode (--runtime): see the header.
if [ "$runtime" -eq 1 ]; then
  bdir=build
  [ "$given" -gt 0 ] && bdir=${paths[0]}
  bin=$bdir/bin/pmcheck
  [ -x "$bin" ] || { echo "pmcheck-mutate: $bin not built" >&2; exit 2; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  # The functions of a target's own code, by namespace.
  own() {
    case $1 in
      fptree) echo 'fptree::' ;;
      fastfair) echo 'fastfair::' ;;
      nvc_hashmap) echo 'nvc' ;;
      nvtree) echo 'nvtree::' ;;
      wbtree) echo 'wbtree::' ;;
      pmwcas) echo 'PMwCAS|pmwcas' ;;
      allocator) echo 'pm::(alloc|Pool|.*Allocator|pool)' ;;
    esac
  }
  : > "$tmp/sites"
  for t in fptree fastfair nvc_hashmap nvtree wbtree pmwcas allocator; do
    "$bin" --list | grep -qx "$t" || continue
    p=$(params_of "$t")
    # shellcheck disable=SC2086
    "$bin" --index "$t" --ops 300 $p --points none --site-counts "$tmp/$t.sc" >/dev/null 2>&1
    # shellcheck disable=SC2086
    "$bin" --index "$t" --keys 30 --ops 400 $p --points none --site-counts "$tmp/$t.sc" >/dev/null 2>&1
    awk '{print $1, $2}' "$tmp/$t.sc" | sort -u | while read -r kind site; do
      obj=${site%%+*}; off=${site#*+}
      path=$(find "$bdir/lib" "$bdir/bin" -maxdepth 1 -name "$obj" | head -1)
      fn=$(addr2line -f -C -e "$path" "$(printf '0x%x' $((off - 1)))" 2>/dev/null | head -1)
      fn=${fn%%(*}
      if grep -qE "$(own "$t")" <<< "$fn" && ! grep -q '^pmcheck::' <<< "$fn"; then
        if [ "$t" != allocator ] || ! grep -qE 'PMwCAS|pmwcas' <<< "$fn"; then
          echo -e "$t\t$kind\t$site\t$fn" >> "$tmp/sites"
        fi
      fi
    done
  done
  mapfile -t rsites < "$tmp/sites"
  if [ $list -eq 1 ]; then
    i=0
    for s in "${rsites[@]}"; do i=$((i + 1)); echo -e "$i\t$s"; done
    exit 0
  fi
  if [ "$spread" -gt 0 ] && [ -z "$only" ]; then
    only=$(awk -v n="${#rsites[@]}" -v k="$spread" 'BEGIN { for (i = 0; i < k && i < n; i++) printf "%s%d", i ? "," : "", 1 + int(i * n / k) }')
  fi
  # equivalent <kind> <function> <site>: prints the reason if the list has
  # it (a line with a fourth field, a site, matches only that site).
  equivalent() {
    awk -F'\t' -v k="$1" -v f="$2" -v s="$3" '!/^#/ && NF >= 3 && $1 == k && $2 == f && (NF < 4 || $4 == "" || $4 == s) { print $3; exit }' "$equiv"
  }
  caught=0 survived=0 equiv_n=0 n=0 i=0
  for s in "${rsites[@]}"; do
    i=$((i + 1))
    if [ -n "$only" ] && ! grep -qw "$i" <<< "${only//,/ }"; then continue; fi
    [ "$max" -gt 0 ] && [ "$n" -ge "$max" ] && break
    n=$((n + 1))
    IFS=$'\t' read -r t kind site fn <<< "$s"
    if why=$(check "$t" --drop-site "$site"); then
      why=$(equivalent "$kind" "$fn" "$site")
      if [ -n "$why" ]; then
        res=equivalent; equiv_n=$((equiv_n + 1))
      else
        res=survived; survived=$((survived + 1))
      fi
    else
      res=caught; caught=$((caught + 1))
    fi
    echo -e "$i\t$fn\t$kind\t$t\t$site\t$res\t$why"
  done
  total=$((caught + survived))
  echo "pmcheck-mutate --runtime: $n mutation(s): caught $caught, survived $survived, equivalent $equiv_n;" \
    "score $([ $total -gt 0 ] && echo "$((100 * caught / total))%" || echo n/a) of the non-equivalent"
  exit 0
fi
mapfile -t all < <(sites)
if [ "$spread" -gt 0 ] && [ -z "$only" ]; then
  # N sites evenly spaced over the list.
  only=$(awk -v n="${#all[@]}" -v k="$spread" 'BEGIN { for (i = 0; i < k && i < n; i++) printf "%s%d", i ? "," : "", 1 + int(i * n / k) }')
fi
if [ $list -eq 1 ]; then
  i=0
  for s in "${all[@]}"; do i=$((i + 1)); read -r f l k <<< "$s"; echo -e "$i\t$f:$l\t$k\t$(target_of "$f")\t$(sed -n "${l}p" "$f" | sed 's/^[ \t]*//')"; done
  exit 0
fi

# The scratch copy: sources only (no build directories), built with ccache;
# its build directory is kept between runs (the copy keeps the tree's file
# times, so only what changed since is rebuilt).
mkdir -p "$scratch"
mkdir -p "$scratch/src-copy"
tar -C "$src" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$scratch/src-copy" -xf - || exit 2
export CMAKE_CXX_COMPILER_LAUNCHER=ccache
( cd "$scratch/src-copy" && bash scripts/build.sh release pmcheck >/dev/null 2>&1 ) || { echo "pmcheck-mutate: the unmutated copy does not build" >&2; exit 2; }
bin=$scratch/src-copy/build/bin/pmcheck

caught=0 survived=0 broken=0 n=0 i=0
for s in "${all[@]}"; do
  i=$((i + 1))
  if [ -n "$only" ] && ! grep -qw "$i" <<< "${only//,/ }"; then continue; fi
  [ "$max" -gt 0 ] && [ "$n" -ge "$max" ] && break
  n=$((n + 1))
  read -r f l k <<< "$s"
  t=$(target_of "$f")
  cp "$src/$f" "$scratch/src-copy/$f"
  case $k in
    flush|fence|persist) sed -i "${l}s/^\([ \t]*\).*$/\1{}  \/\/ pmcheck-mutate: deleted/" "$scratch/src-copy/$f" ;;
    storep) sed -i "${l}s/StorePersist(/StoreAtomic(/" "$scratch/src-copy/$f" ;;
    swap) awk -v a="$l" 'NR == a { x = $0; next } NR == a + 1 { print; print x; next } { print }' "$src/$f" > "$scratch/src-copy/$f" ;;
  esac
  if ! ( cd "$scratch/src-copy" && bash scripts/build.sh release pmcheck >/dev/null 2>&1 ); then
    res=build-error; why=""; broken=$((broken + 1))
  elif why=$(check "$t"); then
    res=survived; survived=$((survived + 1))
  else
    res=caught; caught=$((caught + 1))
  fi
  echo -e "$i\t$f:$l\t$k\t$t\t$res\t$why"
  cp "$src/$f" "$scratch/src-copy/$f"
done
( cd "$scratch/src-copy" && bash scripts/build.sh release pmcheck >/dev/null 2>&1 )
total=$((caught + survived))
echo "pmcheck-mutate: $n mutation(s): caught $caught, survived $survived, build errors $broken;" \
  "score $([ $total -gt 0 ] && echo "$((100 * caught / total))%" || echo n/a) of the ones that built (survivors may be equivalent)"
