//! A record's bytes wherever they are: [`RecordBytes`], implemented by a
//! plain slice (and `Vec`) and by [`RingRecord`], a committed record still in the ring,
//! which the reader hands out ([`Reader::read_in_place`]) so that its
//! consumer copies each part once, straight to where it is needed.
//!
//! A malloc record is a 200-byte header and a stack copy of a few hundred
//! bytes to tens of KiB. Copied out whole, then the stack moved again into
//! its thread's buffer, every stack byte was copied twice; read in place,
//! the header goes to the stack of the caller and the stack bytes straight
//! into the thread's buffer.
//!
//! The bytes of a [`RingRecord`] are shared memory that a hostile writer may
//! change at any moment, so they are only ever read by copies the compiler
//! cannot see into (an opaque `rep movsb` on x86_64, relaxed atomic loads
//! elsewhere): each copy holds whatever bytes were there, as if read from
//! another process, and the caller trusts none of them. Two copies of one
//! record may disagree; each is decoded on its own.
//!
//! [`Reader::read_in_place`]: crate::Reader::read_in_place

use crate::ring::RingBuffer;

/// The bytes of one record, to be copied out in parts.
pub trait RecordBytes {
    /// The record's length in bytes.
    fn len(&self) -> usize;

    /// Whether the record has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the record's bytes `[start, start + dst.len())` into `dst`.
    /// Returns false, copying nothing, if they are not all in the record.
    fn copy_to(&self, start: usize, dst: &mut [u8]) -> bool;

    /// Replaces `out`'s contents with the record's bytes `[start, start +
    /// len)`; false, leaving `out` empty, if they are not all in the record.
    fn copy_to_vec(&self, start: usize, len: usize, out: &mut Vec<u8>) -> bool;
}

/// Whether `[start, start + len)` lies inside `0..record_len`.
fn inside(start: usize, len: usize, record_len: usize) -> bool {
    start.checked_add(len).is_some_and(|end| end <= record_len)
}

impl RecordBytes for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn copy_to(&self, start: usize, dst: &mut [u8]) -> bool {
        let ok = inside(start, dst.len(), self.len());
        if ok {
            dst.copy_from_slice(&self[start..start + dst.len()]);
        }
        ok
    }

    fn copy_to_vec(&self, start: usize, len: usize, out: &mut Vec<u8>) -> bool {
        out.clear();
        let ok = inside(start, len, self.len());
        if ok {
            out.extend_from_slice(&self[start..start + len]);
        }
        ok
    }
}

impl RecordBytes for Vec<u8> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn copy_to(&self, start: usize, dst: &mut [u8]) -> bool {
        self.as_slice().copy_to(start, dst)
    }

    fn copy_to_vec(&self, start: usize, len: usize, out: &mut Vec<u8>) -> bool {
        self.as_slice().copy_to_vec(start, len, out)
    }
}

/// A committed record in the ring's data area, valid until the reader's
/// next read (the reader never publishes the space of the record it last
/// returned, so writers cannot reuse it before then).
#[derive(Debug)]
pub struct RingRecord<'a> {
    data: *const u8,
    len: usize,
    ring: &'a RingBuffer,
}

impl<'a> RingRecord<'a> {
    /// The record at `data`, `len` bytes, in `ring`.
    ///
    /// # Safety
    /// `[data, data + len)` is inside `ring`'s mapping.
    pub(crate) unsafe fn new(data: *const u8, len: usize, ring: &'a RingBuffer) -> Self {
        RingRecord { data, len, ring }
    }

    /// The ring the record is in, for the reader's controls (pausing,
    /// resync requests) while the record is out.
    pub fn ring(&self) -> &'a RingBuffer {
        self.ring
    }

    /// Copies the whole record into `out`, replacing its contents.
    pub fn copy_all(&self, out: &mut Vec<u8>) {
        self.copy_to_vec(0, self.len, out);
    }
}

impl RecordBytes for RingRecord<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn copy_to(&self, start: usize, dst: &mut [u8]) -> bool {
        if !inside(start, dst.len(), self.len) {
            return false;
        }
        // SAFETY: `[start, start + dst.len())` is inside the record, which
        // is mapped (`new`'s contract); `dst` is ours, `dst.len()` bytes.
        unsafe { copy_shared(self.data.add(start), dst.as_mut_ptr(), dst.len()) };
        true
    }

    /// The bytes go straight into `out`'s spare capacity: zeroing it first
    /// (`resize`) cost a `memset` of every record, 2.7% of all CPU samples
    /// of a `record -i 1` of the distinct-stack workload
    /// (docs/PERFORMANCE.md).
    fn copy_to_vec(&self, start: usize, len: usize, out: &mut Vec<u8>) -> bool {
        out.clear();
        if !inside(start, len, self.len) {
            return false;
        }
        out.reserve(len);
        // SAFETY: `[start, start + len)` is inside the record, which is
        // mapped (`new`'s contract); `out` has room for `len` bytes,
        // reserved above on an empty vector, and they are all written
        // before the length is set.
        unsafe {
            copy_shared(self.data.add(start), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        true
    }
}

/// Copies `len` bytes of shared memory at `src` into `dst`.
///
/// On x86_64 one `rep movsb` in inline assembly: an opaque access, and it
/// moves a record's lines across cores in fewer, wider loads (`perf record`
/// of `record -i 1` of sqlite3 on a file, 5.4 KB a record, had 1,740
/// samples in the copy with a loop of word loads and 1,146 with `rep
/// movsb`, of 7,712 and 6,920 in all). Elsewhere relaxed atomic loads: of
/// whole words where `src` is aligned, then of bytes.
///
/// # Safety
/// `[src, src + len)` is mapped and readable, `[dst, dst + len)` writable
/// memory of the caller's that does not overlap it.
unsafe fn copy_shared(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's contract; the assembly reads only `len` bytes at
    // `src`, writes only `len` bytes at `dst`, and uses no stack.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        use core::sync::atomic::{AtomicU8, AtomicU64, Ordering};
        let words = if src as usize % 8 == 0 { len / 8 } else { 0 };
        for i in 0..words {
            // SAFETY: in bounds (the caller's contract); `src` is 8-aligned,
            // as AtomicU64 needs.
            let w = unsafe { AtomicU64::from_ptr(src.add(i * 8).cast_mut().cast()) }
                .load(Ordering::Relaxed);
            // SAFETY: `dst` is writable for `len >= (i + 1) * 8` bytes.
            unsafe {
                dst.add(i * 8)
                    .cast::<[u8; 8]>()
                    .write_unaligned(w.to_ne_bytes())
            };
        }
        for i in words * 8..len {
            // SAFETY: in bounds (the caller's contract).
            let b = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
            // SAFETY: `dst` is writable for `len` bytes.
            unsafe { dst.add(i).write(b) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InPlace, WriteMode};

    #[test]
    fn parts_copy_what_the_record_holds_and_nothing_outside_it() {
        let bytes: Vec<u8> = (0..61u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        let (rb, _fd) = RingBuffer::create(1 << 16).unwrap();
        let mut w = rb.begin_write(bytes.len(), WriteMode::Drop).unwrap();
        w.write_at(0, &bytes);
        w.commit();
        let mut reader = rb.reader();
        let InPlace::Record(rec) = reader.read_in_place() else {
            panic!("the record written")
        };
        assert!(std::ptr::eq(rec.ring(), &rb));
        let mut all = Vec::new();
        rec.copy_all(&mut all);
        assert_eq!(all, bytes[..61]);
        for (start, n) in [(0, 61), (0, 0), (61, 0), (3, 13), (8, 53), (60, 1)] {
            let mut dst = vec![0xaa; n];
            assert!(rec.copy_to(start, &mut dst), "{start}+{n}");
            assert_eq!(dst, bytes[start..start + n]);
            let mut from_slice = vec![0xaa; n];
            assert!(bytes.copy_to(start, &mut from_slice));
            assert_eq!(from_slice, dst);
            let (mut v, mut w) = (vec![1, 2, 3], Vec::with_capacity(100));
            assert!(rec.copy_to_vec(start, n, &mut v));
            assert!(bytes.copy_to_vec(start, n, &mut w));
            assert_eq!((&v, &w), (&dst, &dst));
        }
        for (start, n) in [(0, 62), (61, 1), (58, 4), (usize::MAX, 1)] {
            let mut dst = vec![0xaa; n];
            assert!(!rec.copy_to(start, &mut dst), "{start}+{n}");
            assert!(dst.iter().all(|&b| b == 0xaa), "nothing copied");
            assert!(!bytes.copy_to(start, &mut dst));
            let (mut v, mut w) = (vec![1, 2, 3], vec![4]);
            assert!(!rec.copy_to_vec(start, n, &mut v));
            assert!(!bytes.copy_to_vec(start, n, &mut w));
            assert!(v.is_empty() && w.is_empty(), "left empty");
        }
        assert_eq!(RecordBytes::len(&rec), 61);
        assert!(!RecordBytes::is_empty(&rec));
    }
}
