#!/usr/bin/env bash
# Persist-path coverage of pmcheck's CI workloads (issue 19), per index:
#   scripts/pmcheck-coverage.sh [--update docs/pmcheck.md] [build-dir]
# Records the workload of every clean line tools/pmcheck/ci.sh runs for an
# index (one thread, two threads, shared keys, shared writes, byte keys, the 30-key and
# 3-key spaces in u64 and bytes, FPTree's flip updates, FAST & FAIR's
# rebalances and empty merges, the key sweeps) plus a fill-then-drain line
# (--drain: half the ops remove, so leaves empty, nodes merge and roots
# collapse), with --points none and --site-counts: how often each flush
# and fence call site ran. Sites are symbolised to their enclosing (not
# inlined) function with addr2line, and
# the table lists, per function of the index or of src/pm, its flush and
# fence sites, how often they ran in total, and its least-run site; a
# function whose least-run site ran fewer than 20 times is a gap (the
# crash images are sampled over these recordings, so a site that ran 5
# times is crashed around at most a few times per CI run). Fault switches:
# those declared in the index's sources (PMINDEX_FAULT("...")) and whether
# ci.sh has a line that must report each.
# --update FILE replaces the text between "<!-- coverage:begin -->" and
# "<!-- coverage:end -->" in FILE with the table; otherwise it is printed.
# --only IDX (repeatable) records only those indexes (quicker; do not
# combine with --update). --sites also prints, under each index's table,
# every site (function, kind, object+offset, runs), least-run first.
set -uo pipefail
cd "$(dirname "$0")/.."
update="" only="" sites=0
while [ $# -gt 0 ]; do
  case $1 in
    --update) update=$2; shift 2 ;;
    --only) only+=" $2"; shift 2 ;;
    --sites) sites=1; shift ;;
    *) break ;;
  esac
done
dir=${1:-build}
bin=$dir/bin/pmcheck
[ -x "$bin" ] || { echo "pmcheck-coverage: $bin not built" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The index parameters ci.sh uses (params / shrink_params there).
params() {
  case $1 in
    fptree|fptree_single|ptree) echo "--param leaf_size=8" ;;
    fastfair) echo "--param node_size=256" ;;
    nvc_hashmap) echo "--param initial_buckets=16" ;;
    nvtree) echo "--param leaf_size=8 --param inner_size=4" ;;
    wbtree|wbtree_slot) echo "--param leaf_size=4 --param inner_size=3" ;;
    allocator) echo "--keys 24" ;;
    bztree) echo "--param node_size=256" ;;
    clfbtree) echo "--param leaf_size=128" ;;
  esac
}
shrink_params() {
  case $1 in
    fptree|fptree_single|ptree) echo "--param leaf_size=8 --param inner_size=3" ;;
    nvtree) echo "--param leaf_size=4 --param inner_size=2" ;;
    allocator) echo "" ;;
    *) params "$1" ;;
  esac
}
src_dir() {
  case $1 in
    fptree|fptree_single|ptree) echo src/fptree ;;
    wbtree|wbtree_slot) echo src/wbtree ;;
    allocator) echo src/pm ;;
    pmwcas) echo src/pm ;;
    *) echo "src/$1" ;;
  esac
}

record() {  # record <index> <args...>: appends site counts to $tmp/<index>.sites
  local idx=$1
  shift
  # shellcheck disable=SC2068
  "$bin" --index "$idx" --points none --site-counts "$tmp/$idx.sites" $@ >/dev/null 2>&1
  echo x >> "$tmp/$idx.lines"
}

indexes=$("$bin" --list | grep -v -e '^pmcheck_toy$')
[ -n "$only" ] && indexes=$(echo "$indexes" | grep -xF -f <(tr ' ' '\n' <<< "$only" | grep .))
for idx in $indexes; do
  p=$(params "$idx")
  sp=$(shrink_params "$idx")
  kinds="u64"
  [ "$idx" = allocator ] || [ "$idx" = pmwcas ] || kinds="u64 bytes"
  record "$idx" --ops 300 $p
  if ! "$bin" --index "$idx" --threads 2 --points none --ops 1 2>&1 | grep -q "is not concurrent"; then
    record "$idx" --threads 2 --ops 150 $p
    record "$idx" --threads 2 --shared-keys --keys 24 --ops 200 $p
    if [ "$idx" != allocator ]; then  # shared writes (the allocator target has none)
      record "$idx" --threads 2 --shared-keys --shared-writes --keys 8 --ops 300 $p
      [ "$idx" = pmwcas ] || record "$idx" --threads 2 --shared-keys --shared-writes --keys 8 --key-kind bytes --value-kind bytes --ops 100 --pct 4 --schedules 10 $p
      # Races on the shared keys: eight threads, one own key each.
      record "$idx" --threads 8 --shared-keys --shared-writes --keys 1 --ops 400 $p
      [ "$idx" = pmwcas ] || record "$idx" --threads 8 --shared-keys --shared-writes --keys 1 --key-kind bytes --value-kind bytes --ops 400 $p
    fi
  fi
  for kk in $kinds; do
    kv="--key-kind $kk --value-kind $kk"
    [ "$kk" = bytes ] && record "$idx" $kv --ops 150 $p
    [ "$idx" = allocator ] || record "$idx" $kv --keys 30 --ops 400 $sp
    record "$idx" $kv --keys 3 --ops 300 $sp
    # The delete-heavy phase: fill, then drain.
    record "$idx" $kv --keys 40 --ops 600 --drain $sp
  done
  case $idx in
    fptree|fptree_single|ptree) record "$idx" --ops 300 $p --param update=flip ;;
    fastfair) for kk in u64 bytes; do record "$idx" --key-kind $kk --value-kind $kk --keys 80 --ops 1500 $p; done ;;
  esac
  # ci.sh's key-sweep line (and FAST & FAIR's empty-right-leaf merges).
  case $idx in
    pmwcas|allocator) ;;
    fastfair|wbtree|wbtree_slot)
      for kk in u64 bytes; do record "$idx" --key-kind $kk --value-kind $kk --sweep --keys 24 --ops 960 $sp; done ;;
    fptree|fptree_single|ptree)
      for kk in u64 bytes; do record "$idx" --key-kind $kk --value-kind $kk --sweep --keys 40 --ops 480 $sp; done ;;
    *) record "$idx" --sweep --keys 40 --ops 480 $sp ;;
  esac
  if [ "$idx" = fastfair ]; then
    for kk in u64 bytes; do record "$idx" --key-kind $kk --value-kind $kk --sweep --keys 24 --ops 192 $p --param merge_below=1; done
    # ci.sh's rebalance sweeps and deep sweep (not its two-thread merges
    # lint line: no crash images).
    for kk in u64 bytes; do record "$idx" --key-kind $kk --value-kind $kk --sweep --keys 60 --ops 960 --param node_size=384; done
    record "$idx" --sweep --keys 120 --ops 1920 $p
  fi
  # ci.sh's wBTree deep sweeps and fptree_single's one-leaf groups.
  case $idx in
    wbtree|wbtree_slot)
      record "$idx" --sweep --keys 400 --ops 400 $p
      record "$idx" --key-kind bytes --value-kind bytes --sweep --keys 2000 --ops 2000 --param leaf_size=2 --param inner_size=3 ;;
    fptree_single)
      for kk in u64 bytes; do record "$idx" --key-kind $kk --value-kind $kk --sweep --keys 6 --ops 600 --param leaf_size=2 --param inner_size=3 --param group_size=1; done ;;
  esac
  # ci.sh's clean lines of clfB-tree's other configurations.
  if [ "$idx" = clfbtree ]; then
    for cfg in "leaf=encoded parent=inplace" "leaf=encoded parent=shadow" "leaf=append parent=shadow"; do
      set -- $cfg
      record "$idx" --ops 300 --param leaf_size=128 --param "$1" --param "$2"
    done
    record "$idx" --key-kind bytes --value-kind bytes --keys 30 --ops 300 --param leaf=encoded --param parent=shadow
  fi
  # ci.sh's coverage lines of bztree, nvc_hashmap, the allocator and pmwcas targets.
  case $idx in
    bztree)
      record "$idx" --threads 4 --shared-keys --keys 4 --ops 400 $p ;;  # contention
    nvc_hashmap)
      record "$idx" --keys 200 --ops 300 $p  # growth lint
      for kk in u64 bytes; do
        record "$idx" --key-kind $kk --value-kind $kk --sweep --keys 320 --ops 1280 --param initial_buckets=1 --param load_factor=1
        record "$idx" --key-kind $kk --value-kind $kk --threads 8 --shared-keys --keys 2 --ops 400 --param initial_buckets=1 --param load_factor=1
      done
      record "$idx" --key-kind bytes --value-kind bytes --keys 3 --ops 3000 $p ;;
    allocator)
      record "$idx" --threads 2 --sweep --keys 100 --ops 800 --param max_chunks=400
      record "$idx" --keys 40 --ops 1500 --param max_chunks=12
      record "$idx" --threads 16 --keys 24 --ops 150 ;;
    pmwcas) record "$idx" --threads 16 --shared-keys --keys 3 --ops 150 ;;
  esac
done

# Functions that run about once per recorded line by nature, not structure
# changes (issue 19: "per run", not a gap): creation (Format, InitNew) and
# open (Recover), whose crashes the --recovery-crashes lines (double
# crashes) and the kill lines cover; FAST & FAIR's lazy Repair of a node
# not repaired since the open (in a recording only the root creation
# leaves at gen 0; LockAt's one site is Repair's tail-called fence,
# attributed to its caller) and the retire list's Claim (its fence follows
# the slot array's lazy allocation, once per pool): the kill lines reopen
# and repair, and the lines' --window-images crash before every fence
# site, rarest first.
# NVC-Hashmap's Finish (the end of every create and open) and the pmcheck
# targets' Create (their root) too.
perrun='::(Format|InitNew|Recover)$|fastfair::FastFair<(true|false)>::(Repair|LockAt)$|kit::PmRetireList::Claim$|nvc::NvcHashmap::Finish$|pmcheck::.anon.::(AllocMap|PwMap)::Create$'
# Functions with one branch that only the state creation leaves takes (once
# per recorded line): "per run" only while every other site ran >= 20 times.
# fptree_single's LinkNewGroup links the first group at the list head
# (groups_tail 0) only in Format; FAST & FAIR's FixLk on an empty leaf (its
# SetTail, whose fence is a tail call attributed to Put) runs when key 0
# is inserted into the root leaf Format made with lk 0 (a u64 tree's lk
# only rises after that, and only the root leaf is left empty).
perrun_branch='fptree::FPTree<false, (false|true)>::LinkNewGroup$|fastfair::FastFair<false>::Put$|fastfair::NodeOps::FixLk$'
# Allocator paths in an index's table (thread-cache release at thread exit,
# pool growth): the allocator target's own lines run them >= 20 times (its
# table); an index reaches them only incidentally.
alloc_fn='^pmindex::pm::(alloc_internal::PoolAllocator::|Pool::Grow$)'

# Symbolise: "kind object+0xoff count" -> "function kind count" (the return
# address minus one is inside the call).
symbolise() {  # symbolise <sites file>
  awk '{ split($2, a, "+"); print a[1], a[2], $1, $3 }' "$1" | sort -k1,1 -k2,2 -k3,3 |
    awk '{ k = $1 " " $2 " " $3; n[k] += $4 } END { for (k in n) print k, n[k] }' | sort > "$1.sum"
  : > "$1.fn"
  local obj path
  for obj in $(awk '{print $1}' "$1.sum" | sort -u); do
    path=$(find "$dir/lib" "$dir/bin" -maxdepth 1 -name "$obj" 2>/dev/null | head -1)
    [ -z "$path" ] && path=$(find "$dir" -name "$obj" -type f 2>/dev/null | head -1)
    grep "^$obj " "$1.sum" | while read -r _ off kind count; do
      fn=$(addr2line -f -C -e "$path" "$(printf '0x%x' $((off - 1)))" 2>/dev/null | head -1)
      fn=${fn//(anonymous namespace)/\{anon\}}  # else the cut below leaves "pmcheck::" for every target function
      fn=${fn%%(*}
      echo -e "$fn\t$kind\t$count\t$obj+$off"
    done >> "$1.fn"
  done
}

faults_of() {  # fault switches declared in an index's sources
  grep -rhoE 'PMINDEX_FAULT\("[a-z0-9_.]+"\)' "$(src_dir "$1")" --include='*.cc' --include='*.h' 2>/dev/null |
    sed -E 's/PMINDEX_FAULT\("(.*)"\)/\1/' | sort -u | case $1 in
      pmwcas) grep '^pmwcas\.' ;;
      allocator) grep -v '^pmwcas\.' ;;
      wbtree_slot|ptree|fptree_single) grep -v . ;;  # their switches are listed under wbtree / fptree
      *) cat ;;
    esac
}

{
  echo "Generated by scripts/pmcheck-coverage.sh from the recordings of the CI lines' workloads plus a"
  echo "fill-then-drain line (\`--drain\`, 40 keys, 600 ops, u64 and byte keys) per index: how often each"
  echo "flush and fence call site ran, grouped by the function that contains it (inlined helpers count"
  echo "in their caller). *gap*: the function's least-run site ran fewer than 20 times."
  echo "*per run*: the same, for a function that runs about once per recorded line by nature (creation,"
  echo "open, FAST & FAIR's lazy repair of the root creation leaves, the retire list's lazy slot array);"
  echo "the clean lines' --recovery-crashes, the kill lines and the fence-window images crash inside them."
  echo "*allocator path*: an allocator function reached incidentally by an index; the allocator target's"
  echo "table below counts its own lines' runs of it."
  for idx in $indexes; do
    f=$tmp/$idx.sites
    [ -s "$f" ] || continue
    symbolise "$f"
    nlines=$(wc -l < "$tmp/$idx.lines")
    echo
    echo "#### $idx ($nlines recorded lines)"
    echo
    echo "| function | flush sites | fence sites | runs | least-run site |"
    echo "|---|---|---|---|---|"
    awk -F'\t' '{ n[$1] += $3; if ($2 == "flush") fl[$1]++; else fe[$1]++;
                  if (!($1 in m) || $3 < m[$1]) { if ($1 in m) m2[$1] = m[$1]; m[$1] = $3 }
                  else if (!($1 in m2) || $3 < m2[$1]) m2[$1] = $3 }
                END { for (k in n) printf "%s\t%d\t%d\t%d\t%d\t%d\n", k, fl[k], fe[k], n[k], m[k], (k in m2) ? m2[k] : m[k] }' "$f.fn" |
      sort -t$'\t' -k4,4nr |
      awk -F'\t' -v perrun="$perrun" -v branch="$perrun_branch" -v alloc="$alloc_fn" -v idx="$idx" '{
                    gap = $5 < 20 ? ($1 ~ perrun ? " per run" : " *gap*") : "";
                    if ($5 < 20 && idx != "allocator" && $1 ~ alloc) gap = " allocator path (its own table)";
                    if ($5 < 20 && $1 ~ branch && $6 >= 20) gap = " per run (creation branch; next site " $6 ")";
                    name = $1; gsub(/\|/, "\\|", name);
                    printf "| `%s` | %d | %d | %d | %d%s |\n", name, $2, $3, $4, $5, gap }'
    if [ "$sites" = 1 ]; then
      echo
      echo "Sites of $idx (least-run first): function, kind, site, runs"
      echo
      sort -t$'\t' -k3,3n "$f.fn" | awk -F'\t' '{ printf "    %s %s %s %d\n", $1, $2, $4, $3 }'
    fi
    fl=$(faults_of "$idx")
    if [ -n "$fl" ]; then
      echo
      printf "Fault switches:"
      for s in $fl; do
        if grep -q -- "$s" tools/pmcheck/ci.sh; then printf " \`%s\` (in ci.sh)" "$s"; else printf " \`%s\` (not in ci.sh)" "$s"; fi
      done
      echo
    fi
  done
} > "$tmp/table.md"

if [ -n "$update" ]; then
  awk -v t="$tmp/table.md" '
    /<!-- coverage:begin -->/ { print; while ((getline l < t) > 0) print l; skip = 1; next }
    /<!-- coverage:end -->/ { skip = 0 }
    !skip { print }' "$update" > "$tmp/doc" && cp "$tmp/doc" "$update"
else
  cat "$tmp/table.md"
fi
