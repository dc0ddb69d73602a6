#!/usr/bin/env python3
"""Interleaved whole-command timer: medians of wall and CPU as ratios to the first command.

Usage: scripts/bench-interleaved.py ROUNDS STDIN_FILE NAME=COMMAND...

Each round runs every command once (shell syntax), rotating the order from
round to round, with STDIN_FILE (or /dev/null) as standard input and output
discarded. Wall is start to exit; CPU is wait4's user+sys of the command
and its children. Prints per command the medians, their ratio to the first
command's (the baseline, e.g. the bare program), the paired differences
to it (the median over rounds of this command's time less the baseline's
in the same round: a machine whose speed drifts from round to round moves
both) with a 95% interval for that median, every round's wall, and the
load average at the end (the machine is shared: compare within a run). A
command that fails stops the run.

The interval is a percentile bootstrap of the paired median (2,000
resamples of the rounds, a fixed seed, so the same times print the same
interval), shown in ms and as the ratio it makes with the baseline's
median: a goal of 1.05x is met when the whole wall interval is under it,
missed when the whole interval is over it, and undecided by this run
otherwise. On this project's shared 2-core machine one round of a 0.5 s
program varies by tens of ms, so an interval a few ms wide takes dozens
of rounds.
"""
import os
import statistics
import subprocess
import sys
import time

from bench_stats import paired_median_interval


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__.split("\n\n")[1])
    rounds, stdin = int(sys.argv[1]), sys.argv[2]
    cfgs = [a.split("=", 1) for a in sys.argv[3:]]
    res = {name: [] for name, _ in cfgs}
    for r in range(rounds):
        k = r % len(cfgs)
        for name, cmd in cfgs[k:] + cfgs[:k]:
            with open(stdin) as f:
                t = time.perf_counter()
                p = subprocess.Popen(cmd, shell=True, stdin=f, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
                _, status, ru = os.wait4(p.pid, 0)
                wall = time.perf_counter() - t
            if status != 0:
                sys.exit(f"{name}: `{cmd}` exited with status {status:#x}")
            res[name].append((wall, ru.ru_utime + ru.ru_stime))
    base = res[cfgs[0][0]]
    bw = statistics.median(x[0] for x in base)
    bc = statistics.median(x[1] for x in base)
    for name, _ in cfgs:
        w = statistics.median(x[0] for x in res[name])
        c = statistics.median(x[1] for x in res[name])
        pw = [x[0] - y[0] for x, y in zip(res[name], base)]
        pc = [x[1] - y[1] for x, y in zip(res[name], base)]
        dw = statistics.median(pw) * 1e3
        dc = statistics.median(pc) * 1e3
        walls = " ".join("%.3f" % x[0] for x in res[name])
        print(f"{name:12s} wall {w:.3f} ({w / bw:.2f}x) cpu {c:.3f} ({c / bc:.2f}x) "
              f"paired {dw:+.2f} ms wall {dc:+.2f} ms cpu  walls {walls}")
        if name != cfgs[0][0]:
            (wl, wh), (cl, ch) = paired_median_interval(pw), paired_median_interval(pc)
            print(f"{'':12s} 95% of the paired median: wall [{wl * 1e3:+.1f}, {wh * 1e3:+.1f}] ms "
                  f"= [{1 + wl / bw:.3f}x, {1 + wh / bw:.3f}x], cpu [{cl * 1e3:+.1f}, "
                  f"{ch * 1e3:+.1f}] ms = [{1 + cl / bc:.3f}x, {1 + ch / bc:.3f}x]")
    print("load", open("/proc/loadavg").read().strip())


if __name__ == "__main__":
    main()
