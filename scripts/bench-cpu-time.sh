#!/usr/bin/env bash
# The CPU-time profiler's cost inside the profiled process: the cost of
# one sample (tests/programs/cpu/signal_cost.c: a signal whose handler
# records its stack, bare and under `record`), and the CPU time
# (getrusage) of a fixed amount of work (tests/programs/cpu/cpu_work.c, two
# threads) bare, and under `record --cpu-time 10ms` and `1ms` (--no-heap),
# RUNS runs each, medians. CPU time, not wall time: the machine's load
# changes the latter, not the work's CPU.
#
#   scripts/bench-cpu-time.sh [RUNS] [ITERS]
#
# Needs `cargo build --release --workspace` first.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
iters=${2:-1500000000}
bin=target/release/heapprofd-rs
tmp=$(mktemp -d /tmp/bench-cpu-time.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -g -pthread -o "$tmp/cpu_work" tests/programs/cpu/cpu_work.c
gcc -O2 -g -I client/include -o "$tmp/signal_cost" tests/programs/cpu/signal_cost.c

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

measure() { # label, then the command prefix (empty: bare)
  local label=$1; shift
  local out
  for _ in $(seq "$runs"); do
    out=$("$@" "$tmp/cpu_work" 2 "$iters" 2>/dev/null | sed -n 's/^cpu_ms //p')
    echo "$out"
  done | median | { read -r m; printf '%-22s %10.1f ms\n' "$label" "$m"; echo "$m" > "$tmp/$label"; }
}

measure bare env
measure cpu-time-10ms "$bin" record --no-service --cpu-time 10ms --no-heap -o "$tmp/t10.pftrace" --
measure cpu-time-1ms "$bin" record --no-service --cpu-time 1ms --no-heap -o "$tmp/t1.pftrace" --
bare=$(cat "$tmp/bare")
for l in cpu-time-10ms cpu-time-1ms; do
  v=$(cat "$tmp/$l")
  awk -v b="$bare" -v v="$v" -v l="$l" 'BEGIN {printf "%-22s %+9.2f %%\n", l " overhead", (v - b) / b * 100}'
done
samples10=$("$bin" report --cpu --format json "$tmp/t10.pftrace" | python3 -c 'import json,sys; print(sum(p["samples"] for p in json.load(sys.stdin)["profiles"]))')
samples1=$("$bin" report --cpu --format json "$tmp/t1.pftrace" | python3 -c 'import json,sys; print(sum(p["samples"] for p in json.load(sys.stdin)["profiles"]))')
echo "samples in the last run: 10ms $samples10, 1ms $samples1"
for _ in $(seq "$runs"); do "$tmp/signal_cost" | sed -n 's/^per_signal_us \([0-9.]*\).*/\1/p'; done | median \
  | { read -r m; echo "signal, bare:           $m us"; }
for _ in $(seq "$runs"); do
  "$bin" record --no-service -i 1g -o "$tmp/s.pftrace" -- "$tmp/signal_cost" 2>/dev/null \
    | sed -n 's/^per_signal_us \([0-9.]*\).*/\1/p'
done | median | { read -r m; echo "signal + stack sample:  $m us"; }
