//! One profile of the service, from its request to its reply: read and
//! check the request, give the profile its trace (the service's
//! bookkeeping thread) and its place in the [`Hub`](super::hub::Hub), take
//! in the running processes it wants (sharing a session another profile
//! already has, waking a dormant preloaded client with the signal, or
//! loading the client with ptrace, [`super::service_inject`], which also
//! activates a dormant client for a profile of threads),
//! then run until its duration, the command line closing its side, or the
//! service stopping; at the end stop the sessions no other profile wants,
//! write the trace and answer with the summary.
//!
//! A control peer that sends half a request, garbage, or goes away is
//! harmless: the request has a 2-second deadline, every profile is its own
//! task, and a reply nobody reads is dropped.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use heapprofd_proto::wire::ClientConfig;
use tokio::io::AsyncReadExt;
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::BookMsg;
use super::book_msg::ServiceMsg;
use super::bookkeeper::BookkeeperOptions;
use super::hub::{Joined, ProfileId, Wanted};
use super::service_inject::InjectRequest;
use super::service_state::Service;
use crate::service::access;
use crate::service::contexts::apply_context_filters;
use crate::service::control::{Reply, Request, read_body};
use crate::service::running;
use crate::service::spec::{ProfileSpec, Targets};

/// How long an ending profile waits for a worker to drain one of the
/// sessions other profiles keep.
const DRAIN_WAIT: Duration = Duration::from_secs(2);
/// How often an ending profile looks whether a shared session it must
/// drain reached its worker.
const AT_WORKER_POLL: Duration = Duration::from_millis(5);

/// Serves one control connection: one profile.
pub(super) async fn serve_request(
    service: Arc<Service>,
    stream: UnixStream,
    stop: watch::Receiver<bool>,
) {
    let Ok(std) = stream.into_std() else {
        return;
    };
    let got = tokio::task::spawn_blocking(move || read_request(std)).await;
    let (request, fd, std, requester, requester_pid) = match got {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            log::warn!("bad control request: {e:#}");
            return;
        }
        Err(_) => return,
    };
    let Ok(mut stream) = UnixStream::from_std(std) else {
        return;
    };
    let asked = Asked {
        request,
        fd,
        requester,
        requester_pid,
    };
    let reply = match run_profile(&service, asked, &mut stream, stop).await {
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
}

/// A request as read: the profile, the trace's descriptor, and the user
/// (and process) who asked.
struct Asked {
    request: Request,
    fd: OwnedFd,
    requester: u32,
    /// The asking process (`record`): never woken by its own `--all` or
    /// `-n` profile (installed system-wide, it has the client too).
    requester_pid: u32,
}

/// Reads the framed request and the trace descriptor sent with it (a
/// 2-second deadline: a peer that sends half a request cannot stall the
/// service). A service run by root serves every user, another only its own
/// user and root ([`access::may_request`]); the requester is the peer's
/// user (and process) as the kernel tells it (`SO_PEERCRED`).
fn read_request(
    std: std::os::unix::net::UnixStream,
) -> Result<(Request, OwnedFd, std::os::unix::net::UnixStream, u32, u32)> {
    std.set_nonblocking(false)?;
    std.set_read_timeout(Some(Duration::from_secs(2)))?;
    let peer = nix::sys::socket::getsockopt(&std, nix::sys::socket::sockopt::PeerCredentials)
        .context("reading the peer's credentials")?;
    let me = nix::unistd::geteuid().as_raw();
    if !access::may_request(me, peer.uid()) {
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
    Ok((request, fd, std, peer.uid(), peer.pid() as u32))
}

/// A profile the service cannot run as asked is refused with why, never
/// run differently.
fn supported(spec: &ProfileSpec) -> Result<()> {
    spec.check().map_err(anyhow::Error::msg)
}

/// The configuration the profile's processes get
/// (the heaps it samples and their intervals included).
fn client_config(spec: &ProfileSpec) -> Result<ClientConfig> {
    let mut client = ClientConfig::new(spec.sampling.interval, spec.sampling.shmem_size);
    client.seed = spec.sampling.seed;
    spec.sampling
        .heaps
        .apply(spec.sampling.interval, &mut client)
        .and_then(|()| apply_context_filters(&spec.sampling.contexts, &mut client))
        .map_err(anyhow::Error::msg)?;
    client.cpu_period_ns = spec.sampling.cpu_period_ns;
    client.perf_event = spec.sampling.perf_event;
    client.perf_period = spec.sampling.perf_period;
    if spec.sampling.no_heap {
        client.clear_heaps();
        client.flags &= !ClientConfig::FLAG_ALL_HEAPS;
    }
    if !spec.sampling.no_stack_reuse {
        client.flags |= ClientConfig::FLAG_STACK_REUSE;
    }
    // Named processes fault their free sets in as their sessions start, as
    // under `record`; a profile of every process does not (most of its
    // processes may never sample; see `FLAG_PREFAULT_FREE_SET`).
    if !spec.targets.all {
        client.flags |= ClientConfig::FLAG_PREFAULT_FREE_SET;
    }
    // A seeded run is for reproducible sampling (see `record --seed`).
    if !spec.sampling.fixed_interval && spec.sampling.seed == 0 {
        client.flags |= ClientConfig::FLAG_ADAPTIVE_INTERVAL;
    }
    if spec.sampling.block_client {
        client.flags |= ClientConfig::FLAG_BLOCK_CLIENT;
        client.block_timeout_us = spec.sampling.block_timeout_us;
    }
    Ok(client)
}

/// What the profile is about, for the log.
fn describe(spec: &ProfileSpec) -> String {
    let t = &spec.targets;
    let mut what = Vec::new();
    if t.all {
        what.push("every process".to_string());
    }
    if !t.names.is_empty() {
        what.push(t.names.join(","));
    }
    if !t.pids.is_empty() {
        let p: Vec<String> = t.pids.iter().map(u32::to_string).collect();
        what.push(format!("pid {}", p.join(",")));
    }
    if t.command.is_some() {
        what.push("a command of record".to_string());
    }
    what.join(" and ")
}

/// Runs one profile until its duration passes, the peer closes its side,
/// or the service stops.
async fn run_profile(
    service: &Arc<Service>,
    asked: Asked,
    stream: &mut UnixStream,
    mut stop: watch::Receiver<bool>,
) -> Result<Reply> {
    let Asked {
        request,
        fd,
        requester,
        requester_pid,
    } = asked;
    let req = &request;
    let spec = &req.spec;
    supported(spec)?;
    let client = client_config(spec)?;
    let id = service.profile_id();
    let book = service.book.clone();
    let options = BookkeeperOptions {
        owns_interner: false,
        output: std::fs::File::from(fd),
        output_path: req.output_path.clone(),
        interval: super::setup::libc_malloc_interval(&client),
        dump_at_max: spec.dumps.dump_at_max,
        // The service symbolizes what its workers see (for every profile);
        // a profile that asked for no symbols gets its frames bare.
        symbolize: spec.symbolize,
    };
    let _ = book.send(BookMsg::Service(ServiceMsg::Add(
        id,
        options,
        spec.guardrails,
    )));
    service.hub.add_profile(
        id,
        Wanted {
            targets: spec.targets.clone(),
            client,
            pending: Default::default(),
            requester,
            since_ticks: super::service_scan::boot_ticks(),
        },
    );
    service.update_store();
    let what = describe(spec);
    log::info!("profile {id}: {what}");
    if spec.targets.command.is_some() {
        // Its processes are taken from now on: `record` may start CMD. (A
        // peer gone meanwhile ends the profile below, as any other.)
        let started = crate::service::control::frame(&Reply::Started).map_err(anyhow::Error::from);
        let sent = match started {
            Ok(m) => tokio::io::AsyncWriteExt::write_all(stream, &m)
                .await
                .map_err(anyhow::Error::from),
            Err(e) => Err(e),
        };
        if let Err(e) = sent {
            log::warn!("profile {id}: telling record that its profile started: {e}");
        }
    }
    let (mut notes, to_inject) = if spec.targets.running {
        settle_starting_clients(id, &spec.targets).await;
        take_running(service, id, spec, requester, requester_pid)
    } else {
        Default::default()
    };
    // Each on a blocking thread: the service keeps serving meanwhile.
    let mut injections = tokio::task::JoinSet::new();
    for req in to_inject {
        let (service, book) = (Arc::clone(service), book.clone());
        injections.spawn(async move {
            let injector = Arc::clone(&service.injector);
            injector
                .inject(req, book, service.triggers.as_ref(), &service.hub)
                .await
        });
    }
    let deadline = spec
        .duration_ms
        .map(|ms| tokio::time::Instant::now() + Duration::from_millis(ms));
    let mut dumps = spec.dumps.continuous.map(|c| {
        let period = Duration::from_millis(u64::from(c.interval_ms));
        let first = tokio::time::Instant::now() + Duration::from_millis(u64::from(c.phase_ms));
        let mut t = tokio::time::interval_at(first, period);
        // A late tick is not made up for with a burst of ticks (dumps asked
        // for within one tick of the coarse clock), as `record`'s own.
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    let mut byte = [0u8; 1];
    if !*stop.borrow() {
        loop {
            tokio::select! {
                _ = sleep_for(deadline) => break,
                // EOF or anything else from the command line: stop.
                _ = stream.read(&mut byte) => break,
                _ = stop.changed() => break,
                Some(r) = injections.join_next(), if !injections.is_empty() => {
                    notes.extend(r.ok().flatten());
                }
                _ = async { match dumps.as_mut() {
                    Some(t) => { t.tick().await; }
                    None => std::future::pending().await,
                } } => {
                    let asked = super::clock::read_clocks().monotonic_coarse_ns;
                    let _ = book.send(BookMsg::Service(ServiceMsg::Dump(id, asked)));
                }
            }
        }
    }
    // An injection still running ends first (bounded by its timeouts).
    while let Some(r) = injections.join_next().await {
        notes.extend(r.ok().flatten());
    }
    // The sessions other profiles keep end for this one at once (see
    // `service_book`): what their rings hold now is drained first, so the
    // trace has every record written before its end (bounded wait).
    let shared = service.hub.shared_by(id);
    for &(session, pid) in &shared {
        // A session admitted but not yet at its worker (its client may
        // have written, even exited, meanwhile) is waited for: a drain
        // asked before would not find it there.
        let until = tokio::time::Instant::now() + DRAIN_WAIT;
        while !service.hub.at_worker(session) && tokio::time::Instant::now() < until {
            tokio::time::sleep(AT_WORKER_POLL).await;
        }
        let done = service.stopper.drain_session(session, pid);
        let _ = tokio::task::spawn_blocking(move || done.recv_timeout(DRAIN_WAIT)).await;
    }
    if !shared.is_empty() {
        // ... and handled by the bookkeeping thread while this profile is
        // still on their routes.
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = book.send(BookMsg::Service(ServiceMsg::Barrier(tx)));
        let _ = tokio::task::spawn_blocking(move || rx.recv_timeout(DRAIN_WAIT)).await;
    }
    // New processes stop connecting for it before its sessions are drained;
    // a synchronous session the service started is ended inside the
    // process first.
    for (session, pid) in service.hub.end_profile(id) {
        service.injector.end_sync(pid).await;
        service.stopper.stop_session(session, pid);
    }
    service.update_store();
    let (tx, rx) = std::sync::mpsc::channel();
    let _ = book.send(BookMsg::Service(ServiceMsg::End(id, tx)));
    let summary = tokio::task::spawn_blocking(move || rx.recv())
        .await
        .context("waiting for the trace")?
        .context("the bookkeeping thread stopped")??;
    let processes = summary.processes.iter().filter(|p| p.profiled()).count();
    let plural = if processes == 1 { "" } else { "es" };
    log::info!("profile {id} ({what}) ended: {processes} process{plural}");
    let mut text = String::new();
    for n in &notes {
        text.push_str(n);
        text.push('\n');
    }
    text.push_str(&summary.render(&req.output_path));
    Ok(Reply::Done {
        summary: text,
        processes,
    })
}

/// A process this young that preloads the client but does not catch the
/// activation signal yet may still be starting: see
/// [`settle_starting_clients`].
const STARTING: Duration = Duration::from_secs(2);
/// How long [`settle_starting_clients`] waits at most.
const SETTLE_WAIT: Duration = Duration::from_secs(1);

/// Waits, a bounded time, until every process `targets` names that started
/// moments ago with the client preloaded catches the activation signal
/// (its client's constructor ran) or exits. Until then it has no session
/// and takes no signal, so [`take_running`] would load a second client
/// into it with ptrace in the middle of its start, while its own client
/// connects from its start: a program started just after a `-n` profile
/// was added lost its samples to that race. Only processes named (`-n`,
/// `--pid`) are waited for: `--all` loads no client into anyone.
async fn settle_starting_clients(id: ProfileId, targets: &Targets) {
    if targets.names.is_empty() && targets.pids.is_empty() {
        return;
    }
    let named = Targets {
        all: false,
        ..targets.clone()
    };
    let until = tokio::time::Instant::now() + SETTLE_WAIT;
    let mut told = std::collections::HashSet::new();
    loop {
        let starting: Vec<_> = running::find(&named)
            .into_iter()
            .filter(|f| {
                !running::catches_activation_signal(f.pid)
                    && super::service_scan::age(f.pid).is_some_and(|a| a < STARTING)
                    && running::preloads_client(f.pid)
            })
            .collect();
        for f in &starting {
            if told.insert(f.pid) {
                log::info!(
                    "profile {id}: pid {} ({}) is starting: waiting for its client",
                    f.pid,
                    f.name
                );
            }
        }
        if starting.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= until {
            for f in &starting {
                log::info!(
                    "profile {id}: pid {} ({}) has not started its client after {:?}; \
                     taken as it is",
                    f.pid,
                    f.name,
                    SETTLE_WAIT
                );
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Takes in the running processes profile `id` wants: shares a session
/// another profile has (or is flagged `rejected_concurrent` when that one
/// samples differently), else wakes a preloaded dormant client with the
/// activation signal, else (not for `--all`) returns it to be given the
/// client with ptrace. A profile of threads (`--cpu-time`, `--event`)
/// returns a wakeable glibc client too, unless `--all` alone takes it: it
/// is activated with ptrace, and woken with the signal only if that fails.
/// Returns what `record` should be told about processes it did not get,
/// and the injections to run.
fn take_running(
    service: &Service,
    id: ProfileId,
    spec: &ProfileSpec,
    requester: u32,
    requester_pid: u32,
) -> (Vec<String>, Vec<InjectRequest>) {
    let book = service.book.clone();
    let mut notes = Vec::new();
    let mut inject = Vec::new();
    let samples_threads = spec.sampling.cpu_period_ns != 0 || spec.sampling.perf_event != 0;
    for found in running::find(&spec.targets) {
        let pid = found.pid;
        if pid == requester_pid && !spec.targets.pids.contains(&pid) {
            // `record` itself, found by name or by --all (its own client,
            // installed system-wide): it would only profile its waiting.
            continue;
        }
        // Only what the requester may profile is woken (root's service
        // could signal anyone's); a pid asked for by number is named.
        if !running::effective_uid(pid).is_some_and(|u| access::may_profile(requester, u)) {
            if spec.targets.pids.contains(&pid) {
                notes.push(format!(
                    "pid {pid} ({}) belongs to another user: not profiled",
                    found.name
                ));
            }
            continue;
        }
        match service.hub.join(id, pid) {
            Joined::Shared => {
                log::info!(
                    "profile {id}: pid {pid} ({}) shared with another profile",
                    found.name
                );
                continue;
            }
            Joined::Rejected => {
                notes.push(super::service_inject::flag_rejected(
                    &book,
                    id,
                    pid,
                    &found.name,
                ));
                continue;
            }
            Joined::NoSession => {}
        }
        let wakes = service.triggers.can_wake(pid);
        let by_all_alone = spec.targets.all && !spec.targets.pids.contains(&pid);
        if !wakes && by_all_alone {
            // --all takes the processes that have the client, as
            // heapprofd: none is given one.
            let why = format!(
                "pid {pid} ({}) has no dormant client that takes the wake-up signal \
                 (--all loads none); profile it with `record --pid {pid}`",
                found.name
            );
            log::info!("profile {id}: {why}");
            notes.push(why);
            continue;
        }
        if !running::directed_here(pid, &service.dir, service.default_dir) {
            let why = format!(
                "pid {pid} ({}) would not connect to this service (its environment's \
                 HEAPPROFD_SOCKET or HEAPPROFD_SERVICE_DIR, or their absence, leads its \
                 client elsewhere); not profiled",
                found.name
            );
            log::info!("profile {id}: {why}");
            if !spec.targets.all {
                notes.push(why);
            }
            continue;
        }
        service.hub.expect(id, pid);
        // A profile of threads activates a dormant client with ptrace too
        // (not for --all, which never ptraces): the signal only starts it
        // at the program's next allocation, maybe never.
        let activate =
            wakes && samples_threads && !by_all_alone && service.triggers.ptrace_activates(pid);
        if !wakes || activate {
            // Loaded with ptrace ([`super::service_inject`]), unless another
            // profile is doing so now: the session is then shared.
            if service.injector.claim(pid) {
                inject.push(InjectRequest {
                    profile: id,
                    pid,
                    name: found.name,
                    requester,
                    samples_threads,
                    wake_fallback: activate,
                });
            } else {
                log::info!(
                    "profile {id}: pid {pid} ({}) is being given the profiler for \
                     another profile",
                    found.name
                );
            }
            continue;
        }
        match service.triggers.wake(pid) {
            Ok(()) => log::info!(
                "profile {id}: woke pid {pid} ({}) with signal {}",
                found.name,
                heapprofd_inject::ACTIVATION_SIGNAL
            ),
            Err(e) => {
                log::warn!("profile {id}: pid {pid} ({}): {e:#}", found.name);
                notes.push(format!("pid {pid} ({}): {e:#}", found.name));
            }
        }
    }
    (notes, inject)
}

/// Sleeps until `deadline` (an instant, so making the future anew on each
/// turn of the loop does not move it); forever without one.
pub(super) async fn sleep_for(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(targets: Targets) -> ProfileSpec {
        let mut s = ProfileSpec {
            targets,
            ..ProfileSpec::default()
        };
        s.sampling.interval = 4096;
        s.sampling.shmem_size = 2 << 20;
        s
    }

    #[test]
    fn only_a_profile_of_every_process_leaves_the_free_sets_unfaulted() {
        let named = spec(Targets {
            names: vec!["python3".into()],
            ..Targets::default()
        });
        let pids = spec(Targets {
            pids: vec![42],
            ..Targets::default()
        });
        let all = spec(Targets {
            all: true,
            ..Targets::default()
        });
        let flag = |s: &ProfileSpec| client_config(s).unwrap().prefault_free_set();
        assert!(flag(&named));
        assert!(flag(&pids));
        assert!(!flag(&all));
        // The other flags do not depend on the targets.
        let (a, n) = (client_config(&all).unwrap(), client_config(&named).unwrap());
        assert_eq!(
            a.flags | ClientConfig::FLAG_PREFAULT_FREE_SET,
            n.flags,
            "only the prefault differs"
        );
    }
}
