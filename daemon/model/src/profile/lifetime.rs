//! Lifetimes of allocations in exact mode, counted in allocations: per
//! process, a counter of committed mallocs (an allocation's "birth" is the
//! counter's value when it was made) and, per thread, its latest malloc.
//!
//! Operations are committed in sequence order, which is the order the
//! process made them in (one counter for mallocs and frees of every
//! thread), so at a free:
//!
//! * the allocation's lifetime is the number of mallocs committed after
//!   it, and
//! * it is *temporary* (heaptrack's definition) if it is still the latest
//!   malloc of the thread that made it: that thread has not allocated
//!   since. The tracker keeps the set of the threads' latest mallocs (one
//!   sequence number per thread), so the check is one lookup and needs no
//!   thread id per live allocation.
//!
//! Only meaningful when every allocation is recorded (interval 1): with
//! sampling, the allocations between two samples are unseen.

use rustc_hash::{FxHashMap, FxHashSet};

/// Births and the threads' latest mallocs of one process; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct LifetimeTracker {
    mallocs: u64,
    latest_of_thread: FxHashMap<u32, u64>,
    latest: FxHashSet<u64>,
}

impl LifetimeTracker {
    /// A malloc `seq` of thread `tid` is committed; returns the low 32 bits
    /// of its birth (live allocations keep only those: a lifetime is exact
    /// up to 2^32 - 1 allocations). `track_thread` is false for mallocs of
    /// sampled heaps.
    pub(crate) fn malloc(&mut self, seq: u64, tid: u32, track_thread: bool) -> u32 {
        let birth = self.mallocs as u32;
        self.mallocs += 1;
        if track_thread {
            if let Some(old) = self.latest_of_thread.insert(tid, seq) {
                self.latest.remove(&old);
            }
            self.latest.insert(seq);
        }
        birth
    }

    /// The allocation `seq` born at `birth` is freed: its lifetime in
    /// allocations, and whether it was temporary.
    pub(crate) fn free(&mut self, seq: u64, birth: u32) -> (u64, bool) {
        let lifetime = u64::from((self.mallocs as u32).wrapping_sub(birth).wrapping_sub(1));
        (lifetime, self.latest.remove(&seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporaries_follow_the_allocating_thread() {
        let mut t = LifetimeTracker::default();
        // Thread 1: malloc A (seq 1), thread 2 mallocs B (seq 2), thread 1
        // frees A: A is temporary (thread 1 did not allocate in between),
        // with a lifetime of 1 allocation (B).
        let a = t.malloc(1, 1, true);
        let b = t.malloc(2, 2, true);
        assert_eq!(t.free(1, a), (1, true));
        // Thread 2 mallocs C; B is no longer thread 2's latest.
        let c = t.malloc(4, 2, true);
        assert_eq!(t.free(2, b), (1, false));
        assert_eq!(t.free(4, c), (0, true));
        // Untracked mallocs still count as births.
        let d = t.malloc(6, 3, false);
        assert_eq!(t.free(6, d), (0, false));
    }
}
