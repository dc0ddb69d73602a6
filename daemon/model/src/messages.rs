//! What the unwinding workers tell the bookkeeping: per session, its start,
//! batches of unwound records ([`Op`]s) with the session's statistics, and
//! its end (Perfetto's `unwound_messages.h` plays this role in heapprofd).
//!
//! Stacks cross the thread boundary as ids: a worker sends each distinct
//! stack of a session once ([`Op::Stack`]) and after that only its id with
//! each malloc. Ids are per session, defined before their first use in the
//! same ordered stream, and may be redefined (a worker that forgot its
//! stacks starts its ids again); [`SCRATCH_STACK`] is redefined before each
//! use, for stacks the worker does not cache.

pub use heapprofd_proto::wire::Unprofilable;

use crate::profile::{ClientError, FrameId, ProcessIdentity, UnwindHistogram};
use crate::trace::ProcessMemory;
pub use heapprofd_proto::perfetto::profiling::StackUnwindError;

/// Identifies one client connection for its whole life (pids can be
/// reused, and a process that calls exec connects again with the same pid).
pub type SessionId = u64;

/// The stack id redefined before every use, for stacks that are not cached.
pub const SCRATCH_STACK: u32 = 0;

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
        /// Bytes the program asked for.
        size: u64,
        /// Kernel thread id of the allocating thread.
        tid: u32,
        /// CLOCK_MONOTONIC_COARSE of the allocation.
        timestamp_ns: u64,
        /// The session's stack id, defined by an earlier [`Op::Stack`].
        stack: u32,
        /// The user context installed on the thread (0 = none), defined by
        /// an earlier [`Op::Context`].
        context: u64,
        /// The sample was drawn at the heap's interval times
        /// `2^interval_shift` (the client raised it under load).
        interval_shift: u8,
    },
    /// Defines (or redefines) a stack id of the session for the
    /// operations that follow.
    Stack {
        /// The session's stack id ([`SCRATCH_STACK`] is redefined before
        /// each use).
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
    /// Defines a user context id of the session (see
    /// [`profile::context`](crate::profile::context)).
    Context {
        /// The id samples carry.
        id: u64,
        /// Its interned root frame.
        frame: FrameId,
        /// Contexts the client could not store so far.
        overflowed: u64,
    },
    /// A stack sample (CPU time, a named event).
    StackSample {
        /// Kernel thread id.
        tid: u32,
        /// The event (0: CPU time).
        tag: u64,
        /// CLOCK_MONOTONIC of the sample.
        timestamp_ns: u64,
        /// The thread's CPU clock at the sample.
        cpu_time_ns: u64,
        /// What the sample stands for (CPU ns, the event's period).
        period: u64,
        /// The session's stack id, defined by an earlier [`Op::Stack`].
        stack: u32,
        /// The stack is the requester's own.
        biased: bool,
        /// Timer expirations merged into this sample (in `period`).
        lost_overrun: u32,
        /// Samples (CPU: expirations) the thread lost in the client just
        /// before.
        lost_dropped: u32,
        /// Why the stack could not be walked to its end (its last frame
        /// is then an `ERROR` frame), as Perfetto's `PerfSample` says it.
        unwind_error: Option<StackUnwindError>,
    },
    /// Losses of a thread that no sample carried (it exited).
    SampleLosses {
        /// Kernel thread id.
        tid: u32,
        /// The event.
        tag: u64,
        /// Timer expirations merged (informational).
        lost_overrun: u32,
        /// Samples (CPU: expirations) lost.
        lost_dropped: u32,
    },
    /// Names an event tag.
    EventName {
        /// The tag.
        tag: u64,
        /// Its name.
        name: String,
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

/// The ring buffer's counters that the trace and the summary use (the
/// writer side's are read from shared memory: untrusted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingStats {
    /// Records dropped because the buffer was full.
    pub writes_overflow: u64,
    /// Writes refused because the positions were inconsistent.
    pub writes_corrupt: u64,
    /// Microseconds writers spent waiting (spinlock or full buffer).
    pub blocked_us: u64,
    /// Samples writers thinned away rather than wait for room.
    pub thinned: u64,
    /// Reads that found corruption.
    pub reads_corrupt: u64,
}

/// What a worker knows about a session, sent with every batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    /// Ring-buffer statistics.
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
    /// The client went away on its own (exit, teardown) before the daemon
    /// stopped it, while its process lived on.
    pub disconnected: bool,
    /// The daemon ended the session (duration over, Ctrl-C, stop).
    pub stopped_by_daemon: bool,
}

/// One thing that happened to a session, in the order its worker saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// A client completed its handshake.
    Started {
        /// Session.
        id: SessionId,
        /// Process id.
        pid: u32,
        /// Command line.
        cmdline: Vec<String>,
        /// Connected from its constructor (profiled from process start).
        from_startup: bool,
        /// When the session started (MONOTONIC_COARSE ns, 0 if unknown).
        started_ns: u64,
        /// Parent and thread names, read from `/proc` while the client
        /// waited for the handshake's answer (so a process that exits at
        /// once still has them).
        identity: ProcessIdentity,
        /// Its memory counters, read at `started_ns` (the bookkeeping does
        /// not keep them: the runtime writes them into the trace, and they
        /// bound its time range from the start of the process's window).
        memory: Option<ProcessMemory>,
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
    /// A process runs unprofiled (a client's notice, or `record` found
    /// its program statically linked): not a session of its own; `id` is
    /// a fresh one that no other event uses.
    Unprofilable {
        /// A fresh id.
        id: SessionId,
        /// Process id.
        pid: u32,
        /// Command line.
        cmdline: Vec<String>,
        /// Why.
        why: Unprofilable,
        /// Parent and thread names, if they could be read.
        identity: ProcessIdentity,
    },
    /// A session is over and fully drained.
    Ended {
        /// Session.
        id: SessionId,
        /// Process id.
        pid: u32,
        /// Final stats.
        stats: SessionStats,
        /// How it ended.
        end: SessionEnd,
    },
}

impl SessionEvent {
    /// The session the event belongs to.
    pub fn session(&self) -> SessionId {
        match self {
            SessionEvent::Started { id, .. }
            | SessionEvent::Ops { id, .. }
            | SessionEvent::Unprofilable { id, .. }
            | SessionEvent::Ended { id, .. } => *id,
        }
    }
}
