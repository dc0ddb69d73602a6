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
pub mod book_msg;
pub mod book_thread;
pub mod bookkeeper;
pub mod cleanup;
pub mod clock;
pub mod costs;
pub mod counters;
pub mod dump_request;
pub mod emulation;
pub mod endings;
pub mod handshake;
pub mod hub;
pub mod hub_admit;
pub mod lazy_process;
pub mod mapping;
pub mod maps_keeper;
pub mod memo;
pub mod procinfo;
pub mod program;
pub mod record;
pub mod repolls;
pub mod retirement;
pub mod rundir;
pub mod server;
pub mod service;
pub mod service_book;
pub mod service_command;
pub mod service_inject;
pub mod service_profile;
pub mod service_record;
pub mod service_scan;
pub mod service_state;
pub mod session_unwinder;
pub mod setup;
pub mod spare_ring;
pub mod stacks;
pub mod status;
pub mod stopper;
pub mod summary;
pub mod supervise;
pub mod symbol_cache;
pub mod symbolize;
pub mod thread_stacks;
pub mod triggers;
pub mod worker;

pub use book_msg::BookMsg;
pub use counters::Counters;
