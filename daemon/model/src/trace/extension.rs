//! heapprofd-rs's own data in a trace: what Perfetto's `HeapSample` has no
//! field for (estimated allocation counts, size histograms, lifetimes and
//! temporary allocations; see [`CallsiteStats`]).
//!
//! # Where it goes, and why there
//!
//! One `TracePacket` per dump of a (process, heap), written right after
//! the dump's `ProfilePacket` group on the same sequence, whose only
//! payload is field [`EXTENSION_FIELD`] holding an [`Extension`] message.
//! The callsites are named by the callstack iids of the group's samples
//! (interned on the same sequence), and the values are cumulative like the
//! samples' (the last dump has them all).
//!
//! * One file: the numbers travel with the trace; a side file would be
//!   lost by the first `cp trace.pftrace`.
//! * Perfetto skips it: the field number is none the official
//!   `TracePacket` uses or reserves, at the far end of the field-number
//!   space (2^29 - 1, far from the extension range 1000-1999 and the next
//!   allocations); protobuf readers keep unknown fields aside, and trace
//!   processor parses a packet by the fields it knows, so the packet adds
//!   no row and no stat (checked with trace_processor: `stats` stay clean).
//!   `proto/tests/check_trace.py` knows this one field and reports it as an
//!   extension, not as an unknown field.
//! * Readers that do not know it (heapprofd's own tools, older
//!   heapprofd-rs) lose nothing else: every Perfetto field is as before.
//!
//! The messages are proto2-style (every field optional), defined here with
//! prost, with field numbers that never change meaning.

use prost::Message;

use crate::profile::{CallsiteStats, LifetimeBucket, SizeBucket};

/// Field number of [`Extension`] in a `TracePacket` (the largest protobuf
/// field number; see the module docs).
pub const EXTENSION_FIELD: u32 = (1 << 29) - 1;

/// The payload of an extension packet.
#[derive(Clone, PartialEq, Message)]
pub struct Extension {
    /// Statistics of one dump of a (process, heap).
    #[prost(message, optional, tag = "1")]
    pub heap_stats: Option<HeapStats>,
    /// What the `PerfSample` of the same packet has no field for.
    #[prost(message, optional, tag = "2")]
    pub stack_sample: Option<StackSampleExt>,
    /// A process's stack-sample totals and losses per (event, thread),
    /// cumulative (the last one counts), and its events' names.
    #[prost(message, optional, tag = "3")]
    pub sample_totals: Option<SampleTotals>,
}

/// A stack sample's event and what else `PerfSample` cannot say; written
/// only when it is not a plain CPU-time sample.
#[derive(Clone, PartialEq, Message)]
pub struct StackSampleExt {
    /// The event's tag (0: CPU time).
    #[prost(uint64, optional, tag = "1")]
    pub tag: Option<u64>,
    /// The stack is the requester's own (biased).
    #[prost(bool, optional, tag = "2")]
    pub biased: Option<bool>,
}

/// Per process: stack samples and losses per (event, thread).
#[derive(Clone, PartialEq, Message)]
pub struct SampleTotals {
    /// Process id.
    #[prost(uint64, optional, tag = "1")]
    pub pid: Option<u64>,
    /// One per (event, thread).
    #[prost(message, repeated, tag = "2")]
    pub threads: Vec<ThreadSampleTotals>,
    /// Names of the program's events.
    #[prost(message, repeated, tag = "3")]
    pub events: Vec<EventNameMsg>,
}

/// One (event, thread)'s samples and losses.
#[derive(Clone, PartialEq, Message)]
pub struct ThreadSampleTotals {
    /// The event's tag.
    #[prost(uint64, optional, tag = "1")]
    pub tag: Option<u64>,
    /// Thread id.
    #[prost(uint64, optional, tag = "2")]
    pub tid: Option<u64>,
    /// Samples written.
    #[prost(uint64, optional, tag = "3")]
    pub samples: Option<u64>,
    /// Sum of their periods (CPU ns for CPU time).
    #[prost(uint64, optional, tag = "4")]
    pub weight: Option<u64>,
    /// Timer expirations merged into recorded samples (their CPU time is
    /// in the samples' weights: not lost).
    #[prost(uint64, optional, tag = "5")]
    pub lost_overrun: Option<u64>,
    /// Samples lost in the client (ring full, inside the client).
    #[prost(uint64, optional, tag = "6")]
    pub lost_dropped: Option<u64>,
}

/// A program's name for a tag.
#[derive(Clone, PartialEq, Message)]
pub struct EventNameMsg {
    /// The tag.
    #[prost(uint64, optional, tag = "1")]
    pub tag: Option<u64>,
    /// Its name.
    #[prost(string, optional, tag = "2")]
    pub name: Option<String>,
}

/// Per-callsite statistics of one dump of a (process, heap).
#[derive(Clone, PartialEq, Message)]
pub struct HeapStats {
    /// Process id.
    #[prost(uint64, optional, tag = "1")]
    pub pid: Option<u64>,
    /// Heap name, as in the group's `ProcessHeapSamples`.
    #[prost(string, optional, tag = "2")]
    pub heap_name: Option<String>,
    /// The dump's `ProcessHeapSamples.timestamp`.
    #[prost(uint64, optional, tag = "3")]
    pub timestamp: Option<u64>,
    /// Lifetimes and temporaries were counted (every allocation recorded).
    #[prost(bool, optional, tag = "4")]
    pub exact: Option<bool>,
    /// The callsites, each at most once per dump.
    #[prost(message, repeated, tag = "5")]
    pub callsites: Vec<CallsiteStatsMsg>,
}

/// [`CallsiteStats`] on the wire.
#[derive(Clone, PartialEq, Message)]
pub struct CallsiteStatsMsg {
    /// Callstack iid (the sequence's interned callstacks).
    #[prost(uint64, optional, tag = "1")]
    pub callstack_id: Option<u64>,
    /// Allocations the samples stand for.
    #[prost(double, optional, tag = "2")]
    pub estimated_allocations: Option<f64>,
    /// Temporary allocations.
    #[prost(uint64, optional, tag = "3")]
    pub temporary: Option<u64>,
    /// Requested sizes.
    #[prost(message, repeated, tag = "4")]
    pub sizes: Vec<SizeBucketMsg>,
    /// Lifetimes in allocations.
    #[prost(message, repeated, tag = "5")]
    pub lifetimes: Vec<LifetimeBucketMsg>,
}

/// [`SizeBucket`] on the wire.
#[derive(Clone, PartialEq, Message)]
pub struct SizeBucketMsg {
    /// Log2 bucket.
    #[prost(uint32, optional, tag = "1")]
    pub log2: Option<u32>,
    /// Samples.
    #[prost(uint64, optional, tag = "2")]
    pub samples: Option<u64>,
    /// Estimated allocations.
    #[prost(double, optional, tag = "3")]
    pub estimated: Option<f64>,
}

/// [`LifetimeBucket`] on the wire.
#[derive(Clone, PartialEq, Message)]
pub struct LifetimeBucketMsg {
    /// Log2 bucket.
    #[prost(uint32, optional, tag = "1")]
    pub log2: Option<u32>,
    /// Frees.
    #[prost(uint64, optional, tag = "2")]
    pub frees: Option<u64>,
}

impl CallsiteStatsMsg {
    /// The message of callsite `iid`.
    pub fn from_stats(iid: u64, s: &CallsiteStats) -> Self {
        CallsiteStatsMsg {
            callstack_id: Some(iid),
            estimated_allocations: Some(s.estimated_allocs),
            temporary: (s.temporary > 0).then_some(s.temporary),
            sizes: s
                .sizes
                .iter()
                .map(|b| SizeBucketMsg {
                    log2: Some(u32::from(b.log2)),
                    samples: Some(b.samples),
                    estimated: Some(b.estimated),
                })
                .collect(),
            lifetimes: s
                .lifetimes
                .iter()
                .map(|b| LifetimeBucketMsg {
                    log2: Some(u32::from(b.log2)),
                    frees: Some(b.frees),
                })
                .collect(),
        }
    }

    /// Back to [`CallsiteStats`] (buckets out of range are dropped).
    pub fn to_stats(&self) -> CallsiteStats {
        let log2 = |v: Option<u32>| u8::try_from(v.unwrap_or(0)).ok().filter(|&b| b <= 64);
        let mut sizes: Vec<SizeBucket> = self
            .sizes
            .iter()
            .filter_map(|b| {
                Some(SizeBucket {
                    log2: log2(b.log2)?,
                    samples: b.samples.unwrap_or(0),
                    estimated: b.estimated.filter(|e| e.is_finite()).unwrap_or(0.0),
                })
            })
            .collect();
        sizes.sort_by_key(|b| b.log2);
        let mut lifetimes: Vec<LifetimeBucket> = self
            .lifetimes
            .iter()
            .filter_map(|b| {
                Some(LifetimeBucket {
                    log2: log2(b.log2)?,
                    frees: b.frees.unwrap_or(0),
                })
            })
            .collect();
        lifetimes.sort_by_key(|b| b.log2);
        CallsiteStats {
            estimated_allocs: self
                .estimated_allocations
                .filter(|e| e.is_finite() && *e >= 0.0)
                .unwrap_or(0.0),
            sizes,
            lifetimes,
            temporary: self.temporary.unwrap_or(0),
        }
    }
}

/// Appends field [`EXTENSION_FIELD`] holding `ext` to an encoded
/// `TracePacket`'s bytes.
pub fn append_extension(packet: &mut Vec<u8>, ext: &Extension) {
    prost::encoding::message::encode(EXTENSION_FIELD, ext, packet);
}

/// Finds field [`EXTENSION_FIELD`] among the top-level fields of an
/// encoded `TracePacket` and decodes it. `None` when absent; an extension
/// that does not decode is `Some(Err)`.
pub fn find_extension(packet: &[u8]) -> Option<Result<Extension, prost::DecodeError>> {
    let mut buf = packet;
    while !buf.is_empty() {
        let key = read_varint(&mut buf)?;
        let (field, wire) = (key >> 3, key & 7);
        let len = match wire {
            0 => {
                read_varint(&mut buf)?;
                continue;
            }
            1 => 8,
            5 => 4,
            2 => usize::try_from(read_varint(&mut buf)?).ok()?,
            _ => return None,
        };
        if buf.len() < len {
            return None;
        }
        let (body, rest) = buf.split_at(len);
        if wire == 2 && field == u64::from(EXTENSION_FIELD) {
            return Some(Extension::decode(body));
        }
        buf = rest;
    }
    None
}

fn read_varint(buf: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first()?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use heapprofd_proto::perfetto::TracePacket;

    #[test]
    fn round_trip_through_a_packet() {
        let mut stats = CallsiteStats::default();
        stats.add_alloc(100, 1);
        stats.add_alloc(5000, 1);
        stats.add_free(0, true);
        let ext = Extension {
            heap_stats: Some(HeapStats {
                pid: Some(7),
                heap_name: Some("libc.malloc".into()),
                timestamp: Some(5),
                exact: Some(true),
                callsites: vec![CallsiteStatsMsg::from_stats(3, &stats)],
            }),
            ..Extension::default()
        };
        let mut p = TracePacket {
            timestamp: Some(9),
            ..Default::default()
        };
        p.set_trusted_packet_sequence_id(1);
        let mut bytes = p.encode_to_vec();
        append_extension(&mut bytes, &ext);
        // Perfetto's view: the same packet, the extension skipped.
        assert_eq!(TracePacket::decode(bytes.as_slice()).unwrap(), p);
        let back = find_extension(&bytes).unwrap().unwrap();
        assert_eq!(back, ext);
        let cs = &back.heap_stats.unwrap().callsites[0];
        assert_eq!(cs.to_stats(), stats);
        assert!(find_extension(&p.encode_to_vec()).is_none());
        assert!(
            find_extension(&[0xff]).is_none(),
            "junk is not an extension"
        );
    }
}
