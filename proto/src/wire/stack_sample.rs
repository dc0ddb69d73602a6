//! The stack-sample records (Since [`version::V5`](super::version::V5)):
//! [`StackSampleHeader`] + raw stack bytes, a stack taken from a signal
//! handler (the CPU-time timer's, `heapprofd_request_stack`'s, a perf
//! event's), and [`EventNameRecord`], which names a tag once.
//!
//! A stack sample starts at the interrupted registers (from the handler's
//! `ucontext`), so its first frame is the interrupted pc, not the handler.

use super::arch::{Arch, MAX_REGS, RegisterFile};
use super::codec::{DecodeError, Get, HEAP_NAME_LEN, Put, encode_name, heap_name_str};
use super::kind::RecordKind;

/// The tag of CPU-time samples (the client's per-thread CPU timers).
pub const TAG_CPU_TIME: u64 = 0;

/// Fixed part of a stack sample; the raw stack bytes follow it directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackSampleHeader {
    /// `FLAG_*`.
    pub flags: u32,
    /// Kernel thread id of the sampled thread.
    pub tid: u32,
    /// What the sample counts: [`TAG_CPU_TIME`], or a tag the program
    /// named with an [`EventNameRecord`].
    pub tag: u64,
    /// CLOCK_MONOTONIC when the sample was taken, nanoseconds (the
    /// trace's timeline).
    pub timestamp_ns: u64,
    /// The thread's CPU clock (CLOCK_THREAD_CPUTIME_ID) at the sample,
    /// nanoseconds.
    pub cpu_time_ns: u64,
    /// What one sample stands for: nanoseconds of CPU for CPU-time samples
    /// (the timer's period times one plus the overruns of this signal),
    /// the event's period otherwise (0: unknown, counted as 1).
    pub period: u64,
    /// Timer expirations the kernel merged into this signal
    /// (`timer_getoverrun`): counted in `period`, not lost.
    pub lost_overrun: u32,
    /// Samples (CPU: timer expirations) this thread lost before this one
    /// because the ring was full or the thread was inside the client.
    pub lost_dropped: u32,
    /// How to read `regs`.
    pub arch: Arch,
    /// Address of the first stack byte copied.
    pub stack_pointer: u64,
    /// Number of stack bytes that follow the header.
    pub stack_len: u64,
    /// Registers of the interrupted context.
    pub regs: RegisterFile,
}

impl StackSampleHeader {
    /// Bytes of the fixed part on the wire.
    pub const ENCODED_LEN: usize = 80 + MAX_REGS * 8;
    /// The stack copy was cut short (cap reached).
    pub const FLAG_STACK_TRUNCATED: u32 = 1;
    /// The stack bounds were unknown; only registers were sent.
    pub const FLAG_NO_STACK: u32 = 2;
    /// The stack is the requesting code's own (a `NULL` ucontext), so its
    /// first frames are the handler's: biased.
    pub const FLAG_BIASED: u32 = 4;
    /// Not a sample: only the losses of a thread that exited before a
    /// sample could carry them (no registers, no stack).
    pub const FLAG_LOSSES_ONLY: u32 = 8;

    /// Encodes the fixed part into `out[..ENCODED_LEN]`.
    #[inline]
    pub fn encode_into(&self, out: &mut [u8; Self::ENCODED_LEN]) {
        let mut p = Put::new(out);
        p.u32(RecordKind::StackSample as u32);
        p.u32(self.flags);
        p.u32(self.tid);
        p.u32(self.arch as u32);
        p.u64(self.tag);
        p.u64(self.timestamp_ns);
        p.u64(self.cpu_time_ns);
        p.u64(self.period);
        p.u32(self.lost_overrun);
        p.u32(self.lost_dropped);
        p.u64(self.stack_pointer);
        p.u64(self.stack_len);
        for r in &self.regs.0 {
            p.u64(*r);
        }
    }

    /// Decodes a whole stack sample: the header and the stack bytes after
    /// it (up to 7 bytes of trailing padding allowed).
    pub fn decode(buf: &[u8]) -> Result<(StackSampleHeader, &[u8]), DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let flags = check_kind(&mut g, RecordKind::StackSample)?;
        let tid = g.u32();
        let arch = Arch::from_u32(g.u32())?;
        let tag = g.u64();
        let timestamp_ns = g.u64();
        let cpu_time_ns = g.u64();
        let period = g.u64();
        let lost_overrun = g.u32();
        let lost_dropped = g.u32();
        let stack_pointer = g.u64();
        let stack_len = g.u64();
        let mut regs = RegisterFile::default();
        for r in regs.0.iter_mut() {
            *r = g.u64();
        }
        let rest = &buf[Self::ENCODED_LEN..];
        let Some(n) = usize::try_from(stack_len)
            .ok()
            .filter(|&n| n <= rest.len() && rest.len() - n < 8)
        else {
            return Err(DecodeError::StackLength {
                declared: stack_len,
                available: rest.len(),
            });
        };
        if stack_pointer.checked_add(stack_len).is_none() {
            return Err(DecodeError::InvalidField("stack_pointer"));
        }
        let h = StackSampleHeader {
            flags,
            tid,
            tag,
            timestamp_ns,
            cpu_time_ns,
            period,
            lost_overrun,
            lost_dropped,
            arch,
            stack_pointer,
            stack_len,
            regs,
        };
        Ok((h, &rest[..n]))
    }
}

/// Names a tag of stack samples (`heapprofd_register_event`), once per
/// session before the tag's first sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventNameRecord {
    /// The tag samples carry.
    pub tag: u64,
    /// NUL-padded name (the heap names' rules: 1 to 63 bytes of UTF-8).
    pub name: [u8; HEAP_NAME_LEN],
}

impl EventNameRecord {
    /// Bytes on the wire.
    pub const ENCODED_LEN: usize = 16 + HEAP_NAME_LEN;

    /// Encodes into exactly [`Self::ENCODED_LEN`] bytes.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        let mut p = Put::new(&mut out);
        p.u32(RecordKind::EventName as u32);
        p.u32(0);
        p.u64(self.tag);
        encode_name(&mut p, &self.name);
        out
    }

    /// Decodes an event-name record and validates the name.
    pub fn decode(buf: &[u8]) -> Result<EventNameRecord, DecodeError> {
        let mut g = Get::new(buf, Self::ENCODED_LEN)?;
        let _flags = check_kind(&mut g, RecordKind::EventName)?;
        let tag = g.u64();
        let name = g.array();
        if heap_name_str(&name)?.is_empty() {
            return Err(DecodeError::InvalidField("event name"));
        }
        Ok(EventNameRecord { tag, name })
    }

    /// The name as a string (validated by `decode`).
    pub fn name_str(&self) -> &str {
        heap_name_str(&self.name).unwrap_or("")
    }
}

fn check_kind(g: &mut Get<'_>, expected: RecordKind) -> Result<u32, DecodeError> {
    let kind = g.u32();
    if RecordKind::from_u32(kind)? != expected {
        return Err(DecodeError::WrongKind {
            expected: expected as u32,
            found: kind,
        });
    }
    Ok(g.u32())
}

// Layout pins.
const _: () = assert!(StackSampleHeader::ENCODED_LEN == 352);
const _: () = assert!(StackSampleHeader::ENCODED_LEN % 8 == 0);
const _: () = assert!(EventNameRecord::ENCODED_LEN == 80);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Record, heap_name_field};

    fn header() -> StackSampleHeader {
        let mut regs = RegisterFile::default();
        for (i, r) in regs.0.iter_mut().enumerate() {
            *r = 0x2000 + i as u64;
        }
        StackSampleHeader {
            flags: StackSampleHeader::FLAG_BIASED,
            tid: 77,
            tag: 9,
            timestamp_ns: 1,
            cpu_time_ns: 2,
            period: 10_000_000,
            lost_overrun: 3,
            lost_dropped: 4,
            arch: Arch::X86_64,
            stack_pointer: 0x7ff0_0000,
            stack_len: 24,
            regs,
        }
    }

    #[test]
    fn round_trips_and_every_prefix_is_an_error() {
        let stack: Vec<u8> = (0..24).collect();
        let name = heap_name_field("page-faults").unwrap();
        let records = [
            Record::StackSample(header(), &stack).encode_to_vec(),
            Record::EventName(EventNameRecord { tag: 9, name }).encode_to_vec(),
        ];
        match Record::decode(&records[0]).unwrap() {
            Record::StackSample(h, s) => {
                assert_eq!(h, header());
                assert_eq!(s, &stack[..]);
            }
            other => panic!("{other:?}"),
        }
        match Record::decode(&records[1]).unwrap() {
            Record::EventName(e) => assert_eq!((e.tag, e.name_str()), (9, "page-faults")),
            other => panic!("{other:?}"),
        }
        for bytes in &records {
            for n in 0..bytes.len() {
                assert!(Record::decode(&bytes[..n]).is_err(), "prefix {n} decoded");
            }
        }
    }

    #[test]
    fn a_stack_length_beyond_the_bytes_is_refused() {
        let mut bytes = Record::StackSample(header(), &[0; 24]).encode_to_vec();
        bytes[64..72].copy_from_slice(&1000u64.to_le_bytes());
        assert!(matches!(
            Record::decode(&bytes),
            Err(DecodeError::StackLength { .. })
        ));
        let empty = EventNameRecord {
            tag: 1,
            name: [0; HEAP_NAME_LEN],
        };
        assert!(EventNameRecord::decode(&empty.encode()).is_err());
    }
}
