#!/usr/bin/env python3
"""Interleaved timer of the profiled program's own CPU, for changes too small
to see in the whole command's wall time.

Usage: scripts/bench-program-cpu.py ROUNDS PROGRAM_ARGS NAME=PREFIX...

Runs `PREFIX PROGRAM PROGRAM_ARGS` for each NAME, ROUNDS times, interleaved
(the order rotates from round to round), and reads the `cpu_ns=` the
program prints: the one-stack benchmark (`tests/programs/client/bench.c`,
path in $PROGRAM, default ./onestack) prints its worker threads' CPU,
which leaves out the profiler's daemon and `record`'s start and end. An
empty PREFIX runs the program bare; the first NAME is the baseline. Prints
per NAME the median, the paired median difference to the baseline (this
NAME's value less the baseline's in the same round) with its 95%
bootstrap interval (`bench_stats.py`), and the ratio of the medians.

Then, per NAME, where the whole command's CPU went (medians, and paired
medians against the baseline): the whole command's (`wait4`'s user+sys of
it and its children), the program's worker threads' (`cpu_ns=`), the
profiler's daemon's (`record`'s own `self usage` line: the commands run
with HEAPPROFD_DEBUG=1) and the rest (the program's other threads, exec
and loading, `record`'s process before and after).

Example: scripts/bench-program-cpu.py 15 "1 10000000 20" bare= \\
    head="target/release/heapprofd-rs record --no-service -i 512k -o /tmp/h.pftrace --"
"""
import os
import re
import statistics
import subprocess
import sys

from bench_stats import paired_median_interval


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    rounds, args = int(sys.argv[1]), sys.argv[2].split()
    configs = [a.split("=", 1) for a in sys.argv[3:]]
    program = os.environ.get("PROGRAM", "./onestack")
    values = {name: [] for name, _ in configs}
    daemon = {name: [] for name, _ in configs}
    whole = {name: [] for name, _ in configs}
    env = dict(os.environ, HEAPPROFD_DEBUG="1")
    for r in range(rounds):
        k = r % len(configs)
        for name, prefix in configs[k:] + configs[:k]:
            cmd = prefix.split() + [program] + args
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
            # Small outputs (well under a pipe's 64 KiB): read one, then the
            # other, then reap with wait4 for the command's own CPU.
            out, err = p.stdout.read(), p.stderr.read()
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            p.stdout.close()
            p.stderr.close()
            m = re.search(r"cpu_ns=(\d+)", out)
            if not m:
                print(f"{name}: no cpu_ns= in the output of {cmd}", file=sys.stderr)
                return 1
            values[name].append(int(m.group(1)) / 1e6)
            d = re.search(r"self usage: user_s=([\d.]+) sys_s=([\d.]+)", err)
            daemon[name].append((float(d.group(1)) + float(d.group(2))) * 1e3 if d else 0.0)
            whole[name].append((usage.ru_utime + usage.ru_stime) * 1e3)
    base = values[configs[0][0]]
    for name, _ in configs:
        v = values[name]
        diffs = [x - y for x, y in zip(v, base)]
        paired = statistics.median(diffs)
        ratio = statistics.median(v) / statistics.median(base)
        print(f"{name:12s} median {statistics.median(v):9.1f} ms  paired {paired:+8.1f} ms  "
              f"({ratio:.3f}x)  min {min(v):.1f}")
        if name != configs[0][0]:
            lo, hi = paired_median_interval(diffs)
            b = statistics.median(base)
            print(f"{'':12s} 95% of the paired median: [{lo:+.1f}, {hi:+.1f}] ms "
                  f"= [{1 + lo / b:.3f}x, {1 + hi / b:.3f}x]")
    print("CPU split, ms: median (paired median against the baseline)")
    rest = {name: [w - v - d for w, v, d in zip(whole[name], values[name], daemon[name])]
            for name, _ in configs}
    parts = [("whole", whole), ("program", values), ("daemon", daemon), ("rest", rest)]
    first = configs[0][0]
    for name, _ in configs:
        cols = []
        for label, part in parts:
            v = part[name]
            paired = statistics.median([x - y for x, y in zip(v, part[first])])
            cols.append(f"{label} {statistics.median(v):7.1f} ({paired:+6.1f})")
        print(f"{name:12s} " + "  ".join(cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
