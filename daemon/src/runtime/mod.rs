//! The daemon at run time: sessions, workers, bookkeeping, `record`, and
//! `record --pid` (`attach`).
//!
//! Threads and what each owns (every object has exactly one owner):
//!
//! ```text
//!  tokio runtime (1 thread)     accept loop; per session a task watching the socket
//!        |  new session (after a blocking handshake on a blocking thread)
//!        v
//!  worker threads (N)           each owns its sessions: ring buffer reader +
//!        |  Ops batches          unwinder ProcessContext + stack cache; drains,
//!        |                       unwinds, interns new stacks (stack ids)
//!        v
//!  bookkeeping thread (1)       owns the Profile and the TraceWriter; applies
//!                               ops, dumps on request, writes the trace
//! ```
//!
//! Shared between threads: the [`Interner`](heapprofd_model::profile::Interner)
//! (internally locked; workers add frames, the dump reads them), the
//! unwinder's module cache, and the relaxed [`Counters`] behind the status line.

pub mod attach;
pub mod bookkeeper;
pub mod clock;
pub mod handshake;
pub mod mapping;
pub mod memo;
pub mod record;
pub mod server;
pub mod stacks;
pub mod symbolize;
pub mod worker;

use std::sync::atomic::{AtomicU64, Ordering};

use heapprofd_shmem::{ClientError, Stats as RingStats};

use heapprofd_model::profile::{FrameId, UnwindHistogram};

/// Identifies one client connection for its whole life (pids can be reused).
pub type SessionId = u64;

/// One record of a client, after unwinding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A sampled allocation.
    Malloc {
        /// Heap id (0 = libc.malloc).
        heap: u32,
        /// Client sequence number.
        seq: u64,
        /// Address returned to the program.
        address: u64,
        /// Bytes the sample stands for.
        sample_size: u64,
        /// CLOCK_MONOTONIC_COARSE of the allocation.
        timestamp_ns: u64,
        /// The session's stack id, defined by an earlier [`Op::Stack`]
        /// (see [`stacks`]).
        stack: u32,
    },
    /// Defines (or redefines) a stack id of the session for the
    /// operations that follow.
    Stack {
        /// The session's stack id ([`stacks::SCRATCH_STACK`] is redefined
        /// before each use).
        id: u32,
        /// Interned frames, outermost caller first.
        frames: Box<[FrameId]>,
    },
    /// A free of a possibly sampled address.
    Free {
        /// Heap id.
        heap: u32,
        /// Client sequence number.
        seq: u64,
        /// Address freed.
        address: u64,
    },
    /// A heap declaration or sampling-interval change.
    HeapName {
        /// Heap id.
        heap: u32,
        /// Heap name (empty: keep the previous name).
        name: String,
        /// Current sampling interval.
        interval: u64,
    },
}

/// What a worker knows about a session, sent with every batch.
#[derive(Debug, Clone, Default)]
pub struct SessionStats {
    /// Unwinds that ended in an error.
    pub unwinding_errors: u64,
    /// Malloc samples unwound.
    pub heap_samples: u64,
    /// Times the process's maps were read again.
    pub map_reparses: u64,
    /// Total time spent unwinding.
    pub total_unwinding_time_us: u64,
    /// Distribution of unwinding times.
    pub unwinding_time_us: UnwindHistogram,
    /// Ring-buffer statistics (writer side from shared memory, untrusted).
    pub ring: RingStats,
    /// Error the client recorded in the ring buffer.
    pub client_error: ClientError,
    /// Records that did not decode.
    pub corrupt_records: u64,
    /// The ring buffer itself was found corrupt (session ended).
    pub ring_corrupt: bool,
}

/// How a session ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionEnd {
    /// The client went away on its own (exit, teardown) before the daemon stopped it.
    pub disconnected: bool,
    /// The daemon ended the session (duration over, Ctrl-C, stop).
    pub stopped_by_daemon: bool,
}

/// Messages to the bookkeeping thread.
#[derive(Debug)]
pub enum BookMsg {
    /// A client completed its handshake.
    ProcessStarted {
        /// Session.
        id: SessionId,
        /// Process id.
        pid: u32,
        /// Command line.
        cmdline: Vec<String>,
        /// Connected from its constructor (profiled from process start).
        from_startup: bool,
    },
    /// A batch of unwound records of one session, with its current stats.
    Ops {
        /// Session.
        id: SessionId,
        /// The records, in ring-buffer order.
        ops: Vec<Op>,
        /// Stats snapshot.
        stats: SessionStats,
    },
    /// A session is over and fully drained.
    ProcessEnded {
        /// Session.
        id: SessionId,
        /// Process id.
        pid: u32,
        /// Final stats.
        stats: SessionStats,
        /// How it ended.
        end: SessionEnd,
    },
    /// Write a dump of every process now.
    Dump,
    /// Write the final dump, close the trace and report back.
    Finish(std::sync::mpsc::Sender<anyhow::Result<bookkeeper::Summary>>),
}

/// Relaxed counters for the status line (approximate by design).
#[derive(Debug, Default)]
pub struct Counters {
    /// Malloc samples unwound.
    pub samples: AtomicU64,
    /// Unwinds that ended in an error.
    pub unwind_errors: AtomicU64,
    /// Records dropped by clients because the buffer was full.
    pub dropped: AtomicU64,
    /// Live sampled bytes (from the bookkeeper).
    pub live_bytes: AtomicU64,
    /// Sessions currently connected.
    pub sessions: AtomicU64,
    /// Sessions whose client sent its first byte (it sends one as soon as
    /// its hooks record), ever.
    pub confirmed: AtomicU64,
}

impl Counters {
    /// Reads a counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
