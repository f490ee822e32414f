#!/usr/bin/env bash
# Mutation testing of pmcheck (issue 19; not part of CI: it rebuilds once
# per mutation). Each mutation deletes one persist step from a scratch copy
# of the sources, rebuilds pmcheck there, runs a pmcheck budget on the
# affected target and records whether pmcheck reported anything:
#   scripts/pmcheck-mutate.sh [--list] [--only ID[,ID...]] [--max N] [--scratch DIR] [PATH...]
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
# 1000 images) and, for concurrent targets, two threads (600 images).
set -uo pipefail
cd "$(dirname "$0")/.."
src=$PWD
scratch=/tmp/pmcheck-mutate
list=0
only=""
max=0
paths=()
while [ $# -gt 0 ]; do
  case $1 in
    --list) list=1 ;;
    --only) only=$2; shift ;;
    --max) max=$2; shift ;;
    --scratch) scratch=$2; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) paths+=("$1") ;;
  esac
  shift
done
[ ${#paths[@]} -eq 0 ] && paths=(src/fptree src/fastfair src/nvc_hashmap src/pm)
scale=${PMCHECK_MUTATE_SCALE:-1}

# The pmcheck target a source file is checked with.
target_of() {
  case $1 in
    src/fptree/*) echo fptree ;;
    src/fastfair/*) echo fastfair ;;
    src/nvc_hashmap/*) echo nvc_hashmap ;;
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

mapfile -t all < <(sites)
if [ $list -eq 1 ]; then
  i=0
  for s in "${all[@]}"; do i=$((i + 1)); read -r f l k <<< "$s"; echo -e "$i\t$f:$l\t$k\t$(target_of "$f")\t$(sed -n "${l}p" "$f" | sed 's/^[ \t]*//')"; done
  exit 0
fi

# The scratch copy: sources only (no build directories), built with ccache;
# its build directory is kept between runs.
mkdir -p "$scratch"
mkdir -p "$scratch/src-copy"
tar -C "$src" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$scratch/src-copy" -xf - || exit 2
export CMAKE_CXX_COMPILER_LAUNCHER=ccache
( cd "$scratch/src-copy" && bash scripts/build.sh release pmcheck >/dev/null 2>&1 ) || { echo "pmcheck-mutate: the unmutated copy does not build" >&2; exit 2; }
bin=$scratch/src-copy/build/bin/pmcheck

check() {  # check <target>: prints the first failure and returns 1 if pmcheck reported anything
  local t=$1 p out
  p=$(params_of "$t")
  local lines=("--ops $((300 * scale)) --images $((2000 * scale)) --lint $p")
  [ "$t" != allocator ] && lines+=("--keys 30 --ops $((400 * scale)) --images $((1000 * scale)) --lint $p")
  [ "$t" != fptree ] || lines+=("--ops $((300 * scale)) --images $((1000 * scale)) --lint --param leaf_size=8 --param update=flip")
  "$bin" --index "$t" --threads 2 --points none --ops 1 2>&1 | grep -q "is not concurrent" ||
    lines+=("--threads 2 --ops $((150 * scale)) --images $((600 * scale)) --lint $p")
  for l in "${lines[@]}"; do
    # shellcheck disable=SC2086
    out=$("$bin" --index "$t" $l --images-per-point 3 --stop-after 1 --timeout 10 2>/dev/null)
    if [ $? -ne 0 ]; then
      echo "$out" | grep -m1 '^FAIL' | cut -c1-160
      return 1
    fi
  done
  return 0
}

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
