//! `heapprofd-attach-bench`: the "attach" benchmark of docs/PERFORMANCE.md.
//!
//! 1. **Latency.** For each target (the C target of the attach tests with 2
//!    worker threads, the Python one, the Node.js one), a fresh process is
//!    started and attached to twice with `HEAPPROFD_DEBUG=1 heapprofd-rs
//!    record --pid PID -d 500ms`: the first attach loads the library
//!    (`dlopen`), the second only calls its attach entry. `record` prints,
//!    counted from its own start: preparation (symbols, unwind tables),
//!    the hijacked thread's pause (first stop to detach, with its steps),
//!    the activation, the client's connection, the first sample.
//! 2. **Overhead while attached.** `tests/programs/attach/rounds.c` (rounds
//!    of malloc/free pairs of sizes 16..4096 at call depth 20, timed by the
//!    program itself) runs bare, under `record -- rounds`, and attached
//!    (`record --pid`, rounds that ended while the session was confirmed
//!    active), with the same process's rounds before the attach and after
//!    the detach (it must be back to its own unprofiled speed). Medians of
//!    round times, per configuration, 1 and 2 threads, default sampling
//!    (4 KiB); ratios of `record -- CMD` to the bare run, of the attached
//!    rounds to the same process before the attach.
//!
//! Usage: `cargo run --release -p heapprofd-tests --bin heapprofd-attach-bench --
//! [--reps N]` (`cargo build --release` first).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use heapprofd_tests::attach_harness::{Target, attach_programs, s};
use heapprofd_tests::client_harness::workspace_root;
use heapprofd_tests::record_harness::heapprofd;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const WAIT: Duration = Duration::from_secs(300);

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The number after `key` in `text` (e.g. "pause 2.9 ms" -> 2.9).
fn number_after(text: &str, key: &str) -> Option<f64> {
    let i = text.find(key)? + key.len();
    text[i..].split_whitespace().next()?.parse().ok()
}

#[derive(Debug, Default, Clone)]
struct Latency {
    prepare: Vec<f64>,
    pause: Vec<f64>,
    activated: Vec<f64>,
    connected: Vec<f64>,
    first_sample: Vec<f64>,
    detach_pause: Vec<f64>,
    wall: Vec<f64>,
    steps: Vec<String>,
}

impl Latency {
    fn add(&mut self, stderr: &str, wall: Duration) {
        let get = |k: &str| number_after(stderr, k).unwrap_or(f64::NAN);
        self.prepare.push(get("attach: prepare "));
        self.pause.push(get(" pause "));
        self.activated.push(get("activated after "));
        self.connected.push(get("connected after "));
        self.first_sample.push(get("first sample after "));
        if let Some(l) = stderr.lines().find(|l| l.contains("detach paused thread")) {
            self.detach_pause
                .push(number_after(l, " for ").unwrap_or(f64::NAN));
        }
        self.wall.push(wall.as_secs_f64() * 1e3);
        if let Some(l) = stderr.lines().find(|l| l.contains("attach: pause:")) {
            self.steps.push(
                l.trim_start_matches("heapprofd-rs: attach: pause: ")
                    .to_string(),
            );
        }
    }

    fn print(&mut self, what: &str) {
        println!(
            "{what:<34} prepare {:>6.1} | pause {:>5.2} | activated {:>6.1} | connected {:>6.1} | first sample {:>6.1} | command {:>6.0}  (ms, medians of {})",
            median(&mut self.prepare),
            median(&mut self.pause),
            median(&mut self.activated),
            median(&mut self.connected),
            median(&mut self.first_sample),
            median(&mut self.wall),
            self.wall.len()
        );
        if !self.detach_pause.is_empty() {
            println!(
                "{:<34} synchronous session: the detach call paused the thread {:.2} ms",
                "",
                median(&mut self.detach_pause)
            );
        }
        if let Some(s) = self.steps.first() {
            println!("{:<34} pause steps (first run): {s}", "");
        }
    }
}

fn attach_once(pid: u32, lat: &mut Latency) {
    let out_file = std::env::temp_dir().join(format!("heapprofd-attach-bench-{pid}.pftrace"));
    let t0 = Instant::now();
    let out = heapprofd()
        .env("HEAPPROFD_DEBUG", "1")
        .args(["record", "-d", "500ms", "-o"])
        .arg(&out_file)
        .arg("--pid")
        .arg(pid.to_string())
        .output()
        .expect("run heapprofd-rs");
    let wall = t0.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "record --pid failed:\n{stderr}");
    lat.add(&stderr, wall);
    let _ = std::fs::remove_file(&out_file);
}

fn latency(reps: usize) {
    println!("== attach latency (ms from the start of `record --pid`)");
    let p = attach_programs();
    // (name, program, arguments)
    let targets: [(&str, std::path::PathBuf, String); 4] = [
        ("C target (3 threads)", p.path("target"), "2".into()),
        (
            "C target (1 thread: synchronous)",
            p.path("target"),
            "0".into(),
        ),
        (
            "python3 target",
            "python3".into(),
            s(&p.script("target.py")),
        ),
        ("node target", "node".into(), s(&p.script("target.js"))),
    ];
    for (name, program, arg) in &targets {
        let make = || {
            let mut c = Command::new(program);
            c.arg(arg);
            c
        };
        let (mut first, mut again) = (Latency::default(), Latency::default());
        for _ in 0..reps {
            let t = Target::start(make());
            std::thread::sleep(Duration::from_millis(300));
            attach_once(t.pid, &mut first);
            attach_once(t.pid, &mut again);
            t.quit();
        }
        first.print(&format!("{name}, first attach (dlopen)"));
        again.print(&format!("{name}, attach again"));
    }
}

/// Round lines of `rounds`: (thread, end ns, duration ns).
fn parse_round(l: &str) -> Option<(u32, u64, u64)> {
    let mut it = l.strip_prefix("round ")?.split_whitespace();
    Some((
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
        it.next()?.parse().ok()?,
    ))
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn spawn_rounds(mut c: Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn rounds_cmd(threads: u32, pairs: u64, rounds: u64) -> Command {
    let mut c = Command::new(attach_programs().dir.join("rounds"));
    c.args([threads.to_string(), pairs.to_string(), rounds.to_string()]);
    c
}

/// Median round time (ms) of a whole run of `c`.
fn whole_run(c: Command) -> f64 {
    let (mut child, rx) = spawn_rounds(c);
    let mut v: Vec<f64> = rx
        .iter()
        .filter_map(|l| parse_round(&l))
        .map(|r| r.2 as f64 / 1e6)
        .collect();
    let _ = child.wait();
    median(&mut v)
}

/// (median before the attach, while attached, after the detach), in ms.
fn attached_run(threads: u32, pairs: u64, per_phase: usize) -> (f64, f64, f64) {
    let (mut child, rx) = spawn_rounds(rounds_cmd(threads, pairs, 1_000_000));
    let pid = child.id();
    // Warm up, then the same process unprofiled.
    let mut before = Vec::new();
    let mut seen = 0;
    while before.len() < per_phase {
        if let Some((_, _, d)) = rx.recv_timeout(WAIT).ok().and_then(|l| parse_round(&l)) {
            seen += 1;
            if seen > 20 {
                before.push(d as f64 / 1e6);
            }
        }
    }
    let mut rec = heapprofd()
        .args(["record", "-o"])
        .arg(std::env::temp_dir().join(format!("heapprofd-attach-bench-{pid}.pftrace")))
        .arg("--pid")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("record --pid");
    let err = rec.stderr.take().expect("stderr");
    let (etx, erx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = etx.send(l);
        }
    });
    loop {
        let l = erx.recv_timeout(WAIT).expect("record --pid output");
        if l.contains("profiling process") {
            break;
        }
    }
    let active_from = monotonic_ns();
    let mut during = Vec::new();
    while during.len() < per_phase {
        let l = rx.recv_timeout(WAIT).expect("rounds output");
        if let Some((_, end, d)) = parse_round(&l)
            && end.saturating_sub(d) > active_from
        {
            during.push(d as f64 / 1e6);
        }
    }
    // Our child's pid.
    let _ = kill(Pid::from_raw(rec.id() as i32), Signal::SIGINT);
    let _ = rec.wait();
    let detached_at = monotonic_ns();
    let mut after = Vec::new();
    while after.len() < per_phase {
        let l = rx.recv_timeout(WAIT).expect("rounds output");
        if let Some((_, end, d)) = parse_round(&l)
            && end.saturating_sub(d) > detached_at
        {
            after.push(d as f64 / 1e6);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(
        std::env::temp_dir().join(format!("heapprofd-attach-bench-{pid}.pftrace")),
    );
    (median(&mut before), median(&mut during), median(&mut after))
}

fn overhead(reps: usize) {
    println!("== overhead while attached (median round time, ms; ratio to bare)");
    let dir = attach_programs().dir.clone();
    let out = Command::new("gcc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(dir.join("rounds"))
        .arg(workspace_root().join("tests/programs/attach/rounds.c"))
        .status()
        .expect("gcc");
    assert!(out.success());
    let pairs = 20_000;
    for threads in [1, 2] {
        let (mut bare, mut rec, mut att, mut after) = (vec![], vec![], vec![], vec![]);
        let mut before = vec![];
        for _ in 0..reps {
            bare.push(whole_run(rounds_cmd(threads, pairs, 150)));
            let mut r = heapprofd();
            r.args(["record", "-o"])
                .arg(std::env::temp_dir().join("heapprofd-attach-bench-record.pftrace"))
                .arg("--")
                .arg(dir.join("rounds"))
                .args([threads.to_string(), pairs.to_string(), "150".to_string()]);
            rec.push(whole_run(r));
            let (x, a, b) = attached_run(threads, pairs, 150);
            before.push(x);
            att.push(a);
            after.push(b);
        }
        let b = median(&mut bare);
        let (r, a, f) = (median(&mut rec), median(&mut att), median(&mut after));
        let x = median(&mut before);
        println!(
            "{threads} thread(s), {pairs} pairs/round: bare {b:.3} | record -- CMD {r:.3} ({:.2}x) | same process: before attach {x:.3}, attached {a:.3} ({:.2}x), after detach {f:.3} ({:.2}x)",
            r / b,
            a / x,
            f / x
        );
    }
}

fn main() {
    let args = heapprofd_tests::bench_args::BenchArgs::parse(
        "usage: heapprofd-attach-bench [--reps N]\n\n\
         Times `heapprofd-rs record --pid` (time to the first sample, the target's pause) and\n\
         the overhead while attached (docs/PERFORMANCE.md, attach). Build the release binaries\n\
         first (`cargo build --release`).",
        &["--reps N"],
    );
    let reps: usize = args.value("--reps", 5);
    // SAFETY: uname fills the zeroed struct.
    let kernel = unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        libc::uname(&mut u);
        std::ffi::CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    };
    println!(
        "heapprofd-attach-bench: {reps} reps, {} CPUs, kernel {kernel}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    latency(reps);
    overhead(reps);
}
