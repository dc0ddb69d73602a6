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
//! # Example: a session from the bookkeeping thread's point of view
//!
//! ```
//! use heapprofd_model::profile::{Alloc, Interner, Profile};
//! use heapprofd_model::trace::{ClockReadings, TraceWriter, read_trace};
//!
//! let interner = Interner::new(); // in an Arc, shared with the workers
//! let mut profile = Profile::new(&interner);
//! // Read together at the start (the daemon reads the real clocks).
//! let clocks = ClockReadings {
//!     boottime_ns: 2_000_000_000,
//!     monotonic_coarse_ns: 1_000_000_000,
//!     monotonic_ns: 1_000_000_100,
//!     realtime_ns: 1_700_000_000_000_000_000,
//! };
//! let mut writer = TraceWriter::new(Vec::new(), clocks)?; // a File in practice
//!
//! profile.add_process(1234, vec!["./app".into()], true);
//! profile.set_heap(1234, 0, Some("libc.malloc"), 4096);
//! // A worker unwound a sample: frames interned, outermost caller first.
//! let main = interner.intern_frame(None, 0x1100, Some("main"), None, None);
//! let leaf = interner.intern_frame(None, 0x1200, Some("make_buffer"), None, None);
//! let t = clocks.monotonic_coarse_ns;
//! let alloc = Alloc {
//!     heap: 0, seq: 1, address: 0x5000, sample_size: 4096, size: 4096, tid: 1, timestamp_ns: t,
//! };
//! profile.malloc(1234, alloc, &[main, leaf]);
//! profile.free(1234, 0, 2, 0x5000);
//!
//! // Continuous-dump tick or SIGUSR1: dump what is committed.
//! writer.dump(&mut profile, &interner, t + 1_000_000)?;
//! // End of the session: commit what still waits, final dump, finish.
//! profile.flush_all();
//! writer.dump(&mut profile, &interner, t + 2_000_000)?;
//! let bytes = writer.finish()?;
//!
//! let data = read_trace(bytes.as_slice())?;
//! assert_eq!(data.heaps[0].callstacks[0].self_freed, 4096);
//! # Ok::<(), heapprofd_model::trace::TraceError>(())
//! ```
//!
//! # Threads
//!
//! The writer belongs to the bookkeeping thread: [`TraceWriter::dump`]
//! borrows the [`Profile`](crate::profile::Profile) mutably and reads the
//! shared [`Interner`](crate::profile::Interner) under short read locks.

mod bits;
mod data;
pub mod extension;
mod interned;
mod module_symbols;
mod process_tree;
mod reader;
mod writer;

pub use data::{
    CallstackValues, Counters, DumpPoint, Frame, HeapProfile, MemorySample, ProcessInfo,
    ResolvedFrame, SampleProfile, SampledStack, TraceData, Truncation,
};
pub use reader::read_trace;
pub use writer::{
    ClockReadings, DEFAULT_SEQUENCE_ID, DumpSummary, PACKET_SIZE_THRESHOLD, ProcessMemory,
    TraceWriter, WriterConfig,
};

/// The error type of trace writing and reading.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// Writing to the output failed (disk full, closed pipe…). What was
    /// written before the failing packet is a valid trace.
    #[error("writing the trace failed: {0}")]
    Io(#[from] std::io::Error),
    /// Reading the input failed (a file that cannot be opened or read).
    #[error("reading the trace failed: {0}")]
    Read(std::io::Error),
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
