#!/usr/bin/env bash
# Simulated cache misses per insert and per find of nvc_bench targets
# (docs/nvc_hashmap.md, "Figures"): each target runs once under callgrind
# with a cache model (D1 64 KiB 8-way, LL 8 MiB 16-way, 64-byte lines;
# prefetches are not simulated), one thread, a fixed-size pool (nvc_bench
# --fixed_pool: valgrind cannot reserve the 64 GiB growth range). The
# inclusive cost of the bench's insert worker (its lambda #1) and find worker
# (#2), divided by N, is printed per op: instructions, D1 read + write misses,
# LL read + write misses. For nvc_hashmap targets two more lines split the
# find: its entry (Find's own cost: hash, epoch guard, bucket-table slot,
# value and erratum checks) and its chain (Search called from Find). The
# counts do not depend on the machine's load.
#   bench/nvc_hashmap/nvc_cachegrind.sh N target...
#   e.g. bench/nvc_hashmap/nvc_cachegrind.sh 100000 nvc_hashmap nvc_hashmap:load_factor=4 fptree
# NVC_BENCH overrides the binary (default build/bin/nvc_bench).
set -uo pipefail
n=$1
shift
bench=${NVC_BENCH:-build/bin/nvc_bench}
for t in "$@"; do
  out=$(mktemp /tmp/nvc_cachegrind.XXXXXX)
  valgrind --tool=callgrind --cache-sim=yes --D1=65536,8,64 --LL=8388608,16,64 --callgrind-out-file="$out" \
    "$bench" --n "$n" --rounds 1 --threads 1 --targets "$t" --fixed_pool >/dev/null 2>&1
  callgrind_annotate --inclusive=yes "$out" 2>/dev/null |
    grep -E "Parallel<.*RunIndex.*lambda\(int, unsigned long, unsigned long\)#[12]" |
    while read -r line; do
      which=$(grep -oE "lambda\(int, unsigned long, unsigned long\)#[12]" <<< "$line" | tail -c 2)
      op=find
      [ "$which" = 1 ] && op=insert
      # Columns: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw, each "value (pct%)" or "."
      # shellcheck disable=SC2046
      set -- $(grep -oE "^ *(([0-9,]+ \( *[0-9.]+%\)|\.) +){9}" <<< "$line" | sed -E 's/\( *[0-9.]+%\)//g; s/,//g')
      awk -v t="$t" -v op="$op" -v n="$n" -v ir="$1" -v d1r="$5" -v d1w="$6" -v llr="$8" -v llw="$9" \
        'BEGIN { printf "%-30s %-6s instr %6.0f  D1 misses r+w %5.2f + %5.2f  LL misses r+w %5.2f + %5.2f\n", t, op, ir / n, d1r / n, d1w / n, llr / n, llw / n }'
    done
  # nvc_hashmap targets: the find split into its entry (Find's own cost: hash,
  # epoch guard, bucket-table slot, value and erratum checks) and its chain
  # (Search called from Find), per find (docs/nvc_hashmap.md, "Where a find's
  # misses go").
  callgrind_annotate --tree=caller "$out" 2>/dev/null |
    awk -v t="$t" -v n="$n" '
      # Columns: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw, each "value (pct%)" or ".".
      function cols(line, a,   i, k, f, m) {
        m = split(line, f, /[ \t]+/); k = 0
        for (i = 1; i <= m && k < 9; i++) {
          if (f[i] == ".") a[++k] = 0
          else if (f[i] ~ /^[0-9,]+$/) { gsub(/,/, "", f[i]); a[++k] = f[i] + 0 }
        }
      }
      # Blocks: caller lines ("< fn"), then the function ("* fn"), then a blank.
      / < .*NvcHashmap::Find\(/ { caller = $0 }
      / \*  .*NvcHashmap::Search\(/ && caller != "" { cols(caller, c); chain = 1 }
      / \*  .*NvcHashmap::Find\(/ { cols($0, s); self = 1 }
      /^$/ { caller = "" }
      END {
        if (self) printf "%-30s find entry  instr %6.0f  D1 read misses %5.2f  LL read misses %5.2f\n", t, s[1] / n, s[5] / n, s[8] / n
        if (chain) printf "%-30s find chain  instr %6.0f  D1 read misses %5.2f  LL read misses %5.2f\n", t, c[1] / n, c[5] / n, c[8] / n
      }'
  rm -f "$out"
done
