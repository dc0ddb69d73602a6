//! Helpers for the end-to-end tests of `heapprofd-rs record`
//! (`tests/tests/record_truth.rs`, `tests/tests/record_e2e.rs`) and the
//! record benchmark (`src/bin/heapprofd-record-bench.rs`).
//!
//! * [`release_bins`]: the `heapprofd-rs` binary and the client library that
//!   `cargo build --release` put next to each other. They are looked for in
//!   `$CARGO_TARGET_DIR/release`, in the target directory this test binary
//!   was built into, and in the workspace's `target/release`; nothing is
//!   built here (a test that silently rebuilt the daemon would test whatever
//!   happened to compile), a missing binary is a failure that says
//!   "run `cargo build --release` first".
//! * [`record_programs`]: `tests/programs/alloc_truth.cpp`, the C
//!   programs of `tests/programs/record/` and `tests/programs/heaps/`,
//!   compiled once per test process into a temporary directory.
//! * [`Live`]: a running `record` in its own process group, with its stdin,
//!   and its stdout/stderr collected as they come (to drive an interactive
//!   program and send signals).
//! * [`check_trace`]: runs `proto/tests/check_trace.py --strict` (the
//!   official Perfetto schema) on a trace, fails the test on any problem, and
//!   returns its summary as a [`TraceSummary`].
//! * [`Heaptrack`]: runs a program under heaptrack and reads
//!   `heaptrack_print`'s folded stacks.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::Value;

use crate::client_harness::{Output, compile, run, target_dir, workspace_root};

/// The binaries of a release build.
#[derive(Debug, Clone)]
pub struct ReleaseBins {
    /// `heapprofd-rs`.
    pub heapprofd: PathBuf,
    /// `libheapprofd_client.so` (next to it; `record` finds it there).
    pub client_so: PathBuf,
}

/// Finds the release binaries (see the module docs); panics with
/// "run `cargo build --release` first" when they are missing.
pub fn release_bins() -> &'static ReleaseBins {
    static BINS: OnceLock<ReleaseBins> = OnceLock::new();
    BINS.get_or_init(|| {
        let mut dirs = Vec::new();
        if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
            dirs.push(PathBuf::from(d).join("release"));
        }
        dirs.push(target_dir().join("release"));
        dirs.push(workspace_root().join("target/release"));
        dirs.dedup();
        for d in &dirs {
            let bins = ReleaseBins {
                heapprofd: d.join("heapprofd-rs"),
                client_so: d.join("libheapprofd_client.so"),
            };
            if bins.heapprofd.is_file() && bins.client_so.is_file() {
                eprintln!("record tests: using {}", bins.heapprofd.display());
                warn_if_stale(&bins);
                return bins;
            }
        }
        panic!(
            "heapprofd-rs and libheapprofd_client.so not found together in any of {dirs:?}: \
             run `cargo build --release` first (with the same CARGO_TARGET_DIR as the tests)"
        );
    })
}

/// Warns (loudly, without failing: CI builds right before testing) when a
/// binary is older than the newest source file it is built from.
fn warn_if_stale(bins: &ReleaseBins) {
    fn newest(dir: &Path, t: &mut std::time::SystemTime) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                newest(&p, t);
            } else if p.extension().is_some_and(|x| x == "rs")
                && let Ok(m) = e.metadata().and_then(|m| m.modified())
            {
                *t = (*t).max(m);
            }
        }
    }
    // The client library is built from fewer crates than the daemon (and
    // cargo leaves it alone when only the others change).
    let daemon_crates: &[&str] = &["daemon", "client", "unwinder", "shmem", "proto"];
    let client_crates: &[&str] = &["client", "shmem", "proto"];
    for (b, crates) in [
        (&bins.heapprofd, daemon_crates),
        (&bins.client_so, client_crates),
    ] {
        let mut src = std::time::SystemTime::UNIX_EPOCH;
        for c in crates {
            newest(&workspace_root().join(c).join("src"), &mut src);
        }
        if let Ok(m) = std::fs::metadata(b).and_then(|m| m.modified())
            && m < src
        {
            eprintln!(
                "WARNING: {} is older than the newest source file: the record tests test \
                 a stale build; run `cargo build --release` first",
                b.display()
            );
        }
    }
}

/// A `heapprofd-rs` command (release build).
///
/// Its symbol cache is the tests' own (`target/test-cache`, through
/// `XDG_CACHE_HOME`), not the user's: one run of the suite leaves
/// thousands of files (each generated library is a module of its own).
pub fn heapprofd() -> Command {
    let mut c = Command::new(&release_bins().heapprofd);
    c.env("XDG_CACHE_HOME", target_dir().join("test-cache"));
    c
}

/// Compiled test programs of the record tests.
#[derive(Debug)]
pub struct RecordPrograms {
    /// Directory holding the binaries.
    pub dir: PathBuf,
}

impl RecordPrograms {
    /// Path of program (or library) `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Compiles `alloc_truth.cpp`, `tests/programs/record/*.c` and the
/// `sites` programs (C++ and Rust) once per process, optimized with debug
/// information as in a normal build (frame pointers omitted).
pub fn record_programs() -> &'static RecordPrograms {
    static P: OnceLock<RecordPrograms> = OnceLock::new();
    P.get_or_init(|| {
        let src = workspace_root().join("tests/programs");
        let dir =
            std::env::temp_dir().join(format!("heapprofd-record-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let s = |f: &str| src.join(f).to_string_lossy().into_owned();
        let o = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let truth = (s("alloc_truth.cpp"), o("alloc_truth"));
        compile(&["g++", "-O2", "-g", "-pthread", "-o", &truth.1, &truth.0]);
        for p in ["crash", "exit_now", "many_stacks", "stepper", "analysis"] {
            let (src_f, out_f) = (s(&format!("record/{p}.c")), o(p));
            compile(&["gcc", "-O2", "-g", "-pthread", "-o", &out_f, &src_f, "-ldl"]);
        }
        compile(&[
            "g++",
            "-O2",
            "-g",
            "-o",
            &o("sites_cpp"),
            &s("record/sites.cpp"),
        ]);
        // A Rust release build as users make them: optimized, line tables.
        compile(&[
            "rustc",
            "-O",
            "-C",
            "debuginfo=line-tables-only",
            "--edition",
            "2021",
            "-o",
            &o("sites_rs"),
            &s("record/sites.rs"),
        ]);
        // The custom heap API's pool (tests/tests/custom_heaps.rs).
        let include = workspace_root().join("client/include");
        compile(&[
            "gcc",
            "-O2",
            "-g",
            "-Wall",
            "-Werror",
            "-I",
            &include.to_string_lossy(),
            "-o",
            &o("pool"),
            &s("heaps/pool.c"),
        ]);
        compile(&[
            "gcc",
            "-O2",
            "-g",
            "-Wall",
            "-Werror",
            "-pthread",
            "-I",
            &include.to_string_lossy(),
            "-o",
            &o("heap_threads"),
            &s("heaps/threads.c"),
        ]);
        // The user context API's server (tests/tests/contexts.rs).
        compile(&[
            "gcc",
            "-O2",
            "-g",
            "-Wall",
            "-Werror",
            "-pthread",
            "-I",
            &include.to_string_lossy(),
            "-o",
            &o("endpoints"),
            &s("contexts/endpoints.c"),
        ]);
        let (lib_src, lib_out) = (s("record/libdl_alloc.c"), o("libdl_alloc.so"));
        compile(&[
            "gcc", "-O2", "-g", "-shared", "-fPIC", "-o", &lib_out, &lib_src,
        ]);
        RecordPrograms { dir }
    })
}

/// A fresh empty directory for one test's files.
pub fn scratch_dir(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("heapprofd-record-{}-{n}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch dir");
    d
}

/// Runs `heapprofd-rs record ARGS -- CMD` to completion (stdin closed,
/// output captured) with a timeout.
pub fn record(args: &[&str], cmd: &[&str], timeout: Duration) -> Output {
    let mut c = heapprofd();
    c.arg("record").args(args).arg("--").args(cmd);
    run(c, timeout)
}

/// Runs `heapprofd-rs ARGS` (report, convert...) and expects success.
pub fn heapprofd_ok(args: &[&str]) -> Output {
    let mut c = heapprofd();
    c.args(args);
    let out = run(c, Duration::from_secs(120));
    assert_eq!(
        out.code,
        Some(0),
        "heapprofd-rs {args:?} failed:\n{}",
        out.stderr
    );
    out
}

/// A running `record` in its own process group.
#[derive(Debug)]
pub struct Live {
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr_thread: Option<std::thread::JoinHandle<String>>,
    stdout_thread: Option<std::thread::JoinHandle<()>>,
    /// Process id of `record` (also its process group id).
    pub pid: i32,
}

impl Live {
    /// Starts `heapprofd-rs record ARGS -- CMD` with piped stdio, as the
    /// leader of a new process group (CMD joins that group, as it would a
    /// shell's foreground job).
    pub fn start(args: &[&str], cmd: &[&str]) -> Live {
        use std::os::unix::process::CommandExt;
        let mut c = heapprofd();
        c.arg("record").args(args).arg("--").args(cmd);
        let mut child = c
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn heapprofd-rs record");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let stdout_thread = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let stderr_thread = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut s);
            s
        });
        Live {
            pid: child.id() as i32,
            stdin: child.stdin.take(),
            child: Some(child),
            stdout: lines,
            stderr_thread: Some(stderr_thread),
            stdout_thread: Some(stdout_thread),
        }
    }

    /// Writes one line to CMD's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        writeln!(stdin, "{line}").expect("write to the program's stdin");
        stdin.flush().expect("flush stdin");
    }

    /// Sends `line` and waits for the program's `ok <line>`.
    pub fn step(&mut self, line: &str) {
        self.send(line);
        let want = format!("ok {line}");
        self.wait_stdout(&want, Duration::from_secs(60));
    }

    /// Waits until CMD printed exactly `line` (panics after `timeout`).
    pub fn wait_stdout(&self, line: &str, timeout: Duration) {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if self.stdout.lock().unwrap().iter().any(|l| l == line) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!(
            "no `{line}` from the program within {timeout:?}; stdout so far: {:?}",
            self.stdout.lock().unwrap()
        );
    }

    /// Sends `sig` to `record` itself.
    pub fn signal(&self, sig: i32) {
        kill(
            Pid::from_raw(self.pid),
            Signal::try_from(sig).expect("a signal"),
        )
        .expect("kill record");
    }

    /// Sends `sig` to the whole process group (record and CMD), as a
    /// terminal's Ctrl-C does.
    pub fn signal_group(&self, sig: i32) {
        let sig = Signal::try_from(sig).expect("a signal");
        killpg(Pid::from_raw(self.pid), sig).expect("kill group");
    }

    /// Closes CMD's stdin (end of its input).
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Waits for `record` to exit; returns its exit code and output. Fails
    /// if anything of its process group (CMD) is still running then.
    pub fn finish(self, timeout: Duration) -> Output {
        let (out, leftover) = self.finish_inner(timeout);
        assert!(
            !leftover,
            "record exited but part of its process group was still running; stderr:\n{}",
            out.stderr
        );
        out
    }

    /// Like [`Live::finish`], but CMD may outlive `record` (it ignored
    /// Ctrl-C): whatever is left of the process group is killed.
    pub fn finish_killing_leftovers(self, timeout: Duration) -> Output {
        self.finish_inner(timeout).0
    }

    fn finish_inner(mut self, timeout: Duration) -> (Output, bool) {
        self.close_stdin();
        let mut child = self.child.take().expect("child");
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break st;
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "record hung for {timeout:?}; stdout: {:?}",
                    self.stdout.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // A process left in the group keeps the output pipes open: kill it
        // before reading them to the end. (The group id cannot be reused
        // while the group has members.)
        let leftover = killpg(Pid::from_raw(self.pid), Signal::SIGKILL).is_ok();
        if let Some(t) = self.stdout_thread.take() {
            let _ = t.join();
        }
        let stderr = self
            .stderr_thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let stdout = self.stdout.lock().unwrap().join("\n");
        let out = Output {
            code: status.code(),
            stdout,
            stderr,
        };
        (out, leftover)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // A failed test must not leave the group (record, CMD) behind.
        if let Some(mut c) = self.child.take() {
            let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
            let _ = c.wait();
        }
    }
}

/// One heap-profile sample (a callstack's values in one dump), from
/// `check_trace.py`'s summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Index of its dump in [`TraceSummary::dumps`].
    pub dump: usize,
    /// Process.
    pub pid: u64,
    /// Heap name.
    pub heap: String,
    /// Interned callstack id.
    pub callstack: u64,
    /// Function names, outermost caller first (`?` when unnamed).
    pub frames: Vec<String>,
    /// Cumulative bytes allocated.
    pub allocated: u64,
    /// Cumulative bytes freed.
    pub freed: u64,
    /// Cumulative allocations.
    pub alloc_count: u64,
    /// Cumulative frees.
    pub free_count: u64,
    /// Bytes live at the peak (dump_at_max traces).
    pub self_max: Option<u64>,
    /// Allocations live at the peak.
    pub self_max_count: Option<u64>,
}

/// What `check_trace.py` made of a trace.
#[derive(Debug, Clone)]
pub struct TraceSummary {
    /// The script's whole JSON output.
    pub json: Value,
    /// `summary.heap_dumps`: one per (dump, process, heap), in file order.
    pub dumps: Vec<Value>,
    /// Every sample of every dump.
    pub samples: Vec<Sample>,
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

impl TraceSummary {
    /// The latest values of each (pid, heap, callstack): later dumps may
    /// leave out callstacks that did not change.
    pub fn latest(&self) -> Vec<Sample> {
        let mut by: BTreeMap<(u64, String, u64), Sample> = BTreeMap::new();
        for s in &self.samples {
            by.insert((s.pid, s.heap.clone(), s.callstack), s.clone());
        }
        by.into_values().collect()
    }

    /// Pids of the processes with at least one dump.
    pub fn pids(&self) -> Vec<u64> {
        let mut p: Vec<u64> = self.dumps.iter().map(|d| u(d, "pid")).collect();
        p.sort_unstable();
        p.dedup();
        p
    }

    /// `stats.<key>` of the last dump of `pid`.
    pub fn last_stat(&self, pid: u64, key: &str) -> u64 {
        let d = self
            .dumps
            .iter()
            .rev()
            .find(|d| u(d, "pid") == pid)
            .unwrap_or_else(|| panic!("no dump of pid {pid}"));
        u(&d["stats"], key)
    }

    /// Checks that no (pid, heap, callstack) value ever decreases from one
    /// dump to a later one (Perfetto's cumulative-values rule).
    pub fn assert_non_decreasing(&self) {
        let mut last: HashMap<(u64, String, u64), &Sample> = HashMap::new();
        for s in &self.samples {
            let key = (s.pid, s.heap.clone(), s.callstack);
            if let Some(prev) = last.get(&key) {
                for (what, a, b) in [
                    ("allocated", prev.allocated, s.allocated),
                    ("freed", prev.freed, s.freed),
                    ("alloc_count", prev.alloc_count, s.alloc_count),
                    ("free_count", prev.free_count, s.free_count),
                ] {
                    assert!(
                        b >= a,
                        "{what} of callstack {} decreased from {a} (dump {}) to {b} (dump {})",
                        s.callstack,
                        prev.dump,
                        s.dump
                    );
                }
            }
            last.insert(key, s);
        }
    }
}

/// Path of the trace checker.
pub fn check_trace_script() -> PathBuf {
    workspace_root().join("proto/tests/check_trace.py")
}

/// Runs `check_trace.py --strict TRACE`: fails the test if the trace has
/// unknown fields, dangling interned ids, non-consecutive indices... and
/// returns the parsed summary.
pub fn check_trace(trace: &Path) -> TraceSummary {
    let mut c = Command::new("python3");
    c.arg(check_trace_script()).arg("--strict").arg(trace);
    let out = run(c, Duration::from_secs(300));
    assert_ne!(
        out.code,
        Some(3),
        "check_trace.py needs the `perfetto` Python package: run scripts/install-deps.sh\n{}",
        out.stderr
    );
    let json: Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check_trace.py printed no JSON ({e}); exit {:?}\n{}",
            out.code, out.stderr
        )
    });
    assert!(
        out.code == Some(0) && json["ok"] == Value::Bool(true),
        "check_trace.py --strict rejected {}: exit {:?}, error {}, warnings {}, unknown fields {}",
        trace.display(),
        out.code,
        json["error"],
        json["warnings"],
        json.get("unknown_fields").unwrap_or(&Value::Null)
    );
    let summary = &json["summary"];
    let dumps = summary["heap_dumps"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let samples = summary["heap_samples"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| Sample {
                    dump: u(s, "dump") as usize,
                    pid: u(s, "pid"),
                    heap: s["heap_name"].as_str().unwrap_or("").to_string(),
                    callstack: u(s, "callstack_id"),
                    frames: s["frames"]
                        .as_array()
                        .map(|f| {
                            f.iter()
                                .map(|fr| fr["function"].as_str().unwrap_or("?").to_string())
                                .collect()
                        })
                        .unwrap_or_default(),
                    allocated: u(s, "self_allocated"),
                    freed: u(s, "self_freed"),
                    alloc_count: u(s, "alloc_count"),
                    free_count: u(s, "free_count"),
                    self_max: s.get("self_max").and_then(Value::as_u64),
                    self_max_count: s.get("self_max_count").and_then(Value::as_u64),
                })
                .collect()
        })
        .unwrap_or_default();
    TraceSummary {
        json,
        dumps,
        samples,
    }
}

/// Totals of a group of samples (or of heaptrack stacks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Allocations.
    pub allocs: u64,
    /// Bytes allocated.
    pub bytes: u64,
    /// Frees.
    pub frees: u64,
    /// Bytes freed.
    pub freed: u64,
}

impl Totals {
    /// Adds one sample's values.
    pub fn add(&mut self, s: &Sample) {
        self.allocs += s.alloc_count;
        self.bytes += s.allocated;
        self.frees += s.free_count;
        self.freed += s.freed;
    }
}

/// Groups samples by `key(frames)` and sums their values.
pub fn group_by(samples: &[Sample], key: impl Fn(&[String]) -> String) -> BTreeMap<String, Totals> {
    let mut m: BTreeMap<String, Totals> = BTreeMap::new();
    for s in samples {
        m.entry(key(&s.frames)).or_default().add(s);
    }
    m
}

/// A heaptrack run of one command, read back with `heaptrack_print`.
#[derive(Debug, Clone)]
pub struct Heaptrack {
    /// Folded stacks (frames as heaptrack prints them, e.g.
    /// `main (alloc_truth.cpp)`) with their number of allocations.
    pub allocations: Vec<(Vec<String>, u64)>,
    /// The same stacks with the bytes they leaked.
    pub leaked: Vec<(Vec<String>, u64)>,
    /// `calls to allocation functions: N` of heaptrack_print's summary.
    pub total_calls: u64,
    /// Bytes requested by all allocations (from heaptrack_print's size
    /// histogram, whose sizes are exact).
    pub total_bytes: u64,
    /// heaptrack's standard output (the program's, among heaptrack's own lines).
    pub stdout: String,
}

impl Heaptrack {
    /// Runs `heaptrack -o DIR/ht CMD` (stdout piped) and reads the result.
    pub fn run(cmd: &[&str], dir: &Path) -> Heaptrack {
        Heaptrack::run_env(cmd, &[], dir)
    }

    /// [`Heaptrack::run`] with extra environment variables for CMD.
    pub fn run_env(cmd: &[&str], env: &[(&str, &str)], dir: &Path) -> Heaptrack {
        let base = dir.join("ht");
        let mut c = Command::new("heaptrack");
        c.arg("-o").arg(&base).args(cmd).envs(env.iter().copied());
        let out = run(c, Duration::from_secs(300));
        assert_eq!(
            out.code,
            Some(0),
            "heaptrack failed (is it installed? scripts/install-deps.sh):\n{}",
            out.stderr
        );
        let data = ["zst", "gz"]
            .iter()
            .map(|e| dir.join(format!("ht.{e}")))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no heaptrack data in {}", dir.display()));
        let print = |extra: &[&str]| {
            let mut c = Command::new("heaptrack_print");
            c.arg("-f").arg(&data).args(extra);
            let o = run(c, Duration::from_secs(300));
            assert_eq!(o.code, Some(0), "heaptrack_print failed:\n{}", o.stderr);
            o.stdout
        };
        let folded = |cost: &str| {
            let f = dir.join(format!("folded-{cost}.txt"));
            let fs = f.to_string_lossy().into_owned();
            print(&["-F", &fs, "--flamegraph-cost-type", cost]);
            parse_folded(&std::fs::read_to_string(&f).expect("read folded stacks"))
        };
        let hist = dir.join("histogram.txt");
        let summary = print(&["-H", &hist.to_string_lossy()]);
        let total_calls = summary
            .lines()
            .find_map(|l| l.strip_prefix("calls to allocation functions: "))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no allocation count in heaptrack_print output:\n{summary}"));
        let (mut calls, mut total_bytes) = (0u64, 0u64);
        for line in std::fs::read_to_string(&hist)
            .expect("read heaptrack's size histogram")
            .lines()
        {
            let mut f = line.split_whitespace().map(|x| x.parse::<u64>());
            if let (Some(Ok(size)), Some(Ok(n))) = (f.next(), f.next()) {
                calls += n;
                total_bytes += size * n;
            }
        }
        assert_eq!(
            calls, total_calls,
            "heaptrack's size histogram does not add up to its allocation count"
        );
        Heaptrack {
            allocations: folded("allocations"),
            leaked: folded("leaked"),
            total_calls,
            total_bytes,
            stdout: out.stdout,
        }
    }
}

/// Parses folded stacks: `frame;frame;... COUNT` per line.
pub fn parse_folded(text: &str) -> Vec<(Vec<String>, u64)> {
    text.lines()
        .filter_map(|l| {
            let (stack, n) = l.trim_end().rsplit_once(' ')?;
            let frames = stack
                .trim_end_matches(';')
                .split(';')
                .map(str::to_string)
                .collect();
            Some((frames, n.parse().ok()?))
        })
        .collect()
}

/// Whether a heaptrack frame (`name (file)`) or one of ours (`name`) is
/// function `f`.
pub fn frame_is(frame: &str, f: &str) -> bool {
    frame == f || frame.strip_prefix(f).is_some_and(|r| r.starts_with(" ("))
}
