//! Fuzz target: the bookkeeping state machine, the trace writer and the
//! trace reader together, against a naive model.
//!
//! The input is a script: sessions of up to four pids start (the same pid
//! again is an exec), receive batches of operations (stack definitions,
//! mallocs, frees, heap declarations) in any arrival order, end or not, and
//! dumps are written in between. Every session's sequence numbers increase
//! with gaps (dropped records), and its batches are shuffled, as the
//! workers' threads shuffle them. After the final dump the trace is read
//! back and, per (pid, heap), the allocated and freed bytes must equal a
//! naive model that applies each session's operations in sequence order,
//! one session of a pid after the other (an exec releases the old image's
//! live blocks: they count as freed). Live bytes must agree too. Idle
//! callsites are retired after every dump, so stacks that come back get
//! new ids: the totals read back must not change.

#![no_main]

use std::collections::{BTreeMap, HashMap};

use heapprofd_fuzz::Input;
use heapprofd_model::bookkeeping::Bookkeeping;
use heapprofd_model::messages::{Op, SessionEnd, SessionEvent, SessionId, SessionStats};
use heapprofd_model::profile::{FrameId, Interner};
use heapprofd_model::trace::{ClockReadings, TraceWriter, read_trace};
use heapprofd_proto::wire::HEAP_LIBC_MALLOC_NAME;
use libfuzzer_sys::fuzz_target;

const CLOCKS: ClockReadings = ClockReadings {
    boottime_ns: 2_000_000_000,
    monotonic_coarse_ns: 1_000_000_000,
    monotonic_ns: 1_000_000_000,
    realtime_ns: 1_000_000_000,
};

/// Steps of a script (longer inputs are cut).
const MAX_STEPS: u32 = 128;
/// Dumps before the final one.
const MAX_DUMPS: u32 = 6;

fn heap_name(heap: u32) -> String {
    if heap == 0 {
        HEAP_LIBC_MALLOC_NAME.to_owned()
    } else {
        format!("heap{heap}")
    }
}

/// One session of the script.
#[derive(Debug, Default)]
struct Script {
    pid: u32,
    next_seq: u64,
    started: bool,
    ended: bool,
    /// Operations generated in sequence order (for the naive model).
    in_order: Vec<Op>,
}

/// The naive model: per pid, live blocks of the current image and totals.
#[derive(Debug, Default)]
struct Naive {
    /// (pid, heap) -> (allocated, freed).
    totals: BTreeMap<(u32, u32), (u64, u64)>,
    /// pid -> (heap, address) -> size, for the current image.
    live: HashMap<u32, HashMap<(u32, u64), u64>>,
}

impl Naive {
    fn new_image(&mut self, pid: u32) {
        for ((heap, _), size) in self.live.insert(pid, HashMap::new()).unwrap_or_default() {
            self.totals.entry((pid, heap)).or_default().1 += size;
        }
    }

    fn apply(&mut self, pid: u32, op: &Op) {
        let live = self.live.entry(pid).or_default();
        match *op {
            Op::Malloc {
                heap,
                address,
                sample_size,
                ..
            } => {
                if let Some(old) = live.insert((heap, address), sample_size) {
                    self.totals.entry((pid, heap)).or_default().1 += old;
                }
                self.totals.entry((pid, heap)).or_default().0 += sample_size;
            }
            Op::Free { heap, address, .. } => {
                if let Some(old) = live.remove(&(heap, address)) {
                    self.totals.entry((pid, heap)).or_default().1 += old;
                }
            }
            Op::Stack { .. }
            | Op::HeapName { .. }
            | Op::Context { .. }
            | Op::StackSample { .. }
            | Op::SampleLosses { .. }
            | Op::EventName { .. } => {}
        }
    }

    fn live_bytes(&self) -> u64 {
        self.live.values().flat_map(|m| m.values()).sum()
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let interner = Interner::new();
    let frames: Vec<FrameId> = (0..4u64)
        .map(|i| interner.intern_frame(None, i, Some(&format!("f{i}")), None, None))
        .collect();
    let mut book = Bookkeeping::new(&interner, 4096);
    let mut writer = TraceWriter::new(Vec::new(), CLOCKS).expect("writing to memory");
    let mut sessions: Vec<Script> = Vec::new();
    let mut now = CLOCKS.monotonic_coarse_ns;
    let (mut steps, mut dumps) = (0, 0);
    while !input.is_empty() && steps < MAX_STEPS {
        steps += 1;
        let b = input.u8();
        match b % 8 {
            // A new session (of a pid seen before: an exec).
            0 if sessions.len() < 8 => {
                let pid = 100 + u32::from(input.u8() % 4);
                sessions.push(Script {
                    pid,
                    ..Script::default()
                });
            }
            // The next events of a session: started first, then a batch.
            1..=5 if !sessions.is_empty() => {
                let i = usize::from(input.u8()) % sessions.len();
                // Sessions of one pid start in connection order.
                let pid = sessions[i].pid;
                if sessions[..i].iter().any(|o| o.pid == pid && !o.started) {
                    continue;
                }
                let s = &mut sessions[i];
                let id = i as SessionId + 1;
                if s.ended {
                    continue;
                }
                if !s.started {
                    s.started = true;
                    book.handle(SessionEvent::Started {
                        id,
                        pid: s.pid,
                        cmdline: vec![format!("p{}", s.pid)],
                        from_startup: true,
                        started_ns: now,
                        identity: Default::default(),
                        memory: None,
                    });
                    continue;
                }
                let mut batch = Vec::new();
                for _ in 0..(input.u8() % 16) {
                    let k = input.u8();
                    let heap = u32::from(k >> 6);
                    let address = 0x1000 + u64::from(input.u8() % 16) * 16;
                    let op = match k % 4 {
                        0 => Op::Stack {
                            id: u32::from(k >> 2) % 4,
                            frames: frames[..usize::from(k >> 4) % 4 + 1].into(),
                        },
                        1 => Op::HeapName {
                            heap,
                            name: if k & 4 == 0 {
                                String::new()
                            } else {
                                heap_name(heap)
                            },
                            interval: 1 + u64::from(input.u8()),
                        },
                        2 => {
                            s.next_seq += 1 + u64::from(input.u8() % 4);
                            now += 1000;
                            Op::Malloc {
                                heap,
                                seq: s.next_seq,
                                address,
                                sample_size: 1 + u64::from(input.u16()),
                                size: u64::from(input.u16()),
                                tid: u32::from(input.u8() % 4),
                                timestamp_ns: now,
                                stack: u32::from(k >> 2) % 5,
                                // Undefined contexts too: totals are the same.
                                context: u64::from(input.u8() % 3),
                                // A raised interval weighs counts, not bytes.
                                interval_shift: input.u8() % 12,
                            }
                        }
                        _ => {
                            s.next_seq += 1 + u64::from(input.u8() % 4);
                            Op::Free {
                                heap,
                                seq: s.next_seq,
                                address,
                            }
                        }
                    };
                    s.in_order.push(op.clone());
                    batch.push(op);
                }
                // Arrival order: the workers' threads shuffle records.
                let n = batch.len();
                for j in 0..n {
                    batch.swap(j, usize::from(input.u8()) % n);
                }
                book.handle(SessionEvent::Ops {
                    id,
                    ops: batch,
                    stats: SessionStats::default(),
                });
            }
            // A session ends.
            6 if !sessions.is_empty() => {
                let i = usize::from(input.u8()) % sessions.len();
                let s = &mut sessions[i];
                if s.started && !s.ended {
                    s.ended = true;
                    book.handle(SessionEvent::Ended {
                        id: i as SessionId + 1,
                        pid: s.pid,
                        stats: SessionStats::default(),
                        end: SessionEnd::default(),
                    });
                }
            }
            // A dump (continuous dumps, SIGUSR1), a few per script.
            7 if dumps < MAX_DUMPS => {
                dumps += 1;
                now += 1_000_000;
                writer
                    .dump(book.profile_mut(), &interner, now)
                    .expect("writing to memory");
                // Callsites idle since the previous dump go (the runtime
                // does this once the tree grew; here after every dump).
                book.retire_idle();
            }
            _ => {}
        }
    }
    book.finish();
    now += 1_000_000;
    writer
        .dump(book.profile_mut(), &interner, now)
        .expect("writing to memory");
    let bytes = writer.finish().expect("writing to memory");

    // The naive model: per pid, its started sessions in connection order.
    let mut naive = Naive::default();
    for s in sessions.iter().filter(|s| s.started) {
        naive.new_image(s.pid);
        let mut ops = s.in_order.clone();
        ops.sort_by_key(|op| match op {
            Op::Malloc { seq, .. } | Op::Free { seq, .. } => *seq,
            _ => 0,
        });
        for op in &ops {
            naive.apply(s.pid, op);
        }
    }
    assert_eq!(book.live_bytes(), naive.live_bytes(), "live bytes");

    let data = read_trace(bytes.as_slice()).expect("our own trace reads back");
    let mut read: BTreeMap<(u32, String), (u64, u64)> = BTreeMap::new();
    for h in &data.heaps {
        let t = read.entry((h.pid, h.heap_name.clone())).or_default();
        for c in &h.callstacks {
            t.0 += c.self_allocated;
            t.1 += c.self_freed;
        }
    }
    let expected: BTreeMap<(u32, String), (u64, u64)> = naive
        .totals
        .iter()
        .map(|(&(pid, heap), &t)| ((pid, heap_name(heap)), t))
        .collect();
    for (key, t) in &expected {
        assert_eq!(read.get(key).copied().unwrap_or_default(), *t, "{key:?}");
    }
    for (key, t) in &read {
        assert_eq!(
            expected.get(key).copied().unwrap_or_default(),
            *t,
            "{key:?}"
        );
    }
});
