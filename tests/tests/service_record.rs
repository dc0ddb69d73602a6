//! End-to-end tests of `record`'s choices against the profiling service:
//! `record -- CMD` profiles through a running service (CMD and the
//! programs it starts, from their first allocation), falls back to a
//! daemon of its own when none runs, and runs its own with `--no-service`;
//! `--no-symbolize` is one profile's choice (a process shared with a
//! profile that symbolizes has bare frames in its trace only); a
//! statically linked program `-n` names, started while the profile runs,
//! is named in the trace and the summary as not profiled; an idle service
//! forgets what it interned and profiles on.
//!
//! Each test has its own service in a scratch `HEAPPROFD_SERVICE_DIR`.
//! Traces are checked with `check_trace.py --strict`; whether a profile
//! ran in the service is read from the service's log ("profile N: a
//! command of record") and `record`'s ("profiling through the service").
//! No assertion depends on timing.

use std::path::Path;
use std::process::{Command, Stdio};

use heapprofd_proto::service::DIR_ENV;
use heapprofd_tests::client_harness::compile;
use heapprofd_tests::record_harness::{
    TraceSummary, check_trace, frame_is, heapprofd, record_programs, scratch_dir,
};
use heapprofd_tests::service_harness::{Service, run_preloaded, signal, wait_exit, wait_for};

/// (allocations, bytes) in the trace whose stacks hold `frame`.
fn totals(t: &TraceSummary, frame: &str) -> (u64, u64) {
    t.samples
        .iter()
        .filter(|s| s.frames.iter().any(|f| frame_is(f, frame)))
        .fold((0, 0), |(c, b), s| (c + s.alloc_count, b + s.allocated))
}

/// Runs `record ARGS -o TRACE -- CMD` with `HEAPPROFD_SERVICE_DIR=svc`;
/// its exit code and stderr.
fn record_cmd(svc: &Path, args: &[&str], trace: &Path, cmd: &[&str]) -> (i32, String) {
    let mut child = heapprofd()
        .arg("record")
        .args(args)
        .arg("-o")
        .arg(trace)
        .arg("--")
        .args(cmd)
        .env(DIR_ENV, svc)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start record -- CMD");
    wait_exit(&mut child, "record -- CMD")
}

const THROUGH: &str = "profiling through the service";
const COMMAND_PROFILE: &str = "a command of record";

#[test]
fn record_cmd_uses_a_running_service_for_cmd_and_its_children() {
    let dir = scratch_dir("svc-cmd");
    let svc = Service::start(&dir.join("svc"));
    let trace = dir.join("cmd.pftrace");
    let many_stacks = record_programs().path("many_stacks");
    let m = many_stacks.to_str().expect("utf-8 path");
    // A shell starting two programs, then exiting with its own code.
    let script = format!("{m} 40; {m} 3; exit 7");
    let (code, err) = record_cmd(&svc.dir, &["-i", "1"], &trace, &["sh", "-c", &script]);
    assert_eq!(code, 7, "CMD's exit code passes through:\n{err}");
    assert!(err.contains(THROUGH), "record's log:\n{err}");
    assert!(err.contains("3 processes"), "summary:\n{err}");
    svc.wait_log(COMMAND_PROFILE);
    // -i 1 from their first allocation: every block of both children.
    let t = check_trace(&trace);
    assert_eq!(totals(&t, "stack_leaf"), (43, 43 * 32), "{}", svc.log());

    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn record_cmd_runs_its_own_daemon_without_a_service_or_with_no_service() {
    let dir = scratch_dir("svc-cmd-own");
    let many_stacks = record_programs().path("many_stacks");
    let m = many_stacks.to_str().expect("utf-8 path");

    // No service in the directory: its own daemon, as before.
    let nothing = dir.join("no-service-here");
    std::fs::create_dir_all(&nothing).expect("mkdir");
    let trace = dir.join("own.pftrace");
    let (code, err) = record_cmd(&nothing, &["-i", "1"], &trace, &[m, "9"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains(THROUGH), "record's log:\n{err}");
    assert_eq!(totals(&check_trace(&trace), "stack_leaf"), (9, 9 * 32));

    // A service runs, --no-service: its own daemon; the service sees no profile.
    let svc = Service::start(&dir.join("svc"));
    let trace = dir.join("forced.pftrace");
    let (code, err) = record_cmd(&svc.dir, &["-i", "1", "--no-service"], &trace, &[m, "11"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains(THROUGH), "record's log:\n{err}");
    assert_eq!(totals(&check_trace(&trace), "stack_leaf"), (11, 11 * 32));
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    assert!(
        !log.contains("profile 1:"),
        "the service got a profile:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_symbolize_is_one_profiles_choice() {
    let dir = scratch_dir("svc-nosym");
    let svc = Service::start(&dir.join("svc"));
    let (named, bare) = (dir.join("named.pftrace"), dir.join("bare.pftrace"));
    let a = svc.record(&["-n", "nosym_stacks", "-i", "1"], &named);
    svc.wait_store("name 1 nosym_stacks");
    let b = svc.record(&["-n", "nosym_stacks", "-i", "1", "--no-symbolize"], &bare);
    svc.wait_store("name 2 nosym_stacks");
    // One process, one session, its samples in both traces.
    let many_stacks = record_programs().path("many_stacks");
    let pid = run_preloaded(&svc.dir, &many_stacks, "nosym_stacks", &["40"]);
    for (mut rec, what) in [(a, "record (symbols)"), (b, "record --no-symbolize")] {
        signal(&rec.0, libc::SIGINT);
        let (code, err) = wait_exit(&mut rec.0, what);
        assert_eq!(code, 0, "{what} failed:\n{err}");
    }
    let of_pid = |t: &TraceSummary| -> (u64, u64) {
        t.samples
            .iter()
            .filter(|s| s.pid == u64::from(pid))
            .fold((0, 0), |(c, b), s| (c + s.alloc_count, b + s.allocated))
    };
    let tn = check_trace(&named);
    let tb = check_trace(&bare);
    assert_eq!(totals(&tn, "stack_leaf"), (40, 40 * 32), "{}", svc.log());
    assert_eq!(of_pid(&tb), of_pid(&tn), "the same samples in both");
    let frames: Vec<&String> = tb
        .samples
        .iter()
        .filter(|s| s.pid == u64::from(pid))
        .flat_map(|s| &s.frames)
        .collect();
    assert!(!frames.is_empty());
    assert!(
        frames.iter().all(|f| *f == "?" || f.starts_with("ERROR ")),
        "named frames in the --no-symbolize trace: {frames:?}"
    );
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_static_program_named_by_n_is_named_as_not_profiled() {
    let dir = scratch_dir("svc-static");
    // A statically linked program that lives until its stdin closes.
    let src = dir.join("wait_stdin.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void) { char b[64]; while (fgets(b, sizeof b, stdin)) {} return 0; }\n",
    )
    .expect("write the source");
    let exe = dir.join("wait_stdin");
    compile(&[
        "gcc",
        "-O2",
        "-static",
        "-o",
        exe.to_str().expect("utf-8"),
        src.to_str().expect("utf-8"),
    ]);
    let svc = Service::start(&dir.join("svc"));
    let trace = dir.join("static.pftrace");
    let mut rec = svc.record(&["-n", "static_waiter", "-i", "1"], &trace);
    svc.wait_store("name 1 static_waiter");
    let mut prog = Command::new(&exe);
    std::os::unix::process::CommandExt::arg0(&mut prog, "static_waiter");
    let mut prog = prog
        .env(
            "LD_PRELOAD",
            &heapprofd_tests::record_harness::release_bins().client_so,
        )
        .env(DIR_ENV, &svc.dir)
        .stdin(Stdio::piped())
        .spawn()
        .expect("start the static program");
    let pid = prog.id();
    svc.wait_log(&format!("pid {pid} (`static_waiter`) runs unprofiled"));
    drop(prog.stdin.take());
    assert!(prog.wait().expect("wait").success(), "it ran normally");
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record -n");
    assert_eq!(code, 0, "record -n failed:\n{err}");
    assert!(
        err.contains(&format!(
            "pid {pid:<7} not profiled: it runs a statically linked"
        )),
        "record's summary:\n{err}"
    );
    let t = check_trace(&trace);
    let dumps: Vec<_> = t
        .dumps
        .iter()
        .filter(|d| d["pid"].as_u64() == Some(u64::from(pid)))
        .collect();
    assert!(!dumps.is_empty(), "not in the trace: {:?}", t.dumps);
    assert!(
        dumps
            .iter()
            .all(|d| d["disconnected"] == serde_json::Value::Bool(true)),
        "not flagged: {dumps:?}"
    );
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_idle_service_forgets_what_it_interned_and_profiles_on() {
    let dir = scratch_dir("svc-forget");
    let svc = Service::start(&dir.join("svc"));
    let many_stacks = record_programs().path("many_stacks");
    let m = many_stacks.to_str().expect("utf-8 path");
    for round in 1..=2 {
        let trace = dir.join(format!("round{round}.pftrace"));
        let (code, err) = record_cmd(&svc.dir, &["-i", "1"], &trace, &[m, "20"]);
        assert_eq!(code, 0, "{err}");
        assert!(err.contains(THROUGH), "record's log:\n{err}");
        // Symbolized and exact after the service forgot everything.
        assert_eq!(
            totals(&check_trace(&trace), "stack_leaf"),
            (20, 20 * 32),
            "round {round}:\n{}",
            svc.log()
        );
        // No profile and no session left: the interned mappings and
        // frames (each process's own, with its addresses) are dropped.
        wait_for("the idle service to forget", || {
            svc.log().matches("service idle: forgot").count() == round
        });
    }
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let forgot: Vec<&str> = log.lines().filter(|l| l.contains("forgot")).collect();
    assert_eq!(forgot.len(), 2, "{log}");
    assert!(
        forgot.iter().all(|l| !l.contains(" 0 mappings")),
        "{forgot:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
