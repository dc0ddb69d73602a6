//! `heapprofd-rs daemon`: the profiling service in the foreground.
//!
//! It keeps the [service directory](crate::service::control::service_dir)
//! (created mode 0700 if missing; an existing one must be ours and writable
//! by nobody else), listens on its control socket, and runs the profiles
//! the command line asks for, one at a time (this first version queues a
//! second request until the first ends). For a profile it starts a
//! [`Daemon`] on the directory's client socket and writes the
//! startup-trigger store with the profile's names
//! ([`heapprofd_proto::triggers`]), so a process with the dormant client
//! preloaded that starts while the profile runs connects from its first
//! allocation. When the profile ends (its duration, the command line closing
//! its side, or SIGINT/SIGTERM of the service) the store is removed first,
//! then the sessions are drained and the trace written to the descriptor
//! the command line sent, and the summary goes back as the reply. SIGINT or
//! SIGTERM ends the service after the running profile is written.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use heapprofd_proto::service::{CLIENT_SOCKET, CONTROL_SOCKET, TRIGGERS_FILE};
use heapprofd_proto::wire::ClientConfig;
use nix::sys::stat::{Mode, umask};
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};

use super::Counters;
use super::bookkeeper::BookkeeperOptions;
use super::server::{Daemon, DaemonOptions};
use super::supervise::{Signals, block_on, finish};
use crate::service::control::{Reply, Request, read_body, service_dir};
use crate::service::spec::ProfileSpec;

/// Runs the service until SIGINT or SIGTERM; returns the exit code.
pub fn run() -> Result<i32> {
    let dir = service_dir();
    prepare_dir(&dir)?;
    block_on(serve(dir))??;
    Ok(0)
}

/// Creates the directory (0700) or checks an existing one.
fn prepare_dir(dir: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => {
            return Err(e).with_context(|| {
                format!(
                    "cannot create the service directory {}; set HEAPPROFD_SERVICE_DIR to one you can write",
                    dir.display()
                )
            });
        }
    }
    let meta = std::fs::symlink_metadata(dir)
        .with_context(|| format!("cannot read the service directory {}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        bail!(
            "the service directory {} is not a directory of user {me} writable only by it; \
             remove it or set HEAPPROFD_SERVICE_DIR",
            dir.display()
        );
    }
    Ok(())
}

async fn serve(dir: PathBuf) -> Result<()> {
    let mut signals = Signals::install()?;
    // Stale store of a killed service: nothing wants anything now (removed
    // before the control socket appears).
    let _ = std::fs::remove_file(dir.join(TRIGGERS_FILE));
    let control = dir.join(CONTROL_SOCKET);
    let _ = std::fs::remove_file(&control);
    let old = umask(Mode::from_bits_truncate(0o177));
    let listener = UnixListener::bind(&control);
    umask(old);
    let listener = listener.with_context(|| format!("cannot listen on {}", control.display()))?;
    log::info!(
        "service: control socket {}, clients {}",
        control.display(),
        dir.join(CLIENT_SOCKET).display()
    );
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    if profile(&dir, stream, &mut signals).await {
                        break;
                    }
                }
                Err(e) => {
                    log::warn!("control socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = signals.interrupt.recv() => break,
            _ = signals.terminate.recv() => break,
        }
    }
    let _ = std::fs::remove_file(&control);
    log::info!("service stopped");
    Ok(())
}

/// Serves one control connection; returns whether the service was asked to
/// stop (SIGINT/SIGTERM) meanwhile.
async fn profile(dir: &Path, stream: UnixStream, signals: &mut Signals) -> bool {
    let Ok(std) = stream.into_std() else {
        return false;
    };
    let got = tokio::task::spawn_blocking(move || read_request(std)).await;
    let (request, fd, std) = match got {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            log::warn!("bad control request: {e:#}");
            return false;
        }
        Err(_) => return false,
    };
    let Ok(mut stream) = UnixStream::from_std(std) else {
        return false;
    };
    let mut stop = false;
    let reply = match run_profile(dir, &request, fd, &mut stream, signals, &mut stop).await {
        Ok(r) => r,
        Err(e) => Reply::Failed(format!("{e:#}")),
    };
    let sent = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut std = stream.into_std()?;
        std.set_nonblocking(false)?;
        std.set_write_timeout(Some(Duration::from_secs(2)))?;
        crate::service::control::write_message(&mut std, &reply)
    })
    .await;
    if !matches!(sent, Ok(Ok(()))) {
        log::warn!("could not send the reply to the command line");
    }
    stop
}

/// Reads the framed request and the trace descriptor sent with it (a
/// 2-second deadline: a peer that sends half a request cannot stall the
/// service). Only a peer of our own user or root is served.
fn read_request(
    std: std::os::unix::net::UnixStream,
) -> Result<(Request, OwnedFd, std::os::unix::net::UnixStream)> {
    std.set_nonblocking(false)?;
    std.set_read_timeout(Some(Duration::from_secs(2)))?;
    let peer = nix::sys::socket::getsockopt(&std, nix::sys::socket::sockopt::PeerCredentials)
        .context("reading the peer's credentials")?;
    let me = nix::unistd::geteuid().as_raw();
    if peer.uid() != 0 && peer.uid() != me {
        bail!(
            "refused a request of user {} (the service runs as {me})",
            peer.uid()
        );
    }
    let mut header = [0u8; 4];
    let mut fds = [None];
    let n = heapprofd_proto::socket::recv_with_fds(std.as_raw_fd(), &mut header, &mut fds)
        .context("reading the request")?;
    let [fd] = fds;
    let fd = match (n, fd) {
        (1, Some(fd)) => fd,
        _ => bail!("the request came without the trace file's descriptor"),
    };
    let mut reader = &std;
    let request: Request = read_body(&mut reader, header).context("reading the request")?;
    Ok((request, fd, std))
}

/// What this service does not do yet: a profile it cannot run as asked is
/// refused with why, never run differently.
fn supported(spec: &ProfileSpec) -> Result<()> {
    spec.check().map_err(anyhow::Error::msg)?;
    let t = &spec.targets;
    if t.names.is_empty() || !t.pids.is_empty() || t.all || t.descendants_of.is_some() {
        bail!("this service takes profiles by name only (-n NAME) for now");
    }
    if !t.startup || t.running {
        bail!(
            "this service profiles only programs that start after the request for now: \
             set `no_running: true` in the config (running processes: record --pid)"
        );
    }
    if spec.guardrails != Default::default() {
        bail!("guardrails (max_heapprofd_memory_kb, max_heapprofd_cpu_secs) are not enforced yet");
    }
    Ok(())
}

/// Runs one profile until its duration passes, the peer closes its side,
/// or the service gets SIGINT/SIGTERM (then `stop` is set).
async fn run_profile(
    dir: &Path,
    req: &Request,
    fd: OwnedFd,
    stream: &mut UnixStream,
    signals: &mut Signals,
    stop: &mut bool,
) -> Result<Reply> {
    let spec = &req.spec;
    supported(spec)?;
    let mut client = ClientConfig::new(spec.sampling.interval, spec.sampling.shmem_size);
    client.seed = spec.sampling.seed;
    spec.sampling
        .heaps
        .apply(spec.sampling.interval, &mut client)
        .map_err(anyhow::Error::msg)?;
    if spec.sampling.block_client {
        client.flags |= ClientConfig::FLAG_BLOCK_CLIENT;
        client.block_timeout_us = spec.sampling.block_timeout_us;
    }
    let options = DaemonOptions {
        socket: dir.join(CLIENT_SOCKET),
        client,
        workers: 2,
        symbolize: spec.symbolize,
        book: BookkeeperOptions {
            output: std::fs::File::from(fd),
            output_path: req.output_path.clone(),
            interval: super::setup::libc_malloc_interval(&client),
            dump_at_max: spec.dumps.dump_at_max,
        },
    };
    let counters = Arc::new(Counters::default());
    let mut daemon = Daemon::start(options, counters)?;
    daemon.serve();
    let names: Vec<(&str, u32)> = spec.targets.names.iter().map(|n| (n.as_str(), 1)).collect();
    write_triggers(dir, &heapprofd_proto::triggers::encode(0, names))?;
    let what = spec.targets.names.join(",");
    log::info!("profiling {what} from their start");
    let deadline = spec
        .duration_ms
        .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let mut dumps = spec.dumps.continuous.map(|c| {
        let period = Duration::from_millis(u64::from(c.interval_ms));
        let first = tokio::time::Instant::now() + Duration::from_millis(u64::from(c.phase_ms));
        tokio::time::interval_at(first, period)
    });
    let mut byte = [0u8; 1];
    loop {
        tokio::select! {
            _ = sleep_for(deadline) => break,
            // EOF or anything else from the command line: stop.
            _ = stream.read(&mut byte) => break,
            _ = signals.interrupt.recv() => { *stop = true; break }
            _ = signals.terminate.recv() => { *stop = true; break }
            _ = async { match dumps.as_mut() {
                Some(t) => { t.tick().await; }
                None => std::future::pending().await,
            } } => daemon.dump(),
        }
    }
    // New processes stop connecting before the sessions are drained.
    let _ = std::fs::remove_file(dir.join(TRIGGERS_FILE));
    let summary = finish(daemon).await?;
    let processes = summary.processes.len();
    let plural = if processes == 1 { "" } else { "es" };
    log::info!("profile of {what} ended: {processes} process{plural}");
    Ok(Reply::Done {
        summary: summary.render(&req.output_path),
        processes,
    })
}

/// Sleeps until `deadline` (an instant, so making the future anew on each
/// turn of the loop does not move it); forever without one.
async fn sleep_for(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Replaces the trigger store atomically (write, then rename), mode 0644
/// (clients of every user read it; only we write it).
fn write_triggers(dir: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{TRIGGERS_FILE}.tmp"));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, dir.join(TRIGGERS_FILE))
        .with_context(|| format!("installing {}", dir.join(TRIGGERS_FILE).display()))
}
