//! Where a hijacked thread's pause went: each step's duration, in order
//! (printed with `HEAPPROFD_DEBUG`, docs/PERFORMANCE.md).

use std::time::{Duration, Instant};

/// Durations of the steps of a pause.
pub(crate) struct Steps {
    last: Instant,
    pub(crate) list: Vec<(&'static str, Duration)>,
}

impl Steps {
    /// Starts timing now.
    pub(crate) fn new() -> Steps {
        Steps {
            last: Instant::now(),
            list: Vec::new(),
        }
    }

    /// The step `what` ended now.
    pub(crate) fn done(&mut self, what: &'static str) {
        let now = Instant::now();
        self.list.push((what, now - self.last));
        self.last = now;
    }
}
