//! Unwinding workers: each owns a set of sessions, drains their ring
//! buffers, unwinds and symbolizes malloc samples, and passes the results to
//! the bookkeeping thread in batches.
//!
//! Ownership: a session (ring buffer + `ProcessContext`) belongs to exactly
//! one worker for its whole life (chosen by pid), so no lock guards it. The
//! only shared state a worker touches is the [`Interner`] (new frames) and
//! the [`ModuleCache`](heapprofd_unwinder::ModuleCache) behind the process
//! contexts, both internally synchronised, plus relaxed counters in
//! [`Counters`].
//!
//! Draining follows heapprofd: read up to [`BATCH`] records, and if the
//! buffer still has more, go round again after the other sessions had their
//! turn; when a buffer is empty, set its reader-paused flag, read once more
//! (a writer that committed before seeing the flag will not wake us), and
//! only then sleep until the client pokes the socket. A poll that found
//! records but emptied the buffer does not pause: the session is polled
//! again `REPOLL` later ([`Repolls`]), so a steady stream of samples costs a
//! poll per period rather than a wake-up per sample. A tick every `TICK`
//! re-polls every session in case a wake byte was lost, however busy the
//! worker's channel is.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use heapprofd_shmem::{InPlace, Reader, RingBuffer};

use super::costs::Costs;
use super::endings::{EXIT_WAIT, Ending, Endings, send_end};
use super::handshake::{NewSession, has_exited};
use super::repolls::Repolls;
use super::session_unwinder::SessionUnwinder;
use super::stacks::InternCtx;
use super::symbolize::Symbolizer;
use super::{BookMsg, Counters};
use heapprofd_model::messages::{Op, RingStats, SessionEvent, SessionId, SessionStats};
use heapprofd_model::profile::{ClientError, Interner};

/// Records read from one session before the others get a turn.
pub const BATCH: usize = 1000;
/// After a poll that found records and emptied the buffer, poll again this
/// much later instead of asking to be woken: under a steady stream of
/// samples this turns one wake-up syscall per sample into one poll per
/// period (heapprofd re-polls after 100 ms; a shorter period keeps a
/// blocking client's waits short).
const REPOLL: Duration = Duration::from_millis(10);
/// How often idle sessions are polled even without a wake byte.
const TICK: Duration = Duration::from_millis(100);
/// How long a record reserved but never committed is waited for after the
/// client disconnected (a writer killed mid-record never commits).
const PENDING_GRACE: Duration = Duration::from_millis(500);

/// Messages to a worker.
#[derive(Debug)]
pub enum WorkerMsg {
    /// A new session to own.
    Add(SessionId, Box<NewSession>),
    /// The client poked the socket: records are waiting.
    Poke(SessionId),
    /// The client closed the socket (or died): drain what is left and finish.
    Closed(SessionId),
    /// Stop profiling this session: tell the client to stop writing, drain, finish.
    Stop(SessionId),
    /// Stop every session and exit the worker once they are drained.
    StopAll,
    /// Drain what this session's ring holds now (its operations reach the
    /// bookkeeping thread first), then answer: a profile that ends while
    /// other profiles keep the session gets every record written before
    /// its end. Answered at once for a session this worker does not have.
    Drain(SessionId, Sender<()>),
    /// Drain what every session's ring holds now, then answer (a dump
    /// asked now covers what was written before it: see
    /// `super::dump_request`).
    DrainAll(Sender<()>),
    /// An event for the bookkeeping thread that must come after what this
    /// worker already sent for its pid: a notice that the process runs
    /// unprofiled from now on (an exec of a program that cannot load the
    /// client) follows its session's start, whose worker this is.
    Notice(Box<SessionEvent>),
}

struct Session {
    id: SessionId,
    pid: u32,
    reader: Reader<Arc<RingBuffer>>,
    /// Turns its records into operations.
    unwinder: SessionUnwinder,
    /// Keeps the socket (and so the client's session) alive until we finish.
    _stream: std::os::unix::net::UnixStream,
    pidfd: Option<std::os::fd::OwnedFd>,
    closed_at: Option<Instant>,
    stopping: bool,
    /// When the daemon asked this session to stop.
    stopped_at: Option<Instant>,
    ring_corrupt: bool,
    /// The ring's unload epoch when the maps were last brought up to date
    /// for it (see `heapprofd_shmem`'s `drain`).
    unload_epoch: u32,
}

/// Options that shape how samples are turned into stacks.
#[derive(Debug, Clone, Copy)]
pub struct WorkerOptions {
    /// Symbolize frames (names, files, lines); otherwise only build id + rel_pc.
    pub symbolize: bool,
}

/// Runs a worker until it receives [`WorkerMsg::StopAll`] and has drained
/// every session.
pub fn run_worker(
    rx: Receiver<WorkerMsg>,
    book: Sender<BookMsg>,
    interner: Arc<Interner>,
    symbolizer: Arc<Symbolizer>,
    counters: Arc<Counters>,
    options: WorkerOptions,
) {
    let mut sessions: HashMap<SessionId, Session> = HashMap::new();
    let mut ready: VecDeque<SessionId> = VecDeque::new();
    let mut repolls = Repolls::default();
    let mut endings = Endings::default();
    let mut stop_all = false;
    let mut ops = Vec::with_capacity(BATCH);
    // Where records go that have no place of their own (see
    // `SessionUnwinder::handle_record`), shared by the worker's sessions.
    let mut scratch = Vec::with_capacity(64 * 1024);
    let mut next_tick = Instant::now() + TICK;
    let cx = InternCtx {
        interner: &interner,
        symbolizer: &symbolizer,
        symbolize: options.symbolize,
    };
    loop {
        // Every session drained and finished (what is left in `ready` and
        // `repolls` are ids of finished sessions).
        if stop_all && sessions.is_empty() {
            endings.finish_all(&book);
            return;
        }
        let now = Instant::now();
        repolls.take_due(now, &mut ready);
        if !endings.is_empty() {
            let newer = |pid| sessions.values().any(|s| s.pid == pid);
            endings.settle(now, newer, &book);
        }
        if now >= next_tick {
            next_tick = now + TICK;
            ready.extend(sessions.keys().copied());
        }
        let timeout = if ready.is_empty() {
            let wake = [repolls.next_due(), endings.next_due(now)]
                .into_iter()
                .flatten()
                .fold(next_tick, Instant::min);
            wake.saturating_duration_since(now)
        } else {
            Duration::ZERO
        };
        let msg = match rx.recv_timeout(timeout) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(WorkerMsg::StopAll),
        };
        match msg {
            Some(WorkerMsg::Add(id, s)) => {
                let s = *s;
                let pid = s.peer.pid;
                let client_text = s.handshake.client_text_start..s.handshake.client_text_end;
                let _ = book.send(BookMsg::Session(Box::new(SessionEvent::Started {
                    id,
                    pid,
                    cmdline: s.cmdline,
                    from_startup: s.handshake.flags
                        & heapprofd_proto::wire::Handshake::FLAG_FROM_STARTUP
                        != 0,
                    started_ns: s.started_ns,
                    identity: s.identity,
                    memory: s.memory,
                })));
                sessions.insert(
                    id,
                    Session {
                        id,
                        pid,
                        reader: Reader::new(s.ring),
                        unwinder: SessionUnwinder::pending(s.process, client_text, id),
                        _stream: s.stream,
                        pidfd: s.pidfd,
                        closed_at: None,
                        stopping: false,
                        stopped_at: None,
                        unload_epoch: 0,
                        ring_corrupt: false,
                    },
                );
                ready.push_back(id);
            }
            Some(WorkerMsg::Poke(id)) => ready.push_back(id),
            Some(WorkerMsg::Notice(e)) => {
                let _ = book.send(BookMsg::Session(e));
            }
            Some(WorkerMsg::Closed(id)) => {
                if let Some(s) = sessions.get_mut(&id) {
                    s.closed_at.get_or_insert_with(Instant::now);
                    ready.push_back(id);
                }
            }
            Some(WorkerMsg::Stop(id)) => {
                if let Some(s) = sessions.get_mut(&id) {
                    s.stopping = true;
                    s.stopped_at.get_or_insert_with(Instant::now);
                    s.reader.ring().set_shutdown();
                    ready.push_back(id);
                }
            }
            Some(WorkerMsg::StopAll) => {
                stop_all = true;
                for s in sessions.values_mut() {
                    s.stopping = true;
                    s.stopped_at.get_or_insert_with(Instant::now);
                    s.reader.ring().set_shutdown();
                }
                ready.extend(sessions.keys().copied());
            }
            Some(WorkerMsg::Drain(id, done)) => {
                let s = &mut sessions;
                drain_now(id, s, &mut endings, &mut scratch, &cx, &book, &counters);
                let _ = done.send(());
            }
            Some(WorkerMsg::DrainAll(done)) => {
                let ids: Vec<SessionId> = sessions.keys().copied().collect();
                for id in ids {
                    let s = &mut sessions;
                    drain_now(id, s, &mut endings, &mut scratch, &cx, &book, &counters);
                }
                let _ = done.send(());
            }
            // A re-poll or the tick is due: the top of the loop queues it.
            None => {}
        }
        // One batch for the session at the front; more work goes to the back.
        if let Some(id) = ready.pop_front() {
            // Drop duplicates of this id further back: one turn covers them.
            ready.retain(|&r| r != id);
            let Some(session) = sessions.get_mut(&id) else {
                continue;
            };
            let state = drain_batch(session, &mut scratch, &mut ops, &cx, &counters);
            send_ops(id, session, &mut ops, &book);
            match state {
                DrainState::More => ready.push_back(id),
                DrainState::Drained => repolls.schedule(id, Instant::now() + REPOLL),
                DrainState::Idle => {}
                DrainState::Finished => {
                    if let Some(s) = sessions.remove(&id) {
                        finish(s, &mut endings, &book, &counters);
                    }
                }
            }
        }
    }
}

/// Longest one [`drain_now`] reads a session whose client keeps writing
/// as fast as it is read (the rest waits for the session's next turn).
const DRAIN_NOW_LIMIT: Duration = Duration::from_millis(500);

/// Drains session `id` until its ring is empty (or it finished, or
/// [`DRAIN_NOW_LIMIT`] passed), sending its operations batch by batch.
fn drain_now(
    id: SessionId,
    sessions: &mut HashMap<SessionId, Session>,
    endings: &mut Endings,
    scratch: &mut Vec<u8>,
    cx: &InternCtx<'_>,
    book: &Sender<BookMsg>,
    counters: &Counters,
) {
    let Some(session) = sessions.get_mut(&id) else {
        return;
    };
    let mut ops = Vec::with_capacity(BATCH);
    let deadline = Instant::now() + DRAIN_NOW_LIMIT;
    loop {
        let state = drain_batch(session, scratch, &mut ops, cx, counters);
        send_ops(id, session, &mut ops, book);
        match state {
            DrainState::More if Instant::now() >= deadline => return,
            DrainState::More => {}
            DrainState::Drained | DrainState::Idle => return,
            DrainState::Finished => {
                if let Some(s) = sessions.remove(&id) {
                    finish(s, endings, book, counters);
                }
                return;
            }
        }
    }
}

/// Sends what a batch of session `id` made (if anything) to the
/// bookkeeping thread, with the session's statistics.
fn send_ops(id: SessionId, session: &Session, ops: &mut Vec<Op>, book: &Sender<BookMsg>) {
    if !ops.is_empty() {
        let batch = std::mem::replace(ops, Vec::with_capacity(BATCH));
        let _ = book.send(BookMsg::Session(Box::new(SessionEvent::Ops {
            id,
            ops: batch,
            stats: session_stats(session),
        })));
    }
}

enum DrainState {
    /// The batch filled up; there may be more.
    More,
    /// Records were read and the buffer is now empty: poll again soon.
    Drained,
    /// Nothing to read; the reader is paused until the client pokes us.
    Idle,
    /// The session is over and fully drained.
    Finished,
}

fn drain_batch(
    s: &mut Session,
    scratch: &mut Vec<u8>,
    ops: &mut Vec<Op>,
    cx: &InternCtx<'_>,
    counters: &Counters,
) -> DrainState {
    let (samples, errors) = (s.unwinder.samples, s.unwinder.walker.unwind_errors);
    let records = s.reader.stats().reads_ok;
    let started = Instant::now();
    let state = drain_records(s, scratch, ops, cx);
    // New frames of this batch, if any, to the warm-up thread at once.
    cx.symbolizer.kick();
    let costs = &counters.costs;
    Costs::add_time(&costs.drain_ns, started.elapsed());
    costs
        .records
        .fetch_add(s.reader.stats().reads_ok - records, Ordering::Relaxed);
    costs
        .samples
        .fetch_add(s.unwinder.samples - samples, Ordering::Relaxed);
    // The status line's counters, once per batch rather than per sample.
    counters
        .samples
        .fetch_add(s.unwinder.samples - samples, Ordering::Relaxed);
    counters
        .unwind_errors
        .fetch_add(s.unwinder.walker.unwind_errors - errors, Ordering::Relaxed);
    state
}

fn drain_records(
    s: &mut Session,
    scratch: &mut Vec<u8>,
    ops: &mut Vec<Op>,
    cx: &InternCtx<'_>,
) -> DrainState {
    let mut reader_paused = false;
    let mut read_any = false;
    for _ in 0..BATCH {
        match s.reader.read_in_place() {
            InPlace::Record(record) => {
                let ring = record.ring();
                read_any = true;
                if reader_paused {
                    ring.unpause_reader();
                    reader_paused = false;
                }
                // Loaded after the record: an unload that happened before
                // it was written is seen (the record's commit publishes it).
                let epoch = ring.unload_epoch();
                if epoch != s.unload_epoch {
                    s.unload_epoch = epoch;
                    s.unwinder.objects_unloaded();
                }
                s.unwinder.handle_record(&record, scratch, ops, cx);
                if s.unwinder.take_resync() {
                    ring.request_stack_resync();
                }
            }
            outcome @ (InPlace::Empty | InPlace::Pending) => {
                let pending = matches!(outcome, InPlace::Pending);
                if let Some(closed) = s.closed_at {
                    if !pending || closed.elapsed() > PENDING_GRACE {
                        return DrainState::Finished;
                    }
                    return DrainState::More;
                }
                if s.stopping && !pending {
                    // The client was told to stop; anything already
                    // committed has been read. Finish now rather than wait
                    // for a socket close that may never come.
                    return DrainState::Finished;
                }
                if s.stopping && pending && writer_gone(s) {
                    // A record reserved and never committed: its writer
                    // died with the process, or is stuck. Nothing behind it
                    // can be read; finish with what was drained.
                    return DrainState::Finished;
                }
                if reader_paused {
                    return DrainState::Idle;
                }
                if read_any {
                    return DrainState::Drained;
                }
                s.reader.ring().pause_reader();
                reader_paused = true;
            }
            InPlace::Corrupt(_) => {
                s.ring_corrupt = true;
                s.reader.ring().set_shutdown();
                return DrainState::Finished;
            }
        }
    }
    if reader_paused {
        s.reader.ring().unpause_reader();
    }
    DrainState::More
}

/// For a stopping session stuck on an uncommitted record: the process has
/// exited (even if its socket never reported EOF, e.g. a child still holds
/// a copy), or the writer had [`PENDING_GRACE`] since the stop to commit.
fn writer_gone(s: &Session) -> bool {
    s.stopped_at.is_some_and(|t| t.elapsed() > PENDING_GRACE)
        || s.pidfd
            .as_ref()
            .is_some_and(|fd| has_exited(fd, Duration::ZERO))
}

fn session_stats(s: &Session) -> SessionStats {
    SessionStats {
        ring: ring_stats(&s.reader.stats()),
        client_error: client_error(s.reader.ring().client_error()),
        ring_corrupt: s.ring_corrupt,
        ..s.unwinder.stats()
    }
}

/// The ring buffer's counters the model uses.
fn ring_stats(r: &heapprofd_shmem::Stats) -> RingStats {
    RingStats {
        writes_overflow: r.writes_overflow,
        writes_corrupt: r.writes_corrupt,
        blocked_us: r.blocked_us,
        thinned: r.thinned,
        reads_corrupt: r.reads_corrupt,
    }
}

/// The error the client recorded in the ring buffer, as the model's.
fn client_error(e: heapprofd_shmem::ClientError) -> ClientError {
    match e {
        heapprofd_shmem::ClientError::None => ClientError::None,
        heapprofd_shmem::ClientError::HitTimeout => ClientError::HitTimeout,
        heapprofd_shmem::ClientError::InvalidStackBounds => ClientError::InvalidStackBounds,
    }
}

fn finish(s: Session, endings: &mut Endings, book: &Sender<BookMsg>, counters: &Counters) {
    let stats = session_stats(&s);
    counters.costs.add_session(
        &s.reader.stats(),
        s.unwinder.walker.unwind_time,
        &s.unwinder.walker.stacks.split,
    );
    log::debug!(
        "session {} (pid {}) ended: {:?}; stack bases: {} threads, {} KiB, {} missing, {} evictions; {} stacks cached; replayed walks: {} hits, {} misses, {} traces checked; unwinder rule cache {:?}",
        s.id,
        s.pid,
        s.reader.stats(),
        s.unwinder.thread_stacks.threads(),
        s.unwinder.thread_stacks.bytes() / 1024,
        s.unwinder.thread_stacks.missing,
        s.unwinder.thread_stacks.evictions,
        s.unwinder.walker.stacks.len(),
        s.unwinder.walker.stacks.memo.hits,
        s.unwinder.walker.stacks.memo.misses,
        s.unwinder.walker.stacks.memo.checks,
        s.unwinder.process().and_then(|p| p.rule_cache_stats())
    );
    // The socket closes a moment before the process is reaped; a client
    // that went away while its process lives on (teardown after an error)
    // is what Perfetto calls "disconnected". Whether it does is waited for
    // in `endings`, not here (see there).
    match s.pidfd {
        Some(pidfd) if s.closed_at.is_some() && !s.stopping => endings.add(Ending {
            id: s.id,
            pid: s.pid,
            stats,
            pidfd,
            deadline: Instant::now() + EXIT_WAIT,
        }),
        _ => send_end(s.id, s.pid, stats, false, s.stopping, book),
    }
}
