//! Waiting for the reader to catch up, and telling it that the process
//! unloaded an object: what a client does around `dlclose`.
//!
//! The daemon unwinds a sample after the fact, against the process's
//! mappings as it reads them then. A library unloaded before its samples
//! were unwound is gone from the maps by then (cut stacks), or replaced by
//! another one at the same addresses (frames named after the wrong
//! library). So before the process unloads an object, a writer waits until
//! the reader has consumed every record written so far
//! ([`RingBuffer::wait_consumed`]); the reader publishes only positions
//! whose records it has finished with (see [`Reader::read`](crate::Reader)),
//! so "consumed" means "unwound". After the unload the writer bumps the
//! unload epoch ([`RingBuffer::note_unload`]): the reader, finding it
//! changed after a record, re-reads the maps before unwinding it, so that
//! later samples are not named after what was unloaded.
//!
//! Both fields live in what was padding of the metadata page's first line:
//! a peer that predates them leaves them at zero and ignores them (the
//! waiter then waits for the quarter-buffer or empty-buffer publications,
//! bounded by its timeout).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::ring::RingBuffer;

/// How [`RingBuffer::wait_consumed`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drain {
    /// The reader had already consumed every record: no wait, no wake-up.
    Idle,
    /// The reader consumed every record written before the call.
    Consumed,
    /// The timeout passed first.
    TimedOut,
    /// The session is shutting down: nobody will read.
    Shutdown,
}

/// Spins before the first sleep.
const SPINS: u32 = 64;
/// The first sleep between checks; each next one doubles, up to [`MAX_NAP`].
const FIRST_NAP: Duration = Duration::from_micros(20);
/// The longest sleep between checks.
const MAX_NAP: Duration = Duration::from_millis(1);

impl RingBuffer {
    /// The writers' position now: every record reserved so far ends at or
    /// below it.
    pub fn write_position(&self) -> u64 {
        self.meta().write_pos.load(Ordering::Acquire)
    }

    /// The reader's published position (untrusted: the reader's process
    /// writes it).
    pub fn read_position(&self) -> u64 {
        self.meta().read_pos.load(Ordering::Acquire)
    }

    /// Waits until the reader has published a position at or past `target`
    /// (a [`RingBuffer::write_position`]), at most `timeout`. Calls `wake`
    /// once if there is anything to wait for (the reader may sleep or wait
    /// for its next poll), and again whenever the reader says it paused.
    ///
    /// Holds no lock and allocates nothing: writers keep writing meanwhile
    /// (they may fill the buffer; the reader frees it as it goes). While it
    /// waits, the reader publishes its position before every read.
    pub fn wait_consumed(&self, target: u64, timeout: Duration, wake: &mut dyn FnMut()) -> Drain {
        if self.read_position() >= target {
            return Drain::Idle;
        }
        let meta = self.meta();
        meta.drain_waiters.fetch_add(1, Ordering::SeqCst);
        wake();
        let start = Instant::now();
        let (mut spins, mut nap) = (0u32, FIRST_NAP);
        let outcome = loop {
            if self.read_position() >= target {
                break Drain::Consumed;
            }
            if self.is_shutdown() {
                break Drain::Shutdown;
            }
            if self.take_reader_paused() {
                wake();
            }
            if spins < SPINS {
                spins += 1;
                std::hint::spin_loop();
                continue;
            }
            if start.elapsed() >= timeout {
                break Drain::TimedOut;
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(MAX_NAP);
        };
        meta.drain_waiters.fetch_sub(1, Ordering::SeqCst);
        outcome
    }

    /// Says that the process unloaded an object: the reader re-reads the
    /// maps before unwinding the records that follow.
    pub fn note_unload(&self) {
        self.meta().unload_epoch.fetch_add(1, Ordering::Release);
    }

    /// The unload epoch (untrusted: any value; only a change matters).
    pub fn unload_epoch(&self) -> u32 {
        self.meta().unload_epoch.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ReadOutcome, WriteMode};

    fn write(rb: &RingBuffer, n: usize) {
        for i in 0..n {
            let mut r = rb.begin_write(16, WriteMode::Drop).unwrap();
            r.write_at(0, &(i as u64).to_le_bytes());
            r.commit();
        }
    }

    #[test]
    fn an_empty_buffer_needs_no_wait_and_no_wake() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        let mut woken = 0;
        let d = rb.wait_consumed(rb.write_position(), Duration::ZERO, &mut || woken += 1);
        assert_eq!((d, woken), (Drain::Idle, 0));
    }

    #[test]
    fn the_published_position_covers_only_records_handled() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        write(&rb, 3);
        let target = rb.write_position();
        let mut reader = rb.reader();
        let mut buf = Vec::new();
        // A waiter is registered: the reader publishes before each read,
        // never the record it returns.
        rb.meta().drain_waiters.store(1, Ordering::SeqCst);
        for handled in 0..3u64 {
            assert_eq!(reader.read(&mut buf), ReadOutcome::Record(16));
            assert_eq!(rb.read_position(), handled * 24, "after read {handled}");
        }
        assert_eq!(reader.read(&mut buf), ReadOutcome::Empty);
        assert_eq!(rb.read_position(), target);
        rb.meta().drain_waiters.store(0, Ordering::SeqCst);
        let d = rb.wait_consumed(target, Duration::ZERO, &mut || {});
        assert_eq!(d, Drain::Idle);
    }

    #[test]
    fn a_waiter_returns_once_a_reader_thread_consumed_its_records() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        write(&rb, 100);
        let target = rb.write_position();
        let handled = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                let mut woken = 0;
                let d = rb.wait_consumed(target, Duration::from_secs(600), &mut || woken += 1);
                (d, woken, handled.load(Ordering::SeqCst))
            });
            // The reader starts only once the waiter registered.
            while rb.meta().drain_waiters.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            let mut reader = rb.reader();
            let mut buf = Vec::new();
            while let ReadOutcome::Record(_) = reader.read(&mut buf) {
                handled.fetch_add(1, Ordering::SeqCst);
            }
            let (d, woken, seen) = waiter.join().unwrap();
            assert_eq!(d, Drain::Consumed);
            assert!(woken >= 1);
            // Every record was handled before the waiter could return.
            assert_eq!(seen, 100);
        });
        assert_eq!(rb.meta().drain_waiters.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_waiter_gives_up_after_its_timeout_or_at_shutdown() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        write(&rb, 1);
        let target = rb.write_position();
        let d = rb.wait_consumed(target, Duration::ZERO, &mut || {});
        assert_eq!(d, Drain::TimedOut);
        rb.set_shutdown();
        let d = rb.wait_consumed(target, Duration::from_secs(600), &mut || {});
        assert_eq!(d, Drain::Shutdown);
        assert_eq!(rb.meta().drain_waiters.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_unload_epoch_changes_at_each_unload() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        let e = rb.unload_epoch();
        rb.note_unload();
        assert_ne!(rb.unload_epoch(), e);
    }
}
