#!/bin/bash
# The dormant client's cost system-wide: wall time of 500 `/bin/true` (a bash
# loop: fork + exec + the dynamic linker + the client's constructor) and of 50
# `git status` in a small repository, with and without `heapprofd-rs install`,
# interleaved (off, on, off, on...). Needs root and `cargo build --release`.
# Usage: scripts/bench-preload-system.sh [ROUNDS]   (default 7)
# Prints "round state true500_ms gitstatus50_ms" per run, then the medians.
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
ms() { local s e; s=$(date +%s%N); "$@"; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
trues() { bash -c 'for i in $(seq 500); do /bin/true; done'; }
gits() { for i in $(seq 50); do git -C "$work" status --porcelain >/dev/null; done; }
out="$work/runs"
for r in $(seq 1 "${1:-7}"); do
  for state in off on; do
    if [ $state = on ]; then "$B" install >/dev/null || exit 1; fi
    grep -qs heapprofd /etc/ld.so.preload && [ $state = off ] && { echo "installed while off" >&2; exit 1; }
    echo "$r $state $(ms trues) $(ms gits)" | tee -a "$out"
    if [ $state = on ]; then "$B" uninstall >/dev/null || exit 1; fi
  done
done
for state in off on; do
  for col in 3 4; do
    awk -v s=$state -v c=$col '$2==s {print $c}' "$out" | sort -n | awk -v s=$state -v c=$col \
      '{v[NR]=$1} END {m = (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; printf "median %s %s: %s ms (%d runs)\n", s, (c==3 ? "500x /bin/true" : "50x git status"), m, NR}'
  done
done
