//! Perfetto heap-profile traces: the streaming [`TraceWriter`] and the
//! [`read_trace`] reader the reports are built on.
//!
//! # What a written trace looks like
//!
//! One trusted packet sequence (id [`DEFAULT_SEQUENCE_ID`]):
//!
//! 1. a packet with `SEQ_INCREMENTAL_STATE_CLEARED`, a `ClockSnapshot`
//!    relating BOOTTIME (the trace clock), MONOTONIC_COARSE (the clock of
//!    heap dump timestamps), MONOTONIC and REALTIME, and the `{iid 0, ""}`
//!    entries heapprofd also writes;
//! 2. a `ProcessTree` with the pid and command line of each process (again
//!    when a new process appears);
//! 3. per dump and per (process, heap) a group of `ProfilePacket`s with
//!    consecutive `index`: `continued = true` on every packet with samples
//!    (split at ~400 kB like heapprofd), then an empty `ProfilePacket` that
//!    ends the group. Interned strings, mappings, frames and callstacks go
//!    in `TracePacket.interned_data` just before the first packet that uses
//!    them, each once per trace, in dependency order.
//!
//! Per-callsite values are cumulative since the start and never decrease.
//! A callsite is written when it has live allocations or changed since the
//! last dump; an idle, fully freed callsite is written once and then left
//! out (trace processor takes deltas between dumps, so nothing is lost).
//!
//! # Threads
//!
//! The writer belongs to the bookkeeping thread: [`TraceWriter::dump`]
//! borrows the [`Profile`](crate::profile::Profile) mutably and reads the
//! shared [`Interner`](crate::profile::Interner) under short read locks.

mod reader;
mod writer;

pub use reader::{
    CallstackValues, HeapProfile, ProcessInfo, ResolvedFrame, TraceData, read_trace,
    read_trace_file,
};
pub use writer::{
    ClockReadings, DEFAULT_SEQUENCE_ID, DumpSummary, PACKET_SIZE_THRESHOLD, TraceWriter,
    WriterConfig,
};

/// The error type of trace writing and reading.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Writing to the output failed (disk full, closed pipe…). What was
    /// written before the failing packet is a valid trace.
    #[error("writing the trace failed: {0}")]
    Io(#[from] std::io::Error),
    /// An earlier write failed; the writer writes nothing more.
    #[error("the trace writer stopped after an earlier write error")]
    Failed,
    /// The input is not a well-formed Perfetto trace.
    #[error("malformed trace at byte {offset}: {what}")]
    Malformed {
        /// Offset of the packet (or field) that could not be parsed.
        offset: u64,
        /// What was wrong.
        what: String,
    },
}
