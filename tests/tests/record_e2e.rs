//! End-to-end tests of `heapprofd-rs record` beyond the ground-truth table
//! (`record_truth.rs`): bad input (a command that does not exist, crashes,
//! exits at once; a full disk; Ctrl-C; bad arguments), dumps on SIGUSR1, on
//! `--continuous-dump` ticks and at the peak, samples written just before
//! the program exits, and `report`/`convert` on a real trace.
//!
//! The programs are `tests/programs/record/*.c` (each documents its
//! arguments). Every trace is checked with `proto/tests/check_trace.py
//! --strict`. No assertion depends on timing: interactive programs (the
//! `stepper`) say when they are done with a step, and tests wait for what
//! they need with generous timeouts that only catch hangs.

use std::path::Path;
use std::time::Duration;

use heapprofd_tests::record_harness::{
    Live, Sample, check_trace, heapprofd, heapprofd_ok, record, record_programs, scratch_dir,
};
use heapprofd_tests::report_harness::wait_for_dumps;

const TIMEOUT: Duration = Duration::from_secs(120);

fn prog(name: &str) -> String {
    record_programs().path(name).to_string_lossy().into_owned()
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The samples whose leaf frame is `function`.
fn leaf<'a>(samples: &'a [Sample], function: &str) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|x| x.frames.last().is_some_and(|f| f == function))
        .collect()
}

/// (allocations, bytes, frees, freed) summed over the samples with leaf `function`.
fn totals(samples: &[Sample], function: &str) -> (u64, u64, u64, u64) {
    leaf(samples, function).iter().fold((0, 0, 0, 0), |a, x| {
        (
            a.0 + x.alloc_count,
            a.1 + x.allocated,
            a.2 + x.free_count,
            a.3 + x.freed,
        )
    })
}

fn no_error_frames(samples: &[Sample]) {
    for x in samples {
        assert!(
            !x.frames.iter().any(|f| f.starts_with("ERROR")),
            "error frame in {:?}",
            x.frames
        );
    }
}

#[test]
fn missing_command_is_named_and_leaves_no_trace() {
    let dir = scratch_dir("missing");
    let trace = dir.join("t.pftrace");
    let out = record(
        &["-o", &s(&trace)],
        &["./no-such-program-xyz", "arg"],
        TIMEOUT,
    );
    // 127, as a shell says "command not found" (issue 10 §4).
    assert_eq!(out.code, Some(127), "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains("no-such-program-xyz") && out.stderr.contains("No such file"),
        "the message names the command and the reason: {}",
        out.stderr
    );
    assert!(
        !trace.exists(),
        "a trace was left behind for a command that never ran"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn crashing_command_exits_like_a_shell_and_keeps_the_data() {
    for (mode, code) in [("segv", 128 + 11), ("abort", 128 + 6)] {
        let dir = scratch_dir(mode);
        let trace = dir.join("t.pftrace");
        let out = record(
            &["-i", "1", "-o", &s(&trace)],
            &[&prog("crash"), mode, "1000"],
            TIMEOUT,
        );
        assert_eq!(out.code, Some(code), "{mode}: stderr {}", out.stderr);
        let sum = check_trace(&trace);
        let samples = sum.latest();
        assert_eq!(
            totals(&samples, "alloc_before_crash"),
            (1000, 100_000, 0, 0),
            "{mode}: the allocations made before the crash"
        );
        no_error_frames(&samples);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn command_exiting_at_once_gives_a_valid_trace() {
    let dir = scratch_dir("at-once");
    // No allocation of its own, exit code 7.
    let trace = dir.join("exit7.pftrace");
    let out = record(
        &["-o", &s(&trace)],
        &[&prog("crash"), "exit7", "0"],
        TIMEOUT,
    );
    assert_eq!(
        out.code,
        Some(7),
        "exit code passes through: {}",
        out.stderr
    );
    let sum = check_trace(&trace);
    assert!(leaf(&sum.latest(), "alloc_before_crash").is_empty());
    // The program, and its parent (`record` itself, named in the tree).
    let procs = sum.json["summary"]["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(procs.len(), 2, "record's stderr: {}", out.stderr);
    let program = procs
        .iter()
        .find(|p| p["cmdline"][1] == "exit7")
        .unwrap_or_else(|| panic!("{procs:?}"));
    let parent = procs
        .iter()
        .find(|p| p["pid"] == program["ppid"])
        .unwrap_or_else(|| panic!("{procs:?}"));
    assert_eq!(parent["cmdline"][1], "record", "{procs:?}");
    // A program that never allocates (coreutils `true`), with a longer
    // file at the trace's path: `record` opens it without truncating and
    // cuts it when its bookkeeping starts, so nothing of the old file may
    // be left past the new trace.
    let trace = dir.join("true.pftrace");
    std::fs::write(&trace, vec![0xab_u8; 4 << 20]).unwrap();
    let out = record(&["-o", &s(&trace)], &["true"], TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let len = std::fs::metadata(&trace).unwrap().len();
    assert!(len < 1 << 20, "{len} bytes: the old file was not cut");
    check_trace(&trace);
    // stdout, stderr and the exit code of a shell command pass through.
    let trace = dir.join("sh.pftrace");
    let out = record(
        &["-o", &s(&trace)],
        &["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 5"],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(5));
    assert_eq!(out.stdout, "to-stdout\n");
    assert!(out.stderr.starts_with("to-stderr\n"), "{}", out.stderr);
    // Not a terminal: no status line.
    assert!(
        !out.stderr.contains('\r'),
        "status line on a pipe: {:?}",
        out.stderr
    );
    check_trace(&trace);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Unmounts on drop, so a failing test leaves no mount behind.
struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(self.0.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn full_output_directory_keeps_a_valid_prefix() {
    let dir = scratch_dir("full");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let target = std::ffi::CString::new(s(&mnt)).unwrap();
    // 64 KiB: the header fits, the interned stacks of 600 distinct
    // callstacks (about 270 KiB) do not.
    // SAFETY: valid C strings; the mount is undone by `Mount`'s drop.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"size=64k".as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            eprintln!(
                "\n!!!!! SKIPPED full_output_directory_keeps_a_valid_prefix: mounting a tmpfs \
                 is not permitted here ({e}); run the tests as root (CI does) !!!!!\n"
            );
            return;
        }
        panic!("mount -t tmpfs on {}: {e}", mnt.display());
    }
    let _mount = Mount(mnt.clone());
    let trace = mnt.join("t.pftrace");
    let out = record(
        &["-i", "1", "-o", &s(&trace)],
        &[&prog("many_stacks"), "600"],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(1), "stderr: {}", out.stderr);
    assert!(
        out.stderr.contains("No space left on device") && out.stderr.contains("valid trace"),
        "clear message: {}",
        out.stderr
    );
    assert!(trace.exists(), "the prefix is kept");
    let sum = check_trace(&trace);
    assert!(sum.json["packet_count"].as_u64().unwrap_or(0) >= 1);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ctrl_c_writes_the_trace() {
    let dir = scratch_dir("ctrl-c");
    let trace = dir.join("t.pftrace");
    let mut live = Live::start(&["-i", "1", "-o", &s(&trace)], &[&prog("stepper")]);
    live.step("grow 100");
    live.send("pause");
    live.wait_stdout("ok pause", TIMEOUT);
    // Ctrl-C on a terminal: SIGINT to the foreground process group.
    live.signal_group(libc::SIGINT);
    let out = live.finish(TIMEOUT);
    assert_eq!(out.code, Some(128 + libc::SIGINT), "stderr: {}", out.stderr);
    let sum = check_trace(&trace);
    assert_eq!(totals(&sum.latest(), "grow_site"), (100, 100_000, 0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ctrl_c_when_the_program_ignores_it() {
    let dir = scratch_dir("ctrl-c-ign");
    let trace = dir.join("t.pftrace");
    let mut live = Live::start(&["-i", "1", "-o", &s(&trace)], &[&prog("stepper")]);
    live.step("ignore-int");
    live.step("grow 10");
    live.send("pause");
    live.wait_stdout("ok pause", TIMEOUT);
    live.signal_group(libc::SIGINT);
    // record gives the program a moment, then stops profiling and writes
    // the trace anyway; the program keeps running (killed here afterwards).
    let out = live.finish_killing_leftovers(TIMEOUT);
    assert_eq!(out.code, Some(128 + libc::SIGINT), "stderr: {}", out.stderr);
    assert!(out.stderr.contains("interrupted"), "{}", out.stderr);
    let sum = check_trace(&trace);
    assert_eq!(totals(&sum.latest(), "grow_site"), (10, 10_000, 0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_arguments_are_usage_errors() {
    let dir = scratch_dir("args");
    let trace = dir.join("t.pftrace");
    let t = s(&trace);
    let missing_dir = s(&dir.join("no/such/dir/t.pftrace"));
    let long_heap = "h".repeat(64);
    let cases: [(&[&str], &str); 10] = [
        (&["-o", &missing_dir], "no/such/dir"),
        (&["-o", &t, "--heap-interval", "pool"], "NAME=BYTES"),
        (&["-o", &t, "--heap-interval", "pool=0"], "at least 1 byte"),
        (&["-o", &t, "--heaps", &long_heap], "not a heap name"),
        (&["-o", &t, "--shmem-size", "3M"], "power of two"),
        (&["-o", &t, "--shmem-size", "lots"], "shmem-size"),
        (&["-o", &t, "--interval", "0"], "interval"),
        (&["-o", &t, "-i", "-5"], "-5"),
        (&["-o", &t, "--no-such-flag"], "no-such-flag"),
        (
            &["-o", &t, "--continuous-dump", "1s", "--dump-at-max"],
            "dump-at-max",
        ),
    ];
    for (args, needle) in cases {
        let out = record(args, &["true"], TIMEOUT);
        assert_eq!(out.code, Some(2), "{args:?}: stderr {}", out.stderr);
        assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
        assert!(!trace.exists(), "{args:?} left a trace");
    }
    // No command at all.
    let mut c = heapprofd();
    c.args(["record", "-o", &t]);
    let out = heapprofd_tests::client_harness::run(c, TIMEOUT);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigusr1_adds_a_dump() {
    let dir = scratch_dir("usr1");
    let trace = dir.join("t.pftrace");
    let mut live = Live::start(&["-i", "1", "-o", &s(&trace)], &[&prog("stepper")]);
    live.step("grow 100");
    live.signal(libc::SIGUSR1);
    wait_for_dumps(&trace, 1);
    live.step("grow 50");
    let out = live.finish(TIMEOUT);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let sum = check_trace(&trace);
    assert_eq!(sum.dumps.len(), 2, "the SIGUSR1 dump and the final one");
    sum.assert_non_decreasing();
    assert_eq!(totals(&sum.latest(), "grow_site"), (150, 150_000, 0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn continuous_dumps_are_cumulative() {
    let dir = scratch_dir("continuous");
    let trace = dir.join("t.pftrace");
    let mut live = Live::start(
        &["-i", "1", "--continuous-dump", "100ms", "-o", &s(&trace)],
        &[&prog("stepper")],
    );
    let mut steps = 0;
    for want in 1..=3 {
        live.step("grow 20");
        steps += 1;
        wait_for_dumps(&trace, want);
    }
    let out = live.finish(TIMEOUT);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let sum = check_trace(&trace);
    assert!(sum.dumps.len() >= 4, "{} dumps", sum.dumps.len());
    sum.assert_non_decreasing();
    assert_eq!(
        totals(&sum.latest(), "grow_site"),
        (20 * steps, 20_000 * steps, 0, 0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dump_at_max_shows_the_peak() {
    let dir = scratch_dir("max");
    let trace = dir.join("t.pftrace");
    let mut live = Live::start(
        &["-i", "1", "--dump-at-max", "-o", &s(&trace)],
        &[&prog("stepper")],
    );
    for step in ["big", "free-big", "small"] {
        live.step(step);
    }
    let out = live.finish(TIMEOUT);
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let sum = check_trace(&trace);
    assert_eq!(sum.dumps.len(), 1);
    let samples = sum.latest();
    let peak = leaf(&samples, "peak_site");
    assert_eq!(peak.len(), 1, "{samples:?}");
    assert_eq!(
        (peak[0].self_max, peak[0].self_max_count),
        (Some(1_000_000), Some(10)),
        "at the peak all of peak_site's blocks are live"
    );
    for x in leaf(&samples, "after_peak_site") {
        assert_eq!(
            x.self_max.unwrap_or(0),
            0,
            "allocated after the peak: {x:?}"
        );
    }
    // `report` shows the peak too.
    let rep = heapprofd_ok(&["report", "--format", "json", &s(&trace)]);
    let v: serde_json::Value = serde_json::from_str(&rep.stdout).unwrap();
    let heap = &v["heaps"][0];
    assert_eq!(heap["dump_at_max"], true);
    assert_eq!(heap["top_self"][0]["function"], "peak_site", "{heap}");
    // The closing summary says what the trace holds: the peak (the sum of
    // self_max), besides the end-of-run totals, labeled as such.
    let at_peak: u64 = samples.iter().map(|x| x.self_max.unwrap_or(0)).sum();
    assert!(at_peak >= 1_000_000, "{samples:?}");
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("the trace holds the heap at its peak"))
        .unwrap_or_else(|| panic!("no peak line in the summary:\n{}", out.stderr));
    let shown = line
        .split_once("): ")
        .and_then(|(_, rest)| rest.split_once(" unreleased"))
        .map(|(v, _)| parse_human_bytes(v))
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        shown.abs_diff(at_peak) * 100 <= at_peak,
        "summary peak {shown} vs the trace's {at_peak}: {line}"
    );
    assert!(
        out.stderr.contains(" at the end\n"),
        "the end-of-run totals are labeled: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("peak (in the trace): "),
        "{}",
        out.stderr
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bytes of `human_bytes`'s `976.56 KiB` / `512 B`.
fn parse_human_bytes(s: &str) -> u64 {
    let (v, unit) = s.trim().split_once(' ').expect("a value and a unit");
    let v: f64 = v.parse().expect("a number");
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        u => panic!("unit {u}"),
    };
    (v * scale).round() as u64
}

#[test]
fn samples_written_before_exit_are_all_counted() {
    // 50000 samples are several ring buffers' worth: the program waits for
    // the daemon (block mode) and exits with the ring full of samples.
    for n in [1u64, 1000, 50_000] {
        let dir = scratch_dir("exit-now");
        let trace = dir.join("t.pftrace");
        let out = record(
            &["-i", "1", "-o", &s(&trace)],
            &[&prog("exit_now"), &n.to_string()],
            TIMEOUT,
        );
        assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
        let sum = check_trace(&trace);
        let samples = sum.latest();
        no_error_frames(&samples);
        assert_eq!(totals(&samples, "alloc_then_exit"), (n, 64 * n, 0, 0));
        let pid = sum.pids()[0];
        assert_eq!(sum.last_stat(pid, "unwinding_errors"), 0);
        let total: u64 = samples.iter().map(|x| x.alloc_count).sum();
        assert_eq!(sum.last_stat(pid, "heap_samples"), total);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn samples_in_a_dlopened_library() {
    let lib = prog("libdl_alloc.so");
    // The program lives on for a while after the dlopen: the daemon sees the
    // library's pcs while the process is alive and must find its mapping.
    let dir = scratch_dir("dlopen");
    let trace = dir.join("t.pftrace");
    let out = record(
        &["-i", "1", "-o", &s(&trace)],
        &[&prog("exit_now"), "1000", &lib, "2000"],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let sum = check_trace(&trace);
    let samples = sum.latest();
    no_error_frames(&samples);
    assert_eq!(totals(&samples, "dl_alloc"), (1000, 48_000, 0, 0));
    assert_eq!(totals(&samples, "alloc_then_exit"), (1000, 64_000, 0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn samples_in_a_library_dlopened_just_before_exit_or_exec() {
    let lib = prog("libdl_alloc.so");
    // The program exits (through `exit` or `_exit`) or execs /bin/true at
    // once after the dlopen: the daemon, still loading modules or
    // unwinding, meets the library's pcs after the image is gone, and its
    // maps with it. The client asks for its maps to be read and kept first
    // (`mapsask`); without the ask this test failed 3 times in 3 at the
    // first `exit` round, and without the exec hooks' ask 1 time in 2 at
    // an `exec` round (`ERROR INVALID_MAP`).
    let dir = scratch_dir("dlopen-exit");
    let hows = ["exit", "exec", "_exit", "exit", "exec", "_exit"];
    for (round, how) in hows.into_iter().enumerate() {
        let trace = dir.join(format!("t{round}.pftrace"));
        let out = record(
            &["-i", "1", "-o", &s(&trace)],
            &[&prog("exit_now"), "1000", &lib, "0", how],
            TIMEOUT,
        );
        assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
        let sum = check_trace(&trace);
        let samples = sum.latest();
        no_error_frames(&samples);
        // (The exec ends the old image's heap: its blocks count as freed.)
        let (count, bytes, _, _) = totals(&samples, "dl_alloc");
        assert_eq!((count, bytes), (1000, 48_000), "{how}");
        let (count, bytes, _, _) = totals(&samples, "alloc_then_exit");
        assert_eq!((count, bytes), (1000, 64_000), "{how}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn report_and_convert_a_real_trace() {
    let dir = scratch_dir("report");
    let trace = dir.join("t.pftrace");
    let out = record(
        &["-i", "1", "-o", &s(&trace)],
        &[&prog("alloc_truth")],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("allocations (every allocation recorded)"),
        "summary: {}",
        out.stderr
    );
    check_trace(&trace);

    let text = heapprofd_ok(&["report", &s(&trace)]).stdout;
    let sites = text
        .split("TOP ALLOCATION SITES")
        .nth(1)
        .expect("a TOP ALLOCATION SITES section");
    // Skip the rest of the heading line: the first site follows.
    let first = sites.lines().nth(1).unwrap_or("");
    assert!(
        first.contains("temp_malloc") && first.contains("200 allocations"),
        "{text}"
    );

    let json = heapprofd_ok(&["report", "--format", "json", &s(&trace)]).stdout;
    let v: serde_json::Value = serde_json::from_str(&json).expect("report JSON");
    let heap = &v["heaps"][0];
    let top = &heap["top_self"][0];
    assert_eq!(top["function"], "temp_malloc", "{heap}");
    assert_eq!(
        (top["allocated"].as_u64(), top["alloc_count"].as_u64()),
        (Some(102_400), Some(200))
    );
    assert_eq!(heap["unwinding_errors"], 0);

    let (pprof, folded, svg) = (dir.join("p.pb.gz"), dir.join("f.txt"), dir.join("f.svg"));
    heapprofd_ok(&[
        "convert",
        &s(&trace),
        "--pprof",
        &s(&pprof),
        "--collapsed",
        &s(&folded),
        "--svg",
        &s(&svg),
    ]);
    let folded_text = std::fs::read_to_string(&folded).unwrap();
    assert!(
        folded_text
            .lines()
            .any(|l| l.ends_with(";main;leak_malloc 100000")),
        "{folded_text}"
    );
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains("<svg") && svg_text.contains("leak_malloc"));
    let gz = std::fs::read(&pprof).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip");
    let raw = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(&pprof)
        .output()
        .expect("gzip -dc");
    let raw = String::from_utf8_lossy(&raw.stdout);
    for needle in ["alloc_space", "inuse_space", "temp_malloc", "thread_alloc"] {
        assert!(raw.contains(needle), "pprof string table lacks {needle}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the Perfetto UI (trace_processor) needs of the process tree and
/// the time range, for processes that are gone before the daemon's
/// bookkeeping hears of them: `exit_now` exits right after allocating,
/// once run by sh and once from a subshell sh does not profile (a fork
/// that never execs). Dumps every millisecond, so several are asked for
/// within one tick of the coarse clock.
#[test]
fn short_lived_children_keep_their_parents_names_and_windows() {
    let dir = scratch_dir("tree");
    let trace = dir.join("t.pftrace");
    let exit_now = prog("exit_now");
    let script = format!("{exit_now} 4; ({exit_now} 4; true); sleep 0.2; true");
    let out = record(
        &["-i", "1", "-c", "1ms", "-o", &s(&trace)],
        &["sh", "-c", &script],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let t = check_trace(&trace);
    let summary = &t.json["summary"];
    let procs = summary["processes"].as_array().cloned().unwrap_or_default();
    let find = |pid: u64| procs.iter().find(|p| p["pid"].as_u64() == Some(pid));
    let first_arg = |p: &serde_json::Value| p["cmdline"][0].as_str().unwrap_or("").to_owned();
    let profiled: std::collections::BTreeSet<u64> =
        t.dumps.iter().filter_map(|d| d["pid"].as_u64()).collect();
    // Every profiled process has a parent, named in the tree.
    for &pid in &profiled {
        let p = find(pid).unwrap_or_else(|| panic!("pid {pid} not in the tree: {procs:?}"));
        let ppid = p["ppid"]
            .as_u64()
            .unwrap_or_else(|| panic!("pid {pid} has no parent: {procs:?}"));
        let parent = find(ppid).unwrap_or_else(|| panic!("{pid}'s parent {ppid}: {procs:?}"));
        assert!(!first_arg(parent).is_empty(), "{ppid} unnamed: {procs:?}");
    }
    // Both exit_now processes, their main threads named.
    let children: Vec<&serde_json::Value> = procs
        .iter()
        .filter(|p| first_arg(p).ends_with("exit_now"))
        .collect();
    assert_eq!(children.len(), 2, "{procs:?}");
    let threads = summary["threads"].as_array().cloned().unwrap_or_default();
    for c in &children {
        let pid = c["pid"].as_u64().unwrap();
        let main = threads.iter().find(|t| t["tid"].as_u64() == Some(pid));
        assert_eq!(
            main.and_then(|t| t["name"].as_str()),
            Some("exit_now"),
            "{pid}: {threads:?}"
        );
    }
    // One's parent is sh, the other's the subshell (a child of sh, which
    // is in the tree though not profiled).
    let parents: Vec<u64> = children.iter().filter_map(|c| c["ppid"].as_u64()).collect();
    let sh = parents
        .iter()
        .copied()
        .find(|p| profiled.contains(p))
        .expect("an exit_now run by sh");
    let subshell = parents
        .iter()
        .copied()
        .find(|p| !profiled.contains(p))
        .expect("an exit_now run by the subshell");
    assert_eq!(first_arg(find(sh).unwrap()), "sh");
    assert_eq!(first_arg(find(subshell).unwrap()), "sh");
    assert_eq!(find(subshell).unwrap()["ppid"].as_u64(), Some(sh));
    // The time range: each process's first memory counter comes no later
    // than its first window starts (trace_processor bounds the trace by
    // counters and dumps, not by windows). Windows are MONOTONIC_COARSE,
    // packets BOOTTIME: converted with the trace's clock snapshot.
    let clocks = &summary["clock_snapshots"][0]["clocks"];
    let offset = clocks["6"].as_u64().unwrap() - clocks["4"].as_u64().unwrap();
    for &pid in &profiled {
        let counter = summary["process_stats"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| {
                p["pids"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x.as_u64() == Some(pid)))
            })
            .filter_map(|p| p["timestamp"].as_u64())
            .min()
            .unwrap_or_else(|| panic!("no memory counter of {pid}"));
        let window = t
            .dumps
            .iter()
            .filter(|d| d["pid"].as_u64() == Some(pid))
            .filter_map(|d| d["start_timestamp"].as_u64())
            .min()
            .unwrap();
        assert!(
            counter <= window + offset,
            "pid {pid}: first counter {counter}, first window starts {}",
            window + offset
        );
    }
    // A process's dumps have strictly increasing timestamps (an entry with
    // the previous one's window is the same dump, continued in the next
    // packet).
    let mut last: std::collections::HashMap<u64, (u64, u64)> = Default::default();
    for d in &t.dumps {
        let pid = d["pid"].as_u64().unwrap();
        let window = (
            d["timestamp"].as_u64().unwrap(),
            d["start_timestamp"].as_u64().unwrap(),
        );
        if let Some(prev) = last.insert(pid, window)
            && prev != window
        {
            assert!(
                window.0 > prev.0,
                "pid {pid}: a dump {window:?} after {prev:?}"
            );
        }
    }
    assert!(
        t.dumps.len() > 3 * profiled.len(),
        "{} dumps",
        t.dumps.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--client-lib` may name a copy of the client under any file name: the
/// client it names connects, in CMD and in the programs CMD starts. (The
/// client used to answer only to `libheapprofd_client.so` in `LD_PRELOAD`,
/// so a renamed copy left every process unprofiled, without an error.)
#[test]
fn a_client_lib_of_any_file_name_profiles_cmd_and_its_children() {
    let dir = scratch_dir("client-lib-name");
    let lib = dir.join("libmy_profiler_build.so");
    std::fs::copy(
        &heapprofd_tests::record_harness::release_bins().client_so,
        &lib,
    )
    .expect("copy the client");
    let trace = dir.join("t.pftrace");
    let exit_now = prog("exit_now");
    let out = record(
        &["-i", "1", "--client-lib", &s(&lib), "-o", &s(&trace)],
        &["sh", "-c", &format!("{exit_now} 4; {exit_now} 4")],
        TIMEOUT,
    );
    assert_eq!(out.code, Some(0), "stderr: {}", out.stderr);
    let t = check_trace(&trace);
    let procs = t.json["summary"]["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let profiled: std::collections::BTreeSet<u64> =
        t.dumps.iter().filter_map(|d| d["pid"].as_u64()).collect();
    let children = procs
        .iter()
        .filter(|p| {
            p["cmdline"][0]
                .as_str()
                .is_some_and(|c| c.ends_with("exit_now"))
        })
        .filter(|p| p["pid"].as_u64().is_some_and(|pid| profiled.contains(&pid)))
        .count();
    assert_eq!(
        children, 2,
        "profiled {profiled:?} of {procs:?}\n{}",
        out.stderr
    );
}
