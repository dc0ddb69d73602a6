//! The listening socket, the accept loop, and the threads behind it.
//!
//! [`Daemon::start`] binds the socket (mode 0600), starts the worker threads
//! and the bookkeeping thread, and returns a handle; [`Daemon::serve`] is the
//! accept loop (a tokio task). Each accepted connection gets its handshake
//! ([`super::handshake`]: received on the runtime under one deadline, then
//! checked and answered on a blocking thread, at most
//! [`MAX_ESTABLISHING`] at a time), then belongs to one worker (by pid); a
//! small task per session turns socket activity (wake bytes, EOF) into
//! worker messages. At most [`MAX_PENDING_HANDSHAKES`] connections are in
//! their handshake at once; more are closed at once, so a flood of
//! connections costs neither threads nor unbounded descriptors.
//!
//! [`Daemon::finish`] first closes the door: the accept loop takes the
//! connections already queued on the socket and stops, every handshake in
//! flight hands its session to a worker (or fails), and only then are the
//! workers told to stop. A program that exits right after its handshake
//! (record's blocking start-up) is in the trace even when `record` sees the
//! exit before the session reached a worker.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use heapprofd_proto::wire::ClientConfig;
use heapprofd_unwinder::{ModuleCache, SymbolStore, SymbolizeOptions};
use nix::sys::stat::{Mode, umask};
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;

use super::book_thread;
use super::bookkeeper::{BookkeeperOptions, BookkeeperShared};
use super::dump_request::DumpRequests;
use super::handshake::{Accepted, HANDSHAKE_TIMEOUT, PeerAccess, establish, receive};
use super::maps_keeper::MapsKeeper;
use super::spare_ring::SpareRing;
pub use super::stopper::Stopper;
use super::stopper::worker_of;
use super::summary::Summary;
use super::symbolize::Symbolizer;
use super::worker::{WorkerMsg, WorkerOptions, run_worker};
use super::{BookMsg, Counters};
use heapprofd_model::messages::{SessionEvent, SessionId, Unprofilable};
use heapprofd_model::profile::Interner;

/// Everything the daemon needs to know to serve clients.
#[derive(Debug)]
pub struct DaemonOptions {
    /// Where to listen.
    pub socket: PathBuf,
    /// Configuration sent to every client.
    pub client: ClientConfig,
    /// Unwinding worker threads.
    pub workers: usize,
    /// Symbolize frames.
    pub symbolize: bool,
    /// Where symbolization answers are kept between runs, if anywhere
    /// ([`heapprofd_unwinder::SymbolStore`]).
    pub symbol_store: Option<PathBuf>,
    /// Bookkeeping and trace options.
    pub book: BookkeeperOptions,
}

/// The part of [`DaemonOptions`] without the bookkeeping (the service runs
/// its own bookkeeping thread, [`Daemon::start_with`]).
#[derive(Debug)]
pub struct ServerOptions {
    /// Where to listen.
    pub socket: PathBuf,
    /// Configuration sent to every client (without an [`Admit`]).
    pub client: ClientConfig,
    /// Unwinding worker threads.
    pub workers: usize,
    /// Symbolize frames.
    pub symbolize: bool,
    /// Where symbolization answers are kept between runs, if anywhere.
    pub symbol_store: Option<PathBuf>,
    /// Who decides which connecting processes are wanted.
    pub admit: Option<Arc<dyn Admit>>,
}

/// Decides per connecting process whether it is wanted, and its
/// configuration (the service, [`super::hub`]); without one every process
/// that may connect is profiled with [`ServerOptions::client`].
pub trait Admit: Send + Sync + std::fmt::Debug {
    /// Process `pid` connects as session `session` (`from_startup`: from
    /// its constructor; `uid`: its effective user, from `SO_PEERCRED`):
    /// the configuration to send, or `None` to refuse it.
    fn admit(
        &self,
        session: SessionId,
        pid: u32,
        uid: u32,
        from_startup: bool,
    ) -> Option<ClientConfig>;
    /// The session reached its worker (a drain asked from now on finds it
    /// there): whether some profile still wants it (one that ended
    /// meanwhile could not stop it).
    fn reached_worker(&self, session: SessionId) -> bool;
    /// An admitted session never reached a worker (its handshake failed).
    fn abandoned(&self, session: SessionId);
}

/// What runs the bookkeeping thread: its messages and the shared objects.
pub type BookRunner = Box<dyn FnOnce(mpsc::Receiver<BookMsg>, BookkeeperShared) + Send>;

/// How long [`Daemon::finish`] waits for the accept loop to stop and for
/// handshakes in flight (each bounded by its 2 s deadline).
const HANDOFF_WAIT: Duration = Duration::from_secs(5);
/// The symbol store's budget on disk: the oldest files go beyond it.
const SYMBOL_STORE_BYTES: u64 = 256 << 20;
/// Connections in their handshake at most; more are closed at once.
pub const MAX_PENDING_HANDSHAKES: usize = 128;
/// Handshakes in their blocking part (descriptor checks, maps, ring
/// buffer) at once.
pub const MAX_ESTABLISHING: usize = 8;
/// Refused connections logged as warnings; later ones only with
/// `HEAPPROFD_DEBUG` (a flood of hostile connections must not flood stderr).
const REFUSALS_WARNED: u64 = 5;

/// A running daemon.
#[derive(Debug)]
pub struct Daemon {
    listener: Option<UnixListener>,
    /// The running accept loop: how to stop it and learn that it stopped.
    accepting: Option<(oneshot::Sender<()>, mpsc::Receiver<()>)>,
    socket: PathBuf,
    shared: Arc<Shared>,
    worker_threads: Vec<JoinHandle<()>>,
    book_tx: mpsc::Sender<BookMsg>,
    book_thread: Option<JoinHandle<()>>,
    /// Its times go into the `costs:` line.
    symbolizer: Arc<Symbolizer>,
    /// Started by the first dump asked for.
    dumps: std::sync::OnceLock<DumpRequests>,
}

#[derive(Debug)]
struct Shared {
    client: ClientConfig,
    admit: Option<Arc<dyn Admit>>,
    cache: Arc<ModuleCache>,
    workers: Vec<mpsc::Sender<WorkerMsg>>,
    counters: Arc<Counters>,
    next_id: AtomicU64,
    /// Whose processes may connect.
    access: std::sync::Mutex<PeerAccess>,
    /// Connections accepted whose session has not reached a worker yet.
    in_flight: AtomicUsize,
    /// Unprofilable notices not noted yet (they wait for `in_flight`, and
    /// `finish` waits for them).
    notices_in_flight: AtomicUsize,
    /// Permits for the blocking part of a handshake.
    establishing: Arc<tokio::sync::Semaphore>,
    /// Connections refused so far.
    refusals: AtomicU64,
    /// The bookkeeping thread (notices of processes that run unprofiled).
    book: mpsc::Sender<BookMsg>,
    /// A ring made ready for the next handshake (`record`'s own daemon only:
    /// every client there gets the same size).
    spare: Option<Arc<SpareRing>>,
    /// Pids already noted as running unprofiled: each is noted once, and at
    /// most [`MAX_UNPROFILABLE`] in all (a peer cannot flood the trace or
    /// the terminal with notices).
    unprofilable: std::sync::Mutex<std::collections::HashSet<u32>>,
}

/// Most processes one daemon notes as running unprofiled; later notices are
/// counted as refusals.
const MAX_UNPROFILABLE: usize = 4096;

/// Longest an unprofilable notice waits for the connections in flight
/// before it (see `handle_connection`).
const NOTICE_WAIT: Duration = Duration::from_secs(1);

/// Counts a connection in [`Shared::in_flight`] until dropped.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(shared))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An unprofilable notice in [`Shared::notices_in_flight`] until dropped:
/// made from the connection's [`InFlight`], which it then gives up (the
/// count goes from one to the other with no moment in neither).
struct NoticeInFlight(Arc<Shared>);

impl NoticeInFlight {
    fn from(connection: InFlight) -> Self {
        connection
            .0
            .notices_in_flight
            .fetch_add(1, Ordering::AcqRel);
        let shared = Arc::clone(&connection.0);
        drop(connection);
        NoticeInFlight(shared)
    }
}

impl Drop for NoticeInFlight {
    fn drop(&mut self) {
        self.0.notices_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Daemon {
    /// Binds the socket and starts the worker and bookkeeping threads.
    pub fn start(options: DaemonOptions, counters: Arc<Counters>) -> Result<Daemon> {
        let DaemonOptions {
            socket,
            client,
            workers,
            symbolize,
            symbol_store,
            book,
        } = options;
        let server = ServerOptions {
            socket,
            client,
            workers,
            symbolize,
            symbol_store,
            admit: None,
        };
        let runner: BookRunner = Box::new(move |rx, shared| book_thread::run(rx, shared, book));
        Self::start_with(server, counters, runner)
    }

    /// [`Daemon::start`] with another bookkeeping thread (`runner`).
    pub fn start_with(
        options: ServerOptions,
        counters: Arc<Counters>,
        runner: BookRunner,
    ) -> Result<Daemon> {
        let listener = bind_private(&options.socket)
            .with_context(|| format!("cannot listen on {}", options.socket.display()))?;
        let interner = Arc::new(Interner::new());
        let symbolizer = Arc::new(Symbolizer::new());
        let symbolize = SymbolizeOptions {
            enabled: options.symbolize,
            store: options
                .symbol_store
                .clone()
                .map(|dir| Arc::new(SymbolStore::new(dir, SYMBOL_STORE_BYTES))),
            ..SymbolizeOptions::default()
        };
        let cache = Arc::new(ModuleCache::new(symbolize));
        let (book_tx, book_rx) = mpsc::channel();
        let book_thread = {
            let shared = BookkeeperShared {
                interner: Arc::clone(&interner),
                symbolizer: Arc::clone(&symbolizer),
                counters: Arc::clone(&counters),
            };
            std::thread::Builder::new()
                .name("heapprofd-book".into())
                .spawn(move || runner(book_rx, shared))
                .context("starting the bookkeeping thread")?
        };
        let mut workers = Vec::new();
        let mut worker_threads = Vec::new();
        for i in 0..options.workers.max(1) {
            let (tx, rx) = mpsc::channel();
            let book = book_tx.clone();
            let interner = Arc::clone(&interner);
            let symbolizer = Arc::clone(&symbolizer);
            let counters = Arc::clone(&counters);
            let wopts = WorkerOptions {
                symbolize: options.symbolize,
            };
            let handle = std::thread::Builder::new()
                .name(format!("heapprofd-unwind-{i}"))
                .spawn(move || run_worker(rx, book, interner, symbolizer, counters, wopts))
                .context("starting an unwinding thread")?;
            workers.push(tx);
            worker_threads.push(handle);
        }
        let spare = options.admit.is_none().then(Arc::default);
        let shared = Arc::new(Shared {
            client: options.client,
            admit: options.admit,
            cache,
            workers,
            counters,
            next_id: AtomicU64::new(1),
            access: std::sync::Mutex::new(PeerAccess::Own { extra_uid: None }),
            in_flight: AtomicUsize::new(0),
            notices_in_flight: AtomicUsize::new(0),
            establishing: Arc::new(tokio::sync::Semaphore::new(MAX_ESTABLISHING)),
            refusals: AtomicU64::new(0),
            book: book_tx.clone(),
            spare,
            unprofilable: std::sync::Mutex::new(std::collections::HashSet::new()),
        });
        Ok(Daemon {
            listener: Some(listener),
            accepting: None,
            socket: options.socket,
            shared,
            worker_threads,
            book_tx,
            book_thread: Some(book_thread),
            symbolizer,
            dumps: std::sync::OnceLock::new(),
        })
    }

    /// The module cache the sessions unwind with.
    pub fn module_cache(&self) -> Arc<ModuleCache> {
        Arc::clone(&self.shared.cache)
    }

    /// The socket path clients connect to.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Lets processes of user `uid` connect too (root attaching to another
    /// user's process): the socket is given to that user, and its peers are
    /// accepted besides the daemon's own user and root.
    pub fn allow_user(&self, uid: u32, gid: u32) -> Result<()> {
        std::os::unix::fs::chown(&self.socket, Some(uid), Some(gid))
            .with_context(|| format!("giving {} to uid {uid}", self.socket.display()))?;
        *lock(&self.shared.access) = PeerAccess::Own {
            extra_uid: Some(uid),
        };
        Ok(())
    }

    /// For a service run by root: takes the processes that a profile asked
    /// for by user `uid` may see ([`crate::service::access`]): everyone's
    /// for root (the socket becomes mode 0666), else only that user's (the
    /// socket is given to the user, mode 0600; root's processes are refused
    /// too).
    pub fn serve_requester(&self, uid: u32, gid: u32) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let access = if uid == 0 {
            std::fs::set_permissions(&self.socket, std::fs::Permissions::from_mode(0o666))
                .with_context(|| format!("opening {} to every user", self.socket.display()))?;
            PeerAccess::Anyone
        } else {
            std::os::unix::fs::chown(&self.socket, Some(uid), Some(gid))
                .with_context(|| format!("giving {} to uid {uid}", self.socket.display()))?;
            PeerAccess::Only(uid)
        };
        *lock(&self.shared.access) = access;
        Ok(())
    }

    /// Starts accepting clients on the current tokio runtime.
    pub fn serve(&mut self) {
        let Some(listener) = self.listener.take() else {
            return;
        };
        let shared = Arc::clone(&self.shared);
        let (stop_tx, mut stop) = oneshot::channel();
        let (done, done_rx) = mpsc::channel();
        self.accepting = Some((stop_tx, done_rx));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    r = listener.accept() => match r.and_then(|(s, _)| s.into_std()) {
                        Ok(stream) => spawn_connection(stream, &shared),
                        Err(e) => {
                            log::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    },
                    _ = &mut stop => break,
                }
            }
            // Clients whose connect() already returned are served; the
            // socket then closes and later ones are refused at once.
            if let Ok(listener) = listener.into_std() {
                let _ = listener.set_nonblocking(true);
                while let Ok((stream, _)) = listener.accept() {
                    spawn_connection(stream, &shared);
                }
            }
            let _ = done.send(());
        });
    }

    /// Makes the ring of the next client ready on the blocking pool (see
    /// [`SpareRing`]; `record`'s own daemon only): call it when a client is
    /// about to come, and there is time (CMD spawned, or before an attach).
    /// Later ones are made after each handshake from the second on.
    pub fn prepare_ring(&self) {
        if let Some(spare) = &self.shared.spare {
            spare.prepare_on_pool(self.shared.client.shmem_size);
        }
    }

    /// Records that process `pid` runs unprofiled, and says so (a client's
    /// notice, or `record` found CMD statically linked): it is in the
    /// trace, flagged, and the summary names it instead of counting it.
    pub fn note_unprofilable(&self, pid: u32, cmdline: Vec<String>, why: Unprofilable) {
        note_unprofilable(&self.shared, pid, cmdline, why);
    }

    /// Asks for a dump of every process now (SIGUSR1, continuous dumps).
    /// The dump covers every record written before it was asked (see
    /// [`super::dump_request`]).
    pub fn dump(&self) {
        let asked = super::clock::read_clocks().monotonic_coarse_ns;
        self.dumps
            .get_or_init(|| {
                let shared = Arc::clone(&self.shared);
                DumpRequests::start(
                    move || shared.in_flight.load(Ordering::Acquire),
                    self.shared.workers.clone(),
                    self.book_tx.clone(),
                )
            })
            .ask(asked);
    }

    /// A sender to the bookkeeping thread.
    pub fn book(&self) -> mpsc::Sender<BookMsg> {
        self.book_tx.clone()
    }

    /// What stops single sessions (for another thread or task).
    pub fn stopper(&self) -> Stopper {
        Stopper(self.shared.workers.clone())
    }

    /// Stops every session (clients stop writing), drains what they wrote,
    /// writes the final dump and closes the trace.
    pub fn finish(mut self) -> Result<Summary> {
        let t0 = Instant::now();
        if let Some((stop, done)) = self.accepting.take() {
            let _ = stop.send(());
            let _ = done.recv_timeout(HANDOFF_WAIT);
        }
        // Handshakes on their way to a worker, and notices on their way to
        // the bookkeeping (a notice waits for the handshakes, at most
        // NOTICE_WAIT, less than this waits).
        const _: () = assert!(HANDOFF_WAIT.as_millis() > NOTICE_WAIT.as_millis());
        let deadline = Instant::now() + HANDOFF_WAIT;
        while (self.shared.in_flight.load(Ordering::Acquire) > 0
            || self.shared.notices_in_flight.load(Ordering::Acquire) > 0)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        for w in &self.shared.workers {
            let _ = w.send(WorkerMsg::StopAll);
        }
        let t_accept = t0.elapsed();
        for t in self.worker_threads.drain(..) {
            let _ = t.join();
        }
        let t_drain = t0.elapsed();
        let (tx, rx) = mpsc::channel();
        let (named_tx, named) = mpsc::channel();
        let _ = self.book_tx.send(BookMsg::Finish(tx, named_tx));
        // The symbol store is written while the trace is, once the final
        // dump's names are all found (or after, if the bookkeeping says not).
        let early = named.recv().is_ok();
        if early {
            super::symbol_cache::persist(&self.shared.cache);
        }
        let result = rx
            .recv()
            .context("the bookkeeping thread stopped unexpectedly")?;
        if let Some(t) = self.book_thread.take() {
            let _ = t.join();
        }
        if !early {
            super::symbol_cache::persist(&self.shared.cache);
        }
        let (symbolize, warm) = self.symbolizer.time_spent();
        log::debug!("{}", self.shared.counters.costs.render(symbolize, warm));
        log::debug!(
            "finish: accepting stopped after {:.1} ms, sessions drained after {:.1} ms, \
             final dump written after {:.1} ms",
            t_accept.as_secs_f64() * 1e3,
            t_drain.as_secs_f64() * 1e3,
            t0.elapsed().as_secs_f64() * 1e3
        );
        let _ = std::fs::remove_file(&self.socket);
        result
    }

    /// [`Daemon::finish`] in a process that exits next: the modules' parsed
    /// debug information, the profile's maps and the rest are not freed one
    /// allocation at a time (7-10 ms at the end of every `record` of
    /// sqlite3, measured) but with the process. The socket is removed, as
    /// by `finish`.
    pub fn finish_before_exit(self) -> Result<Summary> {
        let shared = Arc::clone(&self.shared);
        let result = self.finish();
        std::mem::forget(shared);
        result
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves one accepted connection on its own task, counted in flight until
/// its session reaches a worker (or closes it at once when too many are).
fn spawn_connection(stream: std::os::unix::net::UnixStream, shared: &Arc<Shared>) {
    if shared.in_flight.load(Ordering::Acquire) >= MAX_PENDING_HANDSHAKES {
        refused(
            shared,
            format_args!(
                "a connection: {MAX_PENDING_HANDSHAKES} handshakes are already in progress"
            ),
        );
        return;
    }
    let in_flight = InFlight::new(shared);
    let shared = Arc::clone(shared);
    tokio::spawn(async move { handle_connection(stream, shared, in_flight).await });
}

/// Logs a refused connection (the first few as warnings).
fn refused(shared: &Shared, what: std::fmt::Arguments<'_>) {
    let n = shared.refusals.fetch_add(1, Ordering::Relaxed) + 1;
    if n <= REFUSALS_WARNED {
        log::warn!("client refused: {what}");
        if n == REFUSALS_WARNED {
            log::warn!("further refused clients are only logged with HEAPPROFD_DEBUG");
        }
    } else {
        log::debug!("client refused: {what}");
    }
}

async fn handle_connection(
    std_stream: std::os::unix::net::UnixStream,
    shared: Arc<Shared>,
    in_flight: InFlight,
) {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let access = *lock(&shared.access);
    let received = match receive(std_stream, access, deadline).await {
        Ok(Accepted::Session(r)) => r,
        Ok(Accepted::Unprofilable { pid, why, cmdline }) => {
            // A process that execs a program that cannot load the client
            // says so on a new connection, after its own session's reply:
            // that session may still be on its way to its worker, and its
            // start must reach the bookkeeping before this notice (see
            // `note_unprofilable`). So the notice waits, a bounded time,
            // until no other connection is in flight. `finish` waits for
            // the notice in turn: noted after the workers stopped, it was
            // lost (`hostile_peers` lost a pid so in the installed pass).
            let _notice = NoticeInFlight::from(in_flight);
            let until = tokio::time::Instant::now() + NOTICE_WAIT;
            while shared.in_flight.load(Ordering::Acquire) > 0
                && tokio::time::Instant::now() < until
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            note_unprofilable(&shared, pid, cmdline, why);
            return;
        }
        Err(e) => {
            refused(&shared, format_args!("{e:#}"));
            return;
        }
    };
    let pid = received.peer.pid;
    let id: SessionId = shared.next_id.fetch_add(1, Ordering::Relaxed);
    // Until the session reaches its worker, a failure abandons it.
    let (config, admitted) = match &shared.admit {
        None => (shared.client, Admitted(None)),
        Some(a) => {
            let from_startup =
                received.handshake.flags & heapprofd_proto::wire::Handshake::FLAG_FROM_STARTUP != 0;
            match a.admit(id, pid, received.peer.uid, from_startup) {
                Some(c) => (c, Admitted(Some((Arc::clone(a), id)))),
                None => {
                    refused(&shared, format_args!("pid {pid}: no profile wants it"));
                    return;
                }
            }
        }
    };
    let permit = tokio::time::timeout_at(
        deadline.into(),
        Arc::clone(&shared.establishing).acquire_owned(),
    )
    .await;
    let Ok(Ok(permit)) = permit else {
        refused(
            &shared,
            format_args!("pid {pid}: the daemon is busy with {MAX_ESTABLISHING} other handshakes"),
        );
        return;
    };
    let sh = Arc::clone(&shared);
    let joined = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        establish(*received, &config, &sh.cache, sh.spare.as_deref())
    })
    .await;
    let session = match joined {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => {
            refused(&shared, format_args!("{e:#}"));
            None
        }
        Err(e) => {
            log::warn!("handshake task failed: {e}");
            None
        }
    };
    let Some(mut session) = session else {
        return;
    };
    if let Some(spare) = shared.spare.as_ref().filter(|_| id >= 2) {
        // A program that started a second process is likely to start more
        // (a shell, make): the next one's ring is made now (`SpareRing`).
        spare.prepare_on_pool(shared.client.shmem_size);
    }
    let keeper = session.keeper.take();
    let watch = match session.stream.try_clone().and_then(|s| {
        s.set_nonblocking(true)?;
        UnixStream::from_std(s)
    }) {
        Ok(w) => w,
        Err(e) => {
            log::warn!("cannot watch the socket of pid {}: {e}", session.peer.pid);
            return;
        }
    };
    let worker = worker_of(&shared.workers, session.peer.pid);
    shared.counters.sessions.fetch_add(1, Ordering::Relaxed);
    if worker.send(WorkerMsg::Add(id, Box::new(session))).is_err() {
        return;
    }
    admitted.reached_worker();
    if shared.admit.as_ref().is_some_and(|a| !a.reached_worker(id)) {
        let _ = worker.send(WorkerMsg::Stop(id));
    }
    drop(in_flight);
    let announce = shared.admit.is_some().then_some(pid);
    watch_socket(
        watch,
        id,
        worker.clone(),
        &shared.counters,
        announce,
        keeper,
    )
    .await;
    shared.counters.sessions.fetch_sub(1, Ordering::Relaxed);
}

/// An admitted session on its way to a worker; dropped before it got there,
/// tells the [`Admit`] it was abandoned.
struct Admitted(Option<(Arc<dyn Admit>, SessionId)>);

impl Admitted {
    fn reached_worker(mut self) {
        self.0 = None;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        if let Some((a, id)) = self.0.take() {
            a.abandoned(id);
        }
    }
}

/// Says that `pid` runs unprofiled and why, and tells the bookkeeping
/// through `pid`'s worker: a process that execs a program that cannot load
/// the client says so just before, and its session's start, which that
/// worker sends, must reach the bookkeeping first (the other way round,
/// the start of the old image's session was taken for a new image's and
/// cleared the process's `disconnected` flag: `unprofiled_e2e` failed
/// once in a loaded run). Its connection waits for the handshakes in
/// flight first, since that session's may not have reached its worker
/// yet (`unprofiled_e2e` failed so in a run with the client installed
/// system-wide).
fn note_unprofilable(shared: &Shared, pid: u32, cmdline: Vec<String>, why: Unprofilable) {
    {
        let mut noted = shared
            .unprofilable
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if noted.contains(&pid) {
            return;
        }
        if noted.len() >= MAX_UNPROFILABLE {
            refused(
                shared,
                format_args!("pid {pid}: {MAX_UNPROFILABLE} processes already noted as unprofiled"),
            );
            return;
        }
        noted.insert(pid);
    }
    let cmd = if cmdline.is_empty() {
        "?".to_string()
    } else {
        cmdline.join(" ")
    };
    log::warn!("pid {pid} (`{cmd}`) runs unprofiled: {}", why.describe());
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let event = SessionEvent::Unprofilable {
        id,
        pid,
        cmdline,
        why,
        identity: super::procinfo::read_identity(pid),
    };
    let event = Box::new(event);
    let worker = worker_of(&shared.workers, pid);
    if let Err(mpsc::SendError(WorkerMsg::Notice(event))) = worker.send(WorkerMsg::Notice(event)) {
        let _ = shared.book.send(BookMsg::Session(event));
    }
}

/// Turns wake bytes into pokes and EOF (or any error) into `Closed`.
/// The first byte also confirms that the client records (`Counters::confirmed`;
/// the service, `announce` set to the pid, also says so). A wake byte may
/// follow a maps ask: `keeper` answers it (see `maps_keeper`).
async fn watch_socket(
    mut sock: UnixStream,
    id: SessionId,
    worker: mpsc::Sender<WorkerMsg>,
    counters: &Counters,
    announce: Option<u32>,
    mut keeper: Option<MapsKeeper>,
) {
    let mut buf = [0u8; 256];
    let mut first = true;
    loop {
        match sock.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = worker.send(WorkerMsg::Closed(id));
                return;
            }
            Ok(_) => {
                if std::mem::take(&mut first) {
                    counters.confirmed.fetch_add(1, Ordering::Relaxed);
                    if let Some(pid) = announce {
                        log::info!("pid {pid} records (session {id})");
                    }
                }
                if worker.send(WorkerMsg::Poke(id)).is_err() {
                    return;
                }
                // A client about to exit may have asked for its maps.
                if let Some(k) = keeper.as_mut() {
                    k.on_wake().await;
                }
            }
        }
    }
}

/// The value behind `m`, also after a panic of another holder (a plain
/// value: nothing is left half-changed).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Binds a UNIX socket that only our user can connect to.
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Only the creation mask changes, restored right after bind.
    let old = umask(Mode::from_bits_truncate(0o177));
    let result = UnixListener::bind(path);
    umask(old);
    result
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
