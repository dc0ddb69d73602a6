//! End-to-end tests of the service running several profiles at once, and
//! taking in running processes: two profiles sharing a process (its
//! samples in both traces) with one process of their own each, a third
//! that samples differently (the shared process flagged
//! `rejected_concurrent` in its trace); `record -n` of programs already
//! running with the dormant client (a C program and a real perl, woken
//! with the signal); `record --all`; `heapprofd-rs --pid` as shorthand;
//! SIGTERM of the service writing every open profile, SIGKILL leaving the
//! profiled programs running; a program still starting when a profile
//! takes the running ones left to its own client; the free set's prefault
//! only in processes a profile names (not under `--all`).
//!
//! Each test has its own service in a scratch `HEAPPROFD_SERVICE_DIR`; the
//! programs are named through their `argv[0]` so that no other test's
//! programs match. Traces are checked with `check_trace.py --strict`. No
//! assertion depends on timing: tests wait for the service's log lines
//! ("woke pid N", "pid N records") and the store's lines.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Stdio};

use heapprofd_tests::attach_harness::{client_thread, status_kib};
use heapprofd_tests::record_harness::{
    TraceSummary, check_trace, frame_is, heapprofd, record_programs, scratch_dir,
};
use heapprofd_tests::service_harness::{
    Reaped, Service, Stepper, preloaded, run_preloaded, signal, wait_exit, wait_for,
};

/// The tests of this file run concurrently, each with its own service,
/// but a test whose subject is timing (a program still starting, which the
/// service knows by its age) runs alone: beside the others' perl loops and
/// `--all` profiles on a 2-core machine with the client installed
/// system-wide, its program once aged past the service's two seconds of
/// "starting" before the profile looked at it (a CI run, 2026-12-05).
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Shares the machine with the other tests of this file.
fn beside_others() -> std::sync::RwLockReadGuard<'static, ()> {
    ALONE.read().unwrap_or_else(|e| e.into_inner())
}

/// (allocations, bytes) of `pid` in the trace whose stacks hold `frame`.
fn totals(t: &TraceSummary, pid: u32, frame: &str) -> (u64, u64) {
    t.samples
        .iter()
        .filter(|s| s.pid == u64::from(pid) && s.frames.iter().any(|f| frame_is(f, frame)))
        .fold((0, 0), |(c, b), s| (c + s.alloc_count, b + s.allocated))
}

fn has_pid(t: &TraceSummary, pid: u32) -> bool {
    t.dumps
        .iter()
        .any(|d| d["pid"].as_u64() == Some(u64::from(pid)))
}

/// Ends `record` with Ctrl-C; its stderr, after checking it succeeded.
fn end_record(mut rec: Reaped, what: &str) -> String {
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, what);
    assert_eq!(code, 0, "{what} failed:\n{err}");
    err
}

#[test]
fn concurrent_profiles_share_a_process_and_keep_their_own() {
    let _beside = beside_others();
    let dir = scratch_dir("svc-multi");
    let svc = Service::start(&dir.join("svc"));
    let (ta, tb, tc) = (
        dir.join("a.pftrace"),
        dir.join("b.pftrace"),
        dir.join("c.pftrace"),
    );
    let a = svc.record(&["-n", "many_stacks,only_a", "-i", "1"], &ta);
    svc.wait_store("name 1 only_a");
    let b = svc.record(&["-n", "many_stacks,only_b", "-i", "1"], &tb);
    svc.wait_store("name 1 only_b");
    // Samples differently: gets the shared process rejected.
    let mut c = svc.record(&["-n", "many_stacks", "-i", "4096"], &tc);
    svc.wait_store("name 3 many_stacks");

    let many_stacks = record_programs().path("many_stacks");
    let exit_now = record_programs().path("exit_now");
    let shared = run_preloaded(&svc.dir, &many_stacks, "many_stacks", &["40"]);
    let own_a = run_preloaded(&svc.dir, &exit_now, "only_a", &["5"]);
    let own_b = run_preloaded(&svc.dir, &exit_now, "only_b", &["7"]);

    // A ends on its own; B and C are open when the service gets SIGTERM:
    // both are written and answered.
    let err = end_record(a, "record A");
    assert!(err.contains("2 processes"), "{err}");
    svc.wait_store("name 2 many_stacks");
    let mut b = b;
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "daemon failed:\n{log}");
    let (code, err) = wait_exit(&mut b.0, "record B");
    assert_eq!(code, 0, "record B:\n{err}");
    let (code, err) = wait_exit(&mut c.0, "record C");
    assert_eq!(code, 0, "record C:\n{err}");
    assert!(
        err.contains("rejected_concurrent"),
        "record C's summary:\n{err}"
    );

    // -i 1 from the first allocation: the shared process's 40 blocks of 32
    // bytes in both A and B; each one's own exit_now (64-byte blocks) only
    // in its own trace.
    let ta = check_trace(&ta);
    let tb = check_trace(&tb);
    assert_eq!(totals(&ta, shared, "stack_leaf"), (40, 40 * 32));
    assert_eq!(totals(&tb, shared, "stack_leaf"), (40, 40 * 32));
    assert_eq!(totals(&ta, own_a, "alloc_then_exit"), (5, 5 * 64));
    assert_eq!(totals(&tb, own_b, "alloc_then_exit"), (7, 7 * 64));
    assert!(
        !has_pid(&ta, own_b) && !has_pid(&tb, own_a),
        "a process in the other's trace"
    );
    // C: the shared process, flagged rejected_concurrent, without samples.
    let tc = check_trace(&tc);
    let flagged: Vec<_> = tc
        .dumps
        .iter()
        .filter(|d| d["pid"].as_u64() == Some(u64::from(shared)))
        .collect();
    assert!(
        !flagged.is_empty(),
        "C does not name the shared process: {:?}",
        tc.dumps
    );
    assert!(
        flagged
            .iter()
            .all(|d| d["rejected_concurrent"] == serde_json::Value::Bool(true)),
        "{flagged:?}"
    );
    assert_eq!(totals(&tc, shared, "stack_leaf"), (0, 0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program still starting when a `-n` profile takes the running ones
/// (stopped at its exec, before the loader ran its preloaded client) is
/// waited for, not given a second client with ptrace: its own client
/// connects from its start, and every allocation is in the trace. (The
/// service once loaded a client into such a process with ptrace, and the
/// program ran unprofiled.)
#[test]
fn a_program_still_starting_is_left_to_its_own_client() {
    let _alone = ALONE.write().unwrap_or_else(|e| e.into_inner());
    use nix::sys::wait::{WaitStatus, waitpid};
    use nix::unistd::Pid;
    use std::os::unix::process::CommandExt;
    let dir = scratch_dir("svc-starting");
    let svc = Service::start(&dir.join("svc"));
    let trace = dir.join("starting.pftrace");
    let mut cmd = preloaded(
        &svc.dir,
        &record_programs().path("many_stacks"),
        "late_start",
    );
    cmd.arg("40").stdin(Stdio::null());
    // SAFETY: the closure makes one system call between fork and exec.
    unsafe {
        cmd.pre_exec(|| nix::sys::ptrace::traceme().map_err(std::io::Error::from));
    }
    let mut child = Reaped(cmd.spawn().expect("start the program"));
    let pid = child.0.id();
    let traced = Pid::from_raw(pid as i32);
    match waitpid(traced, None) {
        Ok(WaitStatus::Stopped(_, nix::sys::signal::Signal::SIGTRAP)) => {}
        other => panic!("the program did not stop at its exec: {other:?}"),
    }
    let rec = svc.record(&["-n", "late_start", "-i", "1"], &trace);
    svc.wait_log(&format!("pid {pid} (late_start) is starting"));
    nix::sys::ptrace::detach(traced, None).expect("let the program go on");
    let st = child.0.wait().expect("wait for the program");
    assert!(st.success(), "the program failed: {st}");
    let err = end_record(rec, "record -n late_start");
    assert!(
        !err.contains("not profiled"),
        "{err}\nservice:\n{}",
        svc.log()
    );
    let t = check_trace(&trace);
    assert_eq!(totals(&t, pid, "stack_leaf"), (40, 40 * 32));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A perl loop reading a number per line: that many 1000-byte strings,
/// kept; answers `ok`.
fn start_perl(svc: &Path, name: &str) -> (Reaped, ChildStdin, BufReader<ChildStdout>) {
    let mut child = preloaded(svc, Path::new("/usr/bin/perl"), name)
        .args([
            "-e",
            "$| = 1; my @keep; while (my $n = <STDIN>) { push @keep, map { 'y' x 1000 } 1 .. $n; print \"ok\\n\"; }",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start perl");
    let stdin = child.stdin.take().expect("stdin");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    (Reaped(child), stdin, stdout)
}

fn perl_say(stdin: &mut ChildStdin, stdout: &mut BufReader<ChildStdout>, n: u32) {
    writeln!(stdin, "{n}").expect("write to perl");
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read from perl");
    assert_eq!(line.trim_end(), "ok");
}

#[test]
fn record_by_name_wakes_running_programs_and_sigkill_leaves_them_running() {
    let _beside = beside_others();
    let dir = scratch_dir("svc-running");
    let svc = Service::start(&dir.join("svc"));
    let mut stepper = Stepper::start(&svc.dir, "svc_stepper");
    let (mut perl, mut perl_in, mut perl_out) = start_perl(&svc.dir, "svc_perl");
    perl_say(&mut perl_in, &mut perl_out, 1);
    let perl_pid = perl.0.id();

    let trace = dir.join("running.pftrace");
    let rec = svc.record(
        &["-n", "svc_stepper,svc_perl", "-i", "1", "--no-startup"],
        &trace,
    );
    svc.wait_log(&format!("woke pid {}", stepper.pid));
    svc.wait_log(&format!("woke pid {perl_pid}"));
    // The wake-up starts at the next allocation; from the client's first
    // byte on, every allocation is recorded.
    stepper.say("small");
    perl_say(&mut perl_in, &mut perl_out, 1);
    svc.wait_log(&format!("pid {} records", stepper.pid));
    svc.wait_log(&format!("pid {perl_pid} records"));
    stepper.say("grow 25");
    perl_say(&mut perl_in, &mut perl_out, 200);
    let err = end_record(rec, "record -n");
    assert!(err.contains("2 processes"), "{err}");

    let t = check_trace(&trace);
    assert_eq!(totals(&t, stepper.pid, "grow_site"), (25, 25_000));
    let (count, bytes) = t
        .samples
        .iter()
        .filter(|s| s.pid == u64::from(perl_pid))
        .fold((0, 0), |(c, b), s| (c + s.alloc_count, b + s.allocated));
    assert!(
        count >= 200 && bytes >= 200 * 1000,
        "perl's 200 strings of 1000 bytes: {count} allocations, {bytes} bytes"
    );
    assert!(
        t.samples.iter().any(
            |s| s.pid == u64::from(perl_pid) && s.frames.iter().any(|f| f.starts_with("Perl_"))
        ),
        "no perl frames"
    );
    // Dormant again: works on, unprofiled.
    stepper.say("grow 3");
    perl_say(&mut perl_in, &mut perl_out, 3);

    // Woken again by another profile, then the service is killed: both
    // programs go on working (pass-through) and exit normally.
    let rec = svc.record(
        &["-n", "svc_stepper,svc_perl", "-i", "1", "--no-startup"],
        &dir.join("killed.pftrace"),
    );
    stepper.say("small");
    perl_say(&mut perl_in, &mut perl_out, 1);
    svc.wait_log(&format!("pid {} records (session", stepper.pid));
    let mut svc = svc;
    svc.child.0.kill().expect("SIGKILL the service");
    let _ = svc.child.0.wait();
    let mut rec = rec;
    let (code, _) = wait_exit(&mut rec.0, "record after SIGKILL");
    assert_eq!(code, 1);
    for _ in 0..3 {
        stepper.say("grow 100");
        perl_say(&mut perl_in, &mut perl_out, 100);
    }
    stepper.finish();
    drop(perl_in);
    let st = perl.0.wait().expect("wait for perl");
    assert!(st.success(), "perl: {st}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn record_all_takes_running_and_new_processes_into_one_trace() {
    let _beside = beside_others();
    let dir = scratch_dir("svc-all");
    let svc = Service::start(&dir.join("svc"));
    let mut one = Stepper::start(&svc.dir, "all_one");
    let mut two = Stepper::start(&svc.dir, "all_two");
    let trace = dir.join("all.pftrace");
    let rec = svc.record(&["--all", "-i", "1"], &trace);
    let rec_pid = rec.0.id();
    svc.wait_store("all 1");
    svc.wait_log(&format!("woke pid {}", one.pid));
    svc.wait_log(&format!("woke pid {}", two.pid));
    one.say("small");
    two.say("small");
    svc.wait_log(&format!("pid {} records", one.pid));
    svc.wait_log(&format!("pid {} records", two.pid));
    one.say("grow 4");
    two.say("grow 6");
    let new = run_preloaded(
        &svc.dir,
        &record_programs().path("many_stacks"),
        "all_new",
        &["10"],
    );
    let err = end_record(rec, "record --all");
    // With the client installed system-wide (scripts/test-installed.sh)
    // `record` itself has it, and is one of every process.
    let itself = err
        .lines()
        .any(|l| l.trim_start().starts_with(&format!("pid {rec_pid} ")));
    assert!(
        err.contains(if itself { "4 processes" } else { "3 processes" }),
        "{err}\nservice:\n{}",
        svc.log()
    );
    let t = check_trace(&trace);
    assert_eq!(totals(&t, one.pid, "grow_site"), (4, 4000));
    assert_eq!(totals(&t, two.pid, "grow_site"), (6, 6000));
    assert_eq!(totals(&t, new, "stack_leaf"), (10, 320));
    // The process tree: every process; the running ones with their parent
    // (this test). The short-lived one may be gone before its parent is
    // read from /proc.
    let me = u64::from(std::process::id());
    let procs = t.json["summary"]["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for pid in [one.pid, two.pid, new] {
        let p = procs
            .iter()
            .find(|p| p["pid"].as_u64() == Some(u64::from(pid)))
            .unwrap_or_else(|| panic!("pid {pid} not in the process tree: {procs:?}"));
        if pid != new {
            assert_eq!(p["ppid"].as_u64(), Some(me), "{p:?}");
        }
    }
    one.finish();
    two.finish();
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn pid_shorthand_and_pid_lists() {
    let _beside = beside_others();
    // `heapprofd-rs --pid` is `record --pid`: the same refusal of a pid
    // that does not exist.
    let out = heapprofd()
        .args(["--pid", "999999999", "-d", "1s"])
        .output()
        .expect("run heapprofd-rs --pid");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("999999999"), "{err}");
    // Several pids go to the service, one trace.
    let dir = scratch_dir("svc-pids");
    let svc = Service::start(&dir.join("svc"));
    let mut one = Stepper::start(&svc.dir, "pid_one");
    let mut two = Stepper::start(&svc.dir, "pid_two");
    let trace = dir.join("pids.pftrace");
    // A process without the client whose environment does not lead to
    // this service (a client loaded into it would look in the default
    // directory): named in record's output, not profiled. (One that does
    // is given the client: tests/tests/service_inject.rs.)
    let bare = Reaped(
        std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("start sleep"),
    );
    // Named only once it runs `sleep` (right after the fork it is still
    // this test's copy, and slower to exec with the client installed).
    let comm = format!("/proc/{}/cmdline", bare.0.id());
    let exec_deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !std::fs::read(&comm).is_ok_and(|c| c.starts_with(b"sleep\0")) {
        assert!(std::time::Instant::now() < exec_deadline, "sleep never ran");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let list = format!("{},{},{}", one.pid, two.pid, bare.0.id());
    let rec = svc.record(&["-p", &list, "-i", "1"], &trace);
    svc.wait_log(&format!("woke pid {}", one.pid));
    svc.wait_log(&format!("woke pid {}", two.pid));
    one.say("small");
    two.say("small");
    svc.wait_log(&format!("pid {} records", one.pid));
    svc.wait_log(&format!("pid {} records", two.pid));
    one.say("grow 2");
    two.say("grow 3");
    let err = end_record(rec, "record -p PID,PID");
    assert!(
        err.contains(&format!(
            "pid {} (sleep) would not connect to this service",
            bare.0.id()
        )),
        "{err}"
    );
    assert!(err.contains("2 processes"), "{err}");
    let t = check_trace(&trace);
    assert_eq!(totals(&t, one.pid, "grow_site"), (2, 2000));
    assert_eq!(totals(&t, two.pid, "grow_site"), (3, 3000));
    one.finish();
    two.finish();
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_guardrail_ends_the_process_profile_flagged() {
    let _beside = beside_others();
    // max_heapprofd_memory_kb far below any service's memory: the process
    // hits it as soon as its session starts; it is in the trace, flagged
    // hit_guardrail, with at most what came before, and runs to its end.
    let dir = scratch_dir("svc-guard");
    let svc = Service::start(&dir.join("svc"));
    let config = dir.join("guard.cfg");
    std::fs::write(
        &config,
        "process_cmdline: \"guard_x\"\nsampling_interval_bytes: 1\nno_running: true\n\
         max_heapprofd_memory_kb: 1\n",
    )
    .expect("write the config");
    let trace = dir.join("guard.pftrace");
    let rec = svc.record(&["--config", &config.to_string_lossy()], &trace);
    svc.wait_store("name 1 guard_x");
    let pid = run_preloaded(
        &svc.dir,
        &record_programs().path("many_stacks"),
        "guard_x",
        &["40"],
    );
    svc.wait_log(&format!(
        "pid {pid} hit the max_heapprofd_memory_kb guardrail"
    ));
    let err = end_record(rec, "record --config");
    assert!(err.contains("hit a guardrail"), "{err}");
    let t = check_trace(&trace);
    let dumps: Vec<_> = t
        .dumps
        .iter()
        .filter(|d| d["pid"].as_u64() == Some(u64::from(pid)))
        .collect();
    assert!(!dumps.is_empty(), "the process is not in the trace");
    assert!(
        dumps
            .iter()
            .all(|d| d["hit_guardrail"] == serde_json::Value::Bool(true)),
        "{dumps:?}"
    );
    assert!(totals(&t, pid, "stack_leaf").0 <= 40);
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_control_peer_that_goes_away_mid_profile_is_harmless() {
    let _beside = beside_others();
    // `record` killed while its profile runs (and a second one open): its
    // profile ends (the service sees the connection close) and is written
    // to the file record created; the other profile and the service go on.
    let dir = scratch_dir("svc-peer-gone");
    let svc = Service::start(&dir.join("svc"));
    let gone = dir.join("gone.pftrace");
    let mut killed = svc.record(&["-n", "peer_gone", "-i", "1"], &gone);
    svc.wait_store("name 1 peer_gone");
    let other = dir.join("other.pftrace");
    let kept = svc.record(&["-n", "peer_kept", "-i", "1"], &other);
    svc.wait_store("name 1 peer_kept");
    let exit_now = record_programs().path("exit_now");
    let pid = run_preloaded(&svc.dir, &exit_now, "peer_gone", &["3"]);
    killed.0.kill().expect("SIGKILL record");
    let _ = killed.0.wait();
    svc.wait_log("(peer_gone) ended: 1 process");
    // Written for nobody, but a valid trace with the process in it.
    assert_eq!(
        totals(&check_trace(&gone), pid, "alloc_then_exit"),
        (3, 3 * 64)
    );
    let kept_pid = run_preloaded(&svc.dir, &exit_now, "peer_kept", &["4"]);
    end_record(kept, "the other record");
    assert_eq!(
        totals(&check_trace(&other), kept_pid, "alloc_then_exit"),
        (4, 4 * 64)
    );
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether system call `nr` is `poll` or `ppoll` (glibc's `poll` is
/// either, by architecture).
fn is_poll(nr: i64) -> bool {
    #[cfg(target_arch = "x86_64")]
    if nr == libc::SYS_poll {
        return true;
    }
    nr == libc::SYS_ppoll
}

/// Waits until `pid`'s client thread (the session's watcher) sleeps in
/// `poll`, which it enters only after its session's start-up work, the
/// free set's prefault included (`/proc/PID/task/TID/syscall` starts with
/// the number of the call a thread is blocked in).
fn wait_watching(pid: u32) {
    wait_for(&format!("pid {pid}'s client thread in poll"), || {
        client_thread(pid).is_some_and(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
                .ok()
                .and_then(|s| s.split(' ').next()?.parse().ok())
                .is_some_and(is_poll)
        })
    });
}

/// `ClientConfig::FLAG_PREFAULT_FREE_SET` end to end: a process woken by a
/// profile that names it has its free set's 2 MiB of slots in before it
/// samples; one woken by a profile of every process (whose idle processes
/// would each pay twice their ring) does not. At `-i 64m`, the stepper's
/// 20 KB after the wake-up are sampled with a probability of 0.03%.
#[test]
fn only_profiles_that_name_a_process_fault_its_free_set_in() {
    let _beside = beside_others();
    let dir = scratch_dir("svc-prefault");
    let svc = Service::start(&dir.join("svc"));
    for (name, args, faulted) in [
        ("pf_all", &["--all"][..], false),
        ("pf_named", &["-n", "pf_named", "--no-startup"][..], true),
    ] {
        let mut stepper = Stepper::start(&svc.dir, name);
        let before = status_kib(stepper.pid, "RssAnon");
        let trace = dir.join(format!("{name}.pftrace"));
        let mut all_args = args.to_vec();
        all_args.extend(["-i", "64m"]);
        let rec = svc.record(&all_args, &trace);
        svc.wait_log(&format!("woke pid {}", stepper.pid));
        // The wake-up starts the session at the next allocation.
        stepper.say("small");
        wait_watching(stepper.pid);
        let grown = status_kib(stepper.pid, "RssAnon").saturating_sub(before);
        end_record(rec, name);
        stepper.finish();
        if faulted {
            assert!(
                grown >= 1536,
                "{name}: RssAnon grew by {grown} KiB, want 2 MiB"
            );
        } else {
            assert!(
                grown < 1024,
                "{name}: RssAnon grew by {grown} KiB, want no 2 MiB"
            );
        }
    }
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
