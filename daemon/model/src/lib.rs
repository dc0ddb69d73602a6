//! The heapprofd-rs profile model: what was allocated where and what is
//! still live, the messages the unwinding workers send, the bookkeeping
//! that applies them, and Perfetto traces written from it and read back.
//!
//! No I/O, no threads, no async runtime, no unwinder: the daemon's runtime
//! drives it (from its bookkeeping thread), the offline tools read traces
//! with it, and tests and fuzzers exercise it directly.
//!
//! * [`profile`]: interned mappings/frames/strings, the callsite tree, live
//!   sampled allocations per process and heap, cumulative per-callsite
//!   totals, sequence-number ordering.
//! * [`trace`]: writing a Perfetto trace to any `io::Write`, and reading
//!   one (ours or heapprofd's) back.
//! * [`messages`]: what the unwinding workers send: per session its start,
//!   batches of [`messages::Op`]s with statistics, its end.
//! * [`bookkeeping`]: the state machine that applies them to the profile
//!   (sessions, stack ids, exec hold-back, flags), and [`summary`]: the data
//!   of the end-of-run summary.
//!
//! ```text
//!  workers --SessionEvent (Op batches)--> Bookkeeping --> Profile --dump--> TraceWriter
//!                                                                               |
//!                                   report / convert <-- TraceData <-- read_trace
//! ```

pub mod bookkeeping;
pub mod messages;
pub mod profile;
pub mod summary;
pub mod trace;
