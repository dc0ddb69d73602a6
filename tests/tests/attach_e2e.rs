//! End-to-end tests of `heapprofd-rs record --pid` (attaching to a running
//! process): long-running targets in C, C++, Rust, Python and Node.js are
//! profiled twice each and must keep running correctly (they print checksums
//! of deterministic work, compared with the value before any attach) with no
//! profiler thread and glibc's malloc back in their GOT afterwards; a target
//! busy in malloc on every thread; a target blocked in read(2); memory
//! allocated before the attach (single-threaded targets: no profiler thread,
//! glibc's single-thread mode kept); general and vector registers of the
//! hijacked thread, blocked or spinning; a library loaded after it; a preloaded
//! dormant client woken by the signal; root attaching to another user's
//! process; and the errors (no such process, no permission, static, 32-bit,
//! traced, exiting, never at a safe point), each leaving the target running.
//!
//! Programs: `tests/programs/attach/` (each documents its commands). Traces
//! are checked with `proto/tests/check_trace.py --strict`. No assertion
//! depends on timing; timeouts only catch hangs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use heapprofd_tests::attach_harness::{
    Target, attach, attach_programs, attach_with, client_thread, have, is_root, maps_contain, s,
};
use heapprofd_tests::client_harness::Output;
use heapprofd_tests::record_harness::{Sample, TraceSummary, check_trace, heapprofd, scratch_dir};
use nix::sys::ptrace;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

const WAIT: Duration = Duration::from_secs(120);

fn prog(name: &str) -> Command {
    Command::new(attach_programs().path(name))
}

fn ok(out: &Output, what: &str) {
    assert_eq!(out.code, Some(0), "{what} failed:\n{}", out.stderr);
}

/// Samples whose stack contains a frame containing `function`.
fn with_frame<'a>(samples: &'a [Sample], function: &str) -> Vec<&'a Sample> {
    samples
        .iter()
        .filter(|x| x.frames.iter().any(|f| f.contains(function)))
        .collect()
}

/// The trace is valid, about `pid` only, and no callstack freed more than
/// it allocated (frees of memory from before the attach are ignored).
fn check_attach_trace(trace: &std::path::Path, pid: u32) -> TraceSummary {
    let t = check_trace(trace);
    assert_eq!(t.pids(), vec![pid as u64], "{}", trace.display());
    let dump = t.dumps.last().expect("a dump");
    assert_eq!(dump["from_startup"], serde_json::Value::Bool(false));
    for x in t.latest() {
        assert!(
            x.freed <= x.allocated && x.free_count <= x.alloc_count,
            "callstack freed more than it allocated: {x:?}"
        );
    }
    t
}

/// The file-backed mappings of `pid`: (range, permissions, path).
fn file_mappings(pid: u32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 6 && f[5].starts_with('/')).then(|| format!("{} {} {}", f[0], f[1], f[5]))
        })
        .collect()
}

/// Every file mapping of `before` is still there with the same range and
/// permissions (the RELRO pages made writable for the patch were given
/// back their protection); the profiler's library may have been added.
fn assert_mappings_kept(pid: u32, before: &[String]) {
    let after = file_mappings(pid);
    for m in before {
        assert!(
            after.contains(m),
            "mapping changed or gone: {m}\nnow: {after:#?}"
        );
    }
}

/// After a session: no profiler thread, and (if the library is loaded) it
/// is only mapped, not running.
fn assert_left_as_it_was(pid: u32) {
    assert_eq!(client_thread(pid), None, "profiler thread left in {pid}");
}

/// A `record --pid` running in the background, stopped with Ctrl-C.
struct Background {
    child: Option<Child>,
    stderr: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Background {
    /// Starts it and waits until it says it is profiling (the session is
    /// connected, so the target's GOT entries are patched).
    fn start(pid: u32, args: &[&str]) -> Background {
        let mut child = heapprofd()
            .arg("record")
            .arg("--pid")
            .arg(pid.to_string())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn heapprofd-rs");
        let err = child.stderr.take().expect("piped stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut bg = Background {
            child: Some(child),
            stderr: rx,
            seen: Vec::new(),
        };
        let want = format!("profiling process {pid} ");
        loop {
            match bg.stderr.recv_timeout(WAIT) {
                Ok(l) => {
                    let found = l.contains(&want);
                    bg.seen.push(l);
                    if found {
                        return bg;
                    }
                }
                Err(_) => panic!("record --pid never started profiling: {:?}", bg.seen),
            }
        }
    }

    /// SIGINT (Ctrl-C), then the exit code and all of stderr.
    fn stop(self) -> Output {
        let pid = self.child.as_ref().expect("child").id();
        // Our child's pid.
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGINT);
        self.wait()
    }

    /// Waits for it to exit by itself; the exit code and all of stderr.
    fn wait(mut self) -> Output {
        let mut child = self.child.take().expect("child");
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break st;
            }
            if start.elapsed() >= WAIT {
                while let Ok(l) = self.stderr.try_recv() {
                    self.seen.push(l);
                }
                panic!(
                    "record --pid did not stop; its stderr so far:\n{}",
                    self.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        while let Ok(l) = self.stderr.recv_timeout(WAIT) {
            self.seen.push(l);
        }
        Output {
            code: status.code(),
            stdout: String::new(),
            stderr: self.seen.join("\n"),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Profiles `t` twice for 2 s; each time the trace has samples in
/// `own_function`, the work done afterwards gives the checksum it gave
/// before any attach, and no profiler thread is left. Then `quit`.
fn profile_twice(mut t: Target, tag: &str, own_function: &str) {
    let dir = scratch_dir(tag);
    let before = t.cmd("work 20000");
    assert!(before.starts_with("sum="), "{before}");
    let maps = file_mappings(t.pid);
    for round in 1..=2 {
        let trace = dir.join(format!("t{round}.pftrace"));
        let out = attach(t.pid, &["-d", "2s", "-o", &s(&trace)]);
        ok(&out, "record --pid");
        assert!(
            out.stderr
                .contains(&format!("detached from process {}", t.pid)),
            "{}",
            out.stderr
        );
        let summary = check_attach_trace(&trace, t.pid);
        let own = with_frame(&summary.samples, own_function);
        assert!(
            !own.is_empty(),
            "round {round}: no sample in {own_function}; frames: {:?}",
            summary
                .samples
                .iter()
                .map(|x| &x.frames)
                .collect::<Vec<_>>()
        );
        assert_left_as_it_was(t.pid);
        assert_mappings_kept(t.pid, &maps);
        assert_eq!(
            t.cmd("work 20000"),
            before,
            "round {round}: wrong output after detach"
        );
    }
    t.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn c_target_is_profiled_twice_and_left_as_it_was() {
    let mut c = prog("target");
    c.arg("3");
    let mut t = Target::start(c);
    assert_eq!(t.cmd("got"), "malloc=libc");
    let pid = t.pid;
    let dir = scratch_dir("c-got");
    // While attached, the program's GOT entry for malloc is the profiler's.
    let bg = Background::start(pid, &["-o", &s(&dir.join("t.pftrace"))]);
    assert_eq!(t.cmd("got"), "malloc=other");
    ok(&bg.stop(), "record --pid (Ctrl-C)");
    assert_eq!(t.cmd("got"), "malloc=libc", "GOT not restored");
    check_attach_trace(&dir.join("t.pftrace"), pid);
    profile_twice(t, "c", "c_worker_alloc");
}

#[test]
fn cxx_target_is_profiled_twice_and_left_as_it_was() {
    let mut c = prog("target_cxx");
    c.arg("2");
    profile_twice(Target::start(c), "cxx", "cxx_worker_alloc");
}

#[test]
fn rust_target_is_profiled_twice_and_left_as_it_was() {
    let mut c = prog("target_rs");
    c.arg("2");
    profile_twice(Target::start(c), "rust", "rust_worker_alloc");
}

#[test]
fn python_target_is_profiled_twice_and_left_as_it_was() {
    let mut c = Command::new("python3");
    c.arg(attach_programs().script("target.py"));
    // CPython's own functions: the interpreter allocating for the script.
    profile_twice(Target::start(c), "python", "_PyEval_EvalFrameDefault");
}

#[test]
fn node_target_is_profiled_twice_and_left_as_it_was() {
    assert!(
        have("node"),
        "node is not installed: run scripts/install-deps.sh (Debian package nodejs)"
    );
    let mut c = Command::new("node");
    c.arg(attach_programs().script("target.js"));
    // node's ArrayBuffer allocator, under the script's Buffer.alloc.
    profile_twice(Target::start(c), "node", "node::");
}

#[test]
fn target_busy_in_malloc_on_every_thread() {
    let mut c = prog("busy");
    c.arg("3");
    let mut t = Target::start(c);
    let dir = scratch_dir("busy");
    for round in 1..=2 {
        let trace = dir.join(format!("t{round}.pftrace"));
        let out = attach(t.pid, &["-d", "1s", "-o", &s(&trace)]);
        ok(&out, "record --pid");
        let summary = check_attach_trace(&trace, t.pid);
        assert!(!with_frame(&summary.samples, "busy_round").is_empty());
        assert_left_as_it_was(t.pid);
    }
    // Every round of every thread still computed the same checksum.
    t.signal(libc::SIGTERM);
    let last = t.line(WAIT);
    assert!(
        last.starts_with("rounds=") && last.ends_with(" ok"),
        "{last}"
    );
    t.wait_exit(0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn target_blocked_in_read_resumes_its_system_call() {
    // One thread, blocked in read(2) on a pipe: it is the one hijacked.
    let mut c = prog("target");
    c.arg("0");
    let mut t = Target::start(c);
    let before = t.cmd("work 5000");
    assert_eq!(t.cmd("single"), "single=1");
    let dir = scratch_dir("blocked");
    let trace = dir.join("t.pftrace");
    let bg = Background::start(t.pid, &["-o", &s(&trace)]);
    // What is written to the pipe after the injection is read, once.
    assert_eq!(t.cmd("work 5000"), before);
    assert_eq!(t.cmd("got"), "malloc=other");
    // A single-threaded target gets no profiler thread (the session runs
    // synchronously): glibc still sees one thread.
    assert_eq!(client_thread(t.pid), None);
    assert_eq!(t.cmd("single"), "single=1");
    let out = bg.stop();
    ok(&out, "record --pid");
    assert!(
        out.stderr.contains(&format!("through thread {}", t.pid)),
        "{}",
        out.stderr
    );
    let summary = check_attach_trace(&trace, t.pid);
    assert!(!with_frame(&summary.samples, "c_target_work").is_empty());
    assert_left_as_it_was(t.pid);
    assert_eq!(t.cmd("got"), "malloc=libc");
    assert_eq!(t.cmd("work 5000"), before);
    assert_eq!(
        t.cmd("single"),
        "single=1",
        "glibc's single-thread mode was lost"
    );
    t.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn registers_survive_the_attach() {
    // Blocked in read(2) with known values in the general and vector
    // registers the kernel preserves: the attach (dlopen, handshake) and the
    // detach run in that thread; the read resumes with every value intact.
    let mut t = Target::start(prog("regs"));
    let dir = scratch_dir("regs");
    for round in 0..2 {
        let trace = dir.join(format!("t{round}.pftrace"));
        ok(
            &attach(t.pid, &["-d", "200ms", "-o", &s(&trace)]),
            "record --pid",
        );
        assert_eq!(t.cmd("x"), "regs ok 2", "round {round}");
    }
    t.wait_exit(0);
    // Spinning in user space with live registers, checked every iteration.
    let mut c = prog("regs");
    c.arg("spin");
    let mut t = Target::start(c);
    for round in 0..2 {
        let trace = dir.join(format!("s{round}.pftrace"));
        ok(
            &attach(t.pid, &["-d", "200ms", "-o", &s(&trace)]),
            "record --pid",
        );
    }
    t.signal(libc::SIGTERM);
    let last = t.line(WAIT);
    assert!(last.ends_with(" bad=0"), "{last}");
    t.wait_exit(0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn memory_allocated_before_the_attach_is_ignored() {
    let mut c = prog("target");
    c.arg("0");
    let mut t = Target::start(c);
    assert_eq!(t.cmd("keep 3000"), "kept 3000");
    let dir = scratch_dir("before");
    let trace = dir.join("t.pftrace");
    // Every allocation is recorded (-i 1), so the counts are exact.
    let bg = Background::start(t.pid, &["-i", "1", "-o", &s(&trace)]);
    assert_eq!(t.cmd("drop"), "dropped 3000");
    let sum = t.cmd("work 4000");
    assert!(sum.starts_with("sum="));
    ok(&bg.stop(), "record --pid");
    let summary = check_attach_trace(&trace, t.pid);
    let latest = summary.latest();
    assert!(
        with_frame(&latest, "c_prealloc").is_empty(),
        "allocations from before the attach appeared"
    );
    let work: (u64, u64) = with_frame(&latest, "c_target_work")
        .iter()
        .fold((0, 0), |a, x| (a.0 + x.alloc_count, a.1 + x.free_count));
    // Two mallocs per iteration, all freed.
    assert_eq!(work, (8000, 8000), "c_target_work allocations and frees");
    let total_allocs: u64 = latest.iter().map(|x| x.alloc_count).sum();
    let total_frees: u64 = latest.iter().map(|x| x.free_count).sum();
    assert!(
        total_frees <= total_allocs,
        "{total_frees} > {total_allocs}"
    );
    t.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn library_loaded_after_the_attach_is_profiled_and_restored() {
    // Single-threaded (synchronous session, no watcher) and with workers.
    for workers in ["0", "2"] {
        plugin_case(workers);
    }
}

fn plugin_case(workers: &str) {
    let p = attach_programs();
    let dir = scratch_dir("plugin");
    // Two copies: one loaded by bare name (a search: glibc's dlopen is
    // called directly, and the next sampled allocation or the watcher
    // patches it), one by path (patched by the dlopen hook at once).
    let bare = dir.join("libplugin_bare.so");
    std::fs::copy(p.path("libplugin.so"), &bare).unwrap();
    let mut c = prog("target");
    c.arg(workers).env("LD_LIBRARY_PATH", &dir);
    let mut t = Target::start(c);
    let trace = dir.join("t.pftrace");
    let bg = Background::start(t.pid, &["-i", "1", "-o", &s(&trace)]);
    assert_eq!(t.cmd("plugin libplugin_bare.so 1000"), "plugin patched");
    let by_path = format!("plugin {} 1000", s(&p.path("libplugin.so")));
    assert_eq!(t.cmd(&by_path), "plugin patched");
    // A third copy, patched and then unloaded before the end: the restore
    // must leave its (unmapped) slots alone.
    let gone = dir.join("libplugin_gone.so");
    std::fs::copy(p.path("libplugin.so"), &gone).unwrap();
    assert_eq!(t.cmd(&format!("plugin {} 10", s(&gone))), "plugin patched");
    assert_eq!(t.cmd(&format!("unplug {}", s(&gone))), "unplugged");
    assert!(!maps_contain(t.pid, "libplugin_gone.so"), "still mapped");
    ok(&bg.stop(), "record --pid");
    let summary = check_attach_trace(&trace, t.pid);
    let plugin: u64 = with_frame(&summary.latest(), "plugin_alloc")
        .iter()
        .map(|x| x.alloc_count)
        .sum();
    assert!(
        plugin >= 2000,
        "{workers} workers: {plugin} plugin_alloc samples"
    );
    assert_left_as_it_was(t.pid);
    assert_eq!(
        t.cmd("plugin-state libplugin_bare.so"),
        "plugin-state clean"
    );
    let state = format!("plugin-state {}", s(&p.path("libplugin.so")));
    assert_eq!(t.cmd(&state), "plugin-state clean");
    assert_eq!(t.cmd("got"), "malloc=libc");
    t.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn target_exiting_while_profiled_ends_the_profile() {
    let mut c = prog("target");
    c.arg("2");
    let mut t = Target::start(c);
    let pid = t.pid;
    let dir = scratch_dir("exit");
    let trace = dir.join("t.pftrace");
    let bg = Background::start(pid, &["-o", &s(&trace)]);
    // Allocations under the profile just before the exit: the main
    // thread's, done when the command answers, and the workers' (which
    // once had no sample in a CI run when the target quit at once).
    t.cmd("work 20000");
    std::thread::sleep(Duration::from_millis(100));
    t.quit();
    // No Ctrl-C: record --pid ends by itself when the target is gone.
    let out = bg.wait();
    ok(&out, "record --pid");
    assert!(
        out.stderr
            .contains(&format!("process {pid} (target) exited")),
        "{}",
        out.stderr
    );
    let summary = check_attach_trace(&trace, pid);
    assert!(!with_frame(&summary.samples, "c_target_work").is_empty());
    assert!(!with_frame(&summary.samples, "c_worker_alloc").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn preloaded_dormant_client_is_woken_by_the_signal() {
    let so = heapprofd_tests::record_harness::release_bins()
        .client_so
        .clone();
    let dir = scratch_dir("preloaded");
    let mut c = prog("target");
    c.arg("2").env("LD_PRELOAD", &so);
    let mut t = Target::start(c);
    let before = t.cmd("work 5000");
    for (round, method) in [(1, None), (2, Some("ptrace"))] {
        let trace = dir.join(format!("t{round}.pftrace"));
        let env: Vec<(&str, &str)> = method
            .map(|m| ("HEAPPROFD_ATTACH", m))
            .into_iter()
            .collect();
        let out = attach_with(t.pid, &["-d", "1s", "-o", &s(&trace)], &env);
        ok(&out, "record --pid");
        let woken = out.stderr.contains("woke the preloaded profiler");
        assert_eq!(woken, method.is_none(), "{}", out.stderr);
        assert!(out.stderr.contains("dormant again"), "{}", out.stderr);
        let summary = check_attach_trace(&trace, t.pid);
        assert!(!with_frame(&summary.samples, "c_worker_alloc").is_empty());
        assert_left_as_it_was(t.pid);
        assert_eq!(t.cmd("work 5000"), before);
    }
    t.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn root_attaches_to_another_users_process() {
    if !is_root() {
        eprintln!("skipped: needs root (to run the target as another user)");
        return;
    }
    let mut c = prog("target");
    c.arg("1");
    let t = Target::start_as(c, Some(65534));
    let dir = scratch_dir("other-user");
    let trace = dir.join("t.pftrace");
    ok(
        &attach(t.pid, &["-d", "1s", "-o", &s(&trace)]),
        "record --pid",
    );
    let summary = check_attach_trace(&trace, t.pid);
    assert!(!with_frame(&summary.samples, "c_worker_alloc").is_empty());
    t.quit();
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// Errors: each names the problem, says what to do, and leaves the target
// running and unchanged (no profiler loaded).

fn refused(pid: u32, env: &[(&str, &str)]) -> String {
    let dir = scratch_dir("refused");
    let trace = dir.join("t.pftrace");
    let out = attach_with(pid, &["-d", "1s", "-o", &s(&trace)], env);
    assert_eq!(out.code, Some(1), "expected a refusal:\n{}", out.stderr);
    assert!(!trace.exists(), "a trace was left behind");
    let _ = std::fs::remove_dir_all(&dir);
    out.stderr
}

fn untouched(t: &Target) {
    assert!(
        !maps_contain(t.pid, "libheapprofd_client.so"),
        "library loaded"
    );
    assert_eq!(client_thread(t.pid), None);
}

#[test]
fn no_such_process() {
    // The pid of a child we started and reaped.
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    let err = refused(pid, &[]);
    assert!(err.contains(&format!("no process with pid {pid}")), "{err}");
}

#[test]
fn no_permission() {
    use std::os::unix::process::CommandExt;
    let t = Target::start(prog("sleeper"));
    let dir = scratch_dir("perm");
    let mut c = heapprofd();
    c.args(["record", "-d", "1s", "-o"])
        .arg(dir.join("t.pftrace"));
    let pid = if is_root() {
        // An unprivileged heapprofd-rs against our (root) target.
        c.uid(65534).gid(65534);
        t.pid
    } else {
        1
    };
    c.arg("--pid").arg(pid.to_string());
    let out = heapprofd_tests::client_harness::run(c, WAIT);
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("no permission") && out.stderr.contains("CAP_SYS_PTRACE"),
        "{}",
        out.stderr
    );
    untouched(&t);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn statically_linked_target() {
    let t = Target::start(prog("sleeper_static"));
    let err = refused(t.pid, &[]);
    assert!(err.contains("statically linked"), "{err}");
    untouched(&t);
}

#[test]
fn target_of_another_architecture() {
    let t = Target::start(prog("i386"));
    let err = refused(t.pid, &[]);
    assert!(
        err.contains("i386 program") && err.contains("x86_64"),
        "{err}"
    );
}

#[test]
fn target_already_traced() {
    let t = Target::start(prog("sleeper"));
    // We trace it ourselves (as a debugger would), from this thread.
    // Our own child; detached below.
    let tracee = Pid::from_raw(t.pid as i32);
    ptrace::seize(tracee, ptrace::Options::empty()).expect("PTRACE_SEIZE");
    // (the refusal below runs on this thread too)
    let err = refused(t.pid, &[]);
    // Stop and detach our tracee (detaching needs a stopped tracee).
    let _ = ptrace::interrupt(tracee);
    let _ = waitpid(tracee, Some(WaitPidFlag::__WALL));
    let _ = ptrace::detach(tracee, None);
    // The tracer is this thread (ptrace is per thread).
    let me = nix::unistd::gettid();
    assert!(
        err.contains(&format!("already being traced by pid {me}")),
        "{err}"
    );
    untouched(&t);
}

#[test]
fn target_never_at_a_safe_point_is_left_running() {
    // Its only thread waits inside a signal handler: never safe.
    let t = Target::start(prog("in_handler"));
    let err = refused(t.pid, &[("HEAPPROFD_ATTACH_TIMEOUT_MS", "1000")]);
    assert!(
        err.contains("at a safe point") && err.contains("__restore_rt"),
        "{err}"
    );
    untouched(&t);
    let state = std::fs::read_to_string(format!("/proc/{}/status", t.pid)).unwrap();
    assert!(state.contains("TracerPid:\t0"), "still traced");
}

#[test]
fn target_exiting_during_the_attach() {
    let t = Target::start(prog("in_handler"));
    let pid = t.pid;
    let killer = std::thread::spawn(move || {
        // The attach keeps retrying (the target is never safe); once it has
        // stopped the thread at least once, the target is killed.
        let start = Instant::now();
        loop {
            let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            if !st.contains("TracerPid:\t0") || start.elapsed() > WAIT {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // Our child's pid.
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
    });
    let err = refused(pid, &[("HEAPPROFD_ATTACH_TIMEOUT_MS", "60000")]);
    killer.join().unwrap();
    assert!(err.contains("exited during the attach"), "{err}");
    drop(t);
}
