#!/bin/bash
# The dormant client's cost system-wide: wall time of 500 `/bin/true` (a bash
# loop: fork + exec + the dynamic linker + the client's constructor) and of 50
# `git status` in a small repository, with and without `heapprofd-rs install`,
# interleaved (off, on, off, on...). Needs root and `cargo build --release`.
# Usage: scripts/bench-preload-system.sh [ROUNDS]   (default 7)
# Also the median of 300 single spawns of /bin/true (posix_spawn + wait, timed
# one by one: robust against the preemption spikes of a shared machine).
# Prints "round state true500_ms gitstatus50_ms spawn_median_us" per run,
# then the medians over the rounds.
# Always uninstalls on exit; each installed window lasts about one measurement.
set -u
cd "$(dirname "$0")/.."
B="$PWD/target/release/heapprofd-rs"
[ "$(id -u)" = 0 ] || { echo "needs root (it installs into /etc/ld.so.preload)" >&2; exit 1; }
[ -x "$B" ] || { echo "run cargo build --release first" >&2; exit 1; }
work=$(mktemp -d /tmp/heapprofd-preload-bench.XXXXXX)
trap '"$B" uninstall >/dev/null; rm -rf "$work"' EXIT
git -C "$work" init -q && for i in $(seq 50); do echo "$i" > "$work/f$i"; done
git -C "$work" add . && git -C "$work" -c user.name=b -c user.email=b@b commit -qm init
cat > "$work/spawn.c" <<'C'
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
extern char **environ;
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }
int main(void) {
  enum { N = 300 }; double t[N]; char *argv[] = {"/bin/true", 0};
  for (int i = 0; i < N; i++) {
    struct timespec a, b; int st; pid_t p;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (posix_spawn(&p, argv[0], 0, 0, argv, environ) || waitpid(p, &st, 0) != p || st) return 1;
    clock_gettime(CLOCK_MONOTONIC, &b);
    t[i] = (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
  }
  qsort(t, N, sizeof t[0], cmp); printf("%.0f\n", (t[N / 2 - 1] + t[N / 2]) / 2); return 0;
}
C
gcc -O2 -o "$work/spawn" "$work/spawn.c" || exit 1
ms() { local s e; s=$(date +%s%N); "$@"; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
trues() { bash -c 'for i in $(seq 500); do /bin/true; done'; }
gits() { for i in $(seq 50); do git -C "$work" status --porcelain >/dev/null; done; }
out="$work/runs"
for r in $(seq 1 "${1:-7}"); do
  for state in off on; do
    if [ $state = on ]; then "$B" install >/dev/null || exit 1; fi
    grep -qs heapprofd /etc/ld.so.preload && [ $state = off ] && { echo "installed while off" >&2; exit 1; }
    echo "$r $state $(ms trues) $(ms gits) $("$work/spawn")" | tee -a "$out"
    if [ $state = on ]; then "$B" uninstall >/dev/null || exit 1; fi
  done
done
for state in off on; do
  for col in 3 4 5; do
    awk -v s=$state -v c=$col '$2==s {print $c}' "$out" | sort -n | awk -v s=$state -v c=$col \
      '{v[NR]=$1} END {m = (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "median %s %s: %s %s (%d runs)\n", s, (c==3 ? "500x /bin/true" : c==4 ? "50x git status" : "one /bin/true spawn (median of 300)"), m, (c==5 ? "us" : "ms"), NR}'
  done
done
