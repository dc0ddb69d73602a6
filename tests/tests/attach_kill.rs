//! Killing `record --pid` with SIGKILL (which it cannot handle) at any
//! moment of an attach must not kill the target (issue 10, §3).
//!
//! * `killed_at_each_step_of_the_injection` makes the injector stop at
//!   one named step at a time (`HEAPPROFD_ATTACH_TEST_STALL=<step>`: it
//!   prints `test stall at <step>` and sleeps), kills `record` there, and
//!   checks the hijacked thread: a single-threaded target blocked in
//!   `read(2)` with known values in its general and vector registers
//!   (`tests/programs/attach/regs.c`) must resume its read with all of
//!   them intact (also when killed in the hijack that ends its synchronous
//!   session, `record -d`); the same for one spinning in user space, and
//!   for a threaded C target (its work gives the same checksum as before).
//! * `kill_campaign` (ignored by default; run it with
//!   `cargo test --release -p heapprofd-tests --test attach_kill -- --ignored --nocapture`)
//!   kills `record --pid` 100 times by default (`HEAPPROFD_KILL_RUNS`),
//!   in turn against a C target (3 allocating threads), a Python one and
//!   `regs.c` blocked in `read(2)` (one thread: synchronous attach, the
//!   registers checked after the kill). One kill in 4 comes at a random
//!   delay from `record`'s start over the whole attach (calibrated by one
//!   attach of each target); the others at a random delay within the
//!   calibrated pause after a thread of the target was seen seized
//!   (`TracerPid`), so that most land while the injection is in flight.
//!   It counts the kills with a thread seized, those in flight, and the
//!   targets that died or answered differently than before (none may).
//!   `HEAPPROFD_KILL_AFTER=start|seize|stub` uses one of the triggers only
//!   (`seize` is the one an injector without the return stub can be
//!   measured with).
//!
//! A kill "in flight" is one after which the return stub is still at the
//! target's entry point: the injector writes it there before the first
//! call and puts the original bytes back at the end of the restore.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use heapprofd_tests::attach_harness::{Target, attach_programs};
use heapprofd_tests::record_harness::{heapprofd, scratch_dir};

/// The injector's return stub (`daemon/inject/src/sigframe.rs`), kept here
/// literally as an independent check: `mov %rax,%rdi; mov $15,%eax;
/// syscall` (`rt_sigreturn`); `ud2`.
const STUB: [u8; 12] = [
    0x48, 0x89, 0xc7, 0xb8, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x0f, 0x0b,
];

const WAIT: Duration = Duration::from_secs(60);

/// A `record --pid` whose stderr lines are collected as they come.
struct Recorder {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Recorder {
    fn start(pid: u32, env: &[(&str, &str)]) -> Recorder {
        Recorder::start_with(pid, &[], env)
    }

    /// [`Recorder::start`] with more arguments for `record`.
    fn start_with(pid: u32, args: &[&str], env: &[(&str, &str)]) -> Recorder {
        let dir = scratch_dir("kill");
        let mut c = heapprofd();
        c.arg("record")
            .arg("--pid")
            .arg(pid.to_string())
            .arg("-o")
            .arg(dir.join("t.pftrace"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("spawn heapprofd-rs");
        let err = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Recorder {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a stderr line containing `want`; `None` after `timeout`.
    fn wait_for(&mut self, want: &str, timeout: Duration) -> Option<Duration> {
        let start = Instant::now();
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let found = l.contains(want);
                    self.seen.push(l);
                    if found {
                        return Some(start.elapsed());
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// SIGKILL, reaped; returns everything it printed.
    fn kill(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(l);
        }
        self.seen
    }
}

/// The target's entry point (AT_ENTRY) and the bytes there now.
fn entry_bytes(pid: u32) -> Option<[u8; 12]> {
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    let entry = auxv.chunks_exact(16).find_map(|c| {
        let k = u64::from_ne_bytes(c[..8].try_into().ok()?);
        let v = u64::from_ne_bytes(c[8..].try_into().ok()?);
        (k == libc::AT_ENTRY).then_some(v)
    })?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut b = [0u8; 12];
    mem.read_exact_at(&mut b, entry).ok()?;
    Some(b)
}

/// Whether the target is still running (not exited, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next())
        })
        .flatten()
        .is_some_and(|st| st != 'Z' && st != 'X')
}

fn regs_target(spin: bool) -> Target {
    let mut c = Command::new(attach_programs().path("regs"));
    if spin {
        c.arg("spin");
    }
    Target::start(c)
}

fn c_target() -> Target {
    let mut c = Command::new(attach_programs().path("target"));
    c.arg("3");
    Target::start(c)
}

fn py_target() -> Target {
    let mut c = Command::new("python3");
    c.arg(attach_programs().script("target.py"));
    Target::start(c)
}

/// Kills record at `step` of an attach to `t`; panics if it never got there.
fn kill_at(t: &Target, step: &str) -> Vec<String> {
    kill_at_with(t, step, &[])
}

/// [`kill_at`] with more arguments for `record`.
fn kill_at_with(t: &Target, step: &str, args: &[&str]) -> Vec<String> {
    let env = [("HEAPPROFD_ATTACH_TEST_STALL", step)];
    let mut r = Recorder::start_with(t.pid, args, &env);
    let want = format!("test stall at {step}");
    let got = r.wait_for(&want, WAIT);
    let seen = r.kill();
    assert!(got.is_some(), "record never stalled at {step}: {seen:#?}");
    seen
}

/// The steps of a synchronous attach (one thread: `__errno_location`,
/// `dlsym`, `dlopen`, the attach entry with its handshake) and of the
/// restore after the last call.
const SYNC_STEPS: &[&str] = &[
    "call-0-ready",
    "call-0-running",
    "call-0-returned",
    "call-1-ready",
    "call-1-running",
    "call-1-returned",
    "call-2-ready",
    "call-2-running",
    "call-2-returned",
    "call-3-ready",
    "call-3-running",
    "call-3-returned",
    "restore-ready",
    "restore-stopped",
    "restore-fp",
    "restore-regs",
];

#[test]
fn killed_at_each_step_of_the_injection() {
    // Blocked in read(2): the read resumes with every register intact.
    for step in SYNC_STEPS {
        let mut t = regs_target(false);
        let seen = kill_at(&t, step);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            alive(t.pid),
            "target died after a kill at {step}: {seen:#?}"
        );
        assert_eq!(t.cmd("x"), "regs ok 2", "after a kill at {step}");
        t.wait_exit(0);
    }
    // The hijack that ends the synchronous session (`-d`): killed before,
    // in and after the client's detach entry.
    for step in [
        "detach-call-0-running",
        "detach-call-1-ready",
        "detach-call-1-running",
        "detach-call-1-returned",
        "detach-restore-stopped",
    ] {
        let mut t = regs_target(false);
        let seen = kill_at_with(&t, step, &["-d", "300ms"]);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            alive(t.pid),
            "target died after a kill at {step}: {seen:#?}"
        );
        assert_eq!(t.cmd("x"), "regs ok 2", "after a kill at {step}");
        t.wait_exit(0);
    }
    // Spinning in user space, registers checked on every iteration.
    for step in [
        "call-2-running",
        "call-3-returned",
        "restore-stopped",
        "restore-fp",
    ] {
        let t = regs_target(true);
        let seen = kill_at(&t, step);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            alive(t.pid),
            "target died after a kill at {step}: {seen:#?}"
        );
        let mut t = t;
        t.signal(libc::SIGTERM);
        let last = t.line(WAIT);
        assert!(last.ends_with(" bad=0"), "after a kill at {step}: {last}");
        t.wait_exit(0);
    }
    // A threaded C target (the attach entry starts the client's thread).
    for step in [
        "call-2-running",
        "call-3-running",
        "call-3-returned",
        "restore-stopped",
    ] {
        let mut t = c_target();
        let before = t.cmd("work 3000");
        let seen = kill_at(&t, step);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            alive(t.pid),
            "target died after a kill at {step}: {seen:#?}"
        );
        assert_eq!(t.cmd("work 3000"), before, "after a kill at {step}");
        t.quit();
    }
}

/// xorshift64*, seeded from the clock (the seed is printed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [lo, hi).
    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_micros().max(1) as u64;
        lo + Duration::from_micros(self.next() % span)
    }
}

/// The targets of the campaign.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// `target.c` with 3 allocating threads (asynchronous attach).
    C,
    /// `target.py` (a worker thread; asynchronous attach).
    Python,
    /// `regs.c`, one thread blocked in `read(2)` with known register
    /// values (synchronous attach: the session runs in the hijacked thread).
    Regs,
}

const KINDS: [Kind; 3] = [Kind::C, Kind::Python, Kind::Regs];

fn start(kind: Kind) -> Target {
    match kind {
        Kind::C => c_target(),
        Kind::Python => py_target(),
        Kind::Regs => regs_target(false),
    }
}

/// What the target answers to a check: the same before and after a kill.
fn check(kind: Kind, t: &mut Target) -> String {
    match kind {
        Kind::C | Kind::Python => t.cmd("work 2000"),
        Kind::Regs => t.cmd("x"),
    }
}

fn finish(kind: Kind, mut t: Target) {
    match kind {
        Kind::C | Kind::Python => t.quit(),
        Kind::Regs => t.wait_exit(0),
    }
}

/// Whether a thread of `pid` has a tracer now (a thread is seized).
fn traced(pid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .is_some_and(|v| v.trim() != "0")
        })
    })
}

/// Polls `cond` until it holds (true) or `timeout` passed (false).
fn wait_until(timeout: Duration, cond: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    false
}

/// One normal attach of `kind`: when (from spawning `record`) it said it
/// loaded the profiler, and how long the hijacked thread was paused.
fn calibrate(kind: Kind) -> (Duration, Duration) {
    let mut t = start(kind);
    let mut r = Recorder::start(t.pid, &[("HEAPPROFD_DEBUG", "1")]);
    let loaded = r
        .wait_for("the profiler in process", WAIT)
        .expect("a normal attach loads the profiler");
    let seen = r.kill();
    let pause = seen
        .iter()
        .find_map(|l| {
            let rest = l.split("which was paused ").nth(1)?;
            rest.trim_end_matches(" ms").parse::<f64>().ok()
        })
        .map(|ms| Duration::from_secs_f64(ms / 1e3))
        .unwrap_or(Duration::from_millis(20));
    check(kind, &mut t);
    finish(kind, t);
    (loaded, pause)
}

#[derive(Default, Debug)]
struct Tally {
    runs: u32,
    /// A thread was seized just before the kill.
    seized: u32,
    /// The return stub was still at the entry point after the kill
    /// (killed between writing the return path and the end of the restore).
    in_flight: u32,
    died: u32,
    wrong: u32,
}

/// How `record` is killed in run `i`: after a random delay from its
/// start over the whole attach (1 run in 4), after a random delay within
/// the pause from when a thread of the target is seen seized (1 in 4), or
/// from when the return stub is seen at the entry point (2 in 4).
fn kill_one(
    i: u32,
    kind: Kind,
    (loaded, pause): (Duration, Duration),
    rng: &mut Rng,
    tally: &mut Tally,
) {
    let mut t = start(kind);
    let before = check(kind, &mut t);
    let entry_before = entry_bytes(t.pid);
    let r = Recorder::start(t.pid, &[]);
    let d = rng.between(Duration::ZERO, pause + Duration::from_millis(1));
    let mode = match std::env::var("HEAPPROFD_KILL_AFTER").as_deref() {
        Ok("start") => 0,
        Ok("seize") => 1,
        Ok("stub") => 2,
        _ => i % 4,
    };
    // Not seen (an attach quicker than the polling): killed at that timeout.
    let timeout = loaded * 4 + Duration::from_millis(500);
    let delay = match mode {
        0 => {
            let d = rng.between(Duration::ZERO, loaded + Duration::from_millis(20));
            std::thread::sleep(d);
            format!("{d:?} after start")
        }
        1 => {
            if wait_until(timeout, || traced(t.pid)) {
                std::thread::sleep(d);
            }
            format!("{d:?} after the seize")
        }
        _ => {
            let stub = || entry_bytes(t.pid).is_some_and(|b| b == STUB);
            if wait_until(timeout, stub) {
                std::thread::sleep(d);
            }
            format!("{d:?} after the stub was written")
        }
    };
    let seized = traced(t.pid);
    let seen = r.kill();
    let stub_left = entry_bytes(t.pid).is_some_and(|b| b == STUB) && entry_before != Some(STUB);
    std::thread::sleep(Duration::from_millis(200));
    tally.runs += 1;
    tally.seized += u32::from(seized);
    tally.in_flight += u32::from(stub_left);
    if !alive(t.pid) {
        tally.died += 1;
        eprintln!(
            "run {i} ({kind:?}): target {} DIED after a kill {delay} (seized: {seized}, \
             in flight: {stub_left}); record said: {seen:?}",
            t.pid
        );
        return;
    }
    let after = check(kind, &mut t);
    if after != before {
        tally.wrong += 1;
        eprintln!("run {i} ({kind:?}): the check gave {after}, {before} before the kill {delay}");
    }
    finish(kind, t);
}

#[test]
#[ignore = "a campaign of 100 kills (about a minute); run with --ignored"]
fn kill_campaign() {
    let runs: u32 = std::env::var("HEAPPROFD_KILL_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut rng = Rng(seed);
    let windows = KINDS.map(|k| (k, calibrate(k)));
    eprintln!("kill campaign: {runs} runs, seed {seed:#x}, (loaded after, pause): {windows:?}");
    let mut tallies: [Tally; 3] = Default::default();
    for i in 0..runs {
        let k = i as usize % KINDS.len();
        kill_one(i, windows[k].0, windows[k].1, &mut rng, &mut tallies[k]);
    }
    for (k, t) in KINDS.iter().zip(&tallies) {
        eprintln!(
            "kill campaign {k:?}: {} kills, {} with a thread seized, {} while the injection was \
             in flight (return stub in place), {} targets died, {} misbehaved",
            t.runs, t.seized, t.in_flight, t.died, t.wrong
        );
    }
    let sum = |f: fn(&Tally) -> u32| tallies.iter().map(f).sum::<u32>();
    eprintln!(
        "kill campaign total: {} kills, {} seized, {} in flight, {} died, {} misbehaved",
        sum(|t| t.runs),
        sum(|t| t.seized),
        sum(|t| t.in_flight),
        sum(|t| t.died),
        sum(|t| t.wrong)
    );
    assert_eq!(
        sum(|t| t.died + t.wrong),
        0,
        "targets killed or broken by killing record: {tallies:?}"
    );
}
