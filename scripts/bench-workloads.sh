#!/bin/bash
# The benchmark suite of issue 11 (docs/PERFORMANCE.md, "The workload suite"):
# whole-program wall and CPU of real and generated workloads, bare, under
# `heapprofd-rs record` at -i 1, the default 4 KiB and 512 KiB, and under
# heaptrack, interleaved in one run, medians, as ratios against the bare run
# and against heaptrack of the same run; then where record's time goes per
# sample, from the daemon's `costs:` line (HEAPPROFD_DEBUG=1).
#
# Workloads: `tree` (scripts/gen-call-tree.py: ~3,000 distinct leaf stacks
# of random depth, 1 and 4 threads, and 1 thread started through `env`, a
# program that execs), `onestack` (tests/programs/client/
# bench.c: one stack of depth 20, 1 and 4 threads), sqlite3 in memory and on
# a file (100k INSERTs and an index), gcc's cc1 -O2 on a generated C file,
# python3 and node building and serializing a list of dicts (node only if
# installed).
#
# Usage: cargo build --release -p heapprofd-daemon -p heapprofd-client
#        scripts/bench-workloads.sh [--quick] [--rounds N] [--only W,W] [--no-heaptrack] [--base BIN] [--fixed]
# --quick: one round of small sizes (a smoke run, a minute or two).
# --base BIN: also run another build's heapprofd-rs (with its client library
# beside it) at -i 1, 4 KiB and 512 KiB in the same rounds ("base -i 1", ...),
# for a before/after of a change.
# --fixed: also run 4 KiB with --fixed-interval ("4 KiB fixed": the program
# waits for the daemon instead of raising its interval).
# Prints markdown tables and the load average before and after.
set -eu
cd "$(dirname "$0")/.."
ROOT=$PWD
B=${HEAPPROFD_BIN:-$ROOT/target/release/heapprofd-rs}
[ -x "$B" ] || { echo "no $B: run cargo build --release first" >&2; exit 1; }
QUICK=0
for a in "$@"; do [ "$a" = --quick ] && QUICK=1; done
work=$(mktemp -d /tmp/bench-workloads.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ $QUICK = 1 ]; then LEAVES=600; CC_LEAVES=60; else LEAVES=3000; CC_LEAVES=250; fi
echo "building the workloads in $work (gcc -O2 -g)..." >&2
python3 scripts/gen-call-tree.py --seed 11 --leaves $LEAVES > "$work/tree.c"
gcc -O2 -g -fno-optimize-sibling-calls -pthread "$work/tree.c" -o "$work/tree"
gcc -O2 -g -pthread tests/programs/client/bench.c -o "$work/onestack"
python3 scripts/gen-call-tree.py --seed 5 --leaves $CC_LEAVES > "$work/cc1-input.c"
gcc -E "$work/cc1-input.c" -o "$work/cc1-input.i"
python3 - "$B" "$work" "$@" <<'PY'
import os, re, shutil, statistics, subprocess, sys, time

B, WORK = sys.argv[1], sys.argv[2]
args = sys.argv[3:]
quick = "--quick" in args
rounds = 1 if quick else 5
only = None
heaptrack = shutil.which("heaptrack") is not None and "--no-heaptrack" not in args
base = None
for i, a in enumerate(args):
    if a == "--base":
        base = args[i + 1]
    if a == "--rounds":
        rounds = int(args[i + 1])
    if a == "--only":
        only = set(args[i + 1].split(","))

def sql(rows):
    return ("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);\n"
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i < %d)\n"
            "INSERT INTO t(b, c) SELECT hex(randomblob(16)) || i, i * 1.5 FROM n;\n"
            "CREATE INDEX tb ON t(b);\nSELECT count(*) FROM t;\n" % rows)

rows = 20000 if quick else 100000
open(f"{WORK}/mem.sql", "w").write(sql(rows))
# On a file: the same rows in transactions of 1000, then the index.
with open(f"{WORK}/file.sql", "w") as f:
    f.write("CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c REAL);\n")
    for k in range(0, rows, 1000):
        f.write("BEGIN;\nWITH RECURSIVE n(i) AS (SELECT %d UNION ALL SELECT i+1 FROM n WHERE i < %d)\n"
                "INSERT INTO t(b, c) SELECT hex(randomblob(16)) || i, i * 1.5 FROM n;\nCOMMIT;\n" % (k + 1, k + 1000))
    f.write("CREATE INDEX tb ON t(b);\nSELECT count(*) FROM t;\n")
n = 20000 if quick else 200000
PY_CODE = ("import json\nd = [{'k': i, 'v': str(i) * 3, 'l': [i, i + 1]} for i in range(%d)]\n"
           "s = json.dumps(d)\nprint(len(json.loads(s)))\n" % n)
JS_CODE = ("const d = []; for (let i = 0; i < %d; i++) d.push({k: i, v: String(i).repeat(3), l: [i, i + 1]});"
           " console.log(JSON.parse(JSON.stringify(d)).length);" % n)
cc1 = subprocess.run(["gcc", "-print-prog-name=cc1"], capture_output=True, text=True).stdout.strip()
python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else shutil.which("python3")
calls = 100000 if quick else 1000000
pairs = 200000 if quick else 2000000
W = [  # name, argv, stdin file, file to remove before each run
    ("tree-1t", [f"{WORK}/tree", "1", str(calls)], None, None),
    ("tree-4t", [f"{WORK}/tree", "4", str(calls // 4)], None, None),
    # The same behind an exec (`env`): the new image keeps the pid, so its
    # session goes to the worker that ends the old image's.
    ("tree-exec", ["env", f"{WORK}/tree", "1", str(calls)], None, None),
    ("onestack-1t", [f"{WORK}/onestack", "1", str(pairs), "20"], None, None),
    ("onestack-4t", [f"{WORK}/onestack", "4", str(pairs // 4), "20"], None, None),
    ("sqlite-mem", ["sqlite3", ":memory:"], f"{WORK}/mem.sql", None),
    ("sqlite-file", ["sqlite3", f"{WORK}/bench.db"], f"{WORK}/file.sql", f"{WORK}/bench.db"),
    ("cc1", [cc1, "-fpreprocessed", "-quiet", "-O2", f"{WORK}/cc1-input.i", "-o", "/dev/null"], None, None),
    ("python3", [python, "-c", PY_CODE], None, None),
]
if shutil.which("node"):
    W.append(("node", ["node", "-e", JS_CODE], None, None))
if only:
    W = [w for w in W if w[0] in only]
CONFIGS = ["bare", "-i 1", "4 KiB", "512 KiB"] + (["heaptrack"] if heaptrack else [])
if "--fixed" in args:
    CONFIGS.append("4 KiB fixed")
if base:
    CONFIGS += ["base -i 1", "base 4 KiB", "base 512 KiB"]

def command(config, argv, tag):
    out = f"{WORK}/{tag}"
    if config == "bare":
        return argv
    if config == "heaptrack":
        return ["heaptrack", "-o", out] + argv
    binary = B
    if config.startswith("base "):
        binary, config = base, config[5:]
    interval = {"-i 1": ["-i", "1"], "4 KiB": [], "512 KiB": ["-i", "512k"],
                "4 KiB fixed": ["--fixed-interval"]}[config]
    # --no-service: record's own daemon (a running service would take the
    # profile, and its costs are not record's to print).
    return [binary, "record", "--no-service"] + interval + ["-o", out + ".pftrace", "--"] + argv

def run(config, argv, stdin, remove):
    if remove and os.path.exists(remove):
        os.remove(remove)
    cmd = command(config, argv, "out")
    env = dict(os.environ, HEAPPROFD_DEBUG="1")
    fin = open(stdin) if stdin else subprocess.DEVNULL
    ferr = open(f"{WORK}/stderr", "w+")
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=fin, stdout=subprocess.DEVNULL, stderr=ferr, env=env, cwd=WORK,
                         start_new_session=True)
    while True:  # wait4 for the rusage; polled so that a hung run is killed
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() - t0 > TIMEOUT:
            os.killpg(p.pid, 9)
        time.sleep(0.001)
    wall = time.perf_counter() - t0
    ferr.seek(0)
    err = ferr.read()
    p.returncode = os.waitstatus_to_exitcode(status)
    for f in os.listdir(WORK):
        if f.startswith("out"):
            os.remove(os.path.join(WORK, f))
    if p.returncode != 0:
        # Not in the medians: a failed or killed run measures nothing.
        print(f"  {config} {argv[0]} exited {p.returncode}: {err[-400:]}", file=sys.stderr)
        return None
    r = {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime}
    m = re.search(r"costs: (.*)", err)
    if m:
        for k, v in re.findall(r"(\w+)=([\d.]+)", m.group(1)):
            r[k] = float(v)
    # Samples drawn at a raised interval (the summary's warning; none: 0).
    m = re.search(r"(\d+) samples were taken at a raised interval", err)
    r["raised"] = float(m.group(1)) if m else 0.0
    m = re.search(r"self usage: user_s=([\d.]+) sys_s=([\d.]+)", err)
    if m:
        r["daemon_cpu"] = float(m.group(1)) + float(m.group(2))
    return r

# A run longer than this is killed (heaptrack waits forever for its FIFO when
# the program never opens it, e.g. when /tmp/heaptrack_fifo$$ was removed).
TIMEOUT = 300

def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()

print(f"# scripts/bench-workloads.sh {' '.join(args)}: {rounds} round(s), {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
print(f"# {load()} (before)")
try:
    preload = open("/etc/ld.so.preload").read().strip()
except OSError:
    preload = ""
if preload:
    print(f"# WARNING: /etc/ld.so.preload loads {preload} into every run (heaptrack may crash)")
res = {(w[0], c): [] for w in W for c in CONFIGS}
loads = []
for r in range(rounds):
    for name, argv, stdin, remove in W:
        k = r % len(CONFIGS)
        for c in CONFIGS[k:] + CONFIGS[:k]:
            r_ = run(c, argv, stdin, remove)
            if r_ is not None:
                res[(name, c)].append(r_)
    loads.append(os.getloadavg()[0])
    print(f"# round {r + 1}/{rounds} done, {load()}", file=sys.stderr)

def med(name, c, key):
    if not res[(name, c)]:
        return None
    v = [x[key] for x in res[(name, c)] if key in x]
    return statistics.median(v) if v else None

def ratio(a, b):
    return "%.2fx" % (a / b) if a is not None and b else "-"

print(f"# {load()} (after); 1-minute load after each round: {' '.join('%.2f' % l for l in loads)}")
print()
print("## Wall and CPU (medians; CPU = user+sys of the whole command, the profiler's included)")
print()
print("blocked / wall: the writers' time waiting for room in the ring, summed over threads;"
      " raised: the share of samples drawn at a raised interval (the client's adaptive interval).")
print()
print("| workload | config | wall s | CPU s | wall / bare | CPU / bare | wall / heaptrack | CPU / heaptrack | samples | blocked / wall | raised |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name, *_ in W:
    bw, bc = med(name, "bare", "wall"), med(name, "bare", "cpu")
    hw, hc = (med(name, "heaptrack", "wall"), med(name, "heaptrack", "cpu")) if heaptrack else (None, None)
    for c in CONFIGS:
        w, cpu = med(name, c, "wall"), med(name, c, "cpu")
        if w is None:
            print("| %s | %s | failed | | | | | | | | |" % (name, c))
            continue
        rec = c not in ("bare", "heaptrack")
        samples = med(name, c, "samples")
        blocked = med(name, c, "blocked_us")
        raised = statistics.median([x["raised"] / x["samples"] for x in res[(name, c)]
                                    if x.get("samples")] or [0.0])
        print("| %s | %s | %.3f | %.3f | %s | %s | %s | %s | %s | %s | %s |" % (
            name, c, w, cpu, ratio(w, bw) if c != "bare" else "1", ratio(cpu, bc) if c != "bare" else "1",
            ratio(w, hw) if rec else "-", ratio(cpu, hc) if rec else "-",
            "%d" % samples if rec and samples is not None else "-",
            "%.1f%%" % (100 * blocked / 1e6 / w) if rec and blocked is not None else "-",
            "%.0f%%" % (100 * raised) if rec else "-"))
print()
print("## Where record's time goes, per malloc sample (medians, ns)")
print()
print("client = (CPU - daemon CPU - bare CPU) / samples: the program's extra CPU (sampling,"
      " stack copy, free records); blocked: its writers waiting for room in the ring"
      " (summed over threads); read = the workers' drain time less unwinding (ring read, decode);"
      " unwind = replay checks + walks (traced walks: those keeping a replay trace) + new stacks;"
      " book = applying batches; symbolize (ms, whole run) = before dumps + the warm-up thread (wall time, preemption included).")
print()
print("| workload | config | samples | ring B/record | client | blocked | read | unwind | replay / walk+trace / new | walks (traced) | book | daemon CPU | symbolize ms |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, *_ in W:
    bc = med(name, "bare", "cpu")
    for c in CONFIGS:
        if c in ("bare", "heaptrack"):
            continue
        rows_ = res[(name, c)]
        if not rows_:
            continue
        def per(f):
            v = [f(x) for x in rows_ if x.get("samples")]
            return statistics.median(v) if v else float("nan")
        s = per(lambda x: x["samples"])
        ns = lambda key, scale=1e6: per(lambda x: x.get(key, 0) * scale / x["samples"])
        client = per(lambda x: (x["cpu"] - x.get("daemon_cpu", 0) - bc) * 1e9 / x["samples"])
        read = per(lambda x: (x["drain_ms"] - x["unwind_ms"]) * 1e6 / x["samples"])
        walk = per(lambda x: (x["unwind_ms"] - x["replay_ms"] - x["new_stack_ms"]) * 1e6 / x["samples"])
        print("| %s | %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f / %.0f / %.0f | %d (%d) | %.0f | %.0f | %.0f |" % (
            name, c, s, per(lambda x: x["ring_bytes"] / x["records"]), client, ns("blocked_us", 1e3),
            read, ns("unwind_ms"), ns("replay_ms"), walk, ns("new_stack_ms"),
            per(lambda x: x["walks"]), per(lambda x: x["traced_walks"]), ns("book_ms"),
            per(lambda x: x.get("daemon_cpu", 0) * 1e9 / x["samples"]),
            per(lambda x: x["symbolize_ms"] + x["warm_ms"])))
PY
