//! The ring-buffer records: [`MallocHeader`] + stack bytes, [`FreeRecord`],
//! [`HeapNameRecord`] (and [`ContextRecord`], in its own file), each opening
//! with its [`RecordKind`], and [`Record`], any of them decoded by its kind tag.

use super::arch::{Arch, RegisterFile, UNWIND_REGS};
use super::codec::{DecodeError, Get, HEAP_NAME_LEN, Put, encode_name, heap_name_str};
use super::context::ContextRecord;
use super::kind::RecordKind;
use super::stack_sample::{EventNameRecord, StackSampleHeader};

/// The most stack bytes a malloc record may reuse from its thread's base
/// (`MallocHeader::stack_reused`): the client keeps the top this many bytes
/// of a thread's last sampled stack, the daemon needs no more of a base.
pub const STACK_REUSE_WINDOW: usize = 64 * 1024;

fn check_kind(g: &mut Get<'_>, expected: RecordKind) -> Result<u32, DecodeError> {
    let kind = g.u32();
    let kind_ok = RecordKind::from_u32(kind)?;
    if kind_ok != expected {
        return Err(DecodeError::WrongKind {
            expected: expected as u32,
            found: kind,
        });
    }
    Ok(g.u32())
}

/// Fixed part of a malloc sample; the raw stack bytes follow it directly.
///
/// The sample's stack is `[stack_pointer, stack_pointer + stack_len +
/// stack_reused)`. The record carries its first `stack_len` bytes; the
/// `stack_reused` bytes above them are the top bytes of the same thread's
/// previous [`MallocHeader::FLAG_STACK_BASE`] sample of the session, which
/// ended at the same address (Since [`version::V6`](super::version::V6);
/// see `heapprofd_client_core`'s `stackreuse` for why they are unchanged
/// and the daemon's `thread_stacks` for how they are put back).
///
/// `R` holds the registers: a decoded header has them in a
/// [`RegisterFile`]; a client writing one has them as captured
/// ([`CapturedRegs`]), so that a sample builds no 34-slot file (about 550
/// bytes of stores in the sampled thread, for 8 registers on x86_64) only
/// for the encoder to gather them back. The bytes are the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MallocHeader<R = RegisterFile> {
    /// [`MallocHeader::FLAG_STACK_TRUNCATED`] and friends.
    pub flags: u32,
    /// 0 (since [`version::V7`](super::version::V7) the daemon numbers
    /// the records in ring order; was the client's sequence number).
    pub sequence: u64,
    /// Size the program asked for.
    pub alloc_size: u64,
    /// Bytes this sample stands for (>= `alloc_size` when sampled below the interval).
    pub sample_size: u64,
    /// Address returned to the program.
    pub address: u64,
    /// CLOCK_MONOTONIC_COARSE, nanoseconds.
    pub timestamp_ns: u64,
    /// The user context installed on the allocating thread
    /// ([`CONTEXT_NONE`](super::CONTEXT_NONE) = none), defined by a
    /// [`ContextRecord`] earlier in the ring.
    pub context_id: u64,
    /// Kernel thread id of the allocating thread.
    pub tid: u32,
    /// Heap the allocation belongs to.
    pub heap_id: u32,
    /// How to read `regs`.
    pub arch: Arch,
    /// Address of the first stack byte copied.
    pub stack_pointer: u64,
    /// Number of stack bytes that follow the header.
    pub stack_len: u64,
    /// Bytes of the stack above those, taken from the thread's base (at
    /// most [`STACK_REUSE_WINDOW`]; 0 = the record carries the whole stack).
    pub stack_reused: u32,
    /// Registers at the capture point. Only the arch's
    /// [`Arch::unwind_slots`] travel (the others decode as 0).
    pub regs: R,
}

/// Where an encoded header's unwind registers come from.
pub trait UnwindRegs {
    /// The value of the `i`th of `arch`'s [`Arch::unwind_slots`] (0 past
    /// the end).
    fn unwind_value(&self, arch: Arch, i: usize) -> u64;
}

impl UnwindRegs for RegisterFile {
    fn unwind_value(&self, arch: Arch, i: usize) -> u64 {
        arch.unwind_slots().get(i).map_or(0, |&s| self.0[s])
    }
}

/// Registers as a client captures them: the values of the arch's
/// [`Arch::unwind_slots`], in that order (at most [`UNWIND_REGS`] travel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapturedRegs<'a>(pub &'a [u64]);

impl UnwindRegs for CapturedRegs<'_> {
    fn unwind_value(&self, _arch: Arch, i: usize) -> u64 {
        self.0.get(i).copied().unwrap_or(0)
    }
}

impl MallocHeader {
    /// Bytes of the fixed part on the wire.
    pub const ENCODED_LEN: usize = 88 + UNWIND_REGS * 8;
    /// The stack copy was cut short (cap reached); unwinding may stop early.
    pub const FLAG_STACK_TRUNCATED: u32 = 1;
    /// The stack bounds of the thread were unknown; only registers were sent.
    pub const FLAG_NO_STACK: u32 = 2;
    /// This sample's whole stack becomes its thread's base: the next
    /// sample of the thread may reuse its top bytes (`stack_reused`). Set
    /// on every record that reuses, too.
    pub const FLAG_STACK_BASE: u32 = 4;
    /// Bits 8..12: the sample was drawn at the heap's interval times
    /// `2^shift` (the client raised its interval while its ring was
    /// filling: `ClientConfig::FLAG_ADAPTIVE_INTERVAL`); 0 = the heap's
    /// interval. At most [`MallocHeader::MAX_INTERVAL_SHIFT`].
    pub const INTERVAL_SHIFT_MASK: u32 = 0x1f << Self::INTERVAL_SHIFT_BIT;
    /// Lowest bit of [`MallocHeader::INTERVAL_SHIFT_MASK`].
    pub const INTERVAL_SHIFT_BIT: u32 = 8;
    /// Largest interval shift a record may carry (an interval 1,024 times
    /// the configured one).
    pub const MAX_INTERVAL_SHIFT: u32 = 10;

    /// The interval shift in `flags` (see [`MallocHeader::INTERVAL_SHIFT_MASK`]).
    pub fn interval_shift(&self) -> u32 {
        Self::shift_in(self.flags)
    }

    const fn shift_in(flags: u32) -> u32 {
        (flags & Self::INTERVAL_SHIFT_MASK) >> Self::INTERVAL_SHIFT_BIT
    }

    /// Decodes a whole malloc record: the header and the stack bytes after it.
    ///
    /// Trailing bytes beyond `stack_len` (ring-buffer padding) are allowed up
    /// to 7; anything else is a [`DecodeError::StackLength`].
    pub fn decode(buf: &[u8]) -> Result<(MallocHeader, &[u8]), DecodeError> {
        let fixed = buf
            .first_chunk::<{ Self::ENCODED_LEN }>()
            .ok_or(DecodeError::Truncated {
                need: Self::ENCODED_LEN,
                have: buf.len(),
            })?;
        let h = Self::decode_fixed(fixed, buf.len())?;
        // `decode_fixed` checked that `stack_len` bytes follow the header.
        let stack = buf
            .get(Self::ENCODED_LEN..)
            .and_then(|rest| rest.get(..h.stack_len as usize))
            .unwrap_or_default();
        Ok((h, stack))
    }

    /// Decodes the fixed part of a malloc record of `record_len` bytes in
    /// all, checking the stack length against those bytes as
    /// [`MallocHeader::decode`] does, for a reader that copies the stack
    /// bytes on its own (where its thread's stack goes). On success
    /// `stack_len` bytes follow the fixed part.
    pub fn decode_fixed(
        fixed: &[u8; Self::ENCODED_LEN],
        record_len: usize,
    ) -> Result<MallocHeader, DecodeError> {
        let mut g = Get::new(fixed, Self::ENCODED_LEN)?;
        let flags = check_kind(&mut g, RecordKind::Malloc)?;
        let sequence = g.u64();
        let alloc_size = g.u64();
        let sample_size = g.u64();
        let address = g.u64();
        let timestamp_ns = g.u64();
        let context_id = g.u64();
        let tid = g.u32();
        let heap_id = g.u32();
        let arch = Arch::from_u32(g.u32())?;
        let stack_reused = g.u32();
        let stack_pointer = g.u64();
        let stack_len = g.u64();
        let mut values = [0u64; UNWIND_REGS];
        for v in values.iter_mut() {
            *v = g.u64();
        }
        let mut regs = RegisterFile::default();
        arch.place_unwind_regs(&values, &mut regs.0);
        let rest = record_len.saturating_sub(Self::ENCODED_LEN);
        let fits = usize::try_from(stack_len).is_ok_and(|n| n <= rest && rest - n < 8);
        if !fits {
            return Err(DecodeError::StackLength {
                declared: stack_len,
                available: rest,
            });
        }
        if stack_pointer
            .checked_add(stack_len)
            .and_then(|e| e.checked_add(u64::from(stack_reused)))
            .is_none()
        {
            return Err(DecodeError::InvalidField("stack_pointer"));
        }
        if Self::shift_in(flags) > Self::MAX_INTERVAL_SHIFT {
            return Err(DecodeError::InvalidField("flags"));
        }
        if stack_reused as usize > STACK_REUSE_WINDOW
            || (stack_reused != 0 && flags & Self::FLAG_STACK_BASE == 0)
        {
            return Err(DecodeError::InvalidField("stack_reused"));
        }
        let header = MallocHeader {
            flags,
            sequence,
            alloc_size,
            sample_size,
            address,
            timestamp_ns,
            context_id,
            tid,
            heap_id,
            arch,
            stack_pointer,
            stack_len,
            stack_reused,
            regs,
        };
        Ok(header)
    }
}

impl<R: UnwindRegs> MallocHeader<R> {
    /// Encodes the fixed part into `out`.
    #[inline]
    pub fn encode_into(&self, out: &mut [u8; MallocHeader::ENCODED_LEN]) {
        let mut p = Put::new(out);
        p.u32(RecordKind::Malloc as u32);
        p.u32(self.flags);
        p.u64(self.sequence);
        p.u64(self.alloc_size);
        p.u64(self.sample_size);
        p.u64(self.address);
        p.u64(self.timestamp_ns);
        p.u64(self.context_id);
        p.u32(self.tid);
        p.u32(self.heap_id);
        p.u32(self.arch as u32);
        p.u32(self.stack_reused);
        p.u64(self.stack_pointer);
        p.u64(self.stack_len);
        for i in 0..UNWIND_REGS {
            p.u64(self.regs.unwind_value(self.arch, i));
        }
    }
}

/// A free (or the free half of a realloc) of a possibly sampled address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeRecord {
    /// 0 (since [`version::V7`](super::version::V7) the daemon numbers
    /// the records in ring order; was the client's sequence number).
    pub sequence: u64,
    /// Address passed to free.
    pub address: u64,
    /// Heap the address belongs to.
    pub heap_id: u32,
}

impl FreeRecord {
    /// Bytes on the wire.
    pub const ENCODED_LEN: usize = 32;

    /// Encodes into exactly [`Self::ENCODED_LEN`] bytes.
    #[inline]
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let mut p = Put::new(&mut out);
        p.u32(RecordKind::Free as u32);
        p.u32(0);
        p.u64(self.sequence);
        p.u64(self.address);
        p.u32(self.heap_id);
        p.u32(0);
        out
    }

    /// Decodes a free record (trailing padding allowed).
    pub fn decode(buf: &[u8]) -> Result<FreeRecord, DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let _flags = check_kind(&mut g, RecordKind::Free)?;
        let sequence = g.u64();
        let address = g.u64();
        let heap_id = g.u32();
        Ok(FreeRecord {
            sequence,
            address,
            heap_id,
        })
    }
}

/// Declares (or re-declares, after an interval change) a heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapNameRecord {
    /// Heap id used by later records.
    pub heap_id: u32,
    /// Current sampling interval of the heap.
    pub interval: u64,
    /// NUL-padded name; empty keeps the previous name (interval change only).
    pub name: [u8; HEAP_NAME_LEN],
}

impl HeapNameRecord {
    /// Bytes on the wire.
    pub const ENCODED_LEN: usize = 24 + HEAP_NAME_LEN;

    /// Encodes into exactly [`Self::ENCODED_LEN`] bytes.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let mut p = Put::new(&mut out);
        p.u32(RecordKind::HeapName as u32);
        p.u32(0);
        p.u32(self.heap_id);
        p.u32(0);
        p.u64(self.interval);
        encode_name(&mut p, &self.name);
        out
    }

    /// Decodes a heap-name record and validates the name.
    pub fn decode(buf: &[u8]) -> Result<HeapNameRecord, DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let _flags = check_kind(&mut g, RecordKind::HeapName)?;
        let heap_id = g.u32();
        let _pad = g.u32();
        let interval = g.u64();
        let name = g.array();
        heap_name_str(&name)?;
        Ok(HeapNameRecord {
            heap_id,
            interval,
            name,
        })
    }

    /// The heap name as a string (validated by `decode`).
    pub fn name_str(&self) -> &str {
        heap_name_str(&self.name).unwrap_or("")
    }
}

/// Any ring-buffer record, borrowed from the bytes it was decoded from.
// Records are decoded one at a time and consumed at once; boxing the malloc
// header would cost an allocation per sample for no gain.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record<'a> {
    /// A sampled allocation and its raw stack.
    Malloc(MallocHeader, &'a [u8]),
    /// A free of a possibly sampled address.
    Free(FreeRecord),
    /// A heap declaration.
    HeapName(HeapNameRecord),
    /// A user context definition.
    Context(ContextRecord<'a>),
    /// A stack taken from a signal handler, and its raw stack.
    StackSample(StackSampleHeader, &'a [u8]),
    /// The name of a stack-sample tag.
    EventName(EventNameRecord),
}

impl<'a> Record<'a> {
    /// Decodes any record by its kind tag. Never panics, whatever the bytes.
    pub fn decode(buf: &'a [u8]) -> Result<Record<'a>, DecodeError> {
        let mut g = Get::new(buf, 8)?;
        match RecordKind::from_u32(g.u32())? {
            RecordKind::Malloc => {
                let (h, stack) = MallocHeader::decode(buf)?;
                Ok(Record::Malloc(h, stack))
            }
            RecordKind::Free => Ok(Record::Free(FreeRecord::decode(buf)?)),
            RecordKind::HeapName => Ok(Record::HeapName(HeapNameRecord::decode(buf)?)),
            RecordKind::Context => Ok(Record::Context(ContextRecord::decode(buf)?)),
            RecordKind::StackSample => {
                let (h, stack) = StackSampleHeader::decode(buf)?;
                Ok(Record::StackSample(h, stack))
            }
            RecordKind::EventName => Ok(Record::EventName(EventNameRecord::decode(buf)?)),
        }
    }

    /// Encodes the record into a new buffer (tests, fuzzers and tools; the
    /// client writes records in place instead).
    pub fn encode_to_vec(&self) -> Vec<u8> {
        match self {
            Record::Malloc(h, stack) => {
                let mut fixed = [0u8; MallocHeader::ENCODED_LEN];
                let mut h = *h;
                h.stack_len = stack.len() as u64;
                h.encode_into(&mut fixed);
                let mut v = Vec::with_capacity(fixed.len() + stack.len());
                v.extend_from_slice(&fixed);
                v.extend_from_slice(stack);
                v
            }
            Record::Free(f) => f.encode().to_vec(),
            Record::HeapName(n) => n.encode().to_vec(),
            Record::Context(c) => c.encode_to_vec(),
            Record::StackSample(h, stack) => {
                let mut fixed = [0u8; StackSampleHeader::ENCODED_LEN];
                let mut h = *h;
                h.stack_len = stack.len() as u64;
                h.encode_into(&mut fixed);
                let mut v = fixed.to_vec();
                v.extend_from_slice(stack);
                v
            }
            Record::EventName(e) => e.encode().to_vec(),
        }
    }
}

// Layout pins: a change to any field list must change these numbers on purpose.
const _: () = assert!(MallocHeader::ENCODED_LEN == 200);
const _: () = assert!(FreeRecord::ENCODED_LEN == 32);
const _: () = assert!(HeapNameRecord::ENCODED_LEN == 88);
const _: () = assert!(MallocHeader::ENCODED_LEN % 8 == 0);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::heap_name_field;

    fn sample_header() -> MallocHeader {
        let mut regs = RegisterFile::default();
        for &s in Arch::X86_64.unwind_slots() {
            regs.0[s] = 0x1000 + s as u64;
        }
        MallocHeader {
            flags: MallocHeader::FLAG_STACK_TRUNCATED,
            sequence: 42,
            alloc_size: 100,
            sample_size: 4096,
            address: 0xdead_beef,
            timestamp_ns: 123_456_789,
            context_id: 7,
            tid: 99,
            heap_id: 0,
            arch: Arch::X86_64,
            stack_pointer: 0x7fff_0000,
            stack_len: 16,
            stack_reused: 0,
            regs,
        }
    }

    /// `h` with its registers held as `regs`.
    fn with_regs<S>(h: MallocHeader, regs: S) -> MallocHeader<S> {
        MallocHeader {
            flags: h.flags,
            sequence: h.sequence,
            alloc_size: h.alloc_size,
            sample_size: h.sample_size,
            address: h.address,
            timestamp_ns: h.timestamp_ns,
            context_id: h.context_id,
            tid: h.tid,
            heap_id: h.heap_id,
            arch: h.arch,
            stack_pointer: h.stack_pointer,
            stack_len: h.stack_len,
            stack_reused: h.stack_reused,
            regs,
        }
    }

    #[test]
    fn a_captured_header_encodes_as_the_header_it_decodes_to() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let slots = arch.unwind_slots();
            let unwind: Vec<u64> = (0..slots.len() as u64).map(|i| 0x7f00_0000 + i).collect();
            let h = MallocHeader {
                arch,
                ..sample_header()
            };
            let captured = with_regs(h, CapturedRegs(&unwind));
            let mut bytes = [0u8; MallocHeader::ENCODED_LEN];
            captured.encode_into(&mut bytes);
            let mut with_stack = bytes.to_vec();
            with_stack.extend_from_slice(&[0u8; 16]);
            let (decoded, stack) = MallocHeader::decode(&with_stack).unwrap();
            assert_eq!(stack.len(), 16);
            // The registers land in the arch's slots, every other slot is 0.
            let mut regs = RegisterFile::default();
            for (i, &s) in slots.iter().enumerate() {
                regs.0[s] = unwind[i];
            }
            assert_eq!(decoded, MallocHeader { regs, ..h });
            // And the decoded header encodes back to the same bytes.
            let mut again = [0u8; MallocHeader::ENCODED_LEN];
            decoded.encode_into(&mut again);
            assert_eq!(again, bytes, "{arch:?}");
        }
    }

    #[test]
    fn reuse_needs_the_base_flag_and_stays_in_the_window() {
        let stack = [3u8; 16];
        let ok = MallocHeader {
            flags: MallocHeader::FLAG_STACK_BASE,
            stack_reused: 4096,
            ..sample_header()
        };
        let bytes = Record::Malloc(ok, &stack).encode_to_vec();
        assert!(matches!(Record::decode(&bytes), Ok(Record::Malloc(h, _)) if h == ok));
        for bad in [
            MallocHeader { flags: 0, ..ok },
            MallocHeader {
                stack_reused: STACK_REUSE_WINDOW as u32 + 8,
                ..ok
            },
            MallocHeader {
                stack_pointer: u64::MAX - 20,
                ..ok
            },
        ] {
            let bytes = Record::Malloc(bad, &stack).encode_to_vec();
            assert!(Record::decode(&bytes).is_err(), "{bad:?} decoded");
        }
    }

    #[test]
    fn only_the_unwind_registers_travel() {
        for arch in [Arch::X86_64, Arch::Aarch64] {
            let mut regs = RegisterFile::default();
            for (i, r) in regs.0.iter_mut().enumerate() {
                *r = 0x5000 + i as u64;
            }
            let h = MallocHeader {
                arch,
                regs,
                ..sample_header()
            };
            let bytes = Record::Malloc(h, &[0u8; 16]).encode_to_vec();
            assert_eq!(bytes.len(), MallocHeader::ENCODED_LEN + 16);
            let Ok(Record::Malloc(back, _)) = Record::decode(&bytes) else {
                panic!("{arch:?}: no malloc record");
            };
            for (i, v) in back.regs.0.iter().enumerate() {
                let want = if arch.unwind_slots().contains(&i) {
                    0x5000 + i as u64
                } else {
                    0
                };
                assert_eq!(*v, want, "{arch:?} slot {i}");
            }
            let (sp, ip) = arch.sp_ip_slots();
            assert!(arch.unwind_slots().contains(&sp) && arch.unwind_slots().contains(&ip));
            assert!(arch.unwind_slots().len() <= UNWIND_REGS);
        }
    }

    #[test]
    fn malloc_round_trip_with_padding() {
        let stack: Vec<u8> = (0..16).collect();
        let mut bytes = Record::Malloc(sample_header(), &stack).encode_to_vec();
        bytes.extend_from_slice(&[0; 7]);
        match Record::decode(&bytes).unwrap() {
            Record::Malloc(h, s) => {
                assert_eq!(h, sample_header());
                assert_eq!(s, &stack[..]);
            }
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn malloc_rejects_bad_stack_len() {
        let stack = [0u8; 16];
        let mut bytes = Record::Malloc(sample_header(), &stack).encode_to_vec();
        // Declare more stack than present.
        bytes[80..88].copy_from_slice(&1000u64.to_le_bytes());
        assert_eq!(
            Record::decode(&bytes),
            Err(DecodeError::StackLength {
                declared: 1000,
                available: 16
            })
        );
        // 8 or more trailing bytes are not padding.
        let mut bytes = Record::Malloc(sample_header(), &stack).encode_to_vec();
        bytes.extend_from_slice(&[0; 8]);
        assert!(matches!(
            Record::decode(&bytes),
            Err(DecodeError::StackLength { .. })
        ));
    }

    #[test]
    fn every_prefix_of_every_record_is_an_error_not_a_panic() {
        let stack = [1u8; 24];
        let name = heap_name_field("libc.malloc").unwrap();
        let records = [
            Record::Malloc(sample_header(), &stack).encode_to_vec(),
            Record::Free(FreeRecord {
                sequence: 1,
                address: 2,
                heap_id: 0,
            })
            .encode_to_vec(),
            Record::HeapName(HeapNameRecord {
                heap_id: 0,
                interval: 4096,
                name,
            })
            .encode_to_vec(),
        ];
        for bytes in &records {
            assert!(Record::decode(bytes).is_ok());
            for n in 0..bytes.len() {
                assert!(Record::decode(&bytes[..n]).is_err(), "prefix {n} decoded");
            }
        }
    }

    #[test]
    fn unknown_kind_and_arch() {
        let mut bytes = FreeRecord {
            sequence: 1,
            address: 2,
            heap_id: 0,
        }
        .encode()
        .to_vec();
        bytes[0] = 77;
        assert_eq!(Record::decode(&bytes), Err(DecodeError::UnknownKind(77)));
        let mut bytes = Record::Malloc(sample_header(), &[]).encode_to_vec();
        bytes[64] = 9;
        assert_eq!(Record::decode(&bytes), Err(DecodeError::UnknownArch(9)));
    }
}
