#!/usr/bin/env bash
# pmkv_test.sh: pmkv end to end: put/get/remove/count/scan/info on byte and
# u64 stores, load and dump round trips in TSV and JSON lines (with bytes that
# need escaping), reopen, and the exit codes (0 ok, 1 not found / error, 2 usage,
# 3 the pool cannot be opened).
#   pmkv_test.sh PATH/TO/pmkv
set -uo pipefail
pmkv=$1
dir=$(mktemp -d /dev/shm/pmkv-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
fails=0
expect() {  # expect CODE CMD...: runs CMD, checks its exit code
  local want=$1; shift
  "$@" >"$dir/out" 2>"$dir/err"; local got=$?
  if [ "$got" != "$want" ]; then echo "FAIL (exit $got, want $want): $*"; cat "$dir/err"; fails=$((fails+1)); fi
}
same() {  # same WANT: compares the last command's stdout
  if [ "$(cat "$dir/out")" != "$1" ]; then echo "FAIL: got '$(cat "$dir/out")', want '$1'"; fails=$((fails+1)); fi
}

p=$dir/a.pool
expect 2 "$pmkv"
expect 2 "$pmkv" frobnicate "$p"
expect 2 "$pmkv" get "$p"
expect 3 "$pmkv" get "$p" k            # no pool yet
expect 0 "$pmkv" put "$p" apple red
expect 0 "$pmkv" put "$p" banana yellow
expect 0 "$pmkv" put "$p" cherry dark
expect 0 "$pmkv" get "$p" apple; same red
expect 1 "$pmkv" get "$p" durian
expect 0 "$pmkv" count "$p"; same 3
expect 0 "$pmkv" count "$p" --above apple; same 2
expect 0 "$pmkv" count "$p" --above apple --below cherry; same 1
expect 0 "$pmkv" scan "$p" --from b; same $'banana\tyellow\ncherry\tdark'
expect 0 "$pmkv" scan "$p" --to banana; same $'apple\tred'
expect 0 "$pmkv" scan "$p" --limit 1; same $'apple\tred'
expect 0 "$pmkv" remove "$p" banana
expect 1 "$pmkv" remove "$p" banana
expect 0 "$pmkv" info "$p"
grep -q "engine: fptree" "$dir/out" || { echo "FAIL: info"; fails=$((fails+1)); }
expect 0 "$pmkv" info "$p" --json
grep -q '"records": 2' "$dir/out" || { echo "FAIL: info --json"; fails=$((fails+1)); }
expect 1 "$pmkv" --engine fastfair get "$p" apple   # owned by another engine
expect 1 "$pmkv" --engine no_such_engine put "$dir/b.pool" k v
expect 2 "$pmkv" --param nonsense put "$p" k v
expect 2 "$pmkv" --key-kind float put "$dir/c.pool" k v

# load / dump round trips with awkward bytes, per format, on two engines.
printf 'nl\\nx\tv\\x00\\xff\nplain\tslash\\\\\ntab\\there\tv1\n' > "$dir/in.tsv"  # in key order
for eng in fptree fastfair; do
  for fmt in tsv jsonl; do
    q=$dir/$eng-$fmt.pool
    expect 0 "$pmkv" --engine $eng load "$q" "$dir/in.tsv"
    expect 0 "$pmkv" dump "$q" "$dir/out.$fmt" --format $fmt
    r=$dir/$eng-$fmt-2.pool
    expect 0 "$pmkv" --engine $eng load "$r" "$dir/out.$fmt" --format $fmt --progress
    grep -q "loaded 3 records" "$dir/err" || { echo "FAIL: load message"; fails=$((fails+1)); }
    expect 0 "$pmkv" dump "$r"
    if [ "$(cat "$dir/out")" != "$(cat "$dir/in.tsv")" ]; then echo "FAIL: $eng $fmt round trip"; cat "$dir/out"; fails=$((fails+1)); fi
  done
done
printf 'no tab here\n' > "$dir/bad.tsv"
expect 1 "$pmkv" load "$dir/d.pool" "$dir/bad.tsv"
printf '{"key": 1}\n' > "$dir/bad.jsonl"
expect 1 "$pmkv" load "$dir/e.pool" "$dir/bad.jsonl" --format jsonl
expect 1 "$pmkv" load "$dir/e.pool" "$dir/missing.tsv"

# u64 keys: numeric order and decimal text; a hash engine refuses ranges.
u=$dir/u.pool
printf '300\t3\n20\t2\n1\t1\n' | expect 0 "$pmkv" --key-kind u64 --value-kind u64 load "$u" -
expect 0 "$pmkv" scan "$u"; same $'1\t1\n20\t2\n300\t3'
expect 1 "$pmkv" put "$u" notanumber 5
h=$dir/h.pool
expect 0 "$pmkv" --engine nvc_hashmap put "$h" k v
expect 0 "$pmkv" count "$h"; same 1
expect 1 "$pmkv" scan "$h"
expect 1 "$pmkv" count "$h" --above a

if [ $fails -ne 0 ]; then echo "$fails pmkv checks failed"; exit 1; fi
echo "pmkv: all checks passed"
