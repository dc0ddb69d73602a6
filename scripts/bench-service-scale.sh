#!/usr/bin/env bash
# bench-service-scale.sh: the scale requirement of issue 13, measured.
#
# Starts `heapprofd-rs daemon` in a private HEAPPROFD_SERVICE_DIR, 50
# long-running allocating programs (a small C loop, preloaded with the
# dormant client), then `record --all` while a shell loop starts
# short-lived real programs (true, ls, sed, sort, python3 -c) at RATE a
# second, each preloaded. At the end it prints: processes started and seen
# in the trace (per program), samples dropped and the trace's flags
# (buffer_overran, hit_guardrail, ...), the daemon's peak RSS and CPU
# seconds (from /proc), the start rate achieved, and the machine's load
# (this script does not assume an idle machine: compare the achieved rate
# with the one asked for). The profile ends (SIGINT) once every program
# started has exited: a process started but not in the trace is lost.
#
# Usage: scripts/bench-service-scale.sh [-d SECONDS] [-r RATE] [-l LONG]
#        [-i INTERVAL] [-k KEEP_DIR]
#   -d  how long the loop starts programs, in seconds (default 30); the
#       profile ends when the last of them has exited
#   -r  short-lived programs started a second (default 200)
#   -l  long-running programs (default 50)
#   -i  sampling interval for record (default 4096; 1 = every allocation)
#   -k  keep the work directory (trace, logs) instead of removing it
# Needs: cargo build --release done; gcc; python3 with the `perfetto`
# package (scripts/install-deps.sh) for the trace check.
set -euo pipefail

DUR=30 RATE=200 LONG=50 INTERVAL=4096 KEEP=0
while getopts "d:r:l:i:k" o; do
    case $o in
    d) DUR=$OPTARG ;;
    r) RATE=$OPTARG ;;
    l) LONG=$OPTARG ;;
    i) INTERVAL=$OPTARG ;;
    k) KEEP=1 ;;
    *) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d' >&2; exit 2 ;;
    esac
done

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/target/release/heapprofd-rs
CLIENT=$ROOT/target/release/libheapprofd_client.so
[[ -x $BIN && -f $CLIENT ]] || { echo "run cargo build --release first" >&2; exit 2; }
WORK=$(mktemp -d /tmp/heapprofd-scale-XXXXXX)
SVC=$WORK/svc
mkdir -p "$SVC"
export HEAPPROFD_SERVICE_DIR=$SVC
unset HEAPPROFD_SOCKET

DAEMON= RECORD= LONG_PIDS=()
cleanup() {
    for p in "${LONG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [[ -n $RECORD ]] && kill "$RECORD" 2>/dev/null || true
    [[ -n $DAEMON ]] && kill "$DAEMON" 2>/dev/null || true
    wait 2>/dev/null || true
    if [[ $KEEP == 1 ]]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# The long-running program: every 10 ms, 8 blocks of 1000 bytes, freed.
cat >"$WORK/longrun.c" <<'EOF'
#include <stdlib.h>
#include <unistd.h>
static volatile unsigned long sink;
__attribute__((noinline)) void longrun_site(void) {
    void *b[8];
    for (int i = 0; i < 8; i++) b[i] = malloc(1000), sink += (unsigned long)b[i];
    for (int i = 0; i < 8; i++) free(b[i]);
}
int main(void) { for (;;) { longrun_site(); usleep(10000); } }
EOF
gcc -O1 -g -o "$WORK/longrun" "$WORK/longrun.c"

"$BIN" daemon 2>"$WORK/daemon.log" &
DAEMON=$!
for _ in $(seq 500); do [[ -S $SVC/control.sock ]] && break; sleep 0.02; done
[[ -S $SVC/control.sock ]] || { echo "the daemon did not start" >&2; cat "$WORK/daemon.log" >&2; exit 1; }

for _ in $(seq "$LONG"); do
    LD_PRELOAD=$CLIENT "$WORK/longrun" &
    LONG_PIDS+=($!)
done
printf '%s\n' "${LONG_PIDS[@]}" >"$WORK/long.pids"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK=$(getconf CLK_TCK)
CPU0=$(cpu_ticks "$DAEMON")
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# No -d: the profile ends (SIGINT, as Ctrl-C) once every program the loop
# started has exited, so each of them must be in the trace.
"$BIN" record --all -i "$INTERVAL" -o "$WORK/all.pftrace" 2>"$WORK/record.log" &
RECORD=$!
for _ in $(seq 500); do grep -qx 'all 1' "$SVC/triggers" 2>/dev/null && break; sleep 0.02; done

# The short-lived programs, started at RATE a second for DUR seconds (the
# shell keeps up as it can: the achieved rate is reported).
PROGS=(true ls sed sort true ls sed sort python3)
spawn_loop() {
    local start=$EPOCHREALTIME n=0 now want
    local end_us=$(( ${start/./} + DUR * 1000000 ))
    while :; do
        now=${EPOCHREALTIME/./}
        (( now >= end_us )) && break
        want=$(( (now - ${start/./}) * RATE / 1000000 ))
        while (( n < want && ${EPOCHREALTIME/./} < end_us )); do
            case ${PROGS[n % ${#PROGS[@]}]} in
            true) LD_PRELOAD=$CLIENT /usr/bin/true & ;;
            ls) LD_PRELOAD=$CLIENT /usr/bin/ls / >/dev/null & ;;
            sed) LD_PRELOAD=$CLIENT /usr/bin/sed 's/a/b/' /etc/hostname >/dev/null & ;;
            sort) LD_PRELOAD=$CLIENT /usr/bin/sort /etc/passwd >/dev/null & ;;
            python3) LD_PRELOAD=$CLIENT /usr/bin/python3 -c 'x = [str(i) for i in range(1000)]' & ;;
            esac
            echo "$! ${PROGS[n % ${#PROGS[@]}]}"
            n=$((n + 1))
            (( n % 64 == 0 )) && wait
        done
        sleep 0.005
    done
    wait
}
T0=$EPOCHREALTIME
# In a subshell: its `wait` must not wait for the daemon and the long ones.
(spawn_loop) >"$WORK/short.pids"
T1=$EPOCHREALTIME
STARTED=$(wc -l <"$WORK/short.pids")

T2=$EPOCHREALTIME
kill -INT "$RECORD"
set +e
wait "$RECORD"; RC=$?
set -e
RECORD=
PEAK_KB=$(awk '/^VmHWM/ {print $2}' "/proc/$DAEMON/status")
RSS_KB=$(awk '/^VmRSS/ {print $2}' "/proc/$DAEMON/status")
CPU1=$(cpu_ticks "$DAEMON")
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$WORK" "$ROOT/proto/tests/check_trace.py" "$STARTED" "$T0" "$T1" "$RATE" \
    "$PEAK_KB" "$RSS_KB" "$CPU0" "$CPU1" "$TICK" "$RC" "$LOAD0" "$LOAD1" "$T2" <<'EOF'
import json, subprocess, sys, collections
(work, checker, started, t0, t1, rate, peak, rss, cpu0, cpu1, tick, rc,
 load0, load1, t2) = sys.argv[1:]
out = subprocess.run(["python3", checker, "--strict", f"{work}/all.pftrace"],
                     capture_output=True, text=True)
try:
    j = json.loads(out.stdout)
except ValueError:
    sys.exit(f"check_trace.py printed no JSON: {out.stderr}")
s = j["summary"]
dumps = s.get("heap_dumps", [])
seen = {d["pid"] for d in dumps}
flags = collections.Counter()
for d in dumps:
    for f in ("buffer_overran", "buffer_corrupted", "hit_guardrail", "rejected_concurrent",
              "disconnected"):
        if d.get(f):
            flags[f] += 1
    if d.get("client_error") not in (None, "CLIENT_ERROR_NONE"):
        flags["client_error " + str(d["client_error"])] += 1
samples = collections.Counter(x["pid"] for x in s.get("heap_samples", []))
short = [l.split() for l in open(f"{work}/short.pids")]
by_prog = collections.defaultdict(lambda: [0, 0])
for pid, prog in short:
    by_prog[prog][0] += 1
    by_prog[prog][1] += int(pid) in seen
longs = [int(l) for l in open(f"{work}/long.pids")]
long_seen = sum(p in seen for p in longs)
long_with_samples = sum(samples[p] > 0 for p in longs)
secs = float(t1) - float(t0)
print(f"check_trace --strict: {'ok' if j.get('ok') else 'FAILED ' + str(j.get('error'))}; record exit {rc}")
print(f"short-lived: {started} started in {secs:.1f} s = {int(started)/secs:.0f}/s (asked {rate}/s)")
for prog, (n, k) in sorted(by_prog.items()):
    print(f"  {prog:8} {k}/{n} in the trace")
print(f"long-running: {long_seen}/{len(longs)} in the trace, {long_with_samples} with samples")
print(f"processes in the trace: {len(seen)}; dumps flagged: {dict(flags) or 'none'}")
print(f"daemon: peak RSS {int(peak)/1024:.1f} MiB (now {int(rss)/1024:.1f} MiB), "
      f"CPU {(int(cpu1)-int(cpu0))/int(tick):.1f} s over the {float(t2)-float(t0):.1f} s profile")
print(f"load average before {load0}, after {load1}")
EOF
echo "--- record's summary (last lines) ---"
tail -n 8 "$WORK/record.log"
