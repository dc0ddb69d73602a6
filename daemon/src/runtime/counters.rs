//! The relaxed counters behind the status line, shared by the server, the
//! workers and the bookkeeping thread (approximate by design).

use std::sync::atomic::{AtomicU64, Ordering};

use super::costs::Costs;

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
    /// Where the time goes (printed with `HEAPPROFD_DEBUG`, not on the
    /// status line).
    pub costs: Costs,
}

impl Counters {
    /// Reads a counter.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}
