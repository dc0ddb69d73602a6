//! The daemon at run time: the server and handshakes, the unwinding
//! workers, the symbolizer, the bookkeeping thread, and the ways of
//! running it: `record -- CMD` ([`record`]) and `record --pid` ([`attach`]),
//! which share [`supervise`], and the service (`heapprofd-rs daemon`,
//! [`service`]: several profiles on one daemon, [`hub`], [`service_book`]). [`program`] tells `record` whether CMD can
//! load the client at all; a notice from a client that its process runs
//! unprofiled goes from the handshake straight to the bookkeeping.
//!
//! Threads and what each owns (every object has exactly one owner):
//!
//! ```text
//!  tokio runtime (1 thread)     accept loop; per session a task watching the socket
//!        |  new session (after a blocking handshake on a blocking thread)
//!        v
//!  worker threads (N)           each owns its sessions: ring buffer reader +
//!        |  SessionEvents        SessionUnwinder (ProcessContext, stack cache,
//!        |  (Op batches)         replay memo); drains, unwinds, interns new
//!        v                       stacks (stack ids)
//!  bookkeeping thread (1)       owns the model's Bookkeeping (the Profile) and
//!                               the TraceWriter; applies events, symbolizes and
//!                               dumps on request, writes the trace
//! ```
//!
//! The work of each thread is a plain function of its inputs where it can
//! be: a worker's per-record step is [`session_unwinder`], the bookkeeping
//! is the model's `Bookkeeping`; the threads only move messages.
//!
//! Shared between threads: the [`Interner`](heapprofd_model::profile::Interner)
//! (internally locked; workers add frames, the dump reads them), the
//! unwinder's module cache, and the relaxed [`Counters`] behind the status line.

pub mod attach;
pub mod bookkeeper;
pub mod cleanup;
pub mod clock;
pub mod emulation;
pub mod handshake;
pub mod hub;
pub mod mapping;
pub mod memo;
pub mod procinfo;
pub mod program;
pub mod record;
pub mod rundir;
pub mod server;
pub mod service;
pub mod service_book;
pub mod service_profile;
pub mod service_record;
pub mod service_state;
pub mod session_unwinder;
pub mod setup;
pub mod stacks;
pub mod status;
pub mod summary;
pub mod supervise;
pub mod symbolize;
pub mod triggers;
pub mod worker;

use std::sync::atomic::{AtomicU64, Ordering};

use heapprofd_model::messages::SessionEvent;

/// Messages to the bookkeeping thread.
#[derive(Debug)]
pub enum BookMsg {
    /// Something happened to a session (started, a batch of records, ended).
    Session(Box<SessionEvent>),
    /// Write a dump of every process now.
    Dump,
    /// Write the final dump, close the trace and report back.
    Finish(std::sync::mpsc::Sender<anyhow::Result<summary::Summary>>),
    /// The service's profiles ([`service_book`]; ignored elsewhere).
    Service(service_book::ServiceMsg),
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
    /// Live sampled bytes (from the bookkeeping thread).
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
