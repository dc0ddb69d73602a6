#!/usr/bin/env bash
# bench-daemon-memory.sh: the daemon's memory over a long continuous
# profile of a program that keeps loading and unloading libraries and
# starting threads (issue 11).
#
# Builds tests/programs/churn/ (50 libraries with distinct build ids, and
# the churn program), runs `heapprofd-rs record -c PERIOD -- churn ...` for
# SECONDS, and samples record's VmRSS (/proc/PID/status; the daemon is the
# record process) every STEP seconds. Prints the series, the peak, and the
# mean of the first minute against the mean of the last minute (a daemon
# whose caches are bounded stays flat: a ratio near 1). Then reports the
# trace (`heapprofd-rs report`) and checks that the libraries' functions are
# named in it.
#
# Usage: scripts/bench-daemon-memory.sh [-b BIN] [-d SECONDS] [-c PERIOD]
#        [-s STEP] [-n NLIBS] [-p PAUSE_US] [-i INTERVAL] [-f] [-k]
#   -b  the heapprofd-rs binary (default target/release/heapprofd-rs; its
#       client library must be next to it)
#   -d  how long churn runs, in seconds (default 600)
#   -c  record's --continuous-dump period (default 10s)
#   -s  seconds between RSS samples (default 10)
#   -n  libraries (default 50)
#   -p  churn's pause after each round, in microseconds (default 1000)
#   -i  sampling interval (default 4096)
#   -f  fresh libraries: every round loads a new copy with a new build id
#       (churn's `fresh` mode), a stream of distinct modules that never ends
#   -k  keep the work directory (trace, libraries) instead of removing it
# Needs: cargo build --release done (or -b); gcc.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/target/release/heapprofd-rs DUR=600 PERIOD=10s STEP=10 NLIBS=50 PAUSE=1000
INTERVAL=4096 KEEP=0 FRESH=
while getopts "b:d:c:s:n:p:i:fk" o; do
    case $o in
    b) BIN=$OPTARG ;;
    d) DUR=$OPTARG ;;
    c) PERIOD=$OPTARG ;;
    s) STEP=$OPTARG ;;
    n) NLIBS=$OPTARG ;;
    p) PAUSE=$OPTARG ;;
    i) INTERVAL=$OPTARG ;;
    f) FRESH=fresh ;;
    k) KEEP=1 ;;
    *) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//;/^set -e/d' >&2; exit 2 ;;
    esac
done
[[ -x $BIN ]] || { echo "$BIN not found: run cargo build --release first, or pass -b" >&2; exit 2; }

WORK=$(mktemp -d /tmp/heapprofd-daemon-memory-XXXXXX)
RECORD=
cleanup() {
    [[ -n $RECORD ]] && kill "$RECORD" 2>/dev/null || true
    wait 2>/dev/null || true
    if [[ $KEEP == 1 ]]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

SRC=$ROOT/tests/programs/churn
for ((k = 0; k < NLIBS; k++)); do
    gcc -O2 -g -shared -fPIC -DPLUGIN=$k -o "$WORK/libplugin_$k.so" "$SRC/plugin.c"
done
gcc -O2 -g -pthread -Wall -Werror -o "$WORK/churn" "$SRC/churn.c" -ldl

echo "# $BIN ($("$BIN" --version 2>/dev/null | head -1))"
echo "# record -i $INTERVAL -c $PERIOD -- churn $NLIBS libraries ${DUR}s, pause ${PAUSE}us ${FRESH:+(fresh copies) }; RSS every ${STEP}s"
"$BIN" record -i "$INTERVAL" -c "$PERIOD" -o "$WORK/t.pftrace" -- \
    "$WORK/churn" "$WORK" "$NLIBS" "${DUR}s" "$PAUSE" $FRESH >"$WORK/out" 2>"$WORK/err" &
RECORD=$!
START=$(date +%s.%N)
SERIES=()
while kill -0 "$RECORD" 2>/dev/null; do
    sleep "$STEP"
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$RECORD/status" 2>/dev/null || true)
    [[ -n $rss ]] || break
    t=$(awk -v s="$START" -v n="$(date +%s.%N)" 'BEGIN {printf "%.0f", n - s}')
    SERIES+=("$t $rss")
    printf 't=%4ss rss=%7.1f MiB\n' "$t" "$(awk -v r="$rss" 'BEGIN {print r / 1024}')"
    # The last sample before the program's end: the profile is ending.
    ((t + STEP <= DUR)) || break
done
wait "$RECORD" && rc=0 || rc=$?
RECORD=
echo "# record exit $rc; $(cat "$WORK/out")"
[[ $rc == 0 ]] || { cat "$WORK/err" >&2; exit 1; }
printf '%s\n' "${SERIES[@]}" | awk -v dur="$DUR" '
    { t[NR] = $1; r[NR] = $2; if ($2 > peak) peak = $2 }
    END {
        for (i = 1; i <= NR; i++) {
            if (t[i] <= 60) { f += r[i]; nf++ }
            if (t[i] > t[NR] - 60) { l += r[i]; nl++ }
        }
        if (nf == 0 || nl == 0) { print "# too few samples"; exit }
        printf "# first minute mean %.1f MiB, last minute mean %.1f MiB, ratio %.2f, peak %.1f MiB\n",
            f / nf / 1024, l / nl / 1024, (l / nl) / (f / nf), peak / 1024
    }'
if ! "$BIN" report "$WORK/t.pftrace" >"$WORK/report.txt" 2>"$WORK/report.err"; then
    echo "# report failed:" >&2
    cat "$WORK/report.err" >&2
    exit 1
fi
named=$({ grep -o 'plugin_leaf_[0-9]*' "$WORK/report.txt" || true; } | sort -u | wc -l)
echo "# trace: $(stat -c %s "$WORK/t.pftrace") bytes; report names plugin_leaf of $named libraries"
sed -n '1,12p' "$WORK/report.txt"
