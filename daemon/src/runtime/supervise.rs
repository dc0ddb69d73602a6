//! What `record -- CMD` and `record --pid PID` share while they profile:
//! the async runtime they run on, the signals (SIGINT, SIGTERM stop;
//! SIGUSR1 dumps), the profiling phase (its deadline, continuous dumps and
//! the status line), finishing the daemon, and the end-of-run output.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Interval;

use super::Counters;
use super::server::Daemon;
use super::status::StatusLine;
use super::summary::Summary;
use crate::logger::debug_enabled;

/// Runs `f` to completion on a new single-threaded tokio runtime.
pub(super) fn block_on<F: Future>(f: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let out = rt.block_on(f);
    rt.shutdown_timeout(Duration::from_millis(100));
    Ok(out)
}

/// The signals `record` handles (installed before anything starts, so a
/// signal that arrives early does not kill `record` with its default
/// action while the profiled program runs on).
#[derive(Debug)]
pub(super) struct Signals {
    /// Ctrl-C.
    pub(super) interrupt: Signal,
    /// `kill`.
    pub(super) terminate: Signal,
    /// A dump now.
    dump: Signal,
}

impl Signals {
    /// Installs the handlers.
    pub(super) fn install() -> Result<Signals> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            dump: signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?,
        })
    }
}

/// Why profiling stopped (besides the end of the profiled program).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// `--duration` passed.
    Deadline,
    /// SIGINT.
    Interrupt,
    /// SIGTERM.
    Terminate,
}

/// The profiling phase: until `--duration`, SIGINT or SIGTERM, with a dump
/// on SIGUSR1 and every `--continuous-dump` period, and the status line.
#[derive(Debug)]
pub(super) struct Profiling {
    deadline: Option<tokio::time::Instant>,
    dump_tick: Option<Interval>,
    status_tick: Interval,
    status: StatusLine,
    counters: Arc<Counters>,
    started: Instant,
}

impl Profiling {
    /// Profiling starts now: the deadline and the dump period count from
    /// here; the status line (only if `status`, see [`super::status`])
    /// shows the time since `started`.
    pub(super) fn start(
        duration: Option<Duration>,
        continuous_dump: Option<Duration>,
        counters: Arc<Counters>,
        started: Instant,
        status: bool,
    ) -> Profiling {
        let dump_tick = continuous_dump.map(|p| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + p, p);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        Profiling {
            deadline: duration.map(|d| tokio::time::Instant::now() + d),
            dump_tick,
            status_tick: tokio::time::interval(Duration::from_millis(500)),
            status: StatusLine::new(status),
            counters,
            started,
        }
    }

    /// Waits until profiling should stop; meanwhile dumps when asked and
    /// keeps the status line fresh. Cancel-safe (a `select!` arm).
    pub(super) async fn until_stop(&mut self, signals: &mut Signals, daemon: &Daemon) -> Stop {
        loop {
            tokio::select! {
                _ = sleep_until(self.deadline) => return Stop::Deadline,
                _ = signals.interrupt.recv() => return Stop::Interrupt,
                _ = signals.terminate.recv() => return Stop::Terminate,
                _ = signals.dump.recv() => daemon.dump(),
                _ = tick(&mut self.dump_tick) => daemon.dump(),
                _ = self.status_tick.tick() => self.status.update(&self.counters, self.started),
            }
        }
    }

    /// Removes the status line (before a message, and at the end).
    pub(super) fn clear_status(&mut self) {
        self.status.clear();
    }
}

/// Sleeps until `deadline`, or forever without one (a `select!` arm).
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The next tick of `t`, or never without one (a `select!` arm).
async fn tick(t: &mut Option<Interval>) {
    match t {
        Some(t) => {
            t.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Stops every session, drains, writes the final dump (on a blocking thread).
/// For `record` and `attach`, whose process exits next: the daemon's memory
/// is left to the exit ([`Daemon::finish_before_exit`]).
pub(super) async fn finish(daemon: Daemon) -> Result<Summary> {
    tokio::task::spawn_blocking(move || daemon.finish_before_exit())
        .await
        .context("finishing the profile")?
}

/// The end-of-run summary, once.
pub(super) fn print_summary(s: &Summary, output: &Path) {
    if s.already_printed {
        return;
    }
    log::info!("{}", s.render(output));
}

/// What is printed when a run went well: the summary and, with
/// `HEAPPROFD_DEBUG`, the daemon's own resource usage.
pub(super) fn end_of_run(s: &Summary, output: &Path) {
    print_summary(s, output);
    if debug_enabled() {
        print_self_usage();
    }
}

/// With `HEAPPROFD_DEBUG`: the daemon's own CPU time and peak RSS (all of
/// `record`'s threads, not CMD), for the benchmarks of docs/PERFORMANCE.md.
fn print_self_usage() {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::{TimeVal, TimeValLike};
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return;
    };
    let secs = |t: TimeVal| t.num_microseconds() as f64 * 1e-6;
    log::debug!(
        "self usage: user_s={:.3} sys_s={:.3} maxrss_kib={} minflt={} majflt={} nvcsw={} nivcsw={}",
        secs(ru.user_time()),
        secs(ru.system_time()),
        ru.max_rss(),
        ru.minor_page_faults(),
        ru.major_page_faults(),
        ru.voluntary_context_switches(),
        ru.involuntary_context_switches()
    );
}
