#!/usr/bin/env python3
"""Where the fixed cost of a short `record` run goes: start, program, end.

Usage: scripts/bench-fixed-cost.py ROUNDS 'NAME=BINARY ARGS;NAME=...' -- CMD [ARGS...]

Each round runs CMD bare and under `BINARY record -o TRACE ARGS -- timeit
CMD` for every configuration (rotating the order), where timeit is a small
statically linked C program (built here with gcc: the client cannot load
into it, so it adds no session of its own) that stamps CLOCK_MONOTONIC
before it forks CMD and after CMD exits. Prints the medians of:

  start  from spawning `record` to timeit's first stamp (record's own
         start-up: runtime, socket, threads, fork and exec)
  inner  CMD's run under the client (its session's set-up and end included)
  end    from CMD's exit to `record`'s (the last drain, the final dump, the
         trace, the symbol cache)
  whole  all of it

BINARY is a heapprofd-rs with its client library beside it; ARGS are record
options (e.g. `-i 512k --no-symbol-cache`). Compare within one run only.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TIMEIT = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
static double now(void) { struct timespec a; clock_gettime(CLOCK_MONOTONIC, &a); return a.tv_sec * 1e3 + a.tv_nsec / 1e6; }
int main(int argc, char **argv) {
  double a = now();
  pid_t p = fork();
  if (!p) { execvp(argv[1], argv + 1); _exit(127); }
  int st; waitpid(p, &st, 0);
  fprintf(stderr, "TIMEIT %.3f %.3f\n", a, now());
  return 0;
}
"""


def main():
    if len(sys.argv) < 5 or "--" not in sys.argv:
        sys.exit(__doc__.split("\n\n")[1])
    rounds = int(sys.argv[1])
    cfgs = [c.split("=", 1) for c in sys.argv[2].split(";") if c]
    cmd = sys.argv[sys.argv.index("--") + 1:]
    work = tempfile.mkdtemp(prefix="bench-fixed-cost.")
    try:
        src = os.path.join(work, "timeit.c")
        with open(src, "w") as f:
            f.write(TIMEIT)
        timeit = os.path.join(work, "timeit")
        subprocess.run(["gcc", "-O2", "-static", src, "-o", timeit], check=True)
        trace = os.path.join(work, "t.pftrace")
        runs = [("bare", None)] + [(n, spec.split()) for n, spec in cfgs]
        res = {name: [] for name, _ in runs}
        for r in range(rounds):
            k = r % len(runs)
            for name, spec in runs[k:] + runs[:k]:
                argv = [timeit] + cmd
                if spec is not None:
                    argv = [spec[0], "record", "-o", trace] + spec[1:] + ["--"] + argv
                t0 = time.monotonic() * 1e3
                p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
                t1 = time.monotonic() * 1e3
                stamp = [l for l in p.stderr.splitlines() if l.startswith("TIMEIT ")]
                if p.returncode != 0 or not stamp:
                    sys.exit(f"{name}: {' '.join(argv)} failed ({p.returncode}):\n{p.stderr}")
                a, b = (float(x) for x in stamp[0].split()[1:3])
                res[name].append((a - t0, b - a, t1 - b, t1 - t0))
        print(f"# {rounds} rounds, medians in ms; load {os.getloadavg()}")
        print("| config | start | inner | end | whole |")
        print("|---|---|---|---|---|")
        for name, _ in runs:
            m = [statistics.median(x[i] for x in res[name]) for i in range(4)]
            print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in m) + " |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
