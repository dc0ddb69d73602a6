//! `heapprofd-rs record`: run a command with the client preloaded, profile
//! it (and the programs it starts), and write a trace.
//!
//! Lifecycle: open the output file (so a bad path fails before anything
//! runs), start the daemon on a private socket, spawn CMD with `LD_PRELOAD`,
//! `HEAPPROFD_SOCKET` and `HEAPPROFD_BLOCKING_INIT=1` (profiling starts at its
//! first allocation), then wait for whichever comes first: CMD exits,
//! `--duration` passes, or Ctrl-C / SIGTERM. Every sample already in a ring
//! buffer is drained and counted before the final dump. CMD's stdin, stdout
//! and stderr are its own, and `record` exits with CMD's exit code (128 +
//! the signal if CMD was killed by one, as a shell reports it; 130 or 143
//! if Ctrl-C or SIGTERM stopped profiling while CMD kept running). If CMD
//! cannot be started, no trace file is left behind.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use heapprofd_proto::wire::ClientConfig;

use super::bookkeeper::BookkeeperOptions;
use super::server::{Daemon, DaemonOptions};
use super::summary::Summary;
use super::{Counters, Counters as C};
use heapprofd_report::human_bytes;

use crate::cli::{UsageError, parse_duration, parse_size};

/// Options of `heapprofd-rs record`.
#[derive(Debug, Clone, Args)]
#[command(after_help = "\
EXAMPLES:
  heapprofd-rs record -- ./my-server --port 8080
  heapprofd-rs record -i 1 -o every-alloc.pftrace -- ./unit-tests
  heapprofd-rs record -i 512k --duration 30s --continuous-dump 5s -- ./batch-job

Open the trace in https://ui.perfetto.dev, or run `heapprofd-rs report TRACE`.")]
pub struct RecordArgs {
    /// Mean bytes between samples (Poisson sampling); 1 records every
    /// allocation. Accepts units: 4096, 32k, 1MiB.
    #[arg(short = 'i', long, default_value = "4096", value_parser = parse_interval)]
    pub interval: u64,

    /// Where to write the trace [default: heapprofd-<cmd>-<pid>-<time>.pftrace].
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Stop profiling after this long (500ms, 30s, 2m). CMD keeps running;
    /// `record` waits for it to exit.
    #[arg(short = 'd', long, value_parser = parse_duration)]
    pub duration: Option<Duration>,

    /// Also dump every this often (1s, 500ms), so the trace shows the heap over time.
    #[arg(short = 'c', long, value_name = "PERIOD", value_parser = parse_duration)]
    pub continuous_dump: Option<Duration>,

    /// Report the heap at the moment of its peak (of live sampled bytes)
    /// instead of at the end.
    #[arg(long, conflicts_with = "continuous_dump")]
    pub dump_at_max: bool,

    /// Size of each client's ring buffer (a power of two: 8M, 64MiB).
    #[arg(long, default_value = "8MiB", value_parser = parse_shmem_size)]
    pub shmem_size: u64,

    /// When a ring buffer is full, the program waits up to TIMEOUT for the
    /// daemon instead of dropping the sample (0 = wait forever). This is the
    /// default, with 5s; after a timeout the process's profile ends, flagged.
    #[arg(long, value_name = "TIMEOUT", num_args = 0..=1, default_missing_value = "0",
          value_parser = parse_duration, conflicts_with = "no_block_client")]
    pub block_client: Option<Duration>,

    /// Drop samples (counted, and flagged in the trace) when a ring buffer
    /// is full, instead of slowing the program down.
    #[arg(long)]
    pub no_block_client: bool,

    /// Do not symbolize: the trace keeps build ids and addresses only, for
    /// symbolization later on another machine.
    #[arg(long)]
    pub no_symbolize: bool,

    /// The client library to preload [default: libheapprofd_client.so next to this binary].
    #[arg(long, value_name = "PATH")]
    pub client_lib: Option<PathBuf>,

    /// Unwinding threads [default: number of CPUs, at most 4].
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,

    /// Sampler seed, for reproducible sampling (testing).
    #[arg(long, hide = true, default_value = "0")]
    pub seed: u64,

    /// Profile a running process instead of starting one.
    #[arg(short = 'p', long, value_name = "PID", conflicts_with = "command")]
    pub pid: Option<u32>,

    /// The command to profile, after `--`.
    #[arg(last = true, value_name = "CMD", required_unless_present = "pid")]
    pub command: Vec<String>,
}

fn parse_shmem_size(s: &str) -> Result<u64, String> {
    let n = parse_size(s)?;
    heapprofd_shmem::check_data_size(n).map_err(|e| e.to_string())?;
    Ok(n)
}

fn parse_interval(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("the sampling interval must be at least 1 byte (1 = every allocation)".into()),
        n => Ok(n),
    }
}

/// Creates the trace file and the daemon's options from the arguments
/// shared by `record -- CMD` and `record --pid`. A trace path that cannot be
/// created is a bad argument (exit 2), found before anything runs.
pub(super) fn daemon_options(
    args: &RecordArgs,
    socket: PathBuf,
    output: &Path,
) -> Result<DaemonOptions> {
    let file = std::fs::File::create(output).map_err(|e| {
        UsageError(format!(
            "cannot create the trace file {}: {e}; choose another path with -o",
            output.display()
        ))
    })?;
    let mut client = ClientConfig::new(args.interval, args.shmem_size);
    client.seed = args.seed;
    if !args.no_block_client {
        client.flags |= ClientConfig::FLAG_BLOCK_CLIENT;
        client.block_timeout_us = args
            .block_client
            .unwrap_or(Duration::from_secs(5))
            .as_micros() as u64;
    }
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 4)
    });
    Ok(DaemonOptions {
        socket,
        client,
        workers,
        symbolize: !args.no_symbolize,
        book: BookkeeperOptions {
            output: file,
            output_path: output.to_path_buf(),
            interval: args.interval,
            dump_at_max: args.dump_at_max,
        },
    })
}

/// Runs `record`; returns the exit code to exit with.
pub fn run(args: RecordArgs) -> Result<i32> {
    if args.pid.is_some() {
        return super::attach::run(args);
    }
    let client_lib = find_client_lib(args.client_lib.as_deref())?;
    let program = args.command[0].clone();
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&program));
    let socket = std::env::temp_dir().join(format!("heapprofd-rs-{}.sock", std::process::id()));
    let options = daemon_options(&args, socket, &output)?;
    let counters = Arc::new(Counters::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut cmd_started = false;
    let outcome = rt.block_on(supervise(
        args,
        options,
        client_lib,
        Arc::clone(&counters),
        &mut cmd_started,
    ));
    rt.shutdown_timeout(Duration::from_millis(100));
    match outcome {
        Ok((summary, code)) => {
            print_summary(&summary, &output);
            if std::env::var_os("HEAPPROFD_DEBUG").is_some() {
                print_self_usage();
            }
            Ok(code)
        }
        Err(e) => {
            // CMD never ran (not found, not executable): the file only holds
            // the trace header, not worth keeping. Once it ran, whatever was
            // written is kept (the error says how much is valid).
            let empty = std::fs::metadata(&output).is_ok_and(|m| m.len() == 0);
            if !cmd_started || empty {
                let _ = std::fs::remove_file(&output);
            }
            Err(e)
        }
    }
}

/// Exit code of `record` when CMD's own is unknown because profiling was
/// stopped by a signal while CMD kept running: 128 + the signal, as a shell
/// reports a job it interrupted.
fn interrupted_code(sig: i32) -> i32 {
    128 + sig
}

/// Runs CMD under the daemon until it exits or profiling is stopped;
/// returns the summary and the exit code for `record`. `started` is set once
/// CMD has been spawned.
async fn supervise(
    args: RecordArgs,
    options: DaemonOptions,
    client_lib: PathBuf,
    counters: Arc<Counters>,
    cmd_started: &mut bool,
) -> Result<(Summary, i32)> {
    use tokio::signal::unix::{SignalKind, signal};

    // Handlers first: a signal that arrives as soon as CMD runs must not
    // kill `record` with its default action.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigusr1 =
        signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    let mut daemon = Daemon::start(options, Arc::clone(&counters))?;
    daemon.serve();

    let mut preload = client_lib.into_os_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut child = tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env(heapprofd_proto::socket::SOCKET_ENV, daemon.socket_path())
        .env("HEAPPROFD_BLOCKING_INIT", "1")
        .spawn()
        .with_context(|| format!("cannot run `{}`", args.command[0]))?;
    *cmd_started = true;

    let status_line = std::io::stderr().is_terminal();
    let mut status_tick = tokio::time::interval(Duration::from_millis(500));
    let mut dump_tick = args.continuous_dump.map(|p| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + p, p);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let started = Instant::now();
    let mut status = StatusLine::new(status_line);

    let mut exit: Option<ExitStatus> = None;
    let mut interrupted = 0;
    // The signal that stopped profiling while CMD kept running.
    let mut stopped_by: Option<i32> = None;
    loop {
        tokio::select! {
            r = child.wait() => {
                exit = Some(r.context("waiting for the profiled command")?);
                break;
            }
            _ = sleep_until(deadline) => {
                status.clear();
                eprintln!("heapprofd-rs: {} passed, profiling stopped; `{}` keeps running",
                    fmt_duration(args.duration.unwrap_or_default()), args.command[0]);
                break;
            }
            _ = sigint.recv() => {
                interrupted += 1;
                // CMD got the same Ctrl-C from the terminal; give it a moment
                // to exit on its own, then stop profiling anyway.
                if interrupted >= 2 {
                    stopped_by = Some(libc::SIGINT);
                    break;
                }
                tokio::select! {
                    r = child.wait() => { exit = Some(r.context("waiting for the profiled command")?); break; }
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    _ = sigint.recv() => {}
                }
                status.clear();
                eprintln!("heapprofd-rs: interrupted; writing the trace");
                stopped_by = Some(libc::SIGINT);
                break;
            }
            _ = sigterm.recv() => { stopped_by = Some(libc::SIGTERM); break; }
            _ = sigusr1.recv() => { daemon.dump(); }
            _ = tick(&mut dump_tick) => { daemon.dump(); }
            _ = status_tick.tick() => { status.update(&counters, started); }
        }
    }
    status.clear();
    let summary = tokio::task::spawn_blocking(move || daemon.finish())
        .await
        .context("finishing the profile")??;
    if exit.is_none() && interrupted == 0 && args.duration.is_some() {
        // Profiling is over but CMD still runs: keep passing its exit code through.
        print_summary(&summary, &summary.output_path);
        eprintln!(
            "heapprofd-rs: waiting for `{}` to exit (Ctrl-C to stop waiting)",
            args.command[0]
        );
        tokio::select! {
            r = child.wait() => exit = Some(r.context("waiting for the profiled command")?),
            _ = sigint.recv() => stopped_by = Some(libc::SIGINT),
            _ = sigterm.recv() => stopped_by = Some(libc::SIGTERM),
        }
        let code = exit.map_or_else(|| interrupted_code(stopped_by.unwrap_or(0)), exit_code);
        return Ok((
            Summary {
                already_printed: true,
                ..summary
            },
            code,
        ));
    }
    // CMD's own exit code; if it still runs (it ignored Ctrl-C), the code of
    // the signal that stopped profiling.
    let code = exit.map_or_else(|| interrupted_code(stopped_by.unwrap_or(0)), exit_code);
    Ok((summary, code))
}

/// Sleeps until `deadline`, or forever without one (a `select!` arm).
pub(super) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The next tick of `t`, or never without one (a `select!` arm).
pub(super) async fn tick(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The one-line live status on a terminal (stderr); nothing when not a terminal.
pub(super) struct StatusLine {
    enabled: bool,
    shown: bool,
    last_samples: u64,
    last_time: Option<Instant>,
}

impl StatusLine {
    pub(super) fn new(enabled: bool) -> Self {
        StatusLine {
            enabled,
            shown: false,
            last_samples: 0,
            last_time: None,
        }
    }

    pub(super) fn update(&mut self, c: &Counters, started: Instant) {
        if !self.enabled {
            return;
        }
        let samples = C::get(&c.samples);
        let now = Instant::now();
        let rate = match self.last_time {
            Some(t) => {
                (samples - self.last_samples) as f64 / now.duration_since(t).as_secs_f64().max(1e-3)
            }
            None => 0.0,
        };
        self.last_samples = samples;
        self.last_time = Some(now);
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K[heapprofd-rs {:>5.1}s] {} processes | {:.0} samples/s | live sampled {} | unwind errors {} | dropped {}",
            started.elapsed().as_secs_f64(),
            C::get(&c.sessions),
            rate,
            human_bytes(C::get(&c.live_bytes)),
            C::get(&c.unwind_errors),
            C::get(&c.dropped),
        );
        let _ = err.flush();
        self.shown = true;
    }

    pub(super) fn clear(&mut self) {
        if self.shown {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
            self.shown = false;
        }
    }
}

pub(super) fn print_summary(s: &Summary, output: &Path) {
    if s.already_printed {
        return;
    }
    eprintln!("{}", s.render(output));
}

/// With `HEAPPROFD_DEBUG`: the daemon's own CPU time and peak RSS (all of
/// `record`'s threads, not CMD), for the benchmarks of docs/PERFORMANCE.md.
pub(super) fn print_self_usage() {
    // SAFETY: getrusage fills the zeroed struct we pass.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    eprintln!(
        "heapprofd-rs: self usage: user_s={:.3} sys_s={:.3} maxrss_kib={}",
        secs(ru.ru_utime),
        secs(ru.ru_stime),
        ru.ru_maxrss
    );
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

fn fmt_duration(d: Duration) -> String {
    if d.as_secs() >= 1 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Finds the client library: `--client-lib`, else next to this executable.
pub(super) fn find_client_lib(explicit: Option<&Path>) -> Result<PathBuf> {
    const NAME: &str = "libheapprofd_client.so";
    let candidate = match explicit {
        Some(p) => p.to_path_buf(),
        None => {
            let exe = std::env::current_exe().context("finding this executable's directory")?;
            exe.parent()
                .map(|d| d.join(NAME))
                .unwrap_or_else(|| PathBuf::from(NAME))
        }
    };
    if !candidate.is_file() {
        bail!(
            "client library {} not found; build it with `cargo build --release` \
             (it is placed next to heapprofd-rs) or pass --client-lib PATH",
            candidate.display()
        );
    }
    // LD_PRELOAD needs an absolute path once CMD changes directory.
    std::fs::canonicalize(&candidate).with_context(|| format!("resolving {}", candidate.display()))
}

/// `heapprofd-<program>-<pid>-<YYYYmmdd-HHMMSS>.pftrace` in the current directory.
pub(super) fn default_output(program: &str) -> PathBuf {
    let name = Path::new(program)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("cmd");
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    PathBuf::from(format!(
        "heapprofd-{name}-{}-{}.pftrace",
        std::process::id(),
        local_timestamp()
    ))
}

fn local_timestamp() -> String {
    // SAFETY: time/localtime_r write into the zeroed struct we pass.
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return t.to_string();
        }
        format!(
            "{:04}{:02}{:02}-{:02}{:02}{:02}",
            tm.tm_year + 1900,
            tm.tm_mon + 1,
            tm.tm_mday,
            tm.tm_hour,
            tm.tm_min,
            tm.tm_sec
        )
    }
}
