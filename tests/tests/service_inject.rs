//! The service loads the client with ptrace into running programs that have
//! none (`record --pid PID` and `record -n NAME` through the service), and
//! `record --pid` falls back to a daemon of its own as `record -- CMD`
//! does.
//!
//! The targets are `tests/programs/attach/target.c`, started without
//! `LD_PRELOAD` (and without an installed client), named apart with their
//! `argv[0]` so that no other test's process matches; their environment
//! points at the test's service (`HEAPPROFD_SERVICE_DIR`), as the default
//! service directory would without it. After the attach, `keep N`
//! allocates in `c_prealloc` an array of N pointers and N blocks of 1000
//! bytes: at `-i 1` the trace holds exactly those ([`keep_totals`]). No assertion depends on timing: the tests wait for
//! the service's log lines (generous timeouts only catch hangs).
//!
//! A CPU profile activates a preloaded dormant client with ptrace; when
//! that fails (`in_handler`, never at a safe point), the process is woken
//! with the signal instead, not named as not profiled.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use heapprofd_proto::service::DIR_ENV;
use heapprofd_tests::attach_harness::{Target, attach_programs, client_thread};
use heapprofd_tests::record_harness::{
    TraceSummary, check_trace, frame_is, heapprofd, scratch_dir,
};
use heapprofd_tests::service_harness::{Service, preloaded, signal, wait_exit, wait_for};

/// Starts `target THREADS` named `name`, its environment pointing at the
/// service in `svc`, without the client.
fn start_target(svc: &Path, name: &str, threads: u32) -> Target {
    let mut c = Command::new(attach_programs().path("target"));
    std::os::unix::process::CommandExt::arg0(&mut c, name);
    c.arg(threads.to_string())
        .env(DIR_ENV, svc)
        .env_remove("LD_PRELOAD")
        .env_remove("HEAPPROFD_SOCKET");
    Target::start(c)
}

/// What `keep n` allocates: (allocations, bytes).
fn keep_totals(n: u64) -> (u64, u64) {
    (n + 1, n * 8 + n * 1000)
}

/// (allocations, bytes) of process `pid` under `c_prealloc`.
fn kept(t: &TraceSummary, pid: u32) -> (u64, u64) {
    t.latest()
        .iter()
        .filter(|s| s.pid == u64::from(pid) && s.frames.iter().any(|f| frame_is(f, "c_prealloc")))
        .fold((0, 0), |(n, b), s| (n + s.alloc_count, b + s.allocated))
}

/// Runs `record ARGS -o TRACE` against the service directory `svc` to
/// its end: exit code and stderr.
fn record(svc: &Path, args: &[&str], trace: &Path) -> (i32, String) {
    let out = heapprofd()
        .arg("record")
        .args(args)
        .arg("-o")
        .arg(trace)
        .env(DIR_ENV, svc)
        .stdin(Stdio::null())
        .output()
        .expect("run record");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const THROUGH: &str = "profiling through the service";
const OWN_DAEMON: &str = "the profiler in process";

#[test]
fn record_pid_goes_through_the_service_and_falls_back_without_one() {
    let dir = scratch_dir("svc-pid");
    let svc = Service::start(&dir.join("svc"));
    // One thread: the service starts a synchronous session and ends it
    // inside the process.
    let mut t = start_target(&svc.dir, "svcpid_target", 0);
    let pid = t.pid.to_string();
    let trace = dir.join("pid.pftrace");
    let mut rec = svc.record(&["--pid", &pid, "-i", "1"], &trace);
    svc.wait_log(&format!("the profiler in pid {pid} (svcpid_target)"));
    svc.wait_log(&format!("pid {pid} records"));
    assert_eq!(t.cmd("keep 25"), "kept 25");
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record --pid");
    assert_eq!(code, 0, "record --pid failed:\n{err}\n{}", svc.log());
    assert!(err.contains(THROUGH) && !err.contains(OWN_DAEMON), "{err}");
    assert_eq!(kept(&check_trace(&trace), t.pid), keep_totals(25), "{err}");
    // Created by record, for the user who asked, readable by them only.
    let meta = std::fs::metadata(&trace).expect("the trace");
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    svc.wait_log(&format!("ended the session inside pid {pid}"));
    assert_eq!(t.cmd("got"), "malloc=libc", "the GOT was not restored");

    // --no-service: record's own daemon, with the service running.
    let (code, err) = record(
        &svc.dir,
        &["--no-service", "--pid", &pid, "-d", "500ms"],
        &dir.join("own.pftrace"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(OWN_DAEMON) && !err.contains(THROUGH), "{err}");

    // No service answering: record's own daemon.
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let (code, err) = record(
        &dir.join("svc"),
        &["--pid", &pid, "-d", "500ms"],
        &dir.join("none.pftrace"),
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(OWN_DAEMON) && !err.contains(THROUGH), "{err}");
    assert_eq!(t.cmd("got"), "malloc=libc");
    t.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn record_by_name_loads_the_client_into_running_programs_and_names_the_refused() {
    let dir = scratch_dir("svc-inject-name");
    let svc = Service::start(&dir.join("svc"));
    // A worker thread: the client connects from a thread of its own.
    let mut t = start_target(&svc.dir, "svcname_target", 1);
    // Stopped: the probe refuses it, touching nothing.
    let mut stopped = start_target(&svc.dir, "svcname_target", 0);
    stopped.signal(libc::SIGSTOP);
    wait_for("the target to stop", || {
        std::fs::read_to_string(format!("/proc/{}/stat", stopped.pid)).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('T'))
        })
    });
    let trace = dir.join("named.pftrace");
    let mut rec = svc.record(&["-n", "svcname_target", "-i", "1"], &trace);
    svc.wait_log(&format!("pid {} records", t.pid));
    svc.wait_log(&format!(
        "pid {} (svcname_target) not profiled",
        stopped.pid
    ));
    assert_eq!(t.cmd("keep 30"), "kept 30");
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record -n");
    assert_eq!(code, 0, "record -n failed:\n{err}\n{}", svc.log());
    assert!(err.contains("1 process,"), "{err}");
    assert!(
        err.contains(&format!(
            "pid {:<7} not profiled: process {} (target) is stopped",
            stopped.pid, stopped.pid
        )),
        "record's summary:\n{err}"
    );
    let summary = check_trace(&trace);
    assert_eq!(kept(&summary, t.pid), keep_totals(30), "{err}");
    // The refused one is in the trace, flagged, with no samples.
    let named: Vec<_> = summary
        .dumps
        .iter()
        .filter(|d| d["pid"].as_u64() == Some(u64::from(stopped.pid)))
        .collect();
    assert!(!named.is_empty(), "not in the trace: {:?}", summary.dumps);
    assert!(
        named
            .iter()
            .all(|d| d["disconnected"] == serde_json::Value::Bool(true)),
        "not flagged: {named:?}"
    );
    assert!(
        summary
            .samples
            .iter()
            .all(|s| s.pid != u64::from(stopped.pid))
    );

    // Both run on as they were: the client's thread is gone, the GOTs are
    // glibc's.
    wait_for("the client's thread to exit", || {
        client_thread(t.pid).is_none()
    });
    assert_eq!(t.cmd("got"), "malloc=libc");
    stopped.signal(libc::SIGCONT);
    assert_eq!(stopped.cmd("got"), "malloc=libc");
    t.quit();
    stopped.quit();
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_service_answers_while_an_injection_is_stuck_and_its_sigkill_leaves_the_target_running() {
    let dir = scratch_dir("svc-inject-stall");
    // Every injection of this service stops for good with the target's
    // thread stopped, its first call set up.
    let mut svc = Service::start_with_env(
        &dir.join("svc"),
        &[("HEAPPROFD_ATTACH_TEST_STALL", "call-1-ready")],
    );
    let mut t = start_target(&svc.dir, "svcstall_target", 0);
    let mut rec = svc.record(&["-n", "svcstall_target"], &dir.join("stuck.pftrace"));
    svc.wait_log("test stall at call-1-ready");
    // Another profile starts, runs and ends meanwhile.
    let (code, err) = record(
        &svc.dir,
        &["-n", "svcstall_nothing", "-d", "300ms"],
        &dir.join("other.pftrace"),
    );
    assert_eq!(code, 0, "{err}\n{}", svc.log());
    assert!(err.contains("0 processes"), "{err}");
    // SIGKILL of the service mid-injection: the thread goes back by itself.
    let _ = svc.child.0.kill();
    let _ = svc.child.0.wait();
    let (code, err) = wait_exit(&mut rec.0, "record -n after the service died");
    assert_ne!(code, 0, "{err}");
    assert_eq!(t.cmd("got"), "malloc=libc");
    assert_eq!(t.cmd("keep 3"), "kept 3");
    t.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cpu_profile_wakes_a_dormant_client_with_the_signal_when_ptrace_fails() {
    let dir = scratch_dir("svc-activate-fallback");
    // A target never at a safe point: the ptrace activation gives up
    // after 300 ms.
    let svc = Service::start_with_env(&dir.join("svc"), &[("HEAPPROFD_ATTACH_TIMEOUT_MS", "300")]);
    let name = "svcfallback_target";
    let t = Target::start(preloaded(
        &svc.dir,
        &attach_programs().path("in_handler"),
        name,
    ));
    let trace = dir.join("fallback.pftrace");
    let mut rec = svc.record(&["-n", name, "--cpu-time", "5ms", "--no-heap"], &trace);
    let woke = format!(
        "pid {} ({name}): could not activate its dormant profiler",
        t.pid
    );
    let refused = format!("pid {} ({name}) not profiled", t.pid);
    wait_for("the activation's outcome in the service's log", || {
        let log = svc.log();
        log.contains(&woke) || log.contains(&refused)
    });
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, "record -n");
    assert_eq!(code, 0, "record -n failed:\n{err}\n{}", svc.log());
    // Woken with the signal (it starts at its next allocation, which this
    // program never makes), not named as not profiled.
    assert!(
        err.contains(&woke) && err.contains("woke it with signal 36"),
        "{err}"
    );
    assert!(!err.contains("not profiled"), "{err}");
    drop(t);
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
