//! The metadata page and record headers: the exact bytes both sides share.
//!
//! ```text
//! memfd:   [ metadata page (one OS page) ][ data area (size bytes, power of two) ]
//! mapping: [ metadata ][ data ][ data again ]   <- the data area is mapped twice,
//!                                                  so a record that wraps is still
//!                                                  contiguous in virtual memory
//! record:  [ header: u64 ][ payload, padded to 8 bytes ]
//! header:  bits 0..32 payload length, bit 32 COMMITTED, bit 33 DISCARDED; 0 = reserved,
//!          not yet committed
//! ```
//!
//! Every field of the metadata page is an atomic, because the other process
//! may change any of them at any moment (and a hostile peer may write any
//! value). Positions are monotonically increasing byte counters; the offset of
//! a position in the data area is `pos & (size - 1)`.

use core::sync::atomic::{AtomicU32, AtomicU64};

/// Lock word bit: a writer holds the spinlock.
pub(crate) const LOCK_HELD: u32 = 1;
/// Lock word bit: a writer gave up waiting; no writer takes the lock again.
pub(crate) const LOCK_POISONED: u32 = 2;

/// Record header bit: the payload is complete and may be read.
pub(crate) const HDR_COMMITTED: u64 = 1 << 32;
/// Record header bit: the writer gave up on this record; the reader skips it.
pub(crate) const HDR_DISCARDED: u64 = 1 << 33;
/// Mask of the payload length in a header.
pub(crate) const HDR_LEN_MASK: u64 = 0xffff_ffff;
/// Bytes of a record header.
pub const RECORD_HEADER_LEN: usize = 8;

/// Writer-side error states recorded in the metadata page (heapprofd's `ErrorState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u32)]
pub enum ClientError {
    /// No error.
    #[default]
    None = 0,
    /// A blocking writer waited longer than the configured timeout.
    HitTimeout = 1,
    /// The client could not determine a thread's stack bounds.
    InvalidStackBounds = 2,
}

impl ClientError {
    /// Interprets an untrusted error word; unknown values are `None`.
    pub fn from_u32(v: u32) -> ClientError {
        match v {
            1 => ClientError::HitTimeout,
            2 => ClientError::InvalidStackBounds,
            _ => ClientError::None,
        }
    }
}

/// The shared metadata page. `#[repr(C)]` with a pinned size: both sides of a
/// session (possibly different builds, one day different ABIs) read it.
///
/// Fields are grouped by which side writes them, one cache line per group,
/// so the reader and the writers do not bounce a line on every record.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct MetadataPage {
    // --- line 0: set up once, rarely written -------------------------------
    /// Version of this layout, written by the creator.
    pub magic: AtomicU64,
    /// Size of the data area in bytes, written by the creator (informational;
    /// each side trusts its own mapping size instead).
    pub data_size: AtomicU64,
    /// Set by the daemon when the session ends; writers stop writing.
    pub shutdown: AtomicU32,
    /// [`ClientError`] recorded by a writer.
    pub client_error: AtomicU32,
    /// Set by the reader before it sleeps; a writer that clears it wakes the reader.
    pub reader_paused: AtomicU32,
    /// Set by the writer that found the buffer over half full and woke the
    /// reader; cleared by the reader when it publishes progress.
    pub reader_kicked: AtomicU32,
    /// Writers waiting in [`RingBuffer::wait_consumed`](crate::RingBuffer)
    /// (a count): while it is not 0 the reader publishes its position
    /// before every read instead of every quarter of the buffer. Zero
    /// (nobody waits) for a peer that predates it.
    pub drain_waiters: AtomicU32,
    /// Bumped by the client after the process unloaded an object
    /// (`dlclose`): the reader's process must re-read its maps before
    /// unwinding the records that follow. Never changes for a peer that
    /// predates it.
    pub unload_epoch: AtomicU32,
    /// Bumped by the reader when it forgot a thread's stack base (or met a
    /// sample whose base it lacks): a writer whose last stack was sent
    /// under another value sends its next one whole. Never changes for a
    /// peer that predates it.
    pub stack_resync: AtomicU32,
    /// Bumped by the client when it wants its maps read now (its process
    /// is about to exit with objects loaded since the handshake; see
    /// `maps_ask`). Never changes for a peer that predates it.
    pub maps_asked: AtomicU32,
    /// The `maps_asked` value whose maps the daemon has read and kept.
    pub maps_kept: AtomicU32,
    /// Writers waiting for room in a full buffer (a count): while it is
    /// not 0 the reader publishes its position every 64th of the buffer
    /// instead of every quarter. Zero (nobody waits) for a peer that
    /// predates it.
    pub room_waiters: AtomicU32,
    /// `libc.malloc` samples writers thinned away rather than wait for
    /// room (the client's `thinning`: each stands for the samples a
    /// raised interval does not take). Zero from a peer that predates it.
    pub thinned: AtomicU64,
    // --- line 1: writers (under the spinlock or relaxed RMWs) ---------------
    /// Spinlock word: [`LOCK_HELD`] | [`LOCK_POISONED`].
    pub lock: AtomicU32,
    _pad1: u32,
    /// Total bytes reserved by writers (monotonic).
    pub write_pos: AtomicU64,
    pub bytes_written: AtomicU64,
    pub writes_ok: AtomicU64,
    pub writes_overflow: AtomicU64,
    pub writes_corrupt: AtomicU64,
    pub spinlock_failures: AtomicU64,
    pub blocked_us: AtomicU64,
    // --- line 2: the reader -------------------------------------------------
    /// Total bytes released by the reader (monotonic).
    pub read_pos: AtomicU64,
    // Reader statistics, mirrored here by the reader now and then for the
    // writer's benefit (the reader's own copy is authoritative).
    pub reads_ok: AtomicU64,
    pub reads_corrupt: AtomicU64,
    pub reads_empty: AtomicU64,
}

/// Byte offsets of the fields tests and fuzzers poke at as a hostile peer.
pub mod offsets {
    /// The spinlock word.
    pub const LOCK: usize = 64;
    /// The writers' position.
    pub const WRITE_POS: usize = 72;
    /// The reader's published position.
    pub const READ_POS: usize = 128;
}

const _: () = assert!(core::mem::offset_of!(MetadataPage, lock) == offsets::LOCK);
const _: () = assert!(core::mem::offset_of!(MetadataPage, write_pos) == offsets::WRITE_POS);
const _: () = assert!(core::mem::offset_of!(MetadataPage, read_pos) == offsets::READ_POS);

/// `b"HPRSRING"` + layout version 1 in the low byte.
pub(crate) const METADATA_MAGIC: u64 = u64::from_le_bytes(*b"HPRSRNG\x01");

// Layout pin: three 64-byte lines.
const _: () = assert!(core::mem::size_of::<MetadataPage>() == 192);

/// Rounds a payload length up to the 8-byte record granularity.
#[inline(always)]
pub(crate) const fn padded(len: usize) -> usize {
    (len + 7) & !7
}

/// Bytes a record with `payload_len` bytes of payload occupies in the data area.
#[inline(always)]
pub const fn record_size(payload_len: usize) -> usize {
    RECORD_HEADER_LEN + padded(payload_len)
}

/// Checks the two positions read from shared memory against the data size.
///
/// Returns the number of bytes between them, or `None` when they cannot have
/// been produced by well-behaved peers (reader ahead of writer, more than a
/// whole buffer outstanding, or not 8-aligned).
#[inline(always)]
pub fn used_bytes(read_pos: u64, write_pos: u64, size: u64) -> Option<u64> {
    if read_pos % 8 != 0 || write_pos % 8 != 0 {
        return None;
    }
    let used = write_pos.checked_sub(read_pos)?;
    (used <= size).then_some(used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn record_sizes() {
        assert_eq!(record_size(0), 8);
        assert_eq!(record_size(1), 16);
        assert_eq!(record_size(8), 16);
        assert_eq!(record_size(9), 24);
    }

    proptest! {
        #[test]
        fn used_bytes_accepts_exactly_valid_positions(r in any::<u64>(), w in any::<u64>(), shift in 3u32..40) {
            let size = 1u64 << shift;
            let got = used_bytes(r, w, size);
            let valid = r % 8 == 0 && w % 8 == 0 && w >= r && w - r <= size;
            prop_assert_eq!(got.is_some(), valid);
            if let Some(u) = got {
                prop_assert_eq!(u, w - r);
                prop_assert!(u <= size);
            }
        }

        #[test]
        fn offsets_stay_inside_the_double_mapping(pos in any::<u64>(), shift in 12u32..30, len in 0usize..(1 << 12)) {
            // A record that fits in the buffer never reaches past the second copy.
            let size = 1u64 << shift;
            let off = pos & (size - 1);
            let total = record_size(len) as u64;
            prop_assume!(total <= size);
            prop_assert!(off + total <= 2 * size);
        }

        #[test]
        fn padding_is_minimal(len in 0usize..1_000_000) {
            let p = padded(len);
            prop_assert!(p >= len && p - len < 8 && p % 8 == 0);
        }
    }
}
