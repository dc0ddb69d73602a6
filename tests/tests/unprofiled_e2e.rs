//! Programs `record` cannot profile keep running; `record` says which
//! process and why, the trace flags it (a dump with no samples and
//! Perfetto's `disconnected`), and the summary does not count it as
//! profiled:
//!
//! * CMD itself is statically linked (record checks it before starting it);
//! * a profiled process execs a statically linked program (the client's
//!   exec hook tells the daemon before the exec), directly (`env STATIC`:
//!   the process was profiled before) or from a forked child (`sh -c`);
//! * the executable has its allocator linked in (jemalloc's `libjemalloc.a`:
//!   it defines `malloc` and calls it directly; the client tells the daemon
//!   instead of connecting).
//!
//! Every trace is read back with `check_trace.py --strict`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use heapprofd_tests::client_harness::{Output, compile, run, workspace_root};
use heapprofd_tests::record_harness::{TraceSummary, check_trace, heapprofd, scratch_dir};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(120);

fn programs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = workspace_root().join("tests/programs/corpus");
        let dir = std::env::temp_dir().join(format!("heapprofd-unprofiled-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let s = |f: &str| src.join(f).to_string_lossy().into_owned();
        let o = |f: &str| dir.join(f).to_string_lossy().into_owned();
        compile(&[
            "gcc",
            "-O2",
            "-static",
            "-o",
            &o("static_prog"),
            &s("nopie_addr.c"),
        ]);
        compile(&[
            "g++",
            "-O2",
            "-pthread",
            "-o",
            &o("builtin_jemalloc"),
            &s("cxx_alloc.cpp"),
            "/usr/lib/x86_64-linux-gnu/libjemalloc.a",
            "-ldl",
        ]);
        dir
    })
}

fn prog(name: &str) -> String {
    programs().join(name).to_string_lossy().into_owned()
}

fn record(tag: &str, cmd: &[&str]) -> (Output, TraceSummary) {
    let dir = scratch_dir(tag);
    let trace = dir.join("trace.pftrace");
    let mut c = heapprofd();
    c.args(["record", "-i", "1", "-o"])
        .arg(&trace)
        .arg("--")
        .args(cmd);
    let out = run(c, TIMEOUT);
    assert_eq!(
        out.code,
        Some(0),
        "record {cmd:?}:\nstdout:\n{}\nstderr:\n{}",
        out.stdout,
        out.stderr
    );
    let t = check_trace(&trace);
    (out, t)
}

/// The pid named in `pid N (`...`) runs unprofiled: WHY` on stderr.
fn named_pid(stderr: &str, why: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains(") runs unprofiled: ") && l.contains(why))
        .unwrap_or_else(|| panic!("no `runs unprofiled: {why}` line in:\n{stderr}"));
    line.split_whitespace()
        .skip_while(|w| *w != "pid")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"))
}

/// The dumps of `pid`: present, all flagged `disconnected`; its samples.
fn flagged(t: &TraceSummary, pid: u64) -> u64 {
    let dumps: Vec<&Value> = t.dumps.iter().filter(|d| d["pid"] == pid).collect();
    assert!(
        !dumps.is_empty(),
        "pid {pid} is not in the trace: {:?}",
        t.dumps
    );
    for d in &dumps {
        assert_eq!(
            d["disconnected"],
            Value::Bool(true),
            "pid {pid} not flagged: {d}"
        );
    }
    t.samples
        .iter()
        .filter(|s| s.pid == pid)
        .map(|s| s.alloc_count)
        .sum()
}

#[test]
fn statically_linked_cmd_runs_and_is_named() {
    let exe = prog("static_prog");
    let (out, t) = record("static-cmd", &[&exe, "100"]);
    assert!(
        out.stdout.contains("nopie_addr done"),
        "it ran: {}",
        out.stdout
    );
    let pid = named_pid(&out.stderr, "statically linked");
    assert_eq!(flagged(&t, pid), 0, "no samples");
    assert!(
        out.stderr
            .contains("0 processes, 0 allocations (every allocation recorded)"),
        "not counted:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!(
            "pid {pid:<7} not profiled: it runs a statically linked"
        )),
        "{}",
        out.stderr
    );
}

#[test]
fn exec_of_a_static_program_after_being_profiled_is_named() {
    // env is profiled, then execvp()s the static program (same pid).
    let exe = prog("static_prog");
    let (out, t) = record("static-exec", &["env", &exe, "100"]);
    assert!(out.stdout.contains("nopie_addr done"), "{}", out.stdout);
    let pid = named_pid(&out.stderr, "statically linked");
    flagged(&t, pid);
    assert!(
        out.stderr.contains("1 process,")
            && out
                .stderr
                .contains("warning: after that it ran unprofiled: it runs a statically"),
        "{}",
        out.stderr
    );
}

#[test]
fn static_program_started_by_a_shell_is_named() {
    // dash forks; the child (no session of its own) execs the program.
    let exe = prog("static_prog");
    let script = format!("{exe} 100; echo shell done");
    let (out, t) = record("static-sh", &["/bin/sh", "-c", &script]);
    assert!(out.stdout.contains("nopie_addr done") && out.stdout.contains("shell done"));
    let pid = named_pid(&out.stderr, "statically linked");
    assert_eq!(flagged(&t, pid), 0);
    assert!(
        out.stderr.contains(&format!("pid {pid:<7} not profiled: ")),
        "{}",
        out.stderr
    );
}

#[test]
fn allocator_built_into_the_executable_runs_and_is_named() {
    let exe = prog("builtin_jemalloc");
    let (out, t) = record("builtin", &[&exe, "10"]);
    assert!(
        out.stdout.contains("cxx_alloc done"),
        "it ran: {}",
        out.stderr
    );
    let pid = named_pid(&out.stderr, "defines malloc itself");
    assert_eq!(flagged(&t, pid), 0);
    assert!(
        out.stderr
            .contains("0 processes, 0 allocations (every allocation recorded)")
            && out.stderr.contains("not profiled"),
        "{}",
        out.stderr
    );
}
