//! The ring buffer mapping and the state both sides share: creating and
//! attaching the memfd, the metadata page, record headers by position, the
//! statistics. The writers' side (reserve, commit, the spinlock) is in
//! `writer`, the reader's (copy out, publish, corruption) in `reader`; each
//! adds its methods to [`RingBuffer`] and uses only what this file offers.
//!
//! *Important*: this code is written under the assumption that the process on
//! the other side modifies any byte of the shared memory at any moment,
//! without holding the spinlock. Both sides keep the authoritative copy of
//! what they own in private memory (the reader its read position), re-check
//! every shared value before using it, and never loop without a bound.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layout::{ClientError, METADATA_MAGIC, MetadataPage};
use crate::mapping::{Mapping, SetupError};

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
    /// Samples writers thinned away instead of waiting for room.
    pub thinned: u64,
    /// Records read.
    pub reads_ok: u64,
    /// Reads that found corruption.
    pub reads_corrupt: u64,
    /// Reads that found nothing to read.
    pub reads_empty: u64,
}

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
        Self::create_with(data_size, false)
    }

    /// [`RingBuffer::create`] with every page allocated now (see
    /// `Mapping::create`): for a ring prepared before a client asks for it.
    pub fn create_allocated(data_size: u64) -> Result<(RingBuffer, OwnedFd), SetupError> {
        Self::create_with(data_size, true)
    }

    fn create_with(data_size: u64, allocate: bool) -> Result<(RingBuffer, OwnedFd), SetupError> {
        let (map, fd) = Mapping::create(data_size, allocate)?;
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
    pub(crate) fn meta(&self) -> &MetadataPage {
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

    /// [`RingBuffer::prefault`] of the metadata page and the first `bytes`
    /// of the data area only: where the first records go, while another
    /// thread faults the rest in.
    pub fn prefault_head(&self, bytes: usize) -> bool {
        self.map.prefault_head(bytes)
    }

    /// Size of the data area in bytes.
    pub fn size(&self) -> usize {
        self.map.data_size()
    }

    /// `size - 1`: the offset of a position in the data area is `pos & mask`.
    #[inline(always)]
    pub(crate) fn mask(&self) -> u64 {
        self.mask
    }

    /// Start of the data area (mapped twice back to back).
    #[inline(always)]
    pub(crate) fn data_ptr(&self) -> *mut u8 {
        self.map.data_ptr()
    }

    /// The record header at position `pos` (8-aligned).
    #[inline(always)]
    pub(crate) fn header_at(&self, pos: u64) -> &AtomicU64 {
        let off = (pos & self.mask) as usize;
        // SAFETY: `off` < size and 8-aligned (positions are validated to be
        // 8-aligned before use), so the u64 lies inside the first data copy.
        unsafe { AtomicU64::from_ptr(self.map.data_ptr().add(off).cast()) }
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
            thinned: l(&m.thinned),
            reads_ok: l(&m.reads_ok),
            reads_corrupt: l(&m.reads_corrupt),
            reads_empty: l(&m.reads_empty),
        }
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
