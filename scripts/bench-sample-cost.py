#!/usr/bin/env python3
"""What a sample costs, by where `perf` finds the CPU: the client's code, the
program's own code, the kernel and the daemon, per sample.

Usage: scripts/bench-sample-cost.py [--heapprofd [NAME=]BIN]... [-i SIZE] ROUNDS -- CMD [ARGS...]
       scripts/bench-sample-cost.py --self-test   (the suite runs it)

Each round runs, for each build given with --heapprofd (the order
rotates from round to round), under `perf record -e cpu-clock -F 10000`:

  armed    heapprofd-rs record --no-service -i 1g -- CMD
           (a session whose hooks are armed, almost no samples)
  sampled  heapprofd-rs record --no-service --fixed-interval -i SIZE -- CMD
           (SIZE 64k by default; the count of samples is read from the
           `costs:` line HEAPPROFD_DEBUG=1 prints)

and sorts every `perf` sample (`perf script`) by process and symbol. The
process with threads named `heapprofd-book` and `heapprofd-unwind-N` is
the daemon (`record`); any other is the program (the client's watcher
thread, also named `heapprofd-rs`, included). The program's samples go to the client's hooks (the exported
allocation functions of `libheapprofd_client.so`: `malloc`, `free`, ...),
the client's other code (the sampled path: registers, stack copy, ring,
free set, gap draws), the C library's copies, compares and clocks (which
the sampled path calls, and which the program may call too), the rest of
the C library (the allocator), the kernel, or the rest.

Prints per part the median milliseconds a run of each configuration, and
the difference sampled - armed in nanoseconds per sample (medians of each
part, so the parts need not add up). The rest of the C library and the
kernel rows show what samples cost outside the client's code (caches shared with
the daemon, wake-ups); the daemon row, its unwinding and bookkeeping.

Why attribution: on a shared 2-core machine a 0.5 s program's own time
moves by tens of percent from run to run (the allocator's cache misses),
while the CPU in the client's code stays within a few percent. So a
change to the sampled path shows here after a few rounds, where whole
wall times need hundreds. The caveat: `perf` charges a stall to the
instruction that waits, so time the processor overlaps with other work
is counted too (the hooks' rows overstate what removing them would save;
compare a build without them in bench-interleaved.py for that). And the
machine's speed still moves from one quarter of an hour to the next
(here by 10-20%): compare builds in one invocation (--heapprofd
base=BIN --heapprofd head=BIN), not across invocations.

Needs `perf` (software event cpu-clock) and a release build.
Examples: scripts/bench-sample-cost.py 5 -- ./onestack 1 10000000 20
          scripts/bench-sample-cost.py --heapprofd base=/tmp/base/heapprofd-rs \\
              --heapprofd head=target/release/heapprofd-rs 5 -- ./onestack 4 2500000 20
"""
import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HOOKS = {
    "malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign",
    "memalign", "aligned_alloc", "valloc", "pvalloc", "malloc_usable_size",
}
PARTS = ("program: client hooks", "program: client sampled path",
         "program: C library, copies and clocks", "program: C library, the rest",
         "program: kernel", "program: rest", "daemon")
# What the sampled path calls in the C library (the stack copy, its compare,
# the timestamp), charged to the C library by `perf`.
LIBC_HELPERS = ("__memmove", "__memcpy", "__memcmp", "memcpy", "memmove", "memcmp",
                "clock_gettime", "__clock_gettime")


# Threads only the daemon has; the process that has them is `record`'s.
# (Its main thread is called heapprofd-rs, as is the client's watcher thread
# in the program, so the daemon is told by process, not by thread name.)
DAEMON_THREADS = ("heapprofd-book", "heapprofd-unwin")
# One line of `perf script -F comm,pid,tid,period,ip,sym,dso` (the period
# of a cpu-clock sample is in ns: 100000 at 10 kHz, more if the kernel
# lowered the rate).
SCRIPT_LINE = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s+(\d+)\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")


def classify(daemon: bool, dso: str, sym: str) -> str:
    """The part a `perf` sample goes to: of the daemon's process or not, in
    `dso` (a path or `[kernel.kallsyms]`) at `sym`."""
    if daemon:
        return "daemon"
    base = os.path.basename(dso)
    if base.startswith("libheapprofd_client"):
        # C++ operators demangle to "operator new(...)" and the like.
        if sym in HOOKS or sym.startswith("operator new") or sym.startswith("operator delete"):
            return "program: client hooks"
        return "program: client sampled path"
    if base.startswith("libc.so") or base.startswith("libc-"):
        if sym.startswith(LIBC_HELPERS):
            return "program: C library, copies and clocks"
        return "program: C library, the rest"
    if base.startswith("[kernel"):
        return "program: kernel"
    return "program: rest"


def parts_of(lines) -> dict:
    """Milliseconds per part in `perf script` lines."""
    samples = []
    daemon_pids = set()
    for line in lines:
        m = SCRIPT_LINE.match(line)
        if not m:
            continue
        comm, pid, _tid, period, sym, dso = m.groups()
        if comm.startswith(DAEMON_THREADS):
            daemon_pids.add(pid)
        samples.append((pid, int(period), dso, sym))
    ms = collections.Counter()
    for pid, period, dso, sym in samples:
        ms[classify(pid in daemon_pids, dso, sym)] += period / 1e6
    return ms


def perf_parts(data: str) -> dict:
    """Milliseconds per part in one `perf record` file."""
    out = subprocess.run(
        ["perf", "script", "-i", data, "-F", "comm,pid,tid,period,ip,sym,dso"],
        capture_output=True, text=True, check=True).stdout
    return parts_of(out.splitlines())


def run(cmd: list, data: str) -> tuple:
    """Runs `cmd` under `perf record`; returns (parts, samples)."""
    env = dict(os.environ, HEAPPROFD_DEBUG="1")
    p = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "10000",
                        "-o", data, "--"] + cmd,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench-sample-cost: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    m = re.search(r"costs: records=\d+ samples=(\d+)", p.stderr)
    if not m:
        sys.exit(f"bench-sample-cost: no `costs:` line from {cmd[0]} under HEAPPROFD_DEBUG=1; "
                 "is it a heapprofd-rs (name it with --heapprofd)?")
    return perf_parts(data), int(m.group(1))


def self_test() -> None:
    """Checks the sorting on the shapes of `perf script` lines seen here."""
    client = "/usr/local/lib/heapprofd-rs/libheapprofd_client.so"
    lines = [
        # record's process: its main thread, a worker, its C library.
        "    heapprofd-rs 100/100     100000  7f23909c76bd dl_main (/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2)",
        "  heapprofd-unwin 100/104     100000  55d0c0ffee00 drain_batch (/usr/local/bin/heapprofd-rs)",
        "  tokio-rt-worker 100/106     100000  7f2390000000 _int_free (/usr/lib/x86_64-linux-gnu/libc.so.6)",
        # The program: hooks, the sampled path, the C library, the kernel,
        # its own code, and the client's watcher thread, named heapprofd-rs.
        f"        onestack 200/201     100000  7f0000001000 free ({client})",
        f"            node 300/300     100000  7f0000001000 operator new(unsigned long) ({client})",
        f"        onestack 200/201     100000  7f0000002000 heapprofd_client_core::freeset::FreeSet::insert ({client})",
        "        onestack 200/201     100000  7f0000003000 __memmove_avx512_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)",
        "        onestack 200/201     100000  7f0000004000 _int_free (/usr/lib/x86_64-linux-gnu/libc.so.6)",
        "        onestack 200/201     100000  ffffffff8221d78a clear_page_erms ([kernel.kallsyms])",
        # A sample of a lowered rate weighs its period.
        "        onestack 200/201     300000  55d000000100 leaf (/tmp/onestack)",
        f"    heapprofd-rs 200/207     100000  7f0000005000 heapprofd_client_core::watcher::run ({client})",
    ]
    got = parts_of(lines)
    want = {
        "daemon": 3, "program: client hooks": 2, "program: client sampled path": 2,
        "program: C library, copies and clocks": 1, "program: C library, the rest": 1,
        "program: kernel": 1, "program: rest": 3,
    }
    for part in PARTS:
        n = round(got[part] * 10)
        assert n == want.get(part, 0), f"{part}: {n} tenths of a ms, want {want.get(part, 0)}"
    print(f"bench-sample-cost: self-test passed ({len(lines)} lines)")


def report(name: str, cmd: list, interval: str, rounds: int, res: dict, samples: dict) -> None:
    """Prints the table of one build."""
    med = {c: {k: statistics.median(p[k] for p in res[c]) for k in PARTS} for c in res}
    n = statistics.median(samples["sampled"]) - statistics.median(samples["armed"])
    print(f"# {name}: {rounds} rounds of: {' '.join(cmd)}; sampled at {interval} (fixed): "
          f"{statistics.median(samples['sampled']):.0f} samples a run, armed (1g): "
          f"{statistics.median(samples['armed']):.0f}")
    if n < 10_000:
        print(f"# only {n:.0f} more samples a run than armed: the session's fixed costs "
              "(module loading, symbols) dominate the per-sample figures; use a longer "
              "run or a smaller -i")
    print("| part | armed ms | sampled ms | ns per sample |")
    print("|---|---|---|---|")
    for k in PARTS + ("program", "all"):
        if k == "program":
            arm = sum(v for kk, v in med["armed"].items() if kk.startswith("program"))
            smp = sum(v for kk, v in med["sampled"].items() if kk.startswith("program"))
        elif k == "all":
            arm, smp = sum(med["armed"].values()), sum(med["sampled"].values())
        else:
            arm, smp = med["armed"][k], med["sampled"][k]
        per = (smp - arm) * 1e6 / n if n > 0 else float("nan")
        print(f"| {k} | {arm:.1f} | {smp:.1f} | {per:.0f} |")


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    ap = argparse.ArgumentParser(usage=__doc__.split("\n\n")[1].removeprefix("Usage: "))
    ap.add_argument("--heapprofd", action="append", metavar="[NAME=]BIN",
                    help="the heapprofd-rs to measure (repeat to compare builds in the "
                    "same rounds; default target/release/heapprofd-rs)")
    ap.add_argument("-i", dest="interval", default="64k")
    ap.add_argument("rounds", type=int)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd or a.rounds < 1:
        ap.error("give ROUNDS and a command after --")
    builds = {}
    for i, b in enumerate(a.heapprofd or ["target/release/heapprofd-rs"]):
        name, _, path = b.rpartition("=")
        builds[name or (f"build{i + 1}" if a.heapprofd and len(a.heapprofd) > 1 else "head")] = path
    if shutil.which("perf") is None:
        sys.exit("bench-sample-cost: `perf` is not on PATH (Debian: apt install linux-perf)")
    for path in builds.values():
        if not os.access(path, os.X_OK):
            sys.exit(f"bench-sample-cost: {path} is not an executable: build it "
                     "(cargo build --release) or name it with --heapprofd")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t.pftrace")
        runs = []
        for name, path in builds.items():
            runs.append((name, "armed",
                         [path, "record", "--no-service", "-i", "1g", "-o", trace, "--"] + cmd))
            runs.append((name, "sampled",
                         [path, "record", "--no-service", "--fixed-interval", "-i", a.interval,
                          "-o", trace, "--"] + cmd))
        res = {name: {"armed": [], "sampled": []} for name in builds}
        samples = {name: {"armed": [], "sampled": []} for name in builds}
        for r in range(a.rounds):
            k = r % len(runs)
            order = runs[k:] + runs[:k]
            if r % 2:
                order.reverse()
            for name, config, argv in order:
                parts, n = run(argv, os.path.join(tmp, "perf.data"))
                res[name][config].append(parts)
                samples[name][config].append(n)
                print(f"round {r + 1} {name} {config}: {n} samples, "
                      + ", ".join(f"{p} {parts[p]:.1f}" for p in PARTS), file=sys.stderr)
    for name in builds:
        report(name, cmd, a.interval, a.rounds, res[name], samples[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
