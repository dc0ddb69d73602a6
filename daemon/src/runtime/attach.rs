//! `heapprofd-rs record --pid PID`: profile a process that is already
//! running, and leave it as it was.
//!
//! 1. [`inject::probe`] checks the target (and refuses, touching nothing,
//!    what cannot work); the output file is created.
//! 2. The daemon starts on `/tmp/heapprofd-rs-<our pid>.sock`, the path the
//!    client derives from the id it is given.
//! 3. Activation. A client that is loaded and interposing (the program was
//!    started with it preloaded) and catches signal 36 is woken with
//!    `sigqueue(PID, 36, our pid)`: no ptrace needed. Otherwise the client
//!    is loaded with ptrace (unless already loaded) and its attach entry
//!    called ([`inject::inject`]); it patches the program's GOTs for the
//!    session. `HEAPPROFD_ATTACH=signal|ptrace` forces one way;
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

use std::io::IsTerminal;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::unix::AsyncFd;

use super::handshake::pidfd_open;
use super::record::{
    RecordArgs, StatusLine, daemon_options, default_output, find_client_lib, print_self_usage,
    print_summary, sleep_until, tick,
};
use super::server::{Daemon, DaemonOptions};
use super::summary::Summary;
use super::{Counters, Counters as C};
use heapprofd_inject::{self as inject, InjectOptions, Target};

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

fn choose_method(t: &Target) -> Result<Method> {
    let forced = std::env::var("HEAPPROFD_ATTACH").ok();
    match forced.as_deref() {
        Some("signal") => {
            if !t.client_loaded() {
                bail!(
                    "HEAPPROFD_ATTACH=signal: process {} does not have {} loaded",
                    t.pid,
                    inject::CLIENT_FILE_NAME
                );
            }
            Ok(Method::Signal)
        }
        Some("ptrace") => Ok(Method::Ptrace),
        Some(other) if !other.is_empty() => {
            bail!("HEAPPROFD_ATTACH must be `signal` or `ptrace`, not `{other}`")
        }
        _ => Ok(if t.client_loaded() && t.preloaded && t.catches_signal {
            Method::Signal
        } else {
            Method::Ptrace
        }),
    }
}

/// Runs `record --pid`; returns the exit code.
pub fn run(args: RecordArgs) -> Result<i32> {
    // The attach timings (HEAPPROFD_DEBUG) count from here.
    let started = Instant::now();
    let pid = args.pid.context("record --pid without a pid")?;
    let target = inject::probe(pid)?;
    let method = choose_method(&target)?;
    let client_lib = find_client_lib(args.client_lib.as_deref())?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&format!("{}-{pid}", target.comm)));
    let me = std::process::id();
    // The client derives this path from the id (our pid) it is given.
    let socket = PathBuf::from(format!("/tmp/heapprofd-rs-{me}.sock"));
    let options = daemon_options(&args, socket, &output)?;
    let counters = Arc::new(Counters::default());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let outcome = rt.block_on(supervise(
        started,
        args,
        target,
        method,
        options,
        client_lib,
        Arc::clone(&counters),
    ));
    rt.shutdown_timeout(Duration::from_millis(100));
    match outcome {
        Ok(summary) => {
            print_summary(&summary, &output);
            if std::env::var_os("HEAPPROFD_DEBUG").is_some() {
                print_self_usage();
            }
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

async fn supervise(
    started: Instant,
    args: RecordArgs,
    target: Target,
    method: Method,
    options: DaemonOptions,
    client_lib: PathBuf,
    counters: Arc<Counters>,
) -> Result<Summary> {
    use tokio::signal::unix::{SignalKind, signal};

    let debug = std::env::var_os("HEAPPROFD_DEBUG").is_some();
    let pid = target.pid;
    let comm = target.comm.clone();
    let target_preloaded = target.preloaded;
    // Handlers first: Ctrl-C during the injection must not kill us while
    // the target runs our call (it would crash without us).
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigusr1 =
        signal(SignalKind::user_defined1()).context("installing the SIGUSR1 handler")?;
    let mut daemon = Daemon::start(options, Arc::clone(&counters))?;
    // SAFETY: geteuid has no preconditions.
    if target.uid != unsafe { libc::geteuid() } {
        daemon.allow_user(target.uid, target.gid)?;
    }
    daemon.serve();
    let pidfd = pidfd_open(pid).and_then(|fd| {
        // SAFETY: the AsyncFd owns the pidfd for its whole life.
        unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
    });

    let opts = InjectOptions {
        lib: client_lib,
        id: std::process::id(),
        safe_point_timeout: std::env::var("HEAPPROFD_ATTACH_TIMEOUT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(SAFE_POINT_TIMEOUT, Duration::from_millis),
        call_timeout: CALL_TIMEOUT,
        module_cache: daemon.module_cache(),
    };
    let activation = match method {
        Method::Signal => inject::signal_activate(pid, std::process::id()).map(|()| None),
        Method::Ptrace => {
            let opts = opts.clone();
            let t = target.clone();
            tokio::task::spawn_blocking(move || inject::inject(&t, &opts))
                .await
                .context("the injection thread failed")?
                .map(Some)
        }
    };
    let report = match activation {
        Ok(r) => r,
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || daemon.finish()).await;
            return Err(e.into());
        }
    };
    let activated = started.elapsed();
    match &report {
        Some(r) => {
            eprintln!(
                "heapprofd-rs: {} the profiler in process {pid} ({comm}) through thread {}, \
                 which was paused {}",
                if r.loaded { "loaded" } else { "activated" },
                r.tid,
                ms(r.pause)
            );
            if debug {
                eprintln!(
                    "heapprofd-rs: attach: prepare {}, pause {} (thread {}, {} thread(s) \
                     checked), activated after {}",
                    ms(r.prepare),
                    ms(r.pause),
                    r.tid,
                    r.attempts,
                    ms(activated)
                );
                let steps: Vec<String> = r
                    .steps
                    .iter()
                    .map(|(what, d)| format!("{what} {}", ms(*d)))
                    .collect();
                eprintln!("heapprofd-rs: attach: pause: {}", steps.join(", "));
                for (tid, why) in &r.refused {
                    eprintln!("heapprofd-rs: attach: thread {tid} refused: {why}");
                }
            }
        }
        None => eprintln!(
            "heapprofd-rs: woke the preloaded profiler of process {pid} ({comm}) with signal {}",
            inject::ACTIVATION_SIGNAL
        ),
    }

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
                let _ = tokio::task::spawn_blocking(move || daemon.finish()).await;
                bail!("process {pid} ({comm}) exited before the profiler connected");
            }
            _ = sigint.recv() => { stop_early = true; break; }
            _ = sigterm.recv() => { stop_early = true; break; }
            _ = tokio::time::sleep_until(connect_deadline) => {
                if method == Method::Ptrace {
                    let _ = tokio::task::spawn_blocking(move || daemon.finish()).await;
                    bail!(
                        "the profiler loaded into process {pid} did not connect within {}s \
                         (its messages, if any, are on the target's stderr)",
                        CONNECT_TIMEOUT.as_secs()
                    );
                }
                if !warned {
                    warned = true;
                    eprintln!(
                        "heapprofd-rs: no connection yet: a preloaded profiler starts at the \
                         target's next allocation (or the program handles signal {} itself; \
                         HEAPPROFD_ATTACH=ptrace activates it without the signal)",
                        inject::ACTIVATION_SIGNAL
                    );
                }
            }
        }
    }
    let connected = started.elapsed();
    if !stop_early {
        let how_long = args.duration.map_or("until Ctrl-C".to_string(), |d| {
            format!("for {:.1}s", d.as_secs_f64())
        });
        eprintln!("heapprofd-rs: profiling process {pid} ({comm}) {how_long}");
    }

    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut dump_tick = args.continuous_dump.map(|p| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + p, p);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut status = StatusLine::new(std::io::stderr().is_terminal());
    let mut status_tick = tokio::time::interval(Duration::from_millis(500));
    let mut first_sample: Option<Duration> = None;
    let mut target_exited = false;
    if !stop_early {
        loop {
            if first_sample.is_none() && C::get(&counters.samples) > 0 {
                first_sample = Some(started.elapsed());
            }
            tokio::select! {
                _ = sleep_until(deadline) => break,
                _ = exited(&pidfd) => { target_exited = true; break; }
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
                _ = sigusr1.recv() => daemon.dump(),
                _ = tick(&mut dump_tick) => daemon.dump(),
                _ = status_tick.tick() => status.update(&counters, started),
                // Only to time the first sample (docs/PERFORMANCE.md).
                _ = poll.tick(), if first_sample.is_none() => {}
            }
        }
    }
    status.clear();
    // A synchronous session (single-threaded target, no client thread) is
    // ended by a call into the target, before the daemon stops reading.
    if report.as_ref().is_some_and(|r| r.sync) && !target_exited {
        let ended = tokio::task::spawn_blocking(move || {
            let t = inject::probe_loaded(pid)?;
            inject::detach(&t, &opts).map_err(anyhow::Error::from)
        })
        .await
        .context("the detach thread failed")?;
        match ended {
            Ok(r) if debug => eprintln!(
                "heapprofd-rs: attach: detach paused thread {} for {}",
                r.tid,
                ms(r.pause)
            ),
            Ok(_) => {}
            Err(e) => eprintln!(
                "heapprofd-rs: warning: could not end the session inside process {pid} \
                 ({e:#}); its profiler goes dormant when it sees the daemon stop"
            ),
        }
    }
    let summary = tokio::task::spawn_blocking(move || daemon.finish())
        .await
        .context("finishing the profile")??;
    if debug {
        eprintln!(
            "heapprofd-rs: attach: connected after {}, first sample after {}",
            ms(connected),
            first_sample.map_or("-".to_string(), ms)
        );
    }
    if target_exited {
        eprintln!("heapprofd-rs: process {pid} ({comm}) exited");
    } else {
        let t = Instant::now();
        while inject::client_thread(pid).is_some() && t.elapsed() < DETACH_WAIT {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        match inject::client_thread(pid) {
            None if target_preloaded => eprintln!(
                "heapprofd-rs: detached from process {pid} ({comm}): its preloaded profiler is \
                 dormant again"
            ),
            None => eprintln!(
                "heapprofd-rs: detached from process {pid} ({comm}): its allocations no longer \
                 go through the profiler"
            ),
            Some(tid) => eprintln!(
                "heapprofd-rs: warning: the profiler's thread {tid} in process {pid} is still \
                 running {}s after the end of the session",
                DETACH_WAIT.as_secs()
            ),
        }
    }
    Ok(summary)
}
