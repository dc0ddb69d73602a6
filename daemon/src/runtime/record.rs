//! `heapprofd-rs record -- CMD`: run a command with the client preloaded,
//! profile it (and the programs it starts), and write a trace.
//!
//! Lifecycle: open the output file (so a bad path fails before anything
//! runs), start the daemon on a socket in the private runtime directory
//! ([`super::rundir`]; stale sockets of killed daemons removed), spawn CMD with `LD_PRELOAD`,
//! `HEAPPROFD_SOCKET` and `HEAPPROFD_BLOCKING_INIT=1` (profiling starts at its
//! first allocation), then wait for whichever comes first: CMD exits,
//! `--duration` passes, or Ctrl-C / SIGTERM. Every sample already in a ring
//! buffer is drained and counted before the final dump. CMD's stdin, stdout
//! and stderr are its own, and `record` exits with CMD's exit code (128 +
//! the signal if CMD was killed by one, as a shell reports it; 130 or 143
//! if Ctrl-C or SIGTERM stopped profiling while CMD kept running). If CMD
//! cannot be started, no trace file is left behind and `record` exits like
//! a shell: 127 when there is no such program, 126 when it cannot be
//! executed. An error after CMD started (the trace cannot be written)
//! waits for CMD to exit before `record` reports it, so CMD is never left
//! without its parent; a panic kills CMD and removes the socket
//! ([`super::cleanup`]). (`record --pid` is
//! [`super::attach`]; what both share is [`super::supervise`].)

use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::io::IsTerminal;

use anyhow::{Context, Result};

use super::Counters;
use super::rundir::RuntimeDir;
use super::server::{Daemon, DaemonOptions};
use super::setup::{client_lib_to_preload, daemon_options, default_output};
use super::status::status_line_allowed;
use super::summary::Summary;
use super::supervise::{Profiling, Signals, Stop, block_on, end_of_run, finish, print_summary};
use crate::cli::record_args::RecordArgs;
use crate::env::Env;

/// Runs `record -- CMD`; returns the exit code to exit with.
pub fn run(args: RecordArgs, env: &Env) -> Result<i32> {
    let client_lib = client_lib_to_preload(args.client_lib.as_deref())?;
    let program = args.command[0].clone();
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&program));
    let dir = RuntimeDir::for_record(env.xdg_runtime_dir.as_deref())?;
    dir.remove_stale();
    let socket = dir.socket_for(std::process::id());
    super::cleanup::install();
    super::cleanup::set_socket(socket.clone());
    let options = daemon_options(&args, socket, &output)?;
    let mut cmd_started = false;
    let run = Run {
        args,
        options,
        client_lib,
        ld_preload: env.ld_preload.clone(),
        path: env.path.clone(),
    };
    let outcome = block_on(run.supervise(&mut cmd_started))?;
    super::cleanup::set_child(0);
    match outcome {
        Ok(Outcome::Ran(summary, code)) => {
            end_of_run(&summary, &output);
            Ok(code)
        }
        Ok(Outcome::NotStarted(e)) => {
            let _ = std::fs::remove_file(&output);
            log::error!("error: {e}");
            Ok(e.exit_code())
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

/// CMD could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot run `{program}`: {cause}{hint}")]
pub(super) struct SpawnError {
    program: String,
    cause: std::io::Error,
    hint: &'static str,
}

impl SpawnError {
    pub(super) fn new(program: &str, cause: std::io::Error) -> SpawnError {
        let hint = match cause.kind() {
            std::io::ErrorKind::NotFound => "; check the name (is it in PATH?)",
            std::io::ErrorKind::PermissionDenied => "; is it executable (chmod +x)?",
            _ => "",
        };
        SpawnError {
            program: program.to_owned(),
            cause,
            hint,
        }
    }

    /// A shell's exit code for it: 127 not found, 126 found but not runnable.
    pub(super) fn exit_code(&self) -> i32 {
        match self.cause.kind() {
            std::io::ErrorKind::NotFound => 127,
            _ => 126,
        }
    }
}

/// How a run of `record -- CMD` ended, when nothing failed.
enum Outcome {
    /// CMD ran: the summary and the exit code for `record`.
    Ran(Summary, i32),
    /// CMD could not be started.
    NotStarted(SpawnError),
}

/// Exit code of `record` when CMD's own is unknown because profiling was
/// stopped by a signal while CMD kept running: 128 + the signal, as a shell
/// reports a job it interrupted.
fn interrupted_code(sig: i32) -> i32 {
    128 + sig
}

/// One `record -- CMD`.
struct Run {
    args: RecordArgs,
    options: DaemonOptions,
    client_lib: PathBuf,
    /// The caller's `LD_PRELOAD`, kept after the client library.
    ld_preload: Option<std::ffi::OsString>,
    /// The caller's `PATH`, to find CMD's file.
    path: Option<std::ffi::OsString>,
}

impl Run {
    /// Runs CMD under the daemon until it exits or profiling is stopped;
    /// returns the summary and the exit code for `record` (or why CMD could
    /// not be started). `cmd_started` is set once CMD has been spawned.
    async fn supervise(self, cmd_started: &mut bool) -> Result<Outcome> {
        let Run {
            args,
            options,
            client_lib,
            ld_preload,
            path,
        } = self;
        // Handlers first: a signal that arrives as soon as CMD runs must not
        // kill `record` with its default action.
        let mut signals = Signals::install()?;
        let counters = Arc::new(Counters::default());
        let mut daemon = Daemon::start(options, Arc::clone(&counters))?;
        daemon.serve();

        let mut preload = client_lib.into_os_string();
        if let Some(existing) = ld_preload {
            preload.push(":");
            preload.push(existing);
        }
        let unprofilable =
            super::program::unprofilable(std::ffi::OsStr::new(&args.command[0]), path.as_deref());
        let spawned = tokio::process::Command::new(&args.command[0])
            .args(&args.command[1..])
            .env("LD_PRELOAD", preload)
            .env(heapprofd_proto::socket::SOCKET_ENV, daemon.socket_path())
            .env("HEAPPROFD_BLOCKING_INIT", "1")
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => return Ok(Outcome::NotStarted(SpawnError::new(&args.command[0], e))),
        };
        *cmd_started = true;
        daemon.prepare_ring();
        if let Some(pid) = child.id() {
            super::cleanup::set_child(pid);
            if let Some(why) = unprofilable {
                daemon.note_unprofilable(pid, args.command.clone(), why);
            }
        }

        // CMD writes to the same terminal: no live status line there.
        let mut profiling = Profiling::start(
            args.duration,
            args.continuous_dump,
            counters,
            Instant::now(),
            status_line_allowed(std::io::stderr().is_terminal(), true),
        );
        let mut exit: Option<ExitStatus> = None;
        let mut interrupted = 0;
        // The signal that stopped profiling while CMD kept running.
        let mut stopped_by: Option<i32> = None;
        tokio::select! {
            r = child.wait() => {
                exit = Some(r.context("waiting for the profiled command")?);
            }
            stop = profiling.until_stop(&mut signals, &daemon) => match stop {
                Stop::Deadline => {
                    profiling.clear_status();
                    log::info!(
                        "{} passed, profiling stopped; `{}` keeps running",
                        fmt_duration(args.duration.unwrap_or_default()),
                        args.command[0]
                    );
                }
                Stop::Interrupt => {
                    interrupted += 1;
                    // CMD got the same Ctrl-C from the terminal; give it a
                    // moment to exit on its own, then stop profiling anyway.
                    tokio::select! {
                        r = child.wait() => {
                            exit = Some(r.context("waiting for the profiled command")?);
                        }
                        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                        _ = signals.interrupt.recv() => {}
                    }
                    if exit.is_none() {
                        profiling.clear_status();
                        log::info!("interrupted; writing the trace");
                        stopped_by = Some(libc::SIGINT);
                    }
                }
                Stop::Terminate => stopped_by = Some(libc::SIGTERM),
            },
        }
        profiling.clear_status();
        let summary = match finish(daemon).await {
            Ok(s) => s,
            Err(e) => {
                // Never leave CMD without its parent: wait for it, as
                // after --duration, then report the error.
                if exit.is_none() && stopped_by.is_none() {
                    log::error!("error: {e:#}");
                    log::info!(
                        "waiting for `{}` to exit (Ctrl-C to stop waiting)",
                        args.command[0]
                    );
                    tokio::select! {
                        _ = child.wait() => {}
                        _ = signals.interrupt.recv() => {}
                        _ = signals.terminate.recv() => {}
                    }
                }
                return Err(e);
            }
        };
        if exit.is_none() && interrupted == 0 && args.duration.is_some() {
            // Profiling is over but CMD still runs: keep passing its exit code through.
            print_summary(&summary, &summary.output_path);
            log::info!(
                "waiting for `{}` to exit (Ctrl-C to stop waiting)",
                args.command[0]
            );
            tokio::select! {
                r = child.wait() => exit = Some(r.context("waiting for the profiled command")?),
                _ = signals.interrupt.recv() => stopped_by = Some(libc::SIGINT),
                _ = signals.terminate.recv() => stopped_by = Some(libc::SIGTERM),
            }
            let code = exit.map_or_else(|| interrupted_code(stopped_by.unwrap_or(0)), exit_code);
            return Ok(Outcome::Ran(
                Summary {
                    already_printed: true,
                    ..summary
                },
                code,
            ));
        }
        // CMD's own exit code; if it still runs (it ignored Ctrl-C), the code
        // of the signal that stopped profiling.
        let code = exit.map_or_else(|| interrupted_code(stopped_by.unwrap_or(0)), exit_code);
        Ok(Outcome::Ran(summary, code))
    }
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
