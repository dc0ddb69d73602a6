//! `heapprofd-rs daemon`: the profiling service in the foreground.
//!
//! It keeps the [service directory](crate::service::control::service_dir)
//! (created mode 0700 if missing, 0755 for root's service, which serves
//! every user ([`crate::service::access`]); an existing one must be ours
//! and writable by nobody else), listens on its control socket (0600, 0666
//! for root's), and runs every profile
//! the command line asks for at once, each on its own task
//! ([`super::service_profile`]) with its own trace. One [`Daemon`] serves
//! them all on the directory's client socket: the [`Hub`] decides which
//! profiles a connecting process feeds (for root's service, only the
//! profiles whose requester may profile that process's user), the
//! service's bookkeeping thread ([`super::service_book`]) keeps one trace
//! per profile.
//!
//! The startup-trigger store ([`heapprofd_proto::triggers`], mode 0644:
//! every user's clients read it, only the service writes it) exists while
//! some profile runs: it names what the startup profiles want (a process
//! with the dormant client preloaded that starts meanwhile connects from
//! its first allocation), and it tells a client woken by the signal where
//! the service is. It is rewritten whenever a profile starts or ends, and
//! removed with the last one. While a startup profile runs, the service
//! looks for the programs it wants that cannot load the client
//! ([`super::service_scan`]). SIGINT or SIGTERM ends every profile (each
//! trace written, each `record` answered), then the service.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use heapprofd_proto::service::{CLIENT_SOCKET, CONTROL_SOCKET, TRIGGERS_FILE};
use heapprofd_proto::wire::ClientConfig;
use nix::sys::stat::{Mode, umask};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::Counters;
use super::hub::Hub;
use super::hub_admit::HubAdmit;
use super::server::{BookRunner, Daemon, ServerOptions};
use super::service_inject::Injector;
use super::service_profile::serve_request;
use super::service_state::Service;
use super::supervise::{Signals, block_on, finish};
use crate::env::Env;
use crate::service::access;
use crate::service::control::service_dir;

/// Runs the service until SIGINT or SIGTERM; returns the exit code.
pub fn run(env: &Env) -> Result<i32> {
    let dir = service_dir(env.service_dir.as_deref());
    prepare_dir(&dir)?;
    block_on(serve(dir, env))??;
    Ok(0)
}

/// Creates the directory (0700) or checks an existing one.
fn prepare_dir(dir: &Path) -> Result<()> {
    let me = nix::unistd::geteuid().as_raw();
    match std::fs::DirBuilder::new()
        .mode(access::dir_mode(me))
        .create(dir)
    {
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
    if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o022 != 0 {
        bail!(
            "the service directory {} is not a directory of user {me} writable only by it; \
             remove it or set HEAPPROFD_SERVICE_DIR",
            dir.display()
        );
    }
    // Root's service serves every user: its directory must let them reach
    // the sockets (an older one may have been made 0700).
    if access::serves_everyone(me) && meta.mode() & 0o755 != 0o755 {
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .with_context(|| format!("opening {} to every user", dir.display()))?;
    }
    Ok(())
}

async fn serve(dir: PathBuf, env: &Env) -> Result<()> {
    let mut signals = Signals::install()?;
    // Stale store of a killed service: nothing wants anything now (removed
    // before the control socket appears).
    let _ = std::fs::remove_file(dir.join(TRIGGERS_FILE));
    let hub = Arc::new(Hub::default());
    let options = ServerOptions {
        socket: dir.join(CLIENT_SOCKET),
        client: ClientConfig::new(crate::service::spec::DEFAULT_INTERVAL, 1 << 20),
        workers: 2,
        symbolize: true,
        // A service's modules stay cached while it runs.
        symbol_store: None,
        admit: Some(Arc::new(HubAdmit(Arc::clone(&hub)))),
    };
    let book_hub = Arc::clone(&hub);
    let stopper = Arc::new(std::sync::OnceLock::new());
    let book_stopper = Arc::clone(&stopper);
    let runner: BookRunner =
        Box::new(move |rx, shared| super::service_book::run(rx, shared, book_hub, book_stopper));
    let mut daemon = Daemon::start_with(options, Arc::new(Counters::default()), runner)?;
    let me = nix::unistd::geteuid().as_raw();
    if access::serves_everyone(me) {
        // Every user's processes may connect (socket 0666); each profile
        // takes only those its requester may profile (the hub's admission).
        daemon.serve_requester(0, 0)?;
    }
    let _ = stopper.set(daemon.stopper());
    daemon.serve();
    let injector = Injector::new(
        daemon.module_cache(),
        env.attach_test_stall.clone(),
        env.attach_timeout,
    );
    let service = Arc::new(Service::new(
        dir.clone(),
        daemon.book(),
        daemon.stopper(),
        hub,
        injector,
    ));
    let control = dir.join(CONTROL_SOCKET);
    let _ = std::fs::remove_file(&control);
    let old = umask(Mode::from_bits_truncate(0o777 & !access::control_mode(me)));
    let listener = UnixListener::bind(&control);
    umask(old);
    let listener = listener.with_context(|| format!("cannot listen on {}", control.display()))?;
    log::info!(
        "service: control socket {}, clients {}",
        control.display(),
        dir.join(CLIENT_SOCKET).display()
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    // Programs a startup profile wants that cannot load the client.
    tasks.spawn(super::service_scan::watch(
        Arc::clone(&service),
        stop_rx.clone(),
    ));
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    tasks.spawn(serve_request(Arc::clone(&service), stream, stop_rx.clone()));
                }
                Err(e) => {
                    log::warn!("control socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            // Reap finished profile tasks as they end.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = signals.interrupt.recv() => break,
            _ = signals.terminate.recv() => break,
        }
    }
    // No new requests; every open profile is written and answered.
    drop(listener);
    let _ = std::fs::remove_file(&control);
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    let _ = std::fs::remove_file(dir.join(TRIGGERS_FILE));
    drop(service);
    let _ = finish(daemon).await;
    log::info!("service stopped");
    Ok(())
}
