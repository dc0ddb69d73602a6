//! The ring buffer proper: writers reserve and commit, the single reader copies out.
//!
//! *Important*: this code is written under the assumption that the process on
//! the other side modifies any byte of the shared memory at any moment,
//! without holding the spinlock. Both sides keep the authoritative copy of
//! what they own in private memory (the reader its read position), re-check
//! every shared value before using it, and never loop without a bound.

use std::ops::Deref;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use crate::layout::{
    ClientError, HDR_COMMITTED, HDR_DISCARDED, HDR_LEN_MASK, LOCK_HELD, LOCK_POISONED,
    METADATA_MAGIC, MetadataPage, RECORD_HEADER_LEN, record_size, used_bytes,
};
use crate::mapping::{Mapping, SetupError};

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

/// Why the reader considers the buffer corrupt. Corruption is sticky: once
/// seen, every later read returns it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corruption {
    /// The write position is behind the read position, too far ahead, or misaligned.
    Positions {
        /// Our read position.
        read_pos: u64,
        /// The write position found in shared memory.
        write_pos: u64,
    },
    /// A committed header claims more bytes than were reserved.
    RecordSize {
        /// Payload length from the header.
        len: u64,
        /// Bytes available between the positions.
        available: u64,
    },
    /// A header has bits set that no writer sets.
    HeaderBits(u64),
}

/// Result of one read attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOutcome {
    /// A record was copied into the caller's buffer; its payload length.
    Record(usize),
    /// Nothing was written since the last read.
    Empty,
    /// A writer has reserved the next record but not committed it yet.
    Pending,
    /// The buffer is corrupt; see [`Corruption`].
    Corrupt(Corruption),
}

/// A snapshot of the buffer statistics.
///
/// Writer-side numbers come from shared memory and are only as trustworthy
/// as the writer; reader-side numbers are the reader's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of records reserved by writers.
    pub bytes_written: u64,
    /// Records reserved successfully.
    pub writes_ok: u64,
    /// Records dropped because the buffer was full.
    pub writes_overflow: u64,
    /// Writes refused because the positions were inconsistent.
    pub writes_corrupt: u64,
    /// Times a writer gave up on the spinlock.
    pub spinlock_failures: u64,
    /// Microseconds writers spent waiting (spinlock or full buffer).
    pub blocked_us: u64,
    /// Records read.
    pub reads_ok: u64,
    /// Reads that found corruption.
    pub reads_corrupt: u64,
    /// Reads that found nothing to read.
    pub reads_empty: u64,
}

/// How long a writer spins for the lock before poisoning it. The critical
/// section is a handful of instructions, so only a writer that died or was
/// descheduled for this long while holding the lock makes anyone wait this long.
const LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// Spins before a waiting writer starts yielding the CPU.
const SPINS_BEFORE_YIELD: u32 = 128;

/// A ring buffer mapped into this process: the daemon's and the client's view.
#[derive(Debug)]
pub struct RingBuffer {
    map: Mapping,
    mask: u64,
}

impl RingBuffer {
    /// Creates a new sealed memfd ring buffer with `data_size` bytes of data
    /// (a power of two, at least a page) and returns it with the descriptor
    /// to hand to the client.
    pub fn create(data_size: u64) -> Result<(RingBuffer, OwnedFd), SetupError> {
        let (map, fd) = Mapping::create(data_size)?;
        let rb = RingBuffer {
            mask: map.data_size() as u64 - 1,
            map,
        };
        rb.meta().magic.store(METADATA_MAGIC, Ordering::Relaxed);
        rb.meta().data_size.store(data_size, Ordering::Relaxed);
        Ok((rb, fd))
    }

    /// Maps a ring buffer received from the daemon.
    pub fn attach(fd: &OwnedFd) -> Result<RingBuffer, SetupError> {
        let map = Mapping::attach(fd)?;
        Ok(RingBuffer {
            mask: map.data_size() as u64 - 1,
            map,
        })
    }

    #[inline(always)]
    fn meta(&self) -> &MetadataPage {
        // SAFETY: the metadata page is mapped for the lifetime of `self`, is
        // page-aligned, and consists of atomics only.
        unsafe { &*self.map.meta_ptr().cast::<MetadataPage>() }
    }

    /// Faults the whole mapping in now, so that writers do not take a page
    /// fault on each page they touch for the first time (the client calls it
    /// once after attaching, off the allocation path). Contents are not
    /// changed. Returns false if the kernel does not support it.
    pub fn prefault(&self) -> bool {
        self.map.prefault()
    }

    /// Hints the CPU to fetch, for writing, the `len` bytes the next record
    /// will most likely occupy (right after the current write position), so
    /// the next writer does not wait for each cache line's ownership while
    /// it copies. A hint only: it reads one shared position, touches no
    /// memory, and is wrong at no cost other than bandwidth.
    #[inline]
    pub fn prefetch_next(&self, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use core::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
            let wp = self.meta().write_pos.load(Ordering::Relaxed);
            let off = (wp & self.mask) as usize;
            let len = len.min(self.size());
            let base = self.map.data_ptr();
            let mut i = 0;
            while i < len {
                // SAFETY: `off + i < 2 * size`, inside the mirror mapping;
                // a prefetch never faults anyway.
                unsafe { _mm_prefetch::<_MM_HINT_ET0>(base.add(off + i).cast()) };
                i += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = len;
    }

    /// Size of the data area in bytes.
    pub fn size(&self) -> usize {
        self.map.data_size()
    }

    #[inline(always)]
    fn header_at(&self, pos: u64) -> &AtomicU64 {
        let off = (pos & self.mask) as usize;
        // SAFETY: `off` < size and 8-aligned (positions are validated to be
        // 8-aligned before use), so the u64 lies inside the first data copy.
        unsafe { AtomicU64::from_ptr(self.map.data_ptr().add(off).cast()) }
    }

    // ----- writer side -----------------------------------------------------

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
                let off = ((write_pos + RECORD_HEADER_LEN as u64) & self.mask) as usize;
                return Ok(Reservation {
                    rb: self,
                    header_pos: write_pos,
                    used_after: used + total,
                    // SAFETY: off < size and off + len <= 2 * size thanks to
                    // the mirror mapping (len < size).
                    data: unsafe { self.map.data_ptr().add(off) },
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

    // ----- reader side -----------------------------------------------------

    /// Marks the reader as asleep. After calling this the reader must try one
    /// more read before sleeping: a writer that committed before seeing the
    /// flag will not wake it. Even then a writer racing with the pause may
    /// not wake it (see [`RingBuffer::take_reader_paused`]): a reader must
    /// also poll now and then.
    pub fn pause_reader(&self) {
        self.meta().reader_paused.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// Clears the paused flag (the reader found more work after pausing).
    pub fn unpause_reader(&self) {
        self.meta().reader_paused.store(0, Ordering::Relaxed);
    }

    /// Asks all writers to stop.
    pub fn set_shutdown(&self) {
        self.meta().shutdown.store(1, Ordering::Relaxed);
    }

    /// Writer-side error state recorded by the client.
    pub fn client_error(&self) -> ClientError {
        ClientError::from_u32(self.meta().client_error.load(Ordering::Relaxed))
    }

    /// Writer statistics from shared memory (untrusted).
    pub fn writer_stats(&self) -> Stats {
        let m = self.meta();
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            bytes_written: l(&m.bytes_written),
            writes_ok: l(&m.writes_ok),
            writes_overflow: l(&m.writes_overflow),
            writes_corrupt: l(&m.writes_corrupt),
            spinlock_failures: l(&m.spinlock_failures),
            blocked_us: l(&m.blocked_us),
            reads_ok: l(&m.reads_ok),
            reads_corrupt: l(&m.reads_corrupt),
            reads_empty: l(&m.reads_empty),
        }
    }

    /// Returns a reader borrowing this buffer. Only one process (the daemon)
    /// may read, and only through one reader at a time.
    pub fn reader(&self) -> Reader<&RingBuffer> {
        Reader::new(self)
    }

    /// Raw pointers to the metadata page and the data area, for fuzzers and
    /// tests that play the hostile peer. Writing through them is exactly what
    /// the reader must survive.
    pub fn raw_parts_for_testing(&self) -> (*mut u8, *mut u8) {
        (self.map.meta_ptr(), self.map.data_ptr())
    }

    /// Size of the shared metadata structure (the rest of the page is unused).
    pub const fn metadata_len() -> usize {
        core::mem::size_of::<MetadataPage>()
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
    data: *mut u8,
    len: usize,
    committed: bool,
}

impl Reservation<'_> {
    /// Payload length reserved.
    pub fn len(&self) -> usize {
        self.len
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

/// The single reader. Keeps its read position privately and only publishes
/// it; the shared copy is never read back.
///
/// `B` is how the reader holds the buffer: `&RingBuffer` from
/// [`RingBuffer::reader`], or an owning pointer (`Box`, `Arc`) from
/// [`Reader::new`] when the reader must live alongside other session state.
#[derive(Debug)]
pub struct Reader<B: Deref<Target = RingBuffer>> {
    rb: B,
    read_pos: u64,
    /// Last read position stored to shared memory.
    published_pos: u64,
    /// Last validated write position seen; records below it need no reload.
    write_pos: u64,
    corrupt: Option<Corruption>,
    reads_ok: u64,
    reads_corrupt: u64,
    reads_empty: u64,
}

impl<B: Deref<Target = RingBuffer>> Reader<B> {
    /// A reader starting at the beginning of a buffer the caller created.
    pub fn new(rb: B) -> Self {
        Reader {
            rb,
            read_pos: 0,
            published_pos: 0,
            write_pos: 0,
            corrupt: None,
            reads_ok: 0,
            reads_corrupt: 0,
            reads_empty: 0,
        }
    }

    /// The buffer being read.
    pub fn ring(&self) -> &RingBuffer {
        &self.rb
    }

    /// Copies the next record's payload into `out` (replacing its contents).
    ///
    /// Discarded records are skipped. Never blocks, never loops more than the
    /// number of records in the buffer, never reads outside the mapping.
    ///
    /// The freed space is published to writers in batches (every quarter of
    /// the buffer) and whenever the reader runs out of records.
    pub fn read(&mut self, out: &mut Vec<u8>) -> ReadOutcome {
        if let Some(c) = self.corrupt {
            return self.count_corrupt(c);
        }
        let size = self.rb.size() as u64;
        // Each iteration either returns or skips a discarded record (>= 8
        // bytes), so this bound is never reached by a well-formed buffer.
        for _ in 0..=(size / 8) {
            if self.write_pos == self.read_pos {
                self.publish();
                let write_pos = self.rb.meta().write_pos.load(Ordering::Acquire);
                if used_bytes(self.read_pos, write_pos, size).is_none() {
                    return self.set_corrupt(Corruption::Positions {
                        read_pos: self.read_pos,
                        write_pos,
                    });
                }
                if write_pos == self.read_pos {
                    self.reads_empty += 1;
                    return ReadOutcome::Empty;
                }
                self.write_pos = write_pos;
            }
            // The record at read_pos was reserved by a writer that moved the
            // write position past its end before we loaded it, so a committed
            // record must fit below self.write_pos.
            let used = self.write_pos - self.read_pos;
            let header = self.rb.header_at(self.read_pos).load(Ordering::Acquire);
            if header == 0 {
                self.publish();
                return ReadOutcome::Pending;
            }
            if header & !(HDR_LEN_MASK | HDR_COMMITTED | HDR_DISCARDED) != 0
                || header & HDR_COMMITTED == 0
            {
                return self.set_corrupt(Corruption::HeaderBits(header));
            }
            let len = header & HDR_LEN_MASK;
            let total = record_size(len as usize) as u64;
            if total > used {
                return self.set_corrupt(Corruption::RecordSize {
                    len,
                    available: used,
                });
            }
            let discarded = header & HDR_DISCARDED != 0;
            if !discarded {
                let off = ((self.read_pos + RECORD_HEADER_LEN as u64) & self.rb.mask) as usize;
                copy_out(self.rb.map.data_ptr(), off, len as usize, out);
            }
            self.read_pos += total;
            if self.read_pos - self.published_pos >= size / 4 {
                self.publish();
            }
            if !discarded {
                self.reads_ok += 1;
                self.prefetch_ahead();
                return ReadOutcome::Record(len as usize);
            }
        }
        self.set_corrupt(Corruption::Positions {
            read_pos: self.read_pos,
            write_pos: self.write_pos,
        })
    }

    /// Asks the CPU to start fetching the [`PREFETCH_AHEAD`] bytes past the
    /// read position, so that the lines a writer on another core filled are
    /// on their way while the caller handles the record just read. Done
    /// after every record, even for lines asked for before: a line fetched
    /// before its writer wrote it must be fetched again, and re-asking
    /// measured better than asking once per line (daemon CPU at `-i 1`
    /// 0.575 s against 0.634 s; 0.689 s without prefetching). A hint only:
    /// nothing is read, nothing can fault.
    ///
    /// Never past the last write position seen: lines a writer has not
    /// reserved yet are the ones it is about to fill, and fetching them here
    /// would take them away from its core just before it writes them.
    #[inline]
    fn prefetch_ahead(&self) {
        #[cfg(target_arch = "x86_64")]
        for line in 0..PREFETCH_AHEAD.min(self.write_pos.saturating_sub(self.read_pos)) / 64 {
            let pos = (self.read_pos + line * 64) & self.rb.mask;
            // SAFETY: `pos` is inside the data area; a prefetch has no
            // architectural effect and never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch(
                    self.rb
                        .map
                        .data_ptr()
                        .wrapping_add(pos as usize)
                        .cast::<i8>(),
                    std::arch::x86_64::_MM_HINT_T0,
                )
            };
        }
    }

    /// Stores the read position (freeing space for writers) and mirrors the
    /// reader statistics into shared memory.
    fn publish(&mut self) {
        let meta = self.rb.meta();
        if meta.reader_kicked.load(Ordering::Relaxed) != 0 {
            meta.reader_kicked.store(0, Ordering::Relaxed);
        }
        if self.published_pos != self.read_pos {
            meta.read_pos.store(self.read_pos, Ordering::Release);
            self.published_pos = self.read_pos;
        }
        meta.reads_ok.store(self.reads_ok, Ordering::Relaxed);
        meta.reads_empty.store(self.reads_empty, Ordering::Relaxed);
        meta.reads_corrupt
            .store(self.reads_corrupt, Ordering::Relaxed);
    }

    fn set_corrupt(&mut self, c: Corruption) -> ReadOutcome {
        self.corrupt = Some(c);
        self.count_corrupt(c)
    }

    fn count_corrupt(&mut self, c: Corruption) -> ReadOutcome {
        self.reads_corrupt += 1;
        self.rb
            .meta()
            .reads_corrupt
            .store(self.reads_corrupt, Ordering::Relaxed);
        ReadOutcome::Corrupt(c)
    }

    /// The reader's own statistics merged with the writer's shared ones.
    pub fn stats(&self) -> Stats {
        Stats {
            reads_ok: self.reads_ok,
            reads_corrupt: self.reads_corrupt,
            reads_empty: self.reads_empty,
            ..self.rb.writer_stats()
        }
    }

    /// The corruption seen, if any.
    pub fn corruption(&self) -> Option<Corruption> {
        self.corrupt
    }

    /// Bytes currently between the reader and the writers (untrusted).
    pub fn backlog(&self) -> u64 {
        let wp = self.rb.meta().write_pos.load(Ordering::Relaxed);
        wp.saturating_sub(self.read_pos)
    }
}

/// How far past the read position the reader prefetches (a malloc record
/// with a 2 KiB stack is ~2.4 KiB; 1.5, 2.5 and 4 KiB measured 0.612,
/// 0.595 and 0.582 s of daemon CPU at `-i 1`).
const PREFETCH_AHEAD: u64 = 4096;

/// Copies `len` bytes at `off` of the data area into `out` with relaxed
/// atomic loads: the writer may be scribbling on them concurrently (if it is
/// hostile), and racing plain reads would be undefined behaviour.
fn copy_out(data: *mut u8, off: usize, len: usize, out: &mut Vec<u8>) {
    let words = len.div_ceil(8);
    out.clear();
    out.resize(words * 8, 0);
    // `off` is 8-aligned and `off + words * 8 <= 2 * size`, inside the mirror.
    for (i, dst) in out.chunks_exact_mut(8).enumerate() {
        // SAFETY: in bounds as above; AtomicU64 needs 8-byte alignment,
        // which data (page aligned) + off (8-aligned) gives.
        let w =
            unsafe { AtomicU64::from_ptr(data.add(off + i * 8).cast()) }.load(Ordering::Relaxed);
        dst.copy_from_slice(&w.to_ne_bytes());
    }
    out.truncate(len);
}
