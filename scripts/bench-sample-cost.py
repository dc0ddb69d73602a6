#!/usr/bin/env python3
"""What a sample costs, by where `perf` finds the CPU: the client's code, the
program's own code, the kernel and the daemon, per sample.

Usage: scripts/bench-sample-cost.py [--heapprofd BIN] [-i SIZE] ROUNDS -- CMD [ARGS...]
       scripts/bench-sample-cost.py --self-test   (the suite runs it)

Each round runs, in turn (the order alternates), under `perf record -e
cpu-clock -F 10000`:

  armed    heapprofd-rs record --no-service -i 1g -- CMD
           (a session whose hooks are armed, almost no samples)
  sampled  heapprofd-rs record --no-service --fixed-interval -i SIZE -- CMD
           (SIZE 64k by default; the count of samples is read from the
           `costs:` line HEAPPROFD_DEBUG=1 prints)

and sorts every `perf` sample by thread and symbol. A thread named
`heapprofd-*` or `tokio-rt-worker` is the daemon's; any other is the
program's. The program's samples go to the client's hooks (the exported
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
compare a build without them in bench-interleaved.py for that).

Needs `perf` (software event cpu-clock) and a release build.
Example: scripts/bench-sample-cost.py 3 -- ./onestack 1 10000000 20
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


def classify(comm: str, dso: str, sym: str) -> str:
    """The part a `perf` sample of thread `comm` in `dso` at `sym` goes to."""
    if comm.startswith("heapprofd") or comm.startswith("tokio-rt"):
        return "daemon"
    if "libheapprofd_client" in dso:
        # C++ operators demangle to "operator new(...)" and the like.
        if sym in HOOKS or sym.startswith("operator new") or sym.startswith("operator delete"):
            return "program: client hooks"
        return "program: client sampled path"
    if dso.startswith("libc.so") or dso.startswith("libc-"):
        if sym.startswith(LIBC_HELPERS):
            return "program: C library, copies and clocks"
        return "program: C library, the rest"
    if dso.startswith("[kernel"):
        return "program: kernel"
    return "program: rest"


def perf_parts(data: str) -> dict:
    """Milliseconds per part in one `perf record` file (10 kHz samples)."""
    out = subprocess.run(
        ["perf", "report", "-i", data, "--sort", "comm,dso,sym", "--stdio", "-n",
         "--field-separator", "\t"],
        capture_output=True, text=True, check=True).stdout
    ms = collections.Counter()
    for line in out.splitlines():
        if not line or line.startswith("#"):
            continue
        f = line.split("\t")
        if len(f) < 5:
            continue
        try:
            n = int(f[1])
        except ValueError:
            continue
        sym = re.sub(r"^\[[.k]\]\s+", "", f[4].strip())
        ms[classify(f[2].strip(), f[3].strip(), sym)] += n / 10.0
    return ms


def run(cmd: list, data: str) -> tuple:
    """Runs `cmd` under `perf record`; returns (parts, samples)."""
    env = dict(os.environ, HEAPPROFD_DEBUG="1")
    p = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "10000",
                        "-o", data, "--"] + cmd,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench-sample-cost: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    m = re.search(r"costs: records=\d+ samples=(\d+)", p.stderr)
    return perf_parts(data), int(m.group(1)) if m else 0


def self_test() -> None:
    """Checks `classify` on the shapes of `perf report` lines seen here."""
    cases = [
        (("onestack", "libheapprofd_client.so", "free"), "program: client hooks"),
        (("node", "libheapprofd_client.so", "operator new(unsigned long)"),
         "program: client hooks"),
        (("onestack", "libheapprofd_client.so",
          "heapprofd_client_core::freeset::FreeSet::insert"), "program: client sampled path"),
        (("onestack", "libc.so.6", "__memmove_avx512_unaligned_erms"),
         "program: C library, copies and clocks"),
        (("onestack", "libc.so.6", "_int_free"), "program: C library, the rest"),
        (("onestack", "[kernel.kallsyms]", "clear_page_erms"), "program: kernel"),
        (("onestack", "onestack", "leaf"), "program: rest"),
        (("heapprofd-unwin", "heapprofd-rs", "drain_batch"), "daemon"),
        (("tokio-rt-worker", "libc.so.6", "_int_free"), "daemon"),
    ]
    for args, want in cases:
        got = classify(*args)
        assert got == want, f"classify{args} = {got!r}, want {want!r}"
    print(f"bench-sample-cost: self-test passed ({len(cases)} cases)")


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    ap = argparse.ArgumentParser(usage=__doc__.split("\n\n")[1].removeprefix("Usage: "))
    ap.add_argument("--heapprofd", default="target/release/heapprofd-rs")
    ap.add_argument("-i", dest="interval", default="64k")
    ap.add_argument("rounds", type=int)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd or a.rounds < 1:
        ap.error("give ROUNDS and a command after --")
    if shutil.which("perf") is None:
        sys.exit("bench-sample-cost: `perf` is not on PATH (Debian: apt install linux-perf)")
    if not os.access(a.heapprofd, os.X_OK):
        sys.exit(f"bench-sample-cost: {a.heapprofd} is not an executable: build it "
                 "(cargo build --release) or name it with --heapprofd")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t.pftrace")
        configs = {
            "armed": [a.heapprofd, "record", "--no-service", "-i", "1g", "-o", trace, "--"] + cmd,
            "sampled": [a.heapprofd, "record", "--no-service", "--fixed-interval",
                        "-i", a.interval, "-o", trace, "--"] + cmd,
        }
        res = {name: [] for name in configs}
        samples = {name: [] for name in configs}
        for r in range(a.rounds):
            order = list(configs) if r % 2 == 0 else list(reversed(configs))
            for name in order:
                parts, n = run(configs[name], os.path.join(tmp, "perf.data"))
                res[name].append(parts)
                samples[name].append(n)
                print(f"round {r + 1} {name}: {n} samples, "
                      + ", ".join(f"{k} {parts[k]:.1f}" for k in PARTS), file=sys.stderr)
    med = {name: {k: statistics.median(p[k] for p in res[name]) for k in PARTS} for name in res}
    n = statistics.median(samples["sampled"]) - statistics.median(samples["armed"])
    print(f"# {a.rounds} rounds of: {' '.join(cmd)}; sampled at {a.interval} (fixed): "
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
