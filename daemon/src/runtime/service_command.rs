//! `heapprofd-rs record -- CMD` through the running profiling service
//! (`heapprofd-rs daemon`), when one is reachable for this user: the
//! service's control socket ([`service_dir_to_ask`]: the user's own
//! service, else root's) accepts a connection.
//!
//! `record` creates the trace (0600, the user's), asks the service for a
//! profile of "the processes of one command": a random token
//! ([`Targets::command`]) that the service matches in the environment of
//! each process that connects ([`PROFILE_ENV`]). Once the service answers
//! [`Reply::Started`] (the profile is in place), `record` starts CMD with
//! the client preloaded, pointed at the service's client socket, blocking
//! at start-up until configured, and the token in its environment: CMD and
//! every program it starts (they inherit the environment) are profiled from
//! their first allocation, as with a daemon of `record`'s own. The profile
//! ends when CMD exits, at `--duration` or on Ctrl-C / SIGTERM (`record`
//! shuts down its side of the connection); the service writes the trace
//! and answers with the summary. Exit codes are those of `record -- CMD`
//! ([`super::record`]).
//!
//! A daemon of `record`'s own is used instead (returns `None`) with
//! `--no-service` or `--workers`, for a program that cannot load the client
//! (its notice is `record`'s own daemon's), when no service answers, and
//! when the service refuses the profile (an older service that does not
//! take commands).

use std::os::unix::net::UnixStream;
use std::process::ExitStatus;
use std::time::Duration;

use anyhow::{Context, Result};
use heapprofd_proto::service::{CLIENT_SOCKET, CONTROL_SOCKET};

use super::record::SpawnError;
use super::service_record::{create_trace, sampling, send_request};
use super::setup::{client_lib_to_preload, default_output};
use super::supervise::{Signals, block_on};
use crate::cli::record_args::RecordArgs;
use crate::env::Env;
use crate::service::control::{Reply, Request, read_message, service_dir_to_ask};
use crate::service::spec::{Dumps, PROFILE_ENV, ProfileSpec, Targets};

/// How long `record` waits for the service to take the profile.
const START_WAIT: Duration = Duration::from_secs(10);

/// Runs `record -- CMD` through the service if one is reachable and takes
/// it; `None`: run it with a daemon of `record`'s own.
pub fn try_run(args: &RecordArgs, env: &Env) -> Result<Option<i32>> {
    if args.no_service || args.workers.is_some() {
        return Ok(None);
    }
    if super::program::unprofilable(std::ffi::OsStr::new(&args.command[0]), env.path.as_deref())
        .is_some()
    {
        return Ok(None);
    }
    let dir = service_dir_to_ask(env.service_dir.as_deref());
    let Ok(sock) = UnixStream::connect(dir.join(CONTROL_SOCKET)) else {
        return Ok(None);
    };
    let client_lib = client_lib_to_preload(args.client_lib.as_deref())?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.command[0]));
    let file = create_trace(&output)?;
    let token = new_token()?;
    let request = Request {
        spec: spec_for(args, &token),
        output_path: output.clone(),
    };
    let started = send_request(&sock, &request, &file).and_then(|()| wait_started(&sock));
    drop(file);
    if let Err(e) = started {
        log::info!(
            "the profiling service in {} does not take the command ({e:#}); \
             running a daemon of record's own",
            dir.display()
        );
        let _ = std::fs::remove_file(&output);
        return Ok(None);
    }
    log::info!("profiling through the service in {}", dir.display());
    let mut preload = client_lib.into_os_string();
    if let Some(existing) = &env.ld_preload {
        preload.push(":");
        preload.push(existing);
    }
    let launch = Launch {
        command: args.command.clone(),
        preload,
        client_socket: dir.join(CLIENT_SOCKET),
        token,
        duration: args.duration,
    };
    match block_on(launch.supervise(sock))? {
        Ok(code) => Ok(Some(code)),
        Err(e) if e.downcast_ref::<SpawnError>().is_some() => {
            let _ = std::fs::remove_file(&output);
            let code = e
                .downcast_ref::<SpawnError>()
                .map_or(127, SpawnError::exit_code);
            log::error!("error: {e:#}");
            Ok(Some(code))
        }
        Err(e) => Err(e),
    }
}

/// The profile of a command: its token's processes, from their start.
fn spec_for(args: &RecordArgs, token: &str) -> ProfileSpec {
    let continuous = super::service_record::continuous(args);
    ProfileSpec {
        targets: Targets {
            command: Some(token.to_owned()),
            startup: true,
            ..Targets::default()
        },
        sampling: sampling(args),
        dumps: Dumps {
            continuous,
            dump_at_max: args.dump_at_max,
        },
        symbolize: !args.no_symbolize,
        ..ProfileSpec::default()
    }
}

/// 128 random bits as hex.
fn new_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Waits for [`Reply::Started`]; anything else is an error that says why.
fn wait_started(sock: &UnixStream) -> Result<()> {
    sock.set_read_timeout(Some(START_WAIT))?;
    let reply: Reply = read_message(&mut &*sock).context("waiting for the service")?;
    sock.set_read_timeout(None)?;
    match reply {
        Reply::Started => Ok(()),
        Reply::Failed(why) => anyhow::bail!("{why}"),
        Reply::Done { .. } => anyhow::bail!("the profile ended before it started"),
    }
}

/// CMD, as `record` starts it against the service.
struct Launch {
    command: Vec<String>,
    preload: std::ffi::OsString,
    client_socket: std::path::PathBuf,
    token: String,
    duration: Option<Duration>,
}

impl Launch {
    /// Starts CMD, waits for its end (or `--duration`, Ctrl-C, SIGTERM),
    /// ends the profile and prints the service's summary; the exit code.
    async fn supervise(self, sock: UnixStream) -> Result<i32> {
        let mut signals = Signals::install()?;
        let program = &self.command[0];
        let child = tokio::process::Command::new(program)
            .args(&self.command[1..])
            .env("LD_PRELOAD", &self.preload)
            .env(heapprofd_proto::socket::SOCKET_ENV, &self.client_socket)
            .env("HEAPPROFD_BLOCKING_INIT", "1")
            .env(PROFILE_ENV, &self.token)
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = sock.shutdown(std::net::Shutdown::Write);
                return Err(SpawnError::new(program, e).into());
            }
        };
        let deadline = self.duration.map(|d| tokio::time::Instant::now() + d);
        let mut exit: Option<ExitStatus> = None;
        let mut stopped_by: Option<i32> = None;
        tokio::select! {
            r = child.wait() => exit = Some(r.context("waiting for the profiled command")?),
            _ = super::service_profile::sleep_for(deadline) => {
                log::info!("--duration passed, profiling stopped; `{program}` keeps running");
            }
            _ = signals.interrupt.recv() => {
                // CMD got the same Ctrl-C from the terminal: a moment to exit.
                tokio::select! {
                    r = child.wait() => exit = Some(r.context("waiting for the profiled command")?),
                    _ = tokio::time::sleep(Duration::from_secs(2)) => stopped_by = Some(libc::SIGINT),
                    _ = signals.interrupt.recv() => stopped_by = Some(libc::SIGINT),
                }
            }
            _ = signals.terminate.recv() => stopped_by = Some(libc::SIGTERM),
        }
        let _ = sock.shutdown(std::net::Shutdown::Write);
        let reply = tokio::task::spawn_blocking(move || read_message::<Reply>(&mut &sock))
            .await
            .context("waiting for the service")?
            .context(
                "the service ended the connection without an answer (was it killed?); \
                 the trace is incomplete",
            );
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                wait_for_cmd(
                    &mut child,
                    &mut signals,
                    exit.is_none() && stopped_by.is_none(),
                    program,
                )
                .await;
                return Err(e);
            }
        };
        match reply {
            Reply::Done { summary, .. } => log::info!("{summary}"),
            Reply::Failed(why) => {
                log::error!("error: the service could not run the profile: {why}")
            }
            Reply::Started => log::error!("error: the service answered out of turn"),
        }
        if exit.is_none() && stopped_by.is_none() {
            // --duration: profiling is over, CMD's exit code still passes through.
            exit = wait_for_cmd(&mut child, &mut signals, true, program).await;
            if exit.is_none() {
                stopped_by = Some(libc::SIGINT);
            }
        }
        Ok(exit.map_or_else(|| 128 + stopped_by.unwrap_or(0), exit_code))
    }
}

/// Waits for CMD to exit (if `wait`), unless Ctrl-C or SIGTERM stops the
/// waiting; its exit status.
async fn wait_for_cmd(
    child: &mut tokio::process::Child,
    signals: &mut Signals,
    wait: bool,
    program: &str,
) -> Option<ExitStatus> {
    if !wait {
        return None;
    }
    log::info!("waiting for `{program}` to exit (Ctrl-C to stop waiting)");
    tokio::select! {
        r = child.wait() => r.ok(),
        _ = signals.interrupt.recv() => None,
        _ = signals.terminate.recv() => None,
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_valid_and_differ() {
        let (a, b) = (new_token().expect("token"), new_token().expect("token"));
        assert!(crate::service::spec::valid_token(&a), "{a}");
        assert_ne!(a, b);
    }
}
