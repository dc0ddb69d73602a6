//! The stack resync counter: how the reader tells every writer to send its
//! thread's next malloc stack whole.
//!
//! A malloc record may leave out the top of its stack that its thread's
//! previous sample sent (`MallocHeader::stack_reused`); the reader puts it
//! back from the base it kept for the thread. When the reader forgets a
//! base (too many threads) or meets a record whose base it lacks, it bumps
//! this counter. A writer keeps the value it sent its last stack under and
//! reuses nothing once the counter moved, so every thread sends a whole
//! stack again and the reader has bases for the records after it.
//!
//! The counter lives in what was padding of the metadata page's first line:
//! a peer that predates it leaves it at zero and never reads it.

use std::sync::atomic::Ordering;

use crate::ring::RingBuffer;

impl RingBuffer {
    /// The reader forgot some thread's stack base: every writer sends its
    /// thread's next malloc stack whole.
    pub fn request_stack_resync(&self) {
        self.meta().stack_resync.fetch_add(1, Ordering::Relaxed);
    }

    /// The stack resync counter (untrusted; only a change matters).
    #[inline]
    pub fn stack_resync(&self) -> u32 {
        self.meta().stack_resync.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use crate::RingBuffer;

    #[test]
    fn a_resync_request_changes_the_counter_writers_see() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        let before = rb.stack_resync();
        rb.request_stack_resync();
        assert_ne!(rb.stack_resync(), before);
    }
}
