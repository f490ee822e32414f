#!/usr/bin/env bash
# bench/server/figures.sh: the figures of docs/server.md. SET and GET
# throughput and latency percentiles (build/bin/server_load, closed loop, one
# connection per client thread) for memcached, pmindex-server on dram_btree
# and pmindex-server on fptree, with 1 and 2 server threads, in one run; then
# restart times with 1M and 10M items (pmindex-server after SIGTERM and after
# SIGKILL; memcached's warm restart from its -e memory file after a graceful
# SIGUSR1 stop, and what it holds after SIGKILL).
#   bash bench/server/figures.sh [BUILD_DIR]        (default: build)
# Env: RUN_SECONDS (10), KEYS (1000000: key space of the throughput runs),
# VALUE (100 bytes), CLIENTS (4 client threads), RESTART_ITEMS ("1000000
# 10000000"), DIR (/dev/shm: pools and memcached's memory file), PORT (22411),
# MC_MB (4096: memcached's -m, also the size of its memory file in DIR).
# Needs memcached and a release build of pmindex-server and server_load
# (bash scripts/build.sh release pmindex-server server_load). Results are
# printed as lines "figure ... key=value ..."; nothing is written elsewhere.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
RUN_SECONDS=${RUN_SECONDS:-10} KEYS=${KEYS:-1000000} VALUE=${VALUE:-100} CLIENTS=${CLIENTS:-4}
RESTART_ITEMS=${RESTART_ITEMS:-"1000000 10000000"} DIR=${DIR:-/dev/shm} PORT=${PORT:-22411} MC_MB=${MC_MB:-4096}
SRV=$B/bin/pmindex-server LOAD=$B/bin/server_load
MC=(memcached -U 0 -l 127.0.0.1 -p "$PORT" -m "$MC_MB" -I 1m)
[ "$(id -u)" = 0 ] && MC+=(-u root)
pid=
trap '[ -n "$pid" ] && kill -9 $pid 2>/dev/null; rm -f "$DIR"/figures-*.pool "$DIR"/figures-mc.*' EXIT

now() { date +%s.%N; }
# Waits until the port accepts; sets ELAPSED to the seconds since $1.
wait_port() {
  until (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; do sleep 0.005; done
  ELAPSED=$(echo "$(now) - $1" | bc)
}
items() {  # curr_items of the running server
  exec 3<>/dev/tcp/127.0.0.1/$PORT
  printf 'stats\r\nquit\r\n' >&3
  tr -d '\r' <&3 | awk '$2 == "curr_items" { print $3 }'
  exec 3<&-
}
stop() { kill -"${1:-TERM}" "$pid"; wait "$pid" 2>/dev/null || true; pid=; }
start_target() {  # target threads [extra args]; sets pid and ELAPSED (start to accepting)
  local target=$1 t=$2
  shift 2
  local t0
  t0=$(now)
  case $target in
    memcached) "${MC[@]}" -t "$t" "$@" >"$DIR/figures-mc.log" 2>&1 & ;;
    *) "$SRV" --engine "$target" --pool "$DIR/figures-$target.pool" --port "$PORT" -t "$t" --pool_size 1024 "$@" \
         >/dev/null 2>&1 & ;;
  esac
  pid=$!
  wait_port "$t0"
}

# ---- throughput and latency ----
for t in 1 2; do
  for target in memcached dram_btree fptree; do
    rm -f "$DIR/figures-$target.pool"
    start_target "$target" "$t"
    $LOAD --server 127.0.0.1:$PORT --mode load --keys "$KEYS" --value_size "$VALUE" --threads "$CLIENTS" >/dev/null
    for mode in set get; do
      echo "figure throughput target=$target server_threads=$t $($LOAD --server 127.0.0.1:$PORT --mode $mode \
        --keys "$KEYS" --value_size "$VALUE" --threads "$CLIENTS" --seconds "$RUN_SECONDS")"
    done
    stop
    rm -f "$DIR/figures-$target.pool"
  done
done

# ---- restart ----
for n in $RESTART_ITEMS; do
  # pmindex-server on fptree: clean stop, restart; then SIGKILL, restart.
  rm -f "$DIR/figures-fptree.pool"
  start_target fptree 2
  $LOAD --server 127.0.0.1:$PORT --mode load --keys "$n" --value_size "$VALUE" --threads "$CLIENTS" >/dev/null
  stop TERM
  start_target fptree 2
  echo "figure restart target=fptree items=$n after=SIGTERM seconds=$ELAPSED curr_items=$(items)"
  stop KILL
  start_target fptree 2
  echo "figure restart target=fptree items=$n after=SIGKILL seconds=$ELAPSED curr_items=$(items)" \
       "$($LOAD --server 127.0.0.1:$PORT --mode verify --keys "$n" --value_size "$VALUE" --threads "$CLIENTS")"
  stop
  rm -f "$DIR/figures-fptree.pool"
  # memcached: warm restart from the memory file after SIGUSR1; nothing after SIGKILL.
  rm -f "$DIR"/figures-mc.mem*
  start_target memcached 2 -e "$DIR/figures-mc.mem"
  $LOAD --server 127.0.0.1:$PORT --mode load --keys "$n" --value_size "$VALUE" --threads "$CLIENTS" >/dev/null
  stop USR1
  start_target memcached 2 -e "$DIR/figures-mc.mem"
  echo "figure restart target=memcached items=$n after=SIGUSR1 seconds=$ELAPSED curr_items=$(items)"
  grep -h '\[restart\]' "$DIR/figures-mc.log" | sed 's/^/  memcached: /' || true  # why a warm restart failed
  stop KILL
  start_target memcached 2 -e "$DIR/figures-mc.mem"
  echo "figure restart target=memcached items=$n after=SIGKILL seconds=$ELAPSED curr_items=$(items)"
  stop
  rm -f "$DIR"/figures-mc.mem*
done
