//! The writers' side of the ring buffer: reserve room under the shared
//! spinlock, fill the [`Reservation`], commit it (the header, stored last
//! with release ordering, publishes the record), and tell whether the reader
//! must be woken. A full buffer drops or waits ([`WriteMode`]); a writer
//! stuck on the lock poisons it rather than hang the others.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::layout::{
    ClientError, HDR_COMMITTED, HDR_DISCARDED, HDR_LEN_MASK, LOCK_HELD, LOCK_POISONED,
    RECORD_HEADER_LEN, record_size, used_bytes,
};
use crate::prefetch::prefetch_for_write;
use crate::ring::RingBuffer;

/// How a writer behaves when the buffer is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Drop the record and count it as an overflow.
    Drop,
    /// Wait for the reader to make room, up to `timeout` (`None` = forever).
    Block {
        /// How long to wait before giving up.
        timeout: Option<Duration>,
    },
}

/// Why a write did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteError {
    /// The buffer was full (drop mode), counted as an overflow.
    Full,
    /// The buffer stayed full for the whole timeout (block mode).
    Timeout,
    /// The record can never fit in this buffer.
    TooLarge,
    /// The reader asked writers to stop.
    Shutdown,
    /// The spinlock was poisoned by a writer that waited too long.
    Poisoned,
    /// This writer waited too long for the spinlock and poisoned it.
    LockTimeout,
    /// The shared positions are inconsistent.
    Corrupt,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WriteError::Full => "ring buffer full, record dropped",
            WriteError::Timeout => "ring buffer stayed full for the whole block timeout",
            WriteError::TooLarge => "record larger than the ring buffer",
            WriteError::Shutdown => "session is shutting down",
            WriteError::Poisoned => "ring buffer spinlock poisoned",
            WriteError::LockTimeout => "timed out waiting for the ring buffer spinlock",
            WriteError::Corrupt => "ring buffer positions are corrupt",
        })
    }
}

impl std::error::Error for WriteError {}

/// How long a writer spins for the lock before poisoning it. The critical
/// section is a handful of instructions, so only a writer that died or was
/// descheduled for this long while holding the lock makes anyone wait this long.
const LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// Spins before a waiting writer starts yielding the CPU.
const SPINS_BEFORE_YIELD: u32 = 128;

impl RingBuffer {
    /// Hints the CPU to fetch, for writing, the `len` bytes the next record
    /// will most likely occupy (right after the current write position), so
    /// the next writer does not wait for each cache line's ownership while
    /// it copies. A hint only: it reads one shared position, touches no
    /// memory, and is wrong at no cost other than bandwidth.
    #[inline]
    pub fn prefetch_next(&self, len: usize) {
        let wp = self.meta().write_pos.load(Ordering::Relaxed);
        let off = (wp & self.mask()) as usize;
        let len = len.min(self.size());
        let mut i = 0;
        while i < len {
            // `off + i < 2 * size`: inside the mirror mapping (a prefetch
            // would not fault outside it anyway).
            prefetch_for_write(self.data_ptr().wrapping_add(off + i));
            i += 64;
        }
    }

    /// Whether a record with `len` payload bytes would fit now and leave
    /// `reserve` bytes free: a hint, read without the lock (stale as soon
    /// as it returns). Positions that do not make sense say yes, and
    /// [`Self::begin_write`] reports them.
    #[inline]
    pub fn has_room(&self, len: usize, reserve: u64) -> bool {
        let meta = self.meta();
        let size = self.size() as u64;
        let read_pos = meta.read_pos.load(Ordering::Relaxed);
        let write_pos = meta.write_pos.load(Ordering::Relaxed);
        used_bytes(read_pos, write_pos, size)
            .is_none_or(|used| size - used >= record_size(len) as u64 + reserve)
    }

    /// Counts a sample thinned away instead of waiting for room (see
    /// [`Self::has_room`]).
    #[inline]
    pub fn note_thinned(&self) {
        self.meta().thinned.fetch_add(1, Ordering::Relaxed);
    }

    /// Reserves room for a record with `len` payload bytes.
    ///
    /// The returned [`Reservation`] must be filled and then committed; if it
    /// is dropped uncommitted the record is marked discarded and the reader
    /// skips it.
    #[inline]
    pub fn begin_write(&self, len: usize, mode: WriteMode) -> Result<Reservation<'_>, WriteError> {
        let meta = self.meta();
        let size = self.size() as u64;
        let total = record_size(len) as u64;
        if len > HDR_LEN_MASK as usize || total > size {
            meta.writes_overflow.fetch_add(1, Ordering::Relaxed);
            return Err(WriteError::TooLarge);
        }
        let mut started: Option<Instant> = None;
        // Set while this writer waits for room: the reader then frees space
        // in smaller steps (see `Waiting`).
        let mut waiting: Option<Waiting<'_>> = None;
        loop {
            if meta.shutdown.load(Ordering::Relaxed) != 0 {
                return Err(WriteError::Shutdown);
            }
            let guard = self.lock(&mut started)?;
            let read_pos = meta.read_pos.load(Ordering::Acquire);
            let write_pos = meta.write_pos.load(Ordering::Relaxed);
            let Some(used) = used_bytes(read_pos, write_pos, size) else {
                drop(guard);
                meta.writes_corrupt.fetch_add(1, Ordering::Relaxed);
                return Err(WriteError::Corrupt);
            };
            if size - used >= total {
                // Clear the header before publishing the new write position, so
                // the reader sees either "not committed" or our commit.
                self.header_at(write_pos).store(0, Ordering::Relaxed);
                meta.write_pos.store(write_pos + total, Ordering::Release);
                meta.writes_ok.store(
                    meta.writes_ok.load(Ordering::Relaxed) + 1,
                    Ordering::Relaxed,
                );
                let bw = meta.bytes_written.load(Ordering::Relaxed);
                meta.bytes_written.store(bw + total, Ordering::Relaxed);
                drop(guard);
                self.account_blocked(started);
                let off = ((write_pos + RECORD_HEADER_LEN as u64) & self.mask()) as usize;
                return Ok(Reservation {
                    rb: self,
                    header_pos: write_pos,
                    used_after: used + total,
                    waited: started.is_some(),
                    // SAFETY: off < size and off + len <= 2 * size thanks to
                    // the mirror mapping (len < size).
                    data: unsafe { self.data_ptr().add(off) },
                    len,
                    committed: false,
                });
            }
            drop(guard);
            match mode {
                WriteMode::Drop => {
                    meta.writes_overflow.fetch_add(1, Ordering::Relaxed);
                    return Err(WriteError::Full);
                }
                WriteMode::Block { timeout } => {
                    let now = Instant::now();
                    let since = *started.get_or_insert(now);
                    let timed_out = timeout.is_some_and(|t| now.duration_since(since) >= t);
                    if timed_out {
                        meta.writes_overflow.fetch_add(1, Ordering::Relaxed);
                        self.account_blocked(started);
                        self.set_client_error(ClientError::HitTimeout);
                        return Err(WriteError::Timeout);
                    }
                    waiting.get_or_insert_with(|| Waiting::new(&meta.room_waiters));
                    // heapprofd waits 100 us between tries.
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
    }

    /// Writes one record made of `parts` (concatenated) in drop or block
    /// mode. Returns whether the reader must be woken (see [`Reservation::commit`]).
    pub fn write_parts(&self, parts: &[&[u8]], mode: WriteMode) -> Result<bool, WriteError> {
        let len = parts.iter().map(|p| p.len()).sum();
        let mut r = self.begin_write(len, mode)?;
        let mut off = 0;
        for p in parts {
            r.write_at(off, p);
            off += p.len();
        }
        Ok(r.commit())
    }

    fn account_blocked(&self, started: Option<Instant>) {
        if let Some(s) = started {
            let us = s.elapsed().as_micros() as u64;
            self.meta().blocked_us.fetch_add(us, Ordering::Relaxed);
        }
    }

    #[inline(always)]
    fn lock(&self, started: &mut Option<Instant>) -> Result<LockGuard<'_>, WriteError> {
        let lock = &self.meta().lock;
        let mut spins = 0u32;
        loop {
            match lock.compare_exchange_weak(0, LOCK_HELD, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(LockGuard { lock }),
                Err(cur) if cur & LOCK_POISONED != 0 => return Err(WriteError::Poisoned),
                Err(_) => {}
            }
            spins += 1;
            if spins < SPINS_BEFORE_YIELD {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let since = *started.get_or_insert(now);
            if now.duration_since(since) > LOCK_TIMEOUT {
                lock.fetch_or(LOCK_POISONED, Ordering::Relaxed);
                let meta = self.meta();
                meta.spinlock_failures.fetch_add(1, Ordering::Relaxed);
                self.account_blocked(Some(since));
                return Err(WriteError::LockTimeout);
            }
            std::thread::yield_now();
        }
    }

    /// Records a client error in the metadata page for the daemon to report.
    pub fn set_client_error(&self, e: ClientError) {
        self.meta().client_error.store(e as u32, Ordering::Relaxed);
    }

    /// Called by a writer after a commit: returns true if the reader was
    /// asleep and must be woken (the caller then pokes the control socket).
    /// Clears the flag, so only one writer wakes the reader.
    ///
    /// There is deliberately no store-load fence between the commit and this
    /// load: a full fence after every record makes each writer wait for its
    /// stores to drain, which weighs most on the small, frequent records
    /// (frees). Without it, a writer that commits while the reader is
    /// pausing may miss the flag and not wake it; the record is then picked
    /// up by the reader's periodic poll (the daemon polls every 100 ms), so
    /// the race costs latency, never data. A writer that finds the buffer
    /// half full always wakes the reader (see `Reservation::commit`).
    #[inline(always)]
    pub fn take_reader_paused(&self) -> bool {
        let flag = &self.meta().reader_paused;
        flag.load(Ordering::Relaxed) != 0 && flag.swap(0, Ordering::AcqRel) != 0
    }

    /// The first writer to find the buffer over half full since the reader
    /// last made progress gets true.
    #[inline(always)]
    fn take_kick(&self, used: u64) -> bool {
        if used < self.size() as u64 / 2 {
            return false;
        }
        let k = &self.meta().reader_kicked;
        k.load(Ordering::Relaxed) == 0 && k.swap(1, Ordering::AcqRel) == 0
    }

    /// Whether the reader asked writers to stop.
    #[inline(always)]
    pub fn is_shutdown(&self) -> bool {
        self.meta().shutdown.load(Ordering::Relaxed) != 0
    }
}

/// A writer waiting for room, counted in the metadata's `room_waiters`
/// for as long as it lives: while the count is not zero the reader
/// publishes its position every 64th of the buffer instead of every
/// quarter, so a full buffer gets room back a few records at a time rather
/// than hundreds (new stacks take the daemon about 10 us each).
struct Waiting<'a>(&'a AtomicU32);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicU32) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct LockGuard<'a> {
    lock: &'a AtomicU32,
}

impl Drop for LockGuard<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        // Keep the poison bit if someone set it while we held the lock.
        self.lock.fetch_and(!LOCK_HELD, Ordering::Release);
    }
}

/// Room reserved for one record; fill it, then [`Reservation::commit`].
#[derive(Debug)]
pub struct Reservation<'a> {
    rb: &'a RingBuffer,
    header_pos: u64,
    /// Bytes in use once this record was reserved.
    used_after: u64,
    /// The writer waited for room (or for the lock) first.
    waited: bool,
    data: *mut u8,
    len: usize,
    committed: bool,
}

impl Reservation<'_> {
    /// Payload length reserved.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes of the ring in use once this record was reserved (this
    /// record's included): how far the reader is behind.
    pub fn used_after(&self) -> u64 {
        self.used_after
    }

    /// Whether the writer had to wait for room (or, long, for the lock)
    /// before this reservation.
    pub fn waited(&self) -> bool {
        self.waited
    }

    /// The ring's write position just past this record (positions only
    /// grow; the reader's is `end_pos() - used_after()`).
    pub fn end_pos(&self) -> u64 {
        self.header_pos + record_size(self.len) as u64
    }

    /// Whether the reservation is zero-length.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Raw pointer to the payload, for callers that copy from raw memory (the
    /// client copies the thread's stack). Valid for `len()` bytes.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.data
    }

    /// Copies `bytes` into the payload at `offset`; bytes beyond the
    /// reservation are ignored.
    #[inline(always)]
    pub fn write_at(&mut self, offset: usize, bytes: &[u8]) {
        let n = bytes.len().min(self.len.saturating_sub(offset));
        // SAFETY: offset + n <= len, and the reservation covers len bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.data.add(offset), n) };
    }

    /// Publishes the record to the reader. Returns true when the writer must
    /// wake the reader (the client pokes the socket): the reader is asleep,
    /// or the buffer is over half full and no writer has kicked the reader
    /// since it last made progress (it may be waiting for a timer).
    #[inline(always)]
    pub fn commit(mut self) -> bool {
        self.committed = true;
        self.rb
            .header_at(self.header_pos)
            .store(self.len as u64 | HDR_COMMITTED, Ordering::Release);
        self.rb.take_reader_paused() || self.rb.take_kick(self.used_after)
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.committed {
            let h = self.len as u64 | HDR_COMMITTED | HDR_DISCARDED;
            self.rb
                .header_at(self.header_pos)
                .store(h, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ReadOutcome;

    #[test]
    fn a_writer_waiting_for_room_gets_it_after_a_64th_of_the_buffer() {
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        let record = [7u8; 1000];
        let mut filled = 0;
        while rb.write_parts(&[&record], WriteMode::Drop).is_ok() {
            filled += 1;
        }
        assert_eq!(filled, 65, "a 64 KiB buffer holds 65 records of 1008 bytes");
        std::thread::scope(|s| {
            // Ten seconds: far longer than the reader below takes, far
            // shorter than the test's patience.
            let blocked = s.spawn(|| {
                let mode = WriteMode::Block {
                    timeout: Some(Duration::from_secs(10)),
                };
                rb.write_parts(&[&record], mode)
            });
            let since = Instant::now();
            while rb.meta().room_waiters.load(Ordering::SeqCst) == 0 {
                assert!(
                    since.elapsed() < Duration::from_secs(10),
                    "the blocked writer never said it waits"
                );
                std::thread::yield_now();
            }
            // Three reads: the third publishes the first two records' space
            // (a 64th of the buffer, 1 KiB, is more than one record),
            // which is what the waiting writer needs. Without a waiter the
            // reader would publish only after a quarter of the buffer (16
            // records), and the writer would time out.
            let mut reader = rb.reader();
            let mut buf = Vec::new();
            for _ in 0..3 {
                assert_eq!(reader.read(&mut buf), ReadOutcome::Record(1000));
            }
            assert!(blocked.join().unwrap().is_ok());
        });
        assert_eq!(rb.meta().room_waiters.load(Ordering::SeqCst), 0);
        assert!(
            rb.writer_stats().blocked_us >= 100,
            "it slept at least once"
        );
    }
}
