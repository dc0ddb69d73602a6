#!/usr/bin/env bash
# The service's memory from one profile to the next: one `heapprofd-rs
# daemon` in a private HEAPPROFD_SERVICE_DIR, then ROUNDS profiles of
# `record --all`, each with N preloaded `ls /` run one after the other and
# ended by SIGINT; prints the daemon's VmRSS (KiB) after each profile and
# what it forgot when idle (docs/PERFORMANCE.md, "The service at scale").
#
# usage: scripts/bench-service-rounds.sh [BIN_DIR [ROUNDS [N]]]
#   BIN_DIR: holds heapprofd-rs and libheapprofd_client.so [target/release]
set -u
bin=${1:-target/release}; rounds=${2:-8}; n=${3:-300}
bin=$(cd "$bin" && pwd)
svc=$(mktemp -d /tmp/heapprofd-rounds.XXXX)
HEAPPROFD_SERVICE_DIR=$svc "$bin/heapprofd-rs" daemon 2>"$svc/log" &
dpid=$!
trap 'kill -TERM $dpid 2>/dev/null; rm -rf "$svc"' EXIT
while [ ! -S "$svc/control.sock" ]; do sleep 0.05; done
rss() { awk '/VmRSS/{print $2}' "/proc/$dpid/status"; }
echo "start rss_kb=$(rss)"
for r in $(seq 1 "$rounds"); do
  HEAPPROFD_SERVICE_DIR=$svc "$bin/heapprofd-rs" record --all -o "$svc/t$r.pftrace" 2>"$svc/rec$r.log" &
  rp=$!
  while [ ! -f "$svc/triggers" ]; do sleep 0.05; done
  for _ in $(seq 1 "$n"); do
    HEAPPROFD_SERVICE_DIR=$svc LD_PRELOAD=$bin/libheapprofd_client.so ls / >/dev/null
  done
  kill -INT $rp; wait $rp
  sleep 0.5
  echo "round $r rss_kb=$(rss) $(grep -o '[0-9]* processes' "$svc/rec$r.log" | head -1)"
  rm -f "$svc/t$r.pftrace"
done
kill -TERM $dpid; wait $dpid
grep -o "forgot.*" "$svc/log" | head -3
