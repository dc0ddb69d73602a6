//! The bionic front-end (`libheapprofd_bionic.so`, `android/`) under an
//! emulated bionic loader: `tests/programs/bionic/emulated_libc.c`,
//! preloaded into real glibc programs, does what bionic's libc does with
//! heapprofd (`malloc_common_dynamic.cpp`, `malloc_heapprofd.cpp`):
//! `dlopen(RTLD_NOW | RTLD_LOCAL)`, `dlsym` of every `heapprofd_<name>`
//! (one missing: exit 97), `heapprofd_initialize` with a table of glibc's
//! functions, the program's malloc family through the table it installs,
//! and on the profiling signal (36 = `__SIGRTMIN + 4`, `sigqueue` value 0)
//! the table taken out and initialize called again from a `heapprofdinit`
//! thread.
//!
//! * the library exports exactly bionic's names (`nm -D`);
//! * every entry of the table reaches its slot of the table it was given;
//! * the loader refuses a library that lacks one name;
//! * `alloc_truth.cpp` at `-i 1` through the table, recorded by `record`:
//!   every function exact, stacks from `_start` or the thread start;
//! * a second initialize after the session ended (the service's profile
//!   ended, a new `record -n NAME --no-startup` wakes the process with
//!   signal 36, value 0): a new session, exact again;
//! * an initialize while a session is still open (the signal sent during a
//!   `record`): the open session is ended and a second one started, the
//!   allocations of both in the trace.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use heapprofd_tests::alloc_truth::{ThreadStart, check_exact};
use heapprofd_tests::client_harness::{compile, run, workspace_root};
use heapprofd_tests::record_harness::{
    Live, Sample, TraceSummary, check_trace, frame_is, heapprofd, record_programs, release_bins,
    scratch_dir,
};
use heapprofd_tests::service_harness::{Service, Stepper, signal, wait_exit, wait_for};

const TIMEOUT: Duration = Duration::from_secs(300);

/// The bionic front-end, next to the release `heapprofd-rs`.
fn bionic_lib() -> PathBuf {
    let lib = release_bins()
        .heapprofd
        .with_file_name(heapprofd_proto::attach::BIONIC_CLIENT_FILE_NAME);
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build --release --workspace`",
        lib.display()
    );
    lib
}

/// `emulated_libc.so`, built once per test process.
fn emulated_libc() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = scratch_dir("bionic-emu");
        let out = dir.join("emulated_libc.so");
        let src = workspace_root().join("tests/programs/bionic/emulated_libc.c");
        compile(&[
            "gcc",
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-pthread",
            "-Wall",
            "-Werror",
            "-o",
            out.to_str().unwrap(),
            src.to_str().unwrap(),
            "-ldl",
        ]);
        out
    })
}

/// Every name bionic looks up for the prefix `heapprofd` on a 64-bit
/// target (`pvalloc`/`valloc` only on 32-bit ones).
const BIONIC_NAMES: [&str; 20] = [
    "initialize",
    "finalize",
    "get_malloc_leak_info",
    "free_malloc_leak_info",
    "malloc_backtrace",
    "write_malloc_leak_info",
    "free",
    "calloc",
    "mallinfo",
    "mallopt",
    "malloc",
    "malloc_info",
    "malloc_usable_size",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "realloc",
    "malloc_iterate",
    "malloc_disable",
    "malloc_enable",
];

#[test]
fn exports_exactly_the_bionic_abi() {
    let out = Command::new("nm")
        .args(["-D", "--defined-only", "--format=just-symbols"])
        .arg(bionic_lib())
        .output()
        .expect("run nm");
    assert!(out.status.success());
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    got.sort();
    let mut want: Vec<String> = BIONIC_NAMES
        .iter()
        .map(|n| format!("heapprofd_{n}"))
        .collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn every_entry_forwards_through_the_table_it_was_given() {
    let out = Command::new("/bin/true")
        .env("LD_PRELOAD", emulated_libc())
        .env("HEAPPROFD_EMU_CLIENT", bionic_lib())
        .env("HEAPPROFD_EMU_SELFTEST", "1")
        .env("HEAPPROFD_SOCKET", "/nonexistent/heapprofd.sock")
        .output()
        .expect("run /bin/true");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert_eq!(stdout.trim(), "selftest: 14 entries forwarded", "{stderr}");
}

#[test]
fn the_loader_refuses_a_library_without_one_name() {
    let dir = scratch_dir("bionic-missing");
    // Every name but heapprofd_malloc_info, each a function.
    let src = dir.join("incomplete.c");
    let body: String = BIONIC_NAMES
        .iter()
        .filter(|n| **n != "malloc_info")
        .map(|n| format!("void heapprofd_{n}(void) {{}}\n"))
        .collect();
    std::fs::write(&src, body).unwrap();
    let lib = dir.join("incomplete.so");
    compile(&[
        "gcc",
        "-shared",
        "-fPIC",
        "-o",
        lib.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    let out = Command::new("/bin/true")
        .env("LD_PRELOAD", emulated_libc())
        .env("HEAPPROFD_EMU_CLIENT", &lib)
        .env("HEAPPROFD_EMU_ENABLE", "1")
        .output()
        .expect("run /bin/true");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(97), "{stderr}");
    assert!(
        stderr.contains("dlsym(\"heapprofd_malloc_info\") failed"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The emulated libc's own entry points: the leaf frame of a sample when
/// the entry did not tail-call the table (bionic's `malloc` in libc.so
/// is the leaf on a device the same way). Taken off, a stack looks as the
/// glibc front-end's do.
const LIBC_ENTRIES: [&str; 8] = [
    "malloc",
    "calloc",
    "realloc",
    "memalign",
    "posix_memalign",
    "aligned_alloc",
    "valloc",
    "pvalloc",
];

fn without_libc_entry(samples: Vec<Sample>) -> Vec<Sample> {
    samples
        .into_iter()
        .map(|mut s| {
            if s.frames
                .last()
                .is_some_and(|leaf| LIBC_ENTRIES.contains(&leaf.as_str()))
            {
                s.frames.pop();
            }
            s
        })
        .collect()
}

#[test]
fn alloc_truth_through_the_dispatch_table_is_exact_at_interval_1() {
    let dir = scratch_dir("bionic-truth");
    let trace = dir.join("t.pftrace");
    let prog = record_programs().path("alloc_truth");
    let emu = emulated_libc();
    // `record` preloads the emulated libc in place of the glibc client and
    // sets HEAPPROFD_SOCKET; the loader's start-up initialize connects.
    let mut cmd = heapprofd();
    cmd.env("HEAPPROFD_EMU_CLIENT", bionic_lib())
        .env("HEAPPROFD_EMU_ENABLE", "1")
        .arg("record")
        .args(["-i", "1", "--client-lib"])
        .arg(emu)
        .arg("-o")
        .arg(&trace)
        .arg("--")
        .arg(prog)
        .arg("1");
    let out = run(cmd, TIMEOUT);
    assert_eq!(out.code, Some(0), "record failed:\n{}", out.stderr);
    assert!(
        !out.stderr.contains("could not start"),
        "the session must start:\n{}",
        out.stderr
    );
    let summary: TraceSummary = check_trace(&trace);
    assert_eq!(summary.pids().len(), 1, "{}", out.stderr);
    for d in &summary.dumps {
        for flag in ["buffer_overran", "buffer_corrupted", "hit_guardrail"] {
            assert_eq!(d[flag], false, "{flag} set:\n{d}");
        }
        assert_eq!(d["client_error"], "CLIENT_ERROR_NONE");
    }
    let samples = without_libc_entry(summary.latest());
    check_exact(&samples, ThreadStart::Named);
    let _ = std::fs::remove_dir_all(&dir);
}

/// (allocations, bytes) of `pid` in the trace whose stacks hold `frame`.
fn totals(t: &TraceSummary, pid: u32, frame: &str) -> (u64, u64) {
    t.samples
        .iter()
        .filter(|s| s.pid == u64::from(pid) && s.frames.iter().any(|f| frame_is(f, frame)))
        .fold((0, 0), |(c, b), s| (c + s.alloc_count, b + s.allocated))
}

/// Ends a service `record` with Ctrl-C; its stderr, after checking it
/// succeeded.
fn end_record(mut rec: heapprofd_tests::service_harness::Reaped, what: &str) -> String {
    signal(&rec.0, libc::SIGINT);
    let (code, err) = wait_exit(&mut rec.0, what);
    assert_eq!(code, 0, "{what} failed:\n{err}");
    err
}

#[test]
fn a_second_initialize_after_the_session_ended_starts_a_new_session() {
    let dir = scratch_dir("bionic-reinit");
    let svc = Service::start(&dir.join("svc"));
    let emu_log = dir.join("emu.log");

    // Profile 1 wants the name from start-up (the stand-in for bionic's
    // heapprofd.enable.<name> is HEAPPROFD_EMU_ENABLE=1: the loader's
    // start-up initialize, which finds the service by its trigger store).
    let t1 = dir.join("first.pftrace");
    let rec = svc.record(&["-n", "bionic_stepper", "-i", "1"], &t1);
    let store = svc.dir.join(heapprofd_proto::service::TRIGGERS_FILE);
    wait_for("the trigger store", || store.exists());
    let mut cmd = Command::new(record_programs().path("stepper"));
    std::os::unix::process::CommandExt::arg0(&mut cmd, "bionic_stepper");
    cmd.env("LD_PRELOAD", emulated_libc())
        .env("HEAPPROFD_EMU_CLIENT", bionic_lib())
        .env("HEAPPROFD_EMU_ENABLE", "1")
        .env("HEAPPROFD_EMU_LOG", &emu_log)
        .env(heapprofd_proto::service::DIR_ENV, &svc.dir)
        .env_remove("HEAPPROFD_SOCKET");
    // Start-up's "grow 1" is recorded: the session started before main.
    let mut stepper = Stepper::start_command(cmd);
    stepper.say("grow 5");
    let err = end_record(rec, "the first record");
    assert!(err.contains("1 process"), "{err}");
    svc.wait_log("(bionic_stepper) ended: 1 process");
    // Dormant: not recorded anywhere.
    stepper.say("grow 3");

    // Profile 2 of the running process: the service sees the bionic
    // front-end mapped and wakes the process with signal 36, value 0; the
    // emulated libc's next malloc starts the heapprofdinit thread, which
    // initializes again.
    let t2 = dir.join("second.pftrace");
    let pid = stepper.pid.to_string();
    let rec = svc.record(&["-n", "bionic_stepper", "--no-startup", "-i", "1"], &t2);
    svc.wait_log(&format!("woke pid {pid}"));
    stepper.say("small");
    wait_for("the second initialize", || {
        std::fs::read_to_string(&emu_log).is_ok_and(|l| l.lines().count() == 2)
    });
    stepper.say("grow 7");
    end_record(rec, "the second record");
    stepper.finish();

    assert_eq!(
        std::fs::read_to_string(&emu_log).unwrap(),
        "initialize ok\ninitialize ok\n"
    );
    let first = check_trace(&t1);
    assert_eq!(totals(&first, stepper_pid(&pid), "grow_site"), (6, 6000));
    let second = check_trace(&t2);
    assert_eq!(totals(&second, stepper_pid(&pid), "grow_site"), (7, 7000));
    for t in [&first, &second] {
        assert_eq!(t.pids(), vec![u64::from(stepper_pid(&pid))]);
        for d in &t.dumps {
            assert_eq!(d["client_error"], "CLIENT_ERROR_NONE");
        }
    }
    let (code, log) = svc.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn stepper_pid(pid: &str) -> u32 {
    pid.parse().expect("a pid")
}

/// The first child of process `pid` (`/proc/PID/task/PID/children`).
fn child_of(pid: i32) -> i32 {
    let mut child = 0;
    wait_for("record's child", || {
        let path = format!("/proc/{pid}/task/{pid}/children");
        child = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        child != 0
    });
    child
}

#[test]
fn an_initialize_while_a_session_is_open_ends_it_and_starts_another() {
    let dir = scratch_dir("bionic-resignal");
    let trace = dir.join("t.pftrace");
    let emu_log = dir.join("emu.log");
    let client = format!("HEAPPROFD_EMU_CLIENT={}", bionic_lib().display());
    let log = format!("HEAPPROFD_EMU_LOG={}", emu_log.display());
    let stepper = record_programs().path("stepper");
    // `env` (preloaded too, but not enabled) execs the stepper with the
    // loader's variables: the start-up initialize connects to `record`.
    let mut live = Live::start(
        &[
            "-i",
            "1",
            "--client-lib",
            emulated_libc().to_str().unwrap(),
            "-o",
            trace.to_str().unwrap(),
        ],
        &[
            "env",
            &client,
            "HEAPPROFD_EMU_ENABLE=1",
            &log,
            stepper.to_str().unwrap(),
        ],
    );
    live.step("grow 2");
    // The profiling signal while the first session is open (bionic then
    // takes our table out and initializes again): the new initialize ends
    // the open session and starts a second one.
    let pid = child_of(live.pid);
    // SAFETY: sigqueue with a plain integer value.
    let rc = unsafe {
        libc::sigqueue(
            pid,
            36,
            libc::sigval {
                sival_ptr: std::ptr::null_mut(),
            },
        )
    };
    assert_eq!(rc, 0, "sigqueue: {}", std::io::Error::last_os_error());
    live.step("small");
    wait_for("the second initialize", || {
        std::fs::read_to_string(&emu_log).is_ok_and(|l| l.lines().count() == 2)
    });
    live.step("grow 3");
    live.close_stdin();
    let out = live.finish(TIMEOUT);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(&emu_log).unwrap(),
        "initialize ok\ninitialize ok\n"
    );
    // Both sessions of the one process: "grow 2" in the first, "grow 3" in
    // the second (the daemon keeps a pid's sessions in one process, as
    // after an exec).
    let t = check_trace(&trace);
    assert_eq!(t.pids(), vec![pid as u64]);
    let grow = t
        .latest()
        .iter()
        .filter(|s| s.frames.iter().any(|f| frame_is(f, "grow_site")))
        .fold((0, 0), |(c, b), s| (c + s.alloc_count, b + s.allocated));
    assert_eq!(grow, (5, 5000), "{}", out.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}
