#!/usr/bin/env bash
# pmcheck's CI budget (issue 5), for scripts/pmcheck-ci.sh:
#   tools/pmcheck/ci.sh [build-dir]
# For every persistent index in the build:
#   1. one thread, >= 2000 crash images, durability lint fatal (zero missing
#      flushes, missing fences, erratum reads);
#   2. two threads, 600 crash images, lint fatal (concurrent indexes only);
#   3. byte keys and values, 500 crash images, lint fatal;
#   4. a small key space (30 keys per thread), 1000 crash images, lint fatal,
#      u64 and byte keys: deletes empty nodes, so leaf deletion / node
#      merges and root collapses run (FPTree with 3-way inner nodes);
#   4b. a tiny key space (3 keys per thread, keys 0, 1, 2 for u64), 1000
#      crash images each kind: nodes of one or two records, emptied and
#      refilled over and over (sentinel and "left neighbour" words next to
#      the smallest keys: two FAST & FAIR crash bugs showed only here);
#   4c. the FPTree variants with update=flip (algorithm 8 for u64 values), 1000
#       crash images; FAST & FAIR with 80 keys per thread over 1500 ops
#       (rebalances), 3000 crash images, u64 and byte keys; FAST & FAIR,
#       wBTree and fptree_single sweeps shaped for their rarest structure
#       changes (rebalances, deep trees, one-leaf groups; issue 19) and
#       FAST & FAIR's two-thread merges, lint only;
#   5. 20 process kills;
#   6. recovery crashes: the clean line records 3 recoveries and crashes
#      each at 40 sampled images (double crashes, --recovery-crashes);
#   7. shared keys and the read rule (two threads, --shared-keys) for every
#      concurrent index; shared writes (--shared-writes: four keys both
#      threads write), u64 free-running, bytes under 10 PCT schedules, and
#      eight threads racing on them (u64 and bytes).
#   8. 20 PCT schedules (--pct 4 --schedules 20) of a two-thread workload
#      for every concurrent index and the pmwcas and allocator targets;
#   9. one dropped fence per index (--drop-fence K pinned to its insert's
#      commit fence), which crash images must report.
#  10. fence-window images (--window-images 300) on both small-key-space
#      lines: every window shape (fence and flush sites) in turn, each
#      image keeping the last-written dirty lines and dropping the rest.
#  11. a key sweep (--sweep: whole-range ascending and descending runs),
#      400 crash images, lint fatal, u64 keys (and byte keys for the
#      B+-trees): leaf deletion, merges, root growth
#      and collapse >= 20 times per run (docs/pmcheck.md coverage table).
# The allocator target (--index allocator) gets clean, two-thread,
# shared-keys, tiny-key-space and kill lines and its fault switches.
# Every line builds the unfenced image per point (flushed-but-unfenced
# stores dropped, the rest kept), which is pmcheck's default.
# Then the same budgets (clean, two threads, tiny key space, shared keys,
# shared writes, kills) for the pmwcas target, which takes u64 keys and values only.
# Then every fault switch an index declares must be reported (exit status 1):
# the checker proves its power on the real indexes; the toy index's
# fence, read-rule and recovery faults prove the unfenced image, the read
# rule and the recovery crashes, each with the capability it needs only. Exit status 0 only if all
# clean runs pass and all faults are caught. Set PMCHECK_CI_SCALE=N to
# multiply the budgets (scripts/pmcheck-ci.sh --long: 13, at least 100,000
# crash images per index; the totals are printed at the end). Runs go PMCHECK_CI_JOBS at a time
# (default: the number of CPUs). PMCHECK_CI_ONLY=ERE runs only the lines
# whose --index matches (e.g. PMCHECK_CI_ONLY='bztree|pmwcas' for the long
# mode of one index at a time).
set -uo pipefail
dir=${1:-build}
bin=$dir/bin/pmcheck
scale=${PMCHECK_CI_SCALE:-1}
if [ ! -x "$bin" ]; then
  echo "pmcheck ci: $bin not built" >&2
  exit 2
fi
start=$(date +%s)
stamp() { echo "[pmcheck ci +$(( $(date +%s) - start ))s] $*" >&2; }

# Small nodes so that splits, growth and allocation happen within a few
# hundred ops.
params() {
  case $1 in
    fptree|fptree_single|ptree) echo "--param leaf_size=8" ;;
    fastfair) echo "--param node_size=256" ;;
    nvc_hashmap) echo "--param initial_buckets=16" ;;
    nvtree) echo "--param leaf_size=8 --param inner_size=4" ;;
    wbtree|wbtree_slot) echo "--param leaf_size=4 --param inner_size=3" ;;
    bztree) echo "--param node_size=256" ;;
    clfbtree) echo "--param leaf_size=128" ;;
  esac
}
# For the small-key-space run: also small inner nodes, so that emptied
# leaves take their parents (and the root) with them.
shrink_params() {
  case $1 in
    fptree|fptree_single|ptree) echo "--param leaf_size=8 --param inner_size=3" ;;
    nvtree) echo "--param leaf_size=4 --param inner_size=2" ;;
    *) params "$1" ;;
  esac
}

# Runs are independent processes (pool files are named by pid), so up to
# PMCHECK_CI_JOBS (default: the number of CPUs) run at once; each reports
# when it finishes, and failures are collected at the end.
jobs_max=${PMCHECK_CI_JOBS:-$(nproc)}
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
nrun=0
throttle() {
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
}
run() {  # run <label> <expected exit status> <pmcheck args...>
  local label=$1 want=$2
  shift 2
  if [ -n "${PMCHECK_CI_ONLY:-}" ]; then  # only the lines of these targets (an ERE over --index values)
    local a prev="" target=""
    for a in "$@"; do [ "$prev" = --index ] && target=$a; prev=$a; done
    echo "$target" | grep -qxE "$PMCHECK_CI_ONLY" || return 0
  fi
  throttle
  nrun=$((nrun + 1))
  (
    out=$("$bin" "$@" 2>/dev/null)
    rc=$?
    if [ "$rc" != "$want" ]; then
      echo "$out" | tail -25
      stamp "FAILED: $label (exit $rc, expected $want): $bin $*"
      echo "$label" > "$results/$nrun.failed"
    else
      stamp "ok: $label ($(echo "$out" | grep -oE 'tried [0-9]+, crash images [0-9]+|double-crash images [0-9]+|process kills [0-9]+' | tr '\n' ' ' | sed 's/ $//'))"
    fi
    # Crash images per index (the summary at the end).
    echo "${label%% *} $(echo "$out" | grep -oE 'crash images [0-9]+' | head -1 | grep -oE '[0-9]+' || echo 0)" > "$results/$nrun.images"
  ) &
}

indexes=$("$bin" --list | grep -v -e '^pmcheck_toy$' -e '^pmwcas$' -e '^allocator$')  # pmcheck's own targets have their own lines
for idx in $indexes; do
  p=$(params "$idx")
  # shellcheck disable=SC2086
  run "$idx clean" 0 --index "$idx" --ops $((300 * scale)) --images $((2000 * scale)) --images-per-point 3 --lint --timeout 10 --recovery-crashes $((3 * scale)) --recovery-images 40 $p
  probe=$("$bin" --index "$idx" --threads 2 --points none --ops 1 2>&1)
  if grep -q "is not concurrent" <<< "$probe"; then
    stamp "skip: $idx 2 threads (single-threaded index)"
  else
    sk_lint=--lint
    # shellcheck disable=SC2086
    run "$idx 2 threads" 0 --index "$idx" --threads 2 --ops $((150 * scale)) --images $((600 * scale)) --images-per-point 3 $sk_lint --timeout 10 $p
    # The read rule: a version a completed find returned survives every
    # later crash.
    # shellcheck disable=SC2086
    run "$idx shared keys" 0 --index "$idx" --threads 2 --shared-keys --keys 24 --ops $((200 * scale)) --images $((600 * scale)) --images-per-point 3 $sk_lint --timeout 10 $p
    # Shared writes: both threads also write four keys nobody owns; each
    # crash must recover them to a version the ops' real-time order allows.
    # Free-running (writes overlap) with u64 keys, and 10 PCT schedules
    # with byte keys (a bztree insert that lost its slot under such a
    # schedule returned with an unfenced flush).
    # shellcheck disable=SC2086
    run "$idx shared writes" 0 --index "$idx" --threads 2 --shared-keys --shared-writes --keys 8 --ops $((300 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10 $p
    # Races on the shared keys (eight threads, one own key each): the
    # paths of an insert that loses to another thread's insert of the key.
    for kk in u64 bytes; do
      # shellcheck disable=SC2086
      run "$idx shared writes contention $kk" 0 --index "$idx" --threads 8 --shared-keys --shared-writes --keys 1 --key-kind $kk --value-kind $kk --ops $((400 * scale)) --images $((400 * scale)) --images-per-point 3 --lint --timeout 10 $p
    done
    # shellcheck disable=SC2086
    run "$idx shared writes bytes pct" 0 --index "$idx" --threads 2 --shared-keys --shared-writes --keys 8 --key-kind bytes --value-kind bytes --ops $((100 * scale)) --images $((400 * scale)) --pct 4 --schedules 10 --images-per-point 3 --lint --timeout 10 $p
  fi
  # shellcheck disable=SC2086
  run "$idx bytes" 0 --index "$idx" --key-kind bytes --value-kind bytes --ops $((150 * scale)) --images $((500 * scale)) --images-per-point 3 --lint --timeout 10 $p
  # shellcheck disable=SC2086
  run "$idx shrink" 0 --index "$idx" --keys 30 --ops $((400 * scale)) --images $((1000 * scale)) --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 $(shrink_params "$idx")
  # shellcheck disable=SC2086
  run "$idx tiny" 0 --index "$idx" --keys 3 --ops $((300 * scale)) --images $((1000 * scale)) --images-per-point 3 --lint --timeout 10 $(shrink_params "$idx")
  # shellcheck disable=SC2086
  run "$idx tiny bytes" 0 --index "$idx" --key-kind bytes --value-kind bytes --keys 3 --ops $((300 * scale)) --images $((1000 * scale)) --images-per-point 3 --lint --timeout 10 $(shrink_params "$idx")
  # shellcheck disable=SC2086
  run "$idx shrink bytes" 0 --index "$idx" --key-kind bytes --value-kind bytes --keys 30 --ops $((400 * scale)) --images $((1000 * scale)) --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 $(shrink_params "$idx")
  # Algorithm-8 updates (a new slot, then one bitmap store) with u64
  # values: the default updates those in place.
  case $idx in
    fptree|fptree_single|ptree)
      # shellcheck disable=SC2086
      run "$idx flip" 0 --index "$idx" --ops $((300 * scale)) --images $((1000 * scale)) --images-per-point 3 --lint --timeout 10 $p --param update=flip ;;
  esac
  # FAST & FAIR rebalances (a split of the fuller sibling, then a merge):
  # 80 keys per thread in 256-byte nodes over 1500 ops empty and refill
  # nodes next to fuller siblings (the "shrink" run above reaches none).
  if [ "$idx" = fastfair ]; then
    for kk in u64 bytes; do
      # shellcheck disable=SC2086
      run "$idx rebalance $kk" 0 --index "$idx" --key-kind $kk --value-kind $kk --keys 80 --ops $((1500 * scale)) --images $((3000 * scale)) --images-per-point 3 --lint --timeout 10 $p
    done
    # Merges of an empty right leaf (merge_below=1: only emptied nodes
    # merge; the sweep's descending removes empty the rightmost leaf
    # first): no records are appended, so the fence of the separator's
    # delete from the parent is the last before the merge's commit.
    for kk in u64 bytes; do
      # shellcheck disable=SC2086
      run "$idx empty merges $kk" 0 --index "$idx" --key-kind $kk --value-kind $kk --sweep --keys 24 --ops $((192 * scale)) --images $((1000 * scale)) --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 $p --param merge_below=1
    done
    # Rebalances, >= 20 per line (issue 19): 384-byte nodes (18 records;
    # underfull below 6, a merged pair at most 13) and key sweeps: the
    # ascending removes leave the leftmost leaf underfull next to a
    # half-full sibling (from the descending upserts) too full to merge
    # with it (5 + 9 > 13): 40 rebalances per line, u64 and byte keys (the
    # random 80-key lines above reach 0-2; 256-byte nodes give 2 + 5 <= 7:
    # merges).
    for kk in u64 bytes; do
      # shellcheck disable=SC2086
      run "$idx rebalance sweep $kk" 0 --index "$idx" --key-kind $kk --value-kind $kk --sweep --keys 60 --ops $((960 * scale)) --images $((400 * scale)) --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 --param node_size=384
    done
    # A three-level u64 tree (120 keys in 256-byte nodes, eight cycles):
    # inner splits inside InsertInternal's parent insert, and merges into
    # a leaf whose lk (raised by FixLk above the keys inserted into it) is a
    # key of the merged right sibling (DoMerge picks a new lk first): 20
    # each per line (they ran 2 in all lines before).
    # shellcheck disable=SC2086
    run "$idx deep sweep" 0 --index "$idx" --sweep --keys 120 --ops $((1920 * scale)) --images $((400 * scale)) --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 $p
    # Merges on two threads under PCT schedules, lint only (the recording):
    # a remove's merge retires the right node and its reclaim waits while the
    # other thread is in the tree, so the remove returns right after
    # DoMerge's last persist (the retire slot's Unlinked tag clear). Without
    # that fence the op returns with a flush unordered: the lint reports it
    # (docs/pmcheck.md, "Persist-path coverage"). Single-threaded lines
    # reclaim at once (the free fences the slot's line) and cannot. u64
    # and byte keys (their own DoMerge).
    for kk in u64 bytes; do
      # shellcheck disable=SC2086
      run "$idx 2 threads merges lint $kk" 0 --index "$idx" --key-kind $kk --value-kind $kk --threads 2 --keys 30 --ops $((400 * scale)) --pct 4 --schedules $((10 * scale)) --points none --lint --timeout 10 $p
    done
  fi
  # wBTree's root growth, >= 20 per line pair (issue 19): the tree never
  # shrinks, so a line grows the root once per level; ascending runs of 400
  # u64 keys (7 levels) and of 2000 byte keys in 2-record leaves (10).
  case $idx in
    wbtree|wbtree_slot)
      # shellcheck disable=SC2086
      run "$idx deep sweep" 0 --index "$idx" --sweep --keys 400 --ops $((400 * scale)) --images $((400 * scale)) --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 $p
      # shellcheck disable=SC2086
      run "$idx deep sweep bytes" 0 --index "$idx" --key-kind bytes --value-kind bytes --sweep --keys 2000 --ops $((2000 * scale)) --images $((400 * scale)) --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 --param leaf_size=2 --param inner_size=3 ;;
  esac
  # fptree_single's leaf groups (issue 19): one leaf per group
  # (group_size=1), so every leaf split links a new group and every leaf
  # deletion frees one; six keys in 2-record leaves, 25 sweep cycles: the
  # free of the tail group (groups_tail moves back) once per cycle.
  if [ "$idx" = fptree_single ]; then
    for kk in u64 bytes; do
      # shellcheck disable=SC2086
      run "$idx groups $kk" 0 --index "$idx" --key-kind $kk --value-kind $kk --sweep --keys 6 --ops $((600 * scale)) --images $((400 * scale)) --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 --param leaf_size=2 --param inner_size=3 --param group_size=1
    done
  fi
  # NVC-Hashmap over 200 keys, lint only (the recording and window
  # images): the table doubles and eager bucket batches (InitBatch) run;
  # an insert of a present key returns right after its batch, so a batch
  # that leaves its links' flushes unfenced is reported.
  if [ "$idx" = nvc_hashmap ]; then
    # shellcheck disable=SC2086
    run "$idx growth lint" 0 --index "$idx" --keys 200 --ops $((300 * scale)) --points none --window-images $((300 * scale)) --images-per-point 3 --lint --timeout 10 $p
    # Persist-path coverage (docs/pmcheck.md): one bucket and load factor 1,
    # 320 keys swept (the table doubles up to 512 buckets): on-demand
    # InitBucket (buckets 1-15) and eager InitBatch >= 20 times over the two
    # kinds. Eight threads on two keys each in one list, reading each
    # other's keys: HelpUnlink, EnsureDelDurable, Put's retried link and the
    # finds' helping persists (races, so counts vary; >= 20 over the two
    # kinds), NewSlab and ReleaseCache per thread. Byte values updated 3000
    # times: Reclaim frees retired records (once per 32 retirements).
    nvc_grow="--param initial_buckets=1 --param load_factor=1"
    for kk in u64 bytes; do
      # shellcheck disable=SC2086
      run "$idx growth $kk" 0 --index "$idx" --key-kind $kk --value-kind $kk --sweep --keys 320 --ops $((1280 * scale)) --images $((400 * scale)) --window-images $((200 * scale)) --images-per-point 3 --lint --timeout 10 $nvc_grow
      # shellcheck disable=SC2086
      run "$idx 8 threads $kk" 0 --index "$idx" --key-kind $kk --value-kind $kk --threads 8 --shared-keys --keys 2 --ops $((400 * scale)) --images $((600 * scale)) --window-images $((200 * scale)) --images-per-point 3 --lint --timeout 10 $nvc_grow
    done
    # shellcheck disable=SC2086
    run "$idx reclaim bytes" 0 --index "$idx" --key-kind bytes --value-kind bytes --keys 3 --ops $((3000 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10 $p
  fi
  # BzTree under contention (docs/pmcheck.md "Persist-path coverage"): four
  # threads on four shared keys, so PMwCAS reads and CASes meet words whose
  # dirty bit another thread has not cleared yet and persist them
  # (PersistAndClear: 18-29 runs in the other lines, about 240 here).
  if [ "$idx" = bztree ]; then
    # shellcheck disable=SC2086
    run "$idx 4 threads contention" 0 --index "$idx" --threads 4 --shared-keys --keys 4 --ops $((400 * scale)) --images $((400 * scale)) --images-per-point 3 --lint --timeout 10 $p
  fi
  # shellcheck disable=SC2086
  run "$idx kills" 0 --index "$idx" --points none --kill $((20 * scale)) --timeout 10 $p
done

# The PMwCAS target (a hash map built only on the pool's PMwCAS; u64 keys and
# values only, docs/pmwcas.md): clean (with crashes during recovery), two
# threads, a tiny key space, two threads reading each other's keys, kills.
# The pmwcas target is a 2,048-slot open-addressing map: its key spaces are
# fixed at the scale-1 defaults (ops / 2), or the long mode's 3,900 ops would
# fill its probe sequences (PoolFull, found by the first long run).
run "pmwcas clean" 0 --index pmwcas --keys 150 --ops $((300 * scale)) --images $((2000 * scale)) --images-per-point 3 --lint --timeout 10 --recovery-crashes $((3 * scale)) --recovery-images 40
run "pmwcas 2 threads" 0 --index pmwcas --threads 2 --keys 75 --ops $((150 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10
run "pmwcas tiny" 0 --index pmwcas --keys 3 --ops $((300 * scale)) --images $((1000 * scale)) --images-per-point 3 --lint --timeout 10
run "pmwcas kills" 0 --index pmwcas --points none --kill $((20 * scale)) --timeout 10
run "pmwcas shared keys" 0 --index pmwcas --threads 2 --shared-keys --keys 24 --ops $((200 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10
run "pmwcas shared writes" 0 --index pmwcas --threads 2 --shared-keys --shared-writes --keys 8 --ops $((300 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10
run "pmwcas shared writes contention" 0 --index pmwcas --threads 8 --shared-keys --shared-writes --keys 1 --ops $((400 * scale)) --images $((400 * scale)) --images-per-point 3 --lint --timeout 10
# Sixteen threads (docs/pmcheck.md "Persist-path coverage"): the allocator's
# run formatting (Refill) and thread-exit ReleaseCache >= 20 times.
run "pmwcas 16 threads" 0 --index pmwcas --threads 16 --shared-keys --keys 3 --ops $((150 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10

# The toy index's faults for the checker's own capabilities, each run with
# only that capability able to see it: a flush without a fence before the
# commit (images 0 and 1 only, so only the unfenced image can), a recovery
# that is not idempotent (crashes during recovery).
run "pmcheck_toy fault insert.skip_kv_fence (unfenced image)" 1 --index pmcheck_toy --ops 200 --points all --images-per-point 2 --stop-after 1 --fault pmcheck_toy.insert.skip_kv_fence
run "pmcheck_toy fault recover.clear_log_first (recovery crashes)" 1 --index pmcheck_toy --ops 200 --points all --recovery-crashes 1000 --stop-after 1 --fault pmcheck_toy.recover.clear_log_first
indexes=$(printf '%s\npmwcas' "$indexes")

# Every fault switch must be caught. Format: index fault [extra pmcheck args].
# fptree's merges run only in recovery, so its merge switch needs recovery
# crashes and a workload that leaves sparse leaves (--drain). Switches that
# pmcheck cannot reach are caught by unit tests instead (docs/fptree.md,
# "Fault switches": fptree.move.skip_copy_flush, fptree.delete.keep_log_prev).
# nvc.insert.skip_failed_zero_persist needs two inserts of one key racing, which
# pmcheck's workloads never run (each thread writes its own keys): unit test
# NvcHashmapCrash.FailedInsertZeroesItsNodeDurably (docs/nvc_hashmap.md).
faults="
fptree fptree.insert.skip_kv_flush
fptree fptree.insert.bitmap_before_kv
fptree fptree.delete.skip_flush
fptree fptree.split.skip_log
fptree fptree.retire.clear_word_first --key-kind bytes --value-kind bytes
fptree fptree.retire.skip_word_persist --key-kind bytes --value-kind bytes --lint
fptree fptree.merge.skip_copy_flush --drain --recovery-crashes 30 --recovery-images 0
fastfair fastfair.create.skip_meta_flush
fastfair fastfair.insert.skip_shift_flush
fastfair fastfair.remove.skip_flush
fastfair fastfair.split.link_before_persist
fastfair fastfair.merge.free_before_unlink --keys 30
fastfair fastfair.retire.own_after_commit --key-kind bytes --value-kind bytes
fastfair fastfair.retire.unlinked_before_commit --key-kind bytes --value-kind bytes
nvc_hashmap nvc.insert.skip_node_persist
nvc_hashmap nvc.insert.skip_link_persist
nvc_hashmap nvc.remove.skip_mark_persist --lint
nvc_hashmap nvc.create.skip_dummy_persist
nvc_hashmap nvc.create.skip_max_threads_persist --param max_threads=300
nvc_hashmap nvc.open.skip_empty_slab_unlink --keys 3
pmwcas pmwcas.skip_descriptor_persist
pmwcas pmwcas.skip_status_persist
pmwcas pmwcas.skip_dirty_flush
"
# NV-Tree's persist steps (docs/nvtree.md "Fault switches").
faults+="
nvtree nvtree.append.skip_entry_flush
nvtree nvtree.append.count_before_entry
nvtree nvtree.append.skip_count_flush
nvtree nvtree.replace.skip_leaf_flush
nvtree nvtree.replace.free_before_swap --key-kind bytes --value-kind bytes
"
# wBTree's fault switches, both variants (docs/wbtree.md, "Fault switches").
faults+="
wbtree wbtree.insert.skip_entry_flush
wbtree wbtree.insert.skip_slots_flush
wbtree wbtree.update.skip_flush
wbtree wbtree.remove.skip_flush
wbtree wbtree.split.link_before_persist
wbtree wbtree.free.skip_unlink_flush --keys 30
wbtree_slot wbtree.insert.skip_entry_flush
wbtree_slot wbtree.insert.skip_slots_flush
wbtree_slot wbtree.update.skip_flush
wbtree_slot wbtree.remove.skip_flush
wbtree_slot wbtree.split.link_before_persist
wbtree_slot wbtree.free.skip_unlink_flush --keys 30
"
# BzTree's persist steps (docs/bztree.md "Fault switches", bztree::kFaultSwitches).
faults+="
bztree bztree.insert.skip_record_flush
bztree bztree.insert.skip_value_flush --key-kind bytes --value-kind bytes
bztree bztree.smo.skip_node_flush
"
# clfB-tree's fault switches, one per method's persist step (docs/clfbtree.md,
# "Fault switches"), and clean runs of its other crash-safe configurations
# (the loop above runs the default: in-place parent updates, append leaves).
faults+="
clfbtree clfbtree.append.skip_entry_flush
clfbtree clfbtree.split.skip_leaf_flush
clfbtree clfbtree.smo.skip_arm_persist --key-kind bytes --value-kind bytes
clfbtree clfbtree.inplace.skip_log_persist --param leaf=encoded
clfbtree clfbtree.inplace.skip_invalidate --param leaf=encoded
clfbtree clfbtree.shadow.skip_node_flush --param leaf=encoded --param parent=shadow
"
if echo "$indexes" | grep -qx clfbtree; then
  for cfg in "leaf=encoded parent=inplace" "leaf=encoded parent=shadow" "leaf=append parent=shadow"; do
    set -- $cfg
    run "clfbtree clean $cfg" 0 --index clfbtree --ops $((300 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10 --param leaf_size=128 --param "$1" --param "$2"
  done
  run "clfbtree shrink bytes leaf=encoded parent=shadow" 0 --index clfbtree --key-kind bytes --value-kind bytes --keys 30 --ops $((300 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10 --param leaf=encoded --param parent=shadow
fi
while read -r idx fault extra; do
  [ -z "$idx" ] && continue
  echo "$indexes" | grep -qx "$idx" || continue
  p=$(params "$idx")
  # shellcheck disable=SC2086
  run "$idx fault $fault" 1 --index "$idx" --ops 300 --images 3000 --images-per-point 3 --stop-after 1 --timeout 10 --fault "$fault" $p $extra
done <<< "$faults"

# The NVC-Hashmap erratum needs two threads to interleave inside a persist
# window; the schedule is perturbed but not deterministic, so try a few seeds.
erratum() {
  local seed out
  for seed in 1 2 3 4 5 6 7 8 9 10 11 12; do
    out=$("$bin" --index nvc_hashmap --threads 2 --ops 2000 --keys 40 --seed $seed --points none --lint \
        --fault nvc.erratum.no_fix 2>/dev/null)  # exits 1: the erratum is a lint failure
    if grep -q "erratum reads: [1-9]" <<< "$out"; then
      stamp "ok: nvc_hashmap fault nvc.erratum.no_fix (erratum read, seed $seed)"
      return
    fi
  done
  stamp "FAILED: nvc.erratum.no_fix not reported in 12 seeds"
  echo "nvc.erratum.no_fix" > "$results/erratum.failed"
}
if echo "$indexes" | grep -qx nvc_hashmap; then
  throttle
  erratum &
fi

# The read rule on reads of undurable values: two threads must interleave
# inside a writer's window, so a few seeds. The toy's widened window, and
# NVC-Hashmap without its erratum fix (a find returns a node whose link is
# not yet durable).
read_rule() {  # read_rule <label> <pmcheck args...>
  local label=$1 seed out
  shift
  for seed in 1 2 3 4 5 6; do
    out=$("$bin" "$@" --threads 2 --shared-keys --seed $seed --timeout 10 2>/dev/null)
    if grep -q "lost read [1-9]" <<< "$out"; then
      stamp "ok: $label (lost read, seed $seed)"
      return
    fi
  done
  stamp "FAILED: $label not reported as a lost read in 6 seeds"
  echo "$label" > "$results/read_rule.$nrun.failed"
}
throttle
nrun=$((nrun + 1))
read_rule "pmcheck_toy fault update.unlock_before_persist" --index pmcheck_toy --keys 6 --ops 150 --points all --images-per-point 1 \
  --fault pmcheck_toy.update.unlock_before_persist &
if echo "$indexes" | grep -qx nvc_hashmap; then
  throttle
  nrun=$((nrun + 1))
  read_rule "nvc_hashmap erratum_fix=none (read rule)" --index nvc_hashmap --keys 12 --ops 400 --images 600 --images-per-point 3 \
    --param initial_buckets=16 --param erratum_fix=none &
fi
# NV-Tree's read rule: a writer that unlocks its leaf before the count is
# durable lets a find return an entry a crash takes away.
if echo "$indexes" | grep -qx nvtree; then
  throttle
  nrun=$((nrun + 1))
  read_rule "nvtree fault append.unlock_before_count_persist (read rule)" --index nvtree --keys 12 --ops 400 --images 600 \
    --images-per-point 3 --param leaf_size=8 --param inner_size=4 --fault nvtree.append.unlock_before_count_persist &
fi

# The allocator target (tools/pmcheck/allocator_target.cc, docs/allocator.md):
# the allocator driven directly with run blocks of every class and large
# blocks, in a pool that grows to 20 heap chunks and then reclaims; frees of
# blocks other threads allocated. Clean (with recovery crashes), two threads,
# shared keys, a tiny key space, kills; then its fault switches.
run "allocator clean" 0 --index allocator --keys 24 --ops $((300 * scale)) --images $((2000 * scale)) --images-per-point 3 --lint --timeout 10 --recovery-crashes $((3 * scale)) --recovery-images 40
run "allocator 2 threads" 0 --index allocator --threads 2 --keys 24 --ops $((150 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10
run "allocator shared keys" 0 --index allocator --threads 2 --shared-keys --keys 24 --ops $((200 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10
run "allocator tiny" 0 --index allocator --keys 3 --ops $((300 * scale)) --images $((1000 * scale)) --images-per-point 3 --lint --timeout 10
run "allocator kills" 0 --index allocator --points none --kill $((20 * scale)) --timeout 10
# Persist-path coverage (docs/pmcheck.md): two threads sweeping 100 keys
# each in a pool that may grow to 400 chunks (Pool::Grow 8 times; whole
# runs emptied and returned to the heap by frees, about 34 times); a pool
# of 12 chunks (Reclaim returns free runs, about 20 times); sixteen
# threads (with the sweep's two: ReleaseCache at thread exit 18 times).
run "allocator sweep" 0 --index allocator --threads 2 --sweep --keys 100 --ops $((800 * scale)) --param max_chunks=400 --images $((400 * scale)) --window-images $((200 * scale)) --images-per-point 3 --lint --timeout 10
run "allocator pool full" 0 --index allocator --keys 40 --ops $((1500 * scale)) --param max_chunks=12 --images $((600 * scale)) --window-images $((200 * scale)) --images-per-point 3 --lint --timeout 10
run "allocator 16 threads" 0 --index allocator --threads 16 --keys 24 --ops $((150 * scale)) --images $((600 * scale)) --images-per-point 3 --lint --timeout 10
for fault in pm.alloc.skip_replay pm.alloc.skip_dest_flush pm.alloc.skip_commit_fence pm.alloc.large.skip_state_flush \
    pm.free.skip_bit_flush pm.grow.skip_size_persist; do
  run "allocator fault $fault" 1 --index allocator --keys 24 --ops 300 --images 3000 --images-per-point 3 --stop-after 1 --timeout 10 --fault "$fault"
done
# A new run's unpersisted bitmap shows only on a chunk that held records,
# in a bitmap of several lines: a smaller pool, more ops, a seed that gets there.
run "allocator fault pm.run.skip_bitmap_persist" 1 --index allocator --keys 40 --param max_chunks=12 --ops 1000 --seed 1 --images 3000 --images-per-point 3 --stop-after 1 --timeout 10 --fault pm.run.skip_bitmap_persist
# A missing fence, without a fault switch: --drop-fence K records as if the
# K-th fence call site had no fence. The toy's site 7 (its insert's commit
# fence) and the allocator target's site 4 (Allocate's commit fence; sites
# 1-2 format a run, 3 persists the lane).
run "pmcheck_toy drop-fence 7" 1 --index pmcheck_toy --ops 200 --points all --images-per-point 2 --stop-after 1 --drop-fence 7
run "allocator drop-fence 4" 1 --index allocator --keys 24 --ops 300 --images 3000 --images-per-point 3 --stop-after 1 --timeout 10 --drop-fence 4
# Fence-window images (--window-images) alone: AllocLarge's commit fence
# (site 22 in the GCC build), which 6000 sampled images do not report.
run "allocator drop-fence 22 (window images)" 1 --index allocator --keys 24 --ops 300 --points none --window-images 100 --images-per-point 3 --stop-after 1 --timeout 10 --drop-fence 22
# Scheduled interleavings (--pct, tools/pmcheck/scheduler.h): for every
# concurrent index and pmcheck's pmwcas and allocator targets, 20 PCT
# schedules (4 priority change points each) of one two-thread workload,
# sharing 400 crash images; flushed lines are compared with the shadow at
# every flush (unlogged stores in multi-threaded runs).
for idx in $(printf '%s\nallocator' "$indexes"); do
  # (the probe's own exit status is 2 for a single-threaded index: keep it
  # out of the pipeline, which pipefail would otherwise fail)
  probe=$("$bin" --index "$idx" --threads 2 --points none --ops 1 2>&1 || true)
  grep -q "is not concurrent" <<< "$probe" && continue
  p=$(params "$idx")
  [ "$idx" = allocator ] && p="--keys 24"
  pct_lint=--lint
  # shellcheck disable=SC2086
  run "$idx pct schedules" 0 --index "$idx" --threads 2 --ops $((100 * scale)) --pct 4 --schedules $((20 * scale)) \
    --images $((400 * scale)) --images-per-point 3 $pct_lint --timeout 10 $p
done
# A dropped fence on a persist path of every index (--drop-fence K, the
# K-th fence call site in first-recorded order of the clean line's
# workload): each must be reported by crash images (no lint). Site numbers
# move with the code: when a line fails here, list the sites with
# --site-counts and re-pin K to the named function's commit fence.
drop_fences="
fptree 7 FPTree::InsertInto
fptree_single 12 FPTree::InsertInto
ptree 7 FPTree::InsertInto
fastfair 8 FastFair::Put
nvc_hashmap 12 NvcHashmap::AllocNode
nvtree 8 NVTree::Append
wbtree 8 WBTree::InsertEntry
wbtree_slot 8 WBTree::InsertEntry
pmwcas 8 PMwCAS::Op::Execute
"
while read -r idx k fn; do
  [ -z "$idx" ] && continue
  echo "$indexes" | grep -qx "$idx" || continue
  # shellcheck disable=SC2046
  run "$idx drop-fence $k ($fn)" 1 --index "$idx" --ops 300 --images 1500 --images-per-point 3 --stop-after 1 --timeout 10 \
    $(params "$idx") --drop-fence "$k"
done <<< "$drop_fences"
# Key sweeps (--sweep, docs/pmcheck.md "Persist-path coverage"): whole-range
# ascending and descending runs, so every remove run empties the range:
# leaves are deleted, nodes merge, roots grow and collapse once per run,
# >= 20 times per line where the index has the path (FPTree's leaf
# deletion, FAST & FAIR's GrowRoot / CollapseRoot, wBTree's FreeEmptyLeaf).
# 40 keys over 480 ops (three cycles); FAST & FAIR and wBTree 24 keys over
# 960 ops (ten cycles: their root changes and leaf frees are per cycle).
for idx in $indexes; do
  [ "$idx" = pmwcas ] && continue
  sk=40 sops=480
  case $idx in fastfair|wbtree|wbtree_slot) sk=24 sops=960 ;; esac
  # shellcheck disable=SC2046
  run "$idx sweep" 0 --index "$idx" --sweep --keys $sk --ops $((sops * scale)) --images $((400 * scale)) --images-per-point 3 --lint --timeout 10 $(shrink_params "$idx")
  # Byte keys (their own template instance) for the trees whose leaf
  # deletion, merges and root changes the random lines reach rarely.
  case $idx in
    fptree|fptree_single|ptree|fastfair|wbtree|wbtree_slot)
      # shellcheck disable=SC2046
      run "$idx sweep bytes" 0 --index "$idx" --key-kind bytes --value-kind bytes --sweep --keys $sk --ops $((sops * scale)) --images $((400 * scale)) --images-per-point 3 --lint --timeout 10 $(shrink_params "$idx") ;;
  esac
done
wait

failed=()
for f in "$results"/*.failed; do
  [ -e "$f" ] && failed+=("$(cat "$f")")
done
# Crash images per index over every line (long mode: at least 100,000).
cat "$results"/*.images 2>/dev/null | awk '{ n[$1] += $2 } END { for (i in n) printf "%s %d\n", i, n[i] }' | sort |
  while read -r idx n; do stamp "crash images: $idx $n"; done
stamp "done: ${#failed[@]} failure(s)"
for f in "${failed[@]}"; do echo "  $f" >&2; done
[ ${#failed[@]} -eq 0 ]
