//! The reader's side of the ring buffer: the single [`Reader`] hands out
//! each committed record, copied out or left in place for its consumer to
//! copy in parts ([`crate::RingRecord`]), skips discarded ones, publishes
//! its read position in batches, and turns any inconsistency in the shared
//! memory into a sticky, counted [`Corruption`]. Also the reader's controls
//! on the buffer: pausing (the wake-up protocol) and shutdown.

use std::ops::Deref;
use std::sync::atomic::{Ordering, fence};

use crate::layout::{
    HDR_COMMITTED, HDR_DISCARDED, HDR_LEN_MASK, RECORD_HEADER_LEN, record_size, used_bytes,
};
use crate::ring::{RingBuffer, Stats};
use crate::ring_record::{RecordBytes, RingRecord};

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

/// Result of one read attempt of [`Reader::read_in_place`]: the record is
/// left in the ring, for its consumer to copy out in parts.
#[derive(Debug)]
pub enum InPlace<'a> {
    /// A committed record, valid until the next read.
    Record(RingRecord<'a>),
    /// Nothing was written since the last read.
    Empty,
    /// A writer has reserved the next record but not committed it yet.
    Pending,
    /// The buffer is corrupt; see [`Corruption`].
    Corrupt(Corruption),
}

impl RingBuffer {
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

    /// Returns a reader borrowing this buffer. Only one process (the daemon)
    /// may read, and only through one reader at a time.
    pub fn reader(&self) -> Reader<&RingBuffer> {
        Reader::new(self)
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
    /// Lines below this position were asked for by [`Reader::prefetch_ahead`].
    prefetched: u64,
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
            prefetched: 0,
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

    /// Copies the next record's payload into `out` (replacing its contents);
    /// otherwise as [`Reader::read_in_place`].
    pub fn read(&mut self, out: &mut Vec<u8>) -> ReadOutcome {
        match self.read_in_place() {
            InPlace::Record(r) => {
                r.copy_all(out);
                ReadOutcome::Record(r.len())
            }
            InPlace::Empty => ReadOutcome::Empty,
            InPlace::Pending => ReadOutcome::Pending,
            InPlace::Corrupt(c) => ReadOutcome::Corrupt(c),
        }
    }

    /// The next record, left in the ring: the caller copies out what it
    /// needs, where it needs it ([`RingRecord`]), before its next read.
    ///
    /// Discarded records are skipped. Never blocks, never loops more than the
    /// number of records in the buffer, never reads outside the mapping.
    ///
    /// The freed space is published to writers in batches (every quarter of
    /// the buffer, every 64th while a writer waits for room), whenever the
    /// reader runs out of records, and before every read while a writer
    /// waits in [`RingBuffer::wait_consumed`];
    /// the published position never covers the record this call returns.
    pub fn read_in_place(&mut self) -> InPlace<'_> {
        if let Some(c) = self.corrupt {
            return InPlace::Corrupt(self.count_corrupt(c));
        }
        let size = self.rb.size() as u64;
        // Each iteration either returns or skips a discarded record (>= 8
        // bytes), so this bound is never reached by a well-formed buffer.
        for _ in 0..=(size / 8) {
            // Only records returned by earlier calls are published, never
            // the one this call returns: a caller that is done with each
            // record before its next read has handled everything below the
            // published position (what `RingBuffer::wait_consumed` waits
            // for).
            let unpublished = self.read_pos - self.published_pos;
            if unpublished != 0
                && (unpublished >= size / 4
                    || self.rb.meta().drain_waiters.load(Ordering::Relaxed) != 0
                    || (unpublished >= size / ROOM_GRAIN
                        && self.rb.meta().room_waiters.load(Ordering::Relaxed) != 0))
            {
                self.publish();
            }
            if self.write_pos == self.read_pos {
                self.publish();
                let write_pos = self.rb.meta().write_pos.load(Ordering::Acquire);
                if used_bytes(self.read_pos, write_pos, size).is_none() {
                    return InPlace::Corrupt(self.set_corrupt(Corruption::Positions {
                        read_pos: self.read_pos,
                        write_pos,
                    }));
                }
                if write_pos == self.read_pos {
                    self.reads_empty += 1;
                    return InPlace::Empty;
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
                return InPlace::Pending;
            }
            if header & !(HDR_LEN_MASK | HDR_COMMITTED | HDR_DISCARDED) != 0
                || header & HDR_COMMITTED == 0
            {
                return InPlace::Corrupt(self.set_corrupt(Corruption::HeaderBits(header)));
            }
            let len = header & HDR_LEN_MASK;
            let total = record_size(len as usize) as u64;
            if total > used {
                return InPlace::Corrupt(self.set_corrupt(Corruption::RecordSize {
                    len,
                    available: used,
                }));
            }
            let off = ((self.read_pos + RECORD_HEADER_LEN as u64) & self.rb.mask()) as usize;
            self.read_pos += total;
            if header & HDR_DISCARDED == 0 {
                self.reads_ok += 1;
                self.prefetch_ahead();
                // SAFETY: `off + len <= off + record_size(len) <= 2 * size`:
                // inside the mirror mapping of the buffer this reader holds.
                // The space is not published before the next read (see
                // above).
                return InPlace::Record(unsafe {
                    RingRecord::new(self.rb.data_ptr().add(off), len as usize, &self.rb)
                });
            }
        }
        InPlace::Corrupt(self.set_corrupt(Corruption::Positions {
            read_pos: self.read_pos,
            write_pos: self.write_pos,
        }))
    }

    /// Asks the CPU to start fetching the [`PREFETCH_AHEAD`] bytes past the
    /// read position, so that the lines a writer on another core filled are
    /// on their way while the caller handles the record just read. Done
    /// after every record, for the lines not asked for yet and again for
    /// the last [`PREFETCH_REASK`] bytes of those that were: a line fetched
    /// before its writer wrote it must be fetched again, and re-asking
    /// measured better than asking once per line (daemon CPU at `-i 1`
    /// 0.575 s against 0.634 s; 0.689 s without prefetching). Re-asking the
    /// whole 4 KiB after every record (64 prefetches) cost more once stack
    /// reuse made records small (550 bytes on average): sqlite3 on a file
    /// at `-i 1`, 15 rounds interleaved, CPU 0.878 -> 0.828 s, wall 0.720
    /// -> 0.652 s; cc1's CPU the same. A hint only: nothing is read,
    /// nothing can fault.
    ///
    /// Never past the last write position seen: lines a writer has not
    /// reserved yet are the ones it is about to fill, and fetching them here
    /// would take them away from its core just before it writes them.
    #[inline]
    fn prefetch_ahead(&mut self) {
        let end = (self.read_pos + PREFETCH_AHEAD).min(self.write_pos);
        let start = self
            .prefetched
            .saturating_sub(PREFETCH_REASK)
            .max(self.read_pos)
            & !63;
        self.prefetched = self.prefetched.max(end);
        let mut pos = start;
        while pos < end {
            let p = self
                .rb
                .data_ptr()
                .wrapping_add((pos & self.rb.mask()) as usize);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `p` is inside the data area; a prefetch has no
            // architectural effect and never faults.
            unsafe {
                std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
            };
            #[cfg(target_arch = "aarch64")]
            // SAFETY: `p` is inside the data area; `prfm` has no
            // architectural effect and never faults (the stable intrinsic
            // does not exist yet).
            unsafe {
                core::arch::asm!("prfm pldl1keep, [{p}]", p = in(reg) p,
                    options(nostack, preserves_flags, readonly))
            };
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let _ = p;
            pos += 64;
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

    fn set_corrupt(&mut self, c: Corruption) -> Corruption {
        self.corrupt = Some(c);
        self.count_corrupt(c)
    }

    fn count_corrupt(&mut self, c: Corruption) -> Corruption {
        self.reads_corrupt += 1;
        self.rb
            .meta()
            .reads_corrupt
            .store(self.reads_corrupt, Ordering::Relaxed);
        c
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

/// While writers wait for room, the reader publishes its position each
/// time it has freed this fraction of the buffer (32 KiB of the default
/// 2 MiB) rather than each quarter: a writer blocked on a full buffer
/// waits for a few dozen records, not hundreds. Finer than that, the
/// position's cache line moves to the writers after every record, and
/// `-i 1` (whose writers wait all the time) paid for it.
const ROOM_GRAIN: u64 = 64;

/// How far past the read position the reader prefetches (a malloc record
/// with a 2 KiB stack is ~2.4 KiB; 1.5, 2.5 and 4 KiB measured 0.612,
/// 0.595 and 0.582 s of daemon CPU at `-i 1`).
const PREFETCH_AHEAD: u64 = 4096;

/// How far below the highest line asked for the reader asks again (see
/// [`Reader::prefetch_ahead`]).
const PREFETCH_REASK: u64 = 512;
