//! `heapprofd-record-bench`: the "record (end to end)" benchmark of
//! docs/PERFORMANCE.md.
//!
//! Runs `tests/programs/client/bench.c` (the peer-profilers reference
//! workload: malloc/free pairs of random sizes 16..4096 at call depth 20; 1
//! thread, and 2 threads) bare, under `heapprofd-rs record` at 512 KiB, 32
//! KiB, 4 KiB and 1 (every allocation), and under heaptrack. Every
//! repetition runs every configuration once, in a rotated order, so they
//! share the machine's noise; the medians are printed with their ratio to
//! the bare run measured in the same run.
//!
//! Measured per run: the wall time of the whole command (start to exit,
//! `record`'s start-up and final dump or heaptrack's interpretation
//! included), the program's own inner time (thread creation to join, printed
//! by bench), the CPU time of the whole command (`wait4`: the profiler, the
//! program and everything they started), and for `record` the daemon's own
//! CPU time and peak RSS (`HEAPPROFD_DEBUG=1` makes `record` print its
//! `getrusage(RUSAGE_SELF)`) with the samples it counted; for heaptrack the
//! peak RSS is that of its biggest process (heaptrack_interpret).
//!
//! Usage: `cargo run --release -p heapprofd-tests --bin heapprofd-record-bench --
//! [--reps N] [--pairs N] [--threads 1,2] [--no-heaptrack]`
//! (`cargo build --release` first: it runs the release `heapprofd-rs`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use heapprofd_tests::client_harness::workspace_root;
use heapprofd_tests::record_harness::release_bins;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const TIMEOUT: Duration = Duration::from_secs(600);

/// One way of running the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Config {
    Bare,
    Record(u64),
    Heaptrack,
}

impl Config {
    fn name(self) -> String {
        match self {
            Config::Bare => "bare".into(),
            Config::Record(1) => "record -i 1".into(),
            Config::Record(i) if i % 1024 == 0 => format!("record -i {}k", i / 1024),
            Config::Record(i) => format!("record -i {i}"),
            Config::Heaptrack => "heaptrack".into(),
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    wall: f64,
    inner: f64,
    program_cpu: f64,
    total_cpu: f64,
    daemon_cpu: Option<f64>,
    rss_kib: Option<u64>,
    samples: Option<u64>,
}

/// Output and resource usage of a finished command.
struct Measured {
    wall: f64,
    cpu: f64,
    maxrss_kib: u64,
    code: i32,
    stdout: String,
    stderr: String,
}

/// Spawns `cmd` and reaps it with `wait4`, so the CPU time and peak RSS
/// include every process it waited for (the profiled program, heaptrack's
/// interpreter). Killed after [`TIMEOUT`].
fn measure(mut cmd: Command) -> Measured {
    let what = format!("{cmd:?}");
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let pid = child.id() as libc::pid_t;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !done.load(Ordering::Relaxed) {
                if t0.elapsed() > TIMEOUT {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid out-parameter; wait4 reaps our child.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        let r = libc::wait4(pid, &mut status, 0, &mut ru);
        assert_eq!(r, pid, "wait4 {what}");
        ru
    };
    let wall = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    std::mem::forget(child); // already reaped
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    Measured {
        wall,
        cpu: secs(ru.ru_utime) + secs(ru.ru_stime),
        maxrss_kib: ru.ru_maxrss as u64,
        code,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// `key=value` (a number) in `text`.
fn field(text: &str, key: &str) -> Option<f64> {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn run_once(bench: &Path, dir: &Path, config: Config, threads: u32, pairs: u64) -> Run {
    let args = [threads.to_string(), pairs.to_string(), "20".to_string()];
    let mut cmd = match config {
        Config::Bare => Command::new(bench),
        Config::Record(interval) => {
            let mut c = Command::new(&release_bins().heapprofd);
            c.arg("record")
                .arg("-i")
                .arg(interval.to_string())
                .arg("-o")
                .arg(dir.join("bench.pftrace"))
                .arg("--")
                .arg(bench)
                .env("HEAPPROFD_DEBUG", "1");
            c
        }
        Config::Heaptrack => {
            let mut c = Command::new("heaptrack");
            c.arg("-o").arg(dir.join("ht")).arg(bench);
            c
        }
    };
    cmd.args(&args);
    let m = measure(cmd);
    assert_eq!(
        m.code,
        0,
        "{} failed:\n{}\n{}",
        config.name(),
        m.stdout,
        m.stderr
    );
    let inner = field(&m.stdout, "inner_ns").expect("bench prints inner_ns") * 1e-9;
    let program_cpu = field(&m.stdout, "cpu_ns").expect("bench prints cpu_ns") * 1e-9;
    let mut run = Run {
        wall: m.wall,
        inner,
        program_cpu,
        total_cpu: m.cpu,
        ..Run::default()
    };
    match config {
        Config::Record(_) => {
            let usage = m
                .stderr
                .lines()
                .find(|l| l.contains("self usage:"))
                .unwrap_or_else(|| panic!("no self usage line from record:\n{}", m.stderr));
            run.daemon_cpu =
                Some(field(usage, "user_s").unwrap_or(0.0) + field(usage, "sys_s").unwrap_or(0.0));
            run.rss_kib = field(usage, "maxrss_kib").map(|v| v as u64);
            // "heapprofd-rs: 1 process, N samples (...)" (N as 1,234,567)
            run.samples = m.stderr.lines().find_map(|l| {
                let rest = l.strip_prefix("heapprofd-rs: ")?;
                let (_, after) = rest.split_once(", ")?;
                after
                    .split_whitespace()
                    .next()?
                    .replace(',', "")
                    .parse()
                    .ok()
            });
            assert!(
                !m.stderr.contains("warning:"),
                "record warned (dropped samples?):\n{}",
                m.stderr
            );
            let _ = std::fs::remove_file(dir.join("bench.pftrace"));
        }
        Config::Heaptrack => {
            run.rss_kib = Some(m.maxrss_kib);
            for e in ["zst", "gz"] {
                let _ = std::fs::remove_file(dir.join(format!("ht.{e}")));
            }
        }
        Config::Bare => {}
    }
    run
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn compile_bench(dir: &Path) -> PathBuf {
    let out = dir.join("bench");
    let src = workspace_root().join("tests/programs/client/bench.c");
    let st = Command::new("gcc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run gcc");
    assert!(st.success(), "compiling {} failed", src.display());
    out
}

fn main() {
    let args = heapprofd_tests::bench_args::BenchArgs::parse(
        "usage: heapprofd-record-bench [--reps N] [--pairs N] [--threads 1,2] [--no-heaptrack]\n\n\
         Times tests/programs/client/bench.c bare, under `heapprofd-rs record` at 512 KiB, 32 KiB,\n\
         4 KiB and 1, and under heaptrack (docs/PERFORMANCE.md, record). Build the release\n\
         binaries first (`cargo build --release`).",
        &["--reps N", "--pairs N", "--threads 1,2", "--no-heaptrack"],
    );
    let reps: usize = args.value("--reps", 5);
    let pairs: u64 = args.value("--pairs", 2_000_000);
    let threads: Vec<u32> = args.list("--threads", vec![1, 2]);
    let heaptrack = !args.flag("--no-heaptrack");
    let dir = std::env::temp_dir().join(format!("heapprofd-record-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bench = compile_bench(&dir);
    let mut configs = vec![
        Config::Bare,
        Config::Record(512 * 1024),
        Config::Record(32 * 1024),
        Config::Record(4096),
        Config::Record(1),
    ];
    if heaptrack {
        configs.push(Config::Heaptrack);
    }
    println!(
        "heapprofd-record-bench: {} ({}), bench.c {pairs} pairs/thread at depth 20, {reps} interleaved repetitions",
        release_bins().heapprofd.display(),
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| format!("loadavg before: {}", l.trim()))
            .unwrap_or_default()
    );
    for &t in &threads {
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); configs.len()];
        for rep in 0..reps {
            for k in 0..configs.len() {
                let i = (k + rep) % configs.len();
                runs[i].push(run_once(&bench, &dir, configs[i], t, pairs));
            }
        }
        let med = |i: usize, f: fn(&Run) -> f64| median(runs[i].iter().map(f).collect());
        let (base_wall, base_inner) = (med(0, |r| r.wall), med(0, |r| r.inner));
        println!("\n{t} thread(s) x {pairs} malloc/free pairs:");
        println!(
            "| config | wall (s) | wall x | inner (s) | inner x | program CPU (s) | total CPU (s) | daemon CPU (s) | samples | daemon CPU s / 1M samples | profiler peak RSS (MiB) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for (i, c) in configs.iter().enumerate() {
            let (wall, inner) = (med(i, |r| r.wall), med(i, |r| r.inner));
            let daemon = runs[i][0]
                .daemon_cpu
                .map(|_| med(i, |r| r.daemon_cpu.unwrap_or(0.0)));
            let samples = runs[i][0]
                .samples
                .map(|_| med(i, |r| r.samples.unwrap_or(0) as f64));
            let rss = runs[i][0]
                .rss_kib
                .map(|_| med(i, |r| r.rss_kib.unwrap_or(0) as f64) / 1024.0);
            let per_m = match (daemon, samples) {
                (Some(d), Some(s)) if s > 0.0 => format!("{:.2}", d / s * 1e6),
                _ => "-".into(),
            };
            let opt =
                |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
            println!(
                "| {} | {wall:.3} | {:.2} | {inner:.3} | {:.2} | {:.3} | {:.3} | {} | {} | {per_m} | {} |",
                c.name(),
                wall / base_wall,
                inner / base_inner,
                med(i, |r| r.program_cpu),
                med(i, |r| r.total_cpu),
                opt(daemon, 3),
                opt(samples, 0),
                opt(rss, 1),
            );
        }
        let walls = |i: usize| {
            runs[i]
                .iter()
                .map(|r| format!("{:.2}", r.wall))
                .collect::<Vec<_>>()
                .join(" ")
        };
        for (i, c) in configs.iter().enumerate() {
            println!("  walls {}: {}", c.name(), walls(i));
        }
    }
    println!(
        "\n{}",
        std::fs::read_to_string("/proc/loadavg")
            .map(|l| format!("loadavg after: {}", l.trim()))
            .unwrap_or_default()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
