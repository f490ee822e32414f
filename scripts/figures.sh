#!/usr/bin/env bash
# Regenerates the figures of docs/results.md. Every figure there names the
# ID of the run below that produces it, and the exact command is the one
# this script prints before running it (and writes to OUT/commands.txt).
#
#   scripts/figures.sh [--quick] [--only ID|GROUP[,...]] [--repeat N]
#                      [--build DIR] [--out DIR] [--list] [--dry-run]
#
#   --quick     tiny record and operation counts: proves that every command
#               runs and writes its output; the figures mean nothing.
#   --only      run a subset: figure IDs (see --list) or groups: main,
#               throughput, fptree, fastfair, nvc_hashmap, alloc, pmcheck.
#               Group fptree/fastfair/nvc_hashmap includes the throughput
#               runs that have that index in them.
#   --repeat N  run each pmbench throughput command N times (results.md
#               gives the range over its runs; default 1).
#   --build     build directory (default build; a Release build:
#               `bash scripts/build.sh release`).
#   --out       output folder (default results/figures).
#   --dry-run   print the commands, run nothing.
#
# Outputs: OUT/<ID>.txt (what the program printed), OUT/<ID>.json and
# OUT/<ID>-*.png for pmbench runs (pmbench --json, then pmbench-plot when
# it is built),
# OUT/<ID>.callgrind.txt for instruction counts, OUT/commands.txt. Progress
# goes to stderr. Pools go to /dev/shm (each program's default) and are
# removed by the programs. Run on a quiet machine: throughput figures are
# same-run ratios and still move with load (docs/results.md).
#
# The callgrind figures need valgrind; without it they are skipped (said on
# stderr and in commands.txt). Exit status: 0 if every selected run
# succeeded, 1 otherwise (the failing IDs are listed at the end).
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0 repeat=1 only="" build=build out=results/figures list=0 dry=0
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --only) only=$2; shift ;;
    --only=*) only=${1#--only=} ;;
    --repeat) repeat=$2; shift ;;
    --build) build=$2; shift ;;
    --out) out=$2; shift ;;
    --list) list=1 ;;
    --dry-run) dry=1 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "figures: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done

bin=$build/bin
# Sizes: full (the figures of results.md) or quick (smoke test).
if [ $quick = 1 ]; then
  N1M=20000 N5M=40000 P1M=10000 P5M=10000 P2T=5000 NMAIN=20000 PMAIN=10000
  FP_REC=20000 FP_BIG=50000 FP_HUGE=100000
  OC_REC=5000 OC_OPS=2000 OC_FF_REC=5000 OC_FF_OPS=2000
  NVC_300K=20000 NVC_1M=40000 NVC_R5=1 NVC_R3=1
  ALLOC="--rounds 2 --reps 1"
else
  N1M=1000000 N5M=5000000 P1M=1000000 P5M=1000000 P2T=500000 NMAIN=1000000 PMAIN=500000
  FP_REC=1000000 FP_BIG=10000000 FP_HUGE=100000000
  OC_REC=200000 OC_OPS=100000 OC_FF_REC=50000 OC_FF_OPS=20000
  NVC_300K=300000 NVC_1M=1000000 NVC_R5=5 NVC_R3=3
  ALLOC="--rounds 50 --reps 5"
fi
PHASES="--phases read,insert,update,delete,scan,custom -r 0.5 -u 0.5 --no_progress"
SS="--distribution SELFSIMILAR --skew 0.2"
TREES="--phases read,insert,update,delete,scan --no_progress"
CG="valgrind --tool=callgrind"

# ID | kind | command. kind: pmbench (JSON + plots, repeated with --repeat),
# text (stdout saved), callgrind (instruction counts per phase), timed (wall
# time recorded). Commands use $bin; callgrind commands are the program and
# its arguments (the script adds valgrind's).
figures=(
  "main|pmbench|$bin/pmbench --index all -n $NMAIN -p $PMAIN -t 1 --phases read,insert,update,delete,scan,mixed --recovery --no_progress"
  "tp-1m|pmbench|$bin/pmbench --index dram_btree,fptree,fptree_single,ptree,fastfair,nvc_hashmap -n $N1M -p $P1M -t 1 $PHASES"
  "tp-1m-ss|pmbench|$bin/pmbench --index dram_btree,fptree,fptree_single,ptree,fastfair -n $N1M -p $P1M -t 1 $PHASES $SS"
  "tp-5m|pmbench|$bin/pmbench --index dram_btree,fptree,fastfair -n $N5M -p $P5M -t 1 $PHASES"
  "tp-5m-ss|pmbench|$bin/pmbench --index dram_btree,fptree,fastfair -n $N5M -p $P5M -t 1 $PHASES $SS"
  "tp-2t|pmbench|$bin/pmbench --index dram_btree,fptree,fastfair -n $N1M -p $P2T -t 2 $PHASES"
  "tp-2t-ss|pmbench|$bin/pmbench --index dram_btree,fptree,fastfair -n $N1M -p $P2T -t 2 $PHASES $SS"
  "trees-1m|pmbench|$bin/pmbench --index dram_btree,fptree,fastfair,wbtree,wbtree_slot,nvtree -n $N1M -p $P1M -t 1 $TREES"
  "trees-1m-ss|pmbench|$bin/pmbench --index dram_btree,fptree,fastfair,wbtree,wbtree_slot,nvtree -n $N1M -p $P1M -t 1 $TREES --distribution SELFSIMILAR"
  "trees-2t|pmbench|$bin/pmbench --index dram_btree,fptree,fastfair,wbtree,wbtree_slot,nvtree -n $N1M -p $P1M -t 2 $TREES"
  "trees-open|pmbench|$bin/pmbench --index fptree,wbtree,nvtree -n $N1M -p 1000 --phases read --recovery --sequential --no_progress"
  "trees-open-10m|pmbench|$bin/pmbench --index fptree,wbtree,nvtree -n $FP_BIG -p 1000 --phases read --recovery --sequential --no_progress"
  "fptree-cost|text|$bin/fptree_figures --records $FP_REC --skip-big"
  "fptree-10m|text|$bin/fptree_figures --skip-small --big $FP_BIG"
  "fptree-100m|text|$bin/fptree_figures --skip-small --big $FP_HUGE --skip-rebuild"
  "fptree-opcost|callgrind|$bin/fptree_opcost --records $OC_REC --ops $OC_OPS"
  "fptree-opcost-find|callgrind|$bin/fptree_opcost --index fptree --records $OC_REC --ops $OC_REC --skew 0.2 --find-only"
  "fastfair-cost|text|$bin/fastfair_figures --records $FP_REC --big $FP_BIG"
  "fastfair-opcost|callgrind|$bin/fptree_opcost --index fastfair --records $OC_FF_REC --ops $OC_FF_OPS"
  "nvc-300k|text|$bin/nvc_bench --n $NVC_300K --rounds $NVC_R5"
  "nvc-1m|text|$bin/nvc_bench --n $NVC_1M --rounds $NVC_R3 --threads 1,2 --targets nvc_hashmap,fptree,tbb"
  "nvc-eadr|text|$bin/nvc_bench --n $NVC_1M --rounds $NVC_R3 --threads 1 --targets nvc_hashmap,fptree --persist_mode none"
  "nvc-erratum|text|$bin/nvc_bench --n $NVC_300K --rounds $NVC_R5 --threads 1,2 --targets nvc_hashmap:dirty_bit,nvc_hashmap:flush_on_read,nvc_hashmap:none,fptree"
  "alloc|text|$bin/pmbench-alloc $ALLOC"
  "pmcheck|timed|bash scripts/pmcheck-ci.sh $build"
)

# Groups for --only.
group_ids() {
  case $1 in
    main) echo main ;;
    throughput) echo tp-1m tp-1m-ss tp-5m tp-5m-ss tp-2t tp-2t-ss ;;
    fptree) echo tp-1m tp-1m-ss tp-5m tp-5m-ss tp-2t tp-2t-ss fptree-cost fptree-10m fptree-100m fptree-opcost fptree-opcost-find ;;
    fastfair) echo tp-1m tp-1m-ss tp-5m tp-5m-ss tp-2t tp-2t-ss fastfair-cost fastfair-opcost ;;
    nvc_hashmap) echo tp-1m nvc-300k nvc-1m nvc-eadr nvc-erratum ;;
    wbtree|nvtree|trees) echo trees-1m trees-1m-ss trees-2t trees-open trees-open-10m ;;
    alloc) echo alloc ;;
    pmcheck) echo pmcheck ;;
    *) echo "$1" ;;
  esac
}

declare -A want=()
if [ -n "$only" ]; then
  IFS=, read -ra sel <<<"$only"
  for s in "${sel[@]}"; do
    for id in $(group_ids "$s"); do want[$id]=1; done
  done
  for id in "${!want[@]}"; do
    found=0
    for f in "${figures[@]}"; do [ "${f%%|*}" = "$id" ] && found=1; done
    if [ $found = 0 ]; then echo "figures: unknown figure or group '$id' (--list)" >&2; exit 2; fi
  done
fi

if [ $list = 1 ]; then
  for f in "${figures[@]}"; do
    IFS='|' read -r id kind cmd <<<"$f"
    printf '%-20s %s\n' "$id" "$cmd"
  done
  exit 0
fi

mkdir -p "$out"
cmds=$out/commands.txt
: >"$cmds"
have_plot=0  # pmbench-plot finds a Python with matplotlib itself
[ -x "$bin/pmbench-plot" ] && have_plot=1
have_valgrind=0
command -v valgrind >/dev/null && have_valgrind=1
failed=()
start=$(date +%s)
say() { echo "[figures +$(( $(date +%s) - start ))s] $*" >&2; }

# Per-phase instruction counts from callgrind's dumps (fptree_opcost dumps
# one file per phase, named by its trigger): total / operations (scan100:
# per scan of 100, i.e. / (ops / 10)).
callgrind_table() {
  local dir=$1 ops=$2
  for f in "$dir"/cg.*.*; do
    [ -f "$f" ] || continue
    local what total
    what=$(grep -m1 '^desc: Trigger' "$f" | sed 's/.*: //')
    total=$(grep -m1 -E '^(summary|totals):' "$f" | cut -d' ' -f2)
    echo "$what $total"
  done | sort | awk -v ops="$ops" '{ n = ($NF ~ /^[0-9]+$/) ? $NF : 0; d = ($0 ~ /scan100/) ? ops / 10 : ops;
                                     $NF = ""; printf "%-60s %10.1f instructions per op\n", $0, n / d }'
}

run_one() {
  local id=$1 kind=$2 cmd=$3 rep=$4
  local tag=$id
  [ "$rep" -gt 1 ] && tag=$id-$rep
  case $kind in
    pmbench)
      echo "$cmd --json $out/$tag.json" >>"$cmds"
      say "$tag: $cmd --json $out/$tag.json"
      [ $dry = 1 ] && return 0
      $cmd --json "$out/$tag.json" >"$out/$tag.txt" || return 1
      if [ $have_plot = 1 ]; then
        "$bin/pmbench-plot" "$out/$tag.json" -o "$out" --prefix "$tag" >/dev/null || return 1
      fi ;;
    text)
      echo "$cmd" >>"$cmds"
      say "$tag: $cmd"
      [ $dry = 1 ] && return 0
      $cmd >"$out/$tag.txt" || return 1 ;;
    callgrind)
      if [ $have_valgrind = 0 ]; then
        echo "# skipped (no valgrind): $CG $cmd" >>"$cmds"
        say "$tag: skipped, valgrind is not installed"
        return 0
      fi
      local cgdir=$out/$tag.cg
      echo "$CG --callgrind-out-file=$cgdir/cg.%p $cmd" >>"$cmds"
      say "$tag: $CG --callgrind-out-file=$cgdir/cg.%p $cmd"
      [ $dry = 1 ] && return 0
      rm -rf "$cgdir" && mkdir -p "$cgdir"
      $CG --callgrind-out-file="$cgdir/cg.%p" $cmd >"$out/$tag.txt" 2>"$cgdir/valgrind.log" || return 1
      local ops
      ops=$(sed -n 's/.*--ops \([0-9]*\).*/\1/p' <<<"$cmd")
      callgrind_table "$cgdir" "$ops" >"$out/$tag.callgrind.txt"
      [ -s "$out/$tag.callgrind.txt" ] || return 1 ;;
    timed)
      echo "$cmd" >>"$cmds"
      say "$tag: $cmd"
      [ $dry = 1 ] && return 0
      local t0=$(date +%s)
      $cmd >"$out/$tag.txt" 2>&1 || return 1
      echo "wall time $(( $(date +%s) - t0 )) s" >>"$out/$tag.txt" ;;
  esac
}

for f in "${figures[@]}"; do
  IFS='|' read -r id kind cmd <<<"$f"
  if [ -n "$only" ] && [ -z "${want[$id]:-}" ]; then continue; fi
  n=1
  [ "$kind" = pmbench ] && [ "$id" != main ] && n=$repeat
  for ((r = 1; r <= n; r++)); do
    rep=$r
    [ "$n" = 1 ] && rep=1
    if ! run_one "$id" "$kind" "$cmd" "$rep"; then
      say "$id: FAILED (output in $out/$id*.txt)"
      failed+=("$id")
    fi
  done
done

if [ ${#failed[@]} -gt 0 ]; then
  say "done with failures: ${failed[*]}"
  exit 1
fi
say "done; outputs in $out/, commands in $cmds"
