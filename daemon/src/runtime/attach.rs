//! `heapprofd-rs record --pid PID`: profile a process that is already
//! running, and leave it as it was.
//!
//! 1. [`inject::probe`] checks the target (and refuses, touching nothing,
//!    what cannot work); the output file is created.
//! 2. The daemon starts on `/tmp/heapprofd-rs-<euid>/<our pid>.sock` (the
//!    runtime directory of the target's effective user, [`super::rundir`]),
//!    the path the client derives from its user and the id it is given.
//! 3. Activation. A client that is loaded and interposing (the program was
//!    started with it preloaded) and catches signal 36 is woken with
//!    `sigqueue(PID, 36, our pid)`: no ptrace needed. Otherwise the client
//!    is loaded with ptrace (unless already loaded) and its attach entry
//!    called ([`inject::inject`]); it patches the program's GOTs for the
//!    session. A profile of threads (`--cpu-time`, `--event`) uses ptrace
//!    for a wakeable client too (the signal would wait for the program's
//!    next allocation), and its client always gets a thread of its own,
//!    even in a single-threaded process (no synchronous session: its scans
//!    arm the threads started later). `HEAPPROFD_ATTACH=signal|ptrace` forces one way;
//!    `HEAPPROFD_ATTACH_TIMEOUT_MS` changes how long a thread at a safe
//!    point is looked for (10 s).
//! 4. Profiling runs until `--duration`, Ctrl-C/SIGTERM, or the target's
//!    exit (a pidfd). Then the daemon stops the session like `record` does:
//!    the client sees its socket close, tears down, restores every GOT entry
//!    it patched, and its thread exits; we wait (briefly) for that thread to
//!    be gone and say so.
//!
//! With `HEAPPROFD_DEBUG` set, the timings of the attach are printed:
//! preparation, how long the hijacked thread was stopped, time to the
//! connection and to the first sample (docs/PERFORMANCE.md, attach).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use heapprofd_inject::{self as inject, InjectOptions, InjectReport, Target};
use tokio::io::unix::AsyncFd;

use super::handshake::pidfd_open;
use super::rundir::RuntimeDir;
use super::server::{Daemon, DaemonOptions};
use super::setup::{daemon_options, default_output, find_client_lib};
use super::summary::Summary;
use super::supervise::{Profiling, Signals, block_on, end_of_run, finish};
use super::{Counters, Counters as C};
use crate::cli::record_args::RecordArgs;
use crate::env::{AttachChoice, Env};
use crate::logger::debug_enabled;

/// How long a started client may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to look for a thread at a safe point.
const SAFE_POINT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `dlopen` and the attach entry may run in the target.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long to wait for the client's thread to exit after the session.
const DETACH_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Signal,
    Ptrace,
}

/// How to start the client. A preloaded one that catches the activation
/// signal is woken with it; but the signal only flags the start for the
/// program's next allocation, so a profile of threads (`--cpu-time`,
/// `--event`), whose target may not allocate for a long time, activates
/// it through ptrace (falling back to the signal if that fails).
fn choose_method(t: &Target, choice: &AttachChoice, samples_threads: bool) -> Result<Method> {
    match choice {
        AttachChoice::Signal => {
            if !t.client_loaded() {
                bail!(
                    "HEAPPROFD_ATTACH=signal: process {} does not have {} loaded",
                    t.pid,
                    inject::CLIENT_FILE_NAME
                );
            }
            Ok(Method::Signal)
        }
        AttachChoice::Ptrace => Ok(Method::Ptrace),
        AttachChoice::Invalid(other) => {
            bail!("HEAPPROFD_ATTACH must be `signal` or `ptrace`, not `{other}`")
        }
        AttachChoice::Auto => Ok(if wakes_by_signal(t) && !samples_threads {
            Method::Signal
        } else {
            Method::Ptrace
        }),
    }
}

/// Whether the profile samples threads (`--cpu-time`, `--event`): the
/// client is then activated at once, and always gets its thread (which
/// arms the threads the program starts later), never a synchronous
/// session.
fn samples_threads(args: &RecordArgs) -> bool {
    args.cpu_time.is_some() || args.event.is_some()
}

/// Whether the target's client can be woken with the signal.
fn wakes_by_signal(t: &Target) -> bool {
    t.client_loaded() && t.preloaded && t.catches_signal
}

/// Runs `record --pid`; returns the exit code.
pub fn run(args: RecordArgs, env: &Env) -> Result<i32> {
    // The attach timings (HEAPPROFD_DEBUG) count from here.
    let started = Instant::now();
    let pid = *args.pid.first().context("record --pid without a pid")?;
    let target = inject::probe(pid)?;
    let method = choose_method(&target, &env.attach, samples_threads(&args))?;
    let signal_fallback = matches!(env.attach, AttachChoice::Auto) && wakes_by_signal(&target);
    let client_lib = find_client_lib(args.client_lib.as_deref())?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&format!("{}-{pid}", target.comm)));
    let me = std::process::id();
    // The client derives this path from its effective user and the id (our
    // pid) it is given.
    let dir = RuntimeDir::for_user(target.euid, target.egid)?;
    dir.remove_stale();
    let socket =
        PathBuf::from(heapprofd_proto::attach::socket_path_for_id(target.euid, me).as_str());
    let options = daemon_options(&args, socket, &output)?;
    let attach = Attach {
        started,
        args,
        target,
        method,
        signal_fallback,
        client_lib,
        safe_point_timeout: env.attach_timeout.unwrap_or(SAFE_POINT_TIMEOUT),
        test_stall: env.attach_test_stall.clone(),
    };
    match block_on(attach.supervise(options))? {
        Ok(summary) => {
            end_of_run(&summary, &output);
            Ok(0)
        }
        Err(e) => {
            // Nothing was profiled: no trace worth keeping.
            let _ = std::fs::remove_file(&output);
            Err(e)
        }
    }
}

/// Becomes readable when the process behind the pidfd exits.
async fn exited(pidfd: &Option<AsyncFd<OwnedFd>>) {
    match pidfd {
        Some(fd) => {
            let _ = fd.readable().await;
        }
        None => std::future::pending().await,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// One `record --pid`.
struct Attach {
    started: Instant,
    args: RecordArgs,
    target: Target,
    method: Method,
    /// Auto chose ptrace for a client the signal can wake: wake it with the
    /// signal if ptrace fails.
    signal_fallback: bool,
    client_lib: PathBuf,
    safe_point_timeout: Duration,
    test_stall: Option<String>,
}

impl Attach {
    async fn supervise(self, options: DaemonOptions) -> Result<Summary> {
        let pid = self.target.pid;
        let comm = self.target.comm.clone();
        // Handlers first: Ctrl-C during the injection must not kill us while
        // the target runs our call (it would crash without us).
        let mut signals = Signals::install()?;
        let counters = Arc::new(Counters::default());
        let mut daemon = Daemon::start(options, Arc::clone(&counters))?;
        if self.target.euid != nix::unistd::geteuid().as_raw() {
            daemon.allow_user(self.target.euid, self.target.egid)?;
        }
        daemon.serve();
        daemon.prepare_ring();
        let pidfd = pidfd_open(pid).and_then(|fd| {
            // SAFETY: the AsyncFd owns the pidfd for its whole life.
            unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
        });
        let opts = InjectOptions {
            lib: self.client_lib.clone(),
            id: std::process::id(),
            safe_point_timeout: self.safe_point_timeout,
            call_timeout: CALL_TIMEOUT,
            module_cache: daemon.module_cache(),
            samples_threads: samples_threads(&self.args),
            test_stall: self.test_stall.clone(),
        };
        let (report, method) = match self.activate(&opts).await {
            Ok(r) => r,
            Err(e) => {
                let _ = finish(daemon).await;
                return Err(e);
            }
        };

        // Wait for the client to connect.
        let connect_deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        let mut poll = tokio::time::interval(Duration::from_millis(2));
        let mut warned = false;
        let mut stop_early = false;
        // The client's first byte says its hooks record: from then on nothing
        // the target allocates is missed.
        while C::get(&counters.confirmed) == 0 {
            tokio::select! {
                _ = poll.tick() => {}
                _ = exited(&pidfd) => {
                    let _ = finish(daemon).await;
                    bail!("process {pid} ({comm}) exited before the profiler connected");
                }
                _ = signals.interrupt.recv() => { stop_early = true; break; }
                _ = signals.terminate.recv() => { stop_early = true; break; }
                _ = tokio::time::sleep_until(connect_deadline) => {
                    if method == Method::Ptrace {
                        let _ = finish(daemon).await;
                        bail!(
                            "the profiler loaded into process {pid} did not connect within {}s \
                             (its messages, if any, are on the target's stderr)",
                            CONNECT_TIMEOUT.as_secs()
                        );
                    }
                    if !warned {
                        warned = true;
                        log::info!(
                            "no connection yet: a preloaded profiler starts at the \
                             target's next allocation (or the program handles signal {} itself; \
                             HEAPPROFD_ATTACH=ptrace activates it without the signal)",
                            inject::ACTIVATION_SIGNAL
                        );
                    }
                }
            }
        }
        let connected = self.started.elapsed();

        let mut first_sample: Option<Duration> = None;
        let mut target_exited = false;
        if !stop_early {
            let how_long = self.args.duration.map_or("until Ctrl-C".to_string(), |d| {
                format!("for {:.1}s", d.as_secs_f64())
            });
            log::info!("profiling process {pid} ({comm}) {how_long}");
            let mut profiling = Profiling::start(
                self.args.duration,
                self.args.continuous_dump,
                Arc::clone(&counters),
                self.started,
                super::status::status_line_allowed(
                    std::io::IsTerminal::is_terminal(&std::io::stderr()),
                    super::status::terminal_shared_with(pid),
                ),
            );
            loop {
                if first_sample.is_none() && C::get(&counters.samples) > 0 {
                    first_sample = Some(self.started.elapsed());
                }
                tokio::select! {
                    _ = profiling.until_stop(&mut signals, &daemon) => break,
                    _ = exited(&pidfd) => { target_exited = true; break; }
                    // Only to time the first sample (docs/PERFORMANCE.md).
                    _ = poll.tick(), if first_sample.is_none() => {}
                }
            }
            profiling.clear_status();
        }
        // A synchronous session (single-threaded target, no client thread) is
        // ended by a call into the target, before the daemon stops reading.
        if report.as_ref().is_some_and(|r| r.sync) && !target_exited {
            end_sync_session(pid, opts).await?;
        }
        let summary = finish(daemon).await?;
        log::debug!(
            "attach: connected after {}, first sample after {}",
            ms(connected),
            first_sample.map_or("-".to_string(), ms)
        );
        if target_exited {
            log::info!("process {pid} ({comm}) exited");
        } else {
            self.report_detach().await;
        }
        Ok(summary)
    }

    /// Wakes the client with the signal, or loads it with ptrace; says how
    /// (and which of the two it was).
    async fn activate(&self, opts: &InjectOptions) -> Result<(Option<InjectReport>, Method)> {
        let (pid, comm) = (self.target.pid, &self.target.comm);
        let mut method = self.method;
        let report = match self.method {
            Method::Signal => {
                inject::signal_activate(pid, std::process::id())?;
                None
            }
            Method::Ptrace => {
                let opts = opts.clone();
                let t = self.target.clone();
                let r = tokio::task::spawn_blocking(move || inject::inject(&t, &opts))
                    .await
                    .context("the injection thread failed")?;
                match r {
                    Ok(r) => Some(r),
                    Err(e) if self.signal_fallback => {
                        log::info!(
                            "could not activate the preloaded profiler of process {pid} \
                             ({comm}) with ptrace ({e:#}); waking it with the signal \
                             instead: it starts at the target's next allocation"
                        );
                        inject::signal_activate(pid, std::process::id())?;
                        method = Method::Signal;
                        None
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        };
        let activated = self.started.elapsed();
        match &report {
            Some(r) => {
                log::info!(
                    "{} the profiler in process {pid} ({comm}) through thread {}, \
                     which was paused {}",
                    if r.loaded { "loaded" } else { "activated" },
                    r.tid,
                    ms(r.pause)
                );
                log::debug!(
                    "attach: prepare {}, pause {} (thread {}, {} thread(s) \
                     checked), activated after {}",
                    ms(r.prepare),
                    ms(r.pause),
                    r.tid,
                    r.attempts,
                    ms(activated)
                );
                if debug_enabled() {
                    let steps: Vec<String> = r
                        .steps
                        .iter()
                        .map(|(what, d)| format!("{what} {}", ms(*d)))
                        .collect();
                    log::debug!("attach: pause: {}", steps.join(", "));
                    for (tid, why) in &r.refused {
                        log::debug!("attach: thread {tid} refused: {why}");
                    }
                }
            }
            None => log::info!(
                "woke the preloaded profiler of process {pid} ({comm}) with signal {}",
                inject::ACTIVATION_SIGNAL
            ),
        }
        Ok((report, method))
    }

    /// Waits (briefly) for the client's thread to be gone, and says so.
    async fn report_detach(&self) {
        let (pid, comm) = (self.target.pid, &self.target.comm);
        let t = Instant::now();
        while inject::client_thread(pid).is_some() && t.elapsed() < DETACH_WAIT {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        match inject::client_thread(pid) {
            None if self.target.preloaded => log::info!(
                "detached from process {pid} ({comm}): its preloaded profiler is \
                 dormant again"
            ),
            None => log::info!(
                "detached from process {pid} ({comm}): its allocations no longer \
                 go through the profiler"
            ),
            Some(tid) => log::warn!(
                "warning: the profiler's thread {tid} in process {pid} is still \
                 running {}s after the end of the session",
                DETACH_WAIT.as_secs()
            ),
        }
    }
}

/// Ends a synchronous session with a call into the target (its detach
/// entry); a failure is a warning (the client goes dormant by itself).
async fn end_sync_session(pid: u32, opts: InjectOptions) -> Result<()> {
    let ended = tokio::task::spawn_blocking(move || {
        let t = inject::probe_loaded(pid)?;
        inject::detach(&t, &opts).map_err(anyhow::Error::from)
    })
    .await
    .context("the detach thread failed")?;
    match ended {
        Ok(r) => log::debug!("attach: detach paused thread {} for {}", r.tid, ms(r.pause)),
        Err(e) => log::warn!(
            "warning: could not end the session inside process {pid} \
             ({e:#}); its profiler goes dormant when it sees the daemon stop"
        ),
    }
    Ok(())
}
