#!/usr/bin/env bash
# Debian's libmemcached tools against pmindex-server (docs/server.md):
# memccp / memccat / memcexist / memctouch / memcrm / memcflush / memcstat
# round trips, memcslap and memcaslap (which verifies every value it reads)
# load, memccapable's ASCII conformance tests, and a stop with SIGTERM after
# which a restarted server still serves what memccp stored.
#   memc_tools_test.sh PATH/TO/pmindex-server
# Exits 77 (ctest: skipped) when the tools are not installed.
set -euo pipefail
server=$1
for t in memccp memccat memcrm memcexist memcstat memcflush memctouch; do
  command -v "$t" >/dev/null || { echo "SKIP: $t not installed (apt install libmemcached-tools)"; exit 77; }
done
dir=$(mktemp -d /dev/shm/pmindex-memc.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -f "$dir/log" ] && cat "$dir/log"; exit 1; }

start() {
  : >"$dir/log"
  "$server" --engine fptree --pool "$dir/pool" --port 0 --threads 2 2>"$dir/log" &
  pid=$!
  for _ in $(seq 200); do
    port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/log")
    [ -n "$port" ] && break
    kill -0 "$pid" 2>/dev/null || fail "server exited at start"
    sleep 0.05
  done
  [ -n "$port" ] || fail "server did not report its port"
  S="127.0.0.1:$port"
}

start
mkdir "$dir/files"
printf 'hello world\n' >"$dir/files/a.txt"
head -c 200000 /dev/urandom >"$dir/files/b.bin"
: >"$dir/files/empty"
memccp --servers="$S" --flags=7 "$dir/files/a.txt" "$dir/files/b.bin" "$dir/files/empty" || fail memccp
[ "$(memccat --servers="$S" a.txt)" = "hello world" ] || fail "memccat a.txt"
memccat --servers="$S" --file="$dir/b.out" b.bin || fail "memccat b.bin"
cmp "$dir/files/b.bin" "$dir/b.out" || fail "b.bin differs"
memccat --servers="$S" --flags a.txt 2>&1 | grep -q 7 || fail "flags not kept"
memcexist --servers="$S" a.txt || fail memcexist
memcexist --servers="$S" nosuchkey && fail "memcexist of a missing key"
memctouch --servers="$S" --expire=1000 a.txt || fail memctouch
memcrm --servers="$S" a.txt || fail memcrm
memccat --servers="$S" a.txt >/dev/null 2>&1 && fail "a.txt still there after memcrm"
memcstat --servers="$S" | grep -q "engine: fptree" || fail "memcstat shows no engine"
memccp --servers="$S" --add "$dir/files/a.txt" || fail "memccp --add"

# A clean stop and a restart keep what was stored.
kill -TERM "$pid"
wait "$pid" || fail "exit status after SIGTERM"
grep -q "store closed" "$dir/log" || fail "no clean close"
start
memccat --servers="$S" --file="$dir/b.out" b.bin || fail "memccat after restart"
cmp "$dir/files/b.bin" "$dir/b.out" || fail "b.bin differs after restart"
[ "$(memccat --servers="$S" a.txt)" = "hello world" ] || fail "a.txt after restart"

# A second server on the same pool is refused.
if "$server" --engine fptree --pool "$dir/pool" --port 0 2>"$dir/second"; then fail "second server started"; fi
grep -q "already open" "$dir/second" || { cat "$dir/second"; fail "second server: unclear error"; }

# Load generators: memcslap sets and gets; memcaslap checks every value it reads.
memcslap --servers="$S" --concurrency=4 --execute-number=300 --test=set >/dev/null || fail "memcslap set"
memcslap --servers="$S" --concurrency=4 --execute-number=300 --initial-load=300 --test=get >/dev/null ||
  fail "memcslap get"
if command -v memcaslap >/dev/null; then
  memcaslap -s "$S" -T 2 -c 8 -x 2000 --verify=1.0 >"$dir/aslap" 2>&1 || { cat "$dir/aslap"; fail memcaslap; }
  grep -q "^verify_failed: 0" "$dir/aslap" && grep -q "^get_misses: 0" "$dir/aslap" && grep -q "Ops: 2000" "$dir/aslap" ||
    { cat "$dir/aslap"; fail "memcaslap verification"; }
fi

memcflush --servers="$S" || fail memcflush
memccat --servers="$S" b.bin >/dev/null 2>&1 && fail "b.bin still there after flush"

if command -v memccapable >/dev/null; then
  memccapable -a -h 127.0.0.1 -p "$port" -t 5 >"$dir/capable" 2>&1 || { cat "$dir/capable"; fail memccapable; }
fi
kill -TERM "$pid"
wait "$pid" || fail "exit status after SIGTERM"
pid=
echo "memc_tools_test: OK"
