//! `heapprofd-rs record -n NAME[,NAME...]`, `record --all`, `record -p
//! PID,PID...`: ask the running service (`heapprofd-rs daemon`) for a
//! profile: of the programs of those names (running ones, woken, and those
//! that start from now on, from their first allocation: startup
//! profiling; the programs need the dormant client preloaded, e.g. through
//! `LD_PRELOAD`), of every process with the client, or of those pids.
//!
//! `record` creates the trace file itself (so it belongs to the user who
//! asked; mode 0600) and sends its descriptor with the request over the control socket
//! ([`crate::service::control`]); the profile ends after `--duration`, or on
//! Ctrl-C / SIGTERM of `record` (it shuts down its side of the connection),
//! and `record` prints the summary the service answers with. A user without
//! a service of their own asks root's, if one runs (it profiles only that
//! user's processes for them). Without a running service this is an error
//! that says to start one.
//! `record --config FILE` sends the profile a Perfetto HeapprofdConfig
//! describes ([`crate::config`]) the same way. `record --pid PID` of one
//! process goes through the service too when one answers ([`try_pid`];
//! else `record`'s own daemon, [`super::attach`]): the service wakes its
//! dormant client or loads the client with ptrace
//! ([`super::service_inject`]), for root or the process's owner only.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use heapprofd_proto::service::CONTROL_SOCKET;

use super::supervise::{Signals, block_on};
use crate::cli::record_args::RecordArgs;
use crate::cli::usage_error::UsageError;
use crate::env::Env;
use crate::service::control::{Reply, Request, frame_header, read_message, service_dir_to_ask};
use crate::service::spec::{Continuous, DEFAULT_SHMEM_ALL, Dumps, ProfileSpec, Sampling, Targets};

/// The profile `record -n NAME` or `record --config FILE` asks for.
pub fn spec_from(args: &RecordArgs) -> Result<ProfileSpec> {
    let mut spec = match &args.config {
        Some(path) => {
            let from = crate::config::load(path).map_err(|e| UsageError(format!("{e:#}")))?;
            for w in &from.warnings {
                log::warn!("warning: {w}");
            }
            from.spec
        }
        None => ProfileSpec {
            targets: Targets {
                names: args.name.clone(),
                pids: args.pid.clone(),
                all: args.all,
                // Pids are running processes only; names and --all both,
                // unless restricted.
                startup: !args.no_startup && (!args.name.is_empty() || args.all),
                running: !args.no_running,
                ..Targets::default()
            },
            sampling: sampling(args),
            dumps: Dumps {
                continuous: continuous(args),
                dump_at_max: args.dump_at_max,
            },
            symbolize: !args.no_symbolize,
            ..ProfileSpec::default()
        },
    };
    if args.no_symbolize {
        spec.symbolize = false;
    }
    if let Some(d) = args.duration {
        spec.duration_ms = Some(d.as_millis() as u64);
    }
    args.check_sampling().map_err(UsageError)?;
    spec.check().map_err(UsageError)?;
    Ok(spec)
}

/// `--continuous-dump`, as the service takes it (`-n`/`--all` refuse it
/// on the command line; pids and commands take it).
pub(super) fn continuous(args: &RecordArgs) -> Option<Continuous> {
    args.continuous_dump.map(|p| {
        let ms = u32::try_from(p.as_millis()).unwrap_or(u32::MAX);
        Continuous {
            phase_ms: ms,
            interval_ms: ms,
        }
    })
}

/// How `record`'s options sample.
pub(super) fn sampling(args: &RecordArgs) -> Sampling {
    Sampling {
        interval: args.interval,
        // Many processes at once under --all: smaller rings unless asked.
        shmem_size: match args.shmem_size {
            None if args.all => DEFAULT_SHMEM_ALL,
            _ => args.ring_size(),
        },
        block_client: !args.no_block_client,
        block_timeout_us: args
            .block_client
            .unwrap_or(Duration::from_secs(5))
            .as_micros() as u64,
        seed: args.seed,
        heaps: args.heap_selection(),
        contexts: args.context.clone(),
        cpu_period_ns: args.cpu_period_ns(),
        no_heap: args.no_heap,
        perf_event: args.perf_event().0,
        perf_period: args.perf_event().1,
        no_stack_reuse: args.no_stack_reuse,
        fixed_interval: args.fixed_interval,
    }
}

/// Creates the trace file, readable by the requesting user only (a root
/// service may have profiled processes of this user that nobody else may
/// look into).
pub(super) fn create_trace(output: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(output)
        .map_err(|e| {
            UsageError(format!(
                "cannot create the trace file {}: {e}; choose another path with -o",
                output.display()
            ))
            .into()
        })
}

/// Sends `request` with the trace file's descriptor.
pub(super) fn send_request(sock: &UnixStream, request: &Request, file: &File) -> Result<()> {
    let body = serde_json::to_vec(request)?;
    heapprofd_proto::socket::send_with_fds(
        sock.as_raw_fd(),
        &frame_header(body.len())?,
        &[file.as_raw_fd()],
    )
    .context("sending the request to the service")?;
    std::io::Write::write_all(&mut &*sock, &body).context("sending the request to the service")
}

/// What the profile takes in, for the log.
fn what(spec: &ProfileSpec) -> String {
    let t = &spec.targets;
    let mut what = Vec::new();
    if t.all {
        what.push("every process with the client".to_string());
    }
    if !t.names.is_empty() {
        what.push(t.names.join(","));
    }
    if !t.pids.is_empty() {
        let p: Vec<String> = t.pids.iter().map(u32::to_string).collect();
        what.push(format!("pid {}", p.join(",")));
    }
    let when = match (t.running, t.startup) {
        (true, true) => " (running, and from the start of new ones)",
        (false, true) => " from their start",
        _ => "",
    };
    format!("{}{when}", what.join(" and "))
}

/// `record --pid PID` through a running service, if one answers; `None`:
/// run it with a daemon of `record`'s own ([`super::attach`]), as with
/// `--no-service`, `--workers`, `--client-lib`, or `HEAPPROFD_ATTACH*`
/// (the ways of attaching that only `record`'s own daemon has).
pub fn try_pid(args: RecordArgs, env: &Env) -> Result<Option<i32>> {
    let own = args.no_service
        || args.workers.is_some()
        || args.client_lib.is_some()
        || env.attach != crate::env::AttachChoice::Auto
        || env.attach_timeout.is_some()
        || env.attach_test_stall.is_some();
    // A pid that is not a process: `record`'s own probe says so best.
    let missing = args
        .pid
        .iter()
        .any(|p| !std::path::Path::new(&format!("/proc/{p}")).exists());
    if own || missing {
        return Ok(None);
    }
    let dir = service_dir_to_ask(env.service_dir.as_deref());
    let Ok(sock) = UnixStream::connect(dir.join(CONTROL_SOCKET)) else {
        return Ok(None);
    };
    let spec = spec_from(&args)?;
    log::info!("profiling through the service in {}", dir.display());
    run_with(args, spec, sock).map(Some)
}

/// Runs `record -n` / `record --all` / `record -p PID,PID` /
/// `record --config`; returns the exit code.
pub fn run(args: RecordArgs, env: &Env) -> Result<i32> {
    // Bad usage is said before looking for a service.
    let spec = spec_from(&args)?;
    let dir = service_dir_to_ask(env.service_dir.as_deref());
    let control = dir.join(CONTROL_SOCKET);
    let sock = UnixStream::connect(&control).with_context(|| {
        format!(
            "no profiling service at {}; start one with `heapprofd-rs daemon` \
             (with the same HEAPPROFD_SERVICE_DIR)",
            control.display()
        )
    })?;
    run_with(args, spec, sock)
}

/// Sends `spec` (what `args` ask for) on `sock` (connected to the control
/// socket) and waits for its end; the exit code: 1 when pids were asked
/// for and none of them could be profiled.
fn run_with(args: RecordArgs, spec: ProfileSpec, sock: UnixStream) -> Result<i32> {
    let what = what(&spec);
    let output = args.output.clone().unwrap_or_else(|| {
        let t = &spec.targets;
        let stem = match (t.all, t.names.first(), t.pids.first()) {
            (true, _, _) => "all".to_string(),
            (_, Some(n), _) => n.clone(),
            (_, _, Some(p)) => format!("pid-{p}"),
            _ => "names".to_string(),
        };
        super::setup::default_output(&stem)
    });
    let file = create_trace(&output)?;
    let duration = spec.duration_ms;
    let only_pids = spec.targets.names.is_empty() && !spec.targets.all;
    let request = Request {
        spec,
        output_path: output.clone(),
    };
    send_request(&sock, &request, &file)?;
    drop(file);
    log::info!(
        "profiling {what}{}; Ctrl-C to stop",
        duration.map_or(String::new(), |ms| format!(" for {ms}ms"))
    );
    let reply = block_on(wait_reply(sock))??;
    match reply {
        Reply::Done { summary, processes } => {
            log::info!("{summary}");
            if only_pids && processes == 0 {
                bail!("no process was profiled (see above why)");
            }
            Ok(0)
        }
        Reply::Started => bail!("the service answered out of turn (Started)"),
        Reply::Failed(why) => {
            // Nothing was written: no empty trace left behind.
            if std::fs::metadata(&output).is_ok_and(|m| m.len() == 0) {
                let _ = std::fs::remove_file(&output);
            }
            bail!("the service could not run the profile: {why}")
        }
    }
}

/// Waits for the reply; on Ctrl-C or SIGTERM first tells the service to
/// end the profile (shutting down our side), then waits for the reply.
async fn wait_reply(sock: UnixStream) -> Result<Reply> {
    let mut signals = Signals::install()?;
    let reader = sock.try_clone()?;
    let mut reply = tokio::task::spawn_blocking(move || read_message::<Reply>(&mut &reader));
    tokio::select! {
        r = &mut reply => return answered(r),
        _ = signals.interrupt.recv() => {}
        _ = signals.terminate.recv() => {}
    }
    log::info!("stopping; the service writes the trace");
    let _ = sock.shutdown(std::net::Shutdown::Write);
    answered(reply.await)
}

/// The reply, or an error that says the service went away.
fn answered(
    r: std::result::Result<std::io::Result<Reply>, tokio::task::JoinError>,
) -> Result<Reply> {
    r.context("waiting for the service")?.context(
        "the service ended the connection without an answer (was it killed?); \
         the trace is incomplete",
    )
}
