//! One session's records turned into operations: the worker's per-record
//! step, without threads, channels or `/proc` (the worker owns one per
//! session; a fuzzer drives it with a static process model).
//!
//! A record is decoded (a malformed one is counted, never trusted); a
//! malloc sample's stack is put back together from its thread's base when
//! its record reuses one (see [`ThreadStacks`]), and its frames come from
//! the replay memo or a walk (see [`StackCache`]), and becomes an [`Op::Malloc`] with its stack id,
//! preceded by an [`Op::Stack`] when the stack is new; frees and heap
//! declarations pass through; a context definition becomes an
//! [`Op::Context`] with its root frame interned.

use std::ops::Range;
use std::time::{Duration, Instant};

use heapprofd_model::messages::{Op, SessionStats, StackUnwindError};
use heapprofd_model::profile::{UnwindHistogram, context};
use heapprofd_proto::wire::{ContextRecord, MallocHeader, Record, RecordKind, StackSampleHeader};
use heapprofd_shmem::RecordBytes;
use heapprofd_unwinder::{PendingProcess, ProcessContext, UnwindErrorKind};

use super::lazy_process::LazyProcess;
use super::stacks::{InternCtx, StackCache, StackEntry, WalkStart};
use super::thread_stacks::{Missing, ThreadStacks};

/// One replayed sample in this many is timed (see
/// [`SessionUnwinder::handle_record`]).
pub const HIT_TIMING: u64 = 16;

/// What a worker keeps per session to turn its records into operations.
#[derive(Debug)]
pub struct SessionUnwinder {
    /// A sample's frames from the memo or a walk, and the unwinding times.
    pub walker: Walker,
    /// The threads' last stacks, for samples that reuse them.
    pub thread_stacks: ThreadStacks,
    /// Set when the client must send whole stacks again (see
    /// [`SessionUnwinder::take_resync`]).
    resync: bool,
    /// Records that did not decode.
    pub corrupt_records: u64,
    /// Malloc samples unwound.
    pub samples: u64,
    /// Stack samples (CPU time, events) unwound.
    pub stack_samples: u64,
    /// The interner's retire generation the caches were made under.
    interner_generation: u64,
    /// The sequence number of the session's last malloc or free: the
    /// daemon numbers them in ring order (see `wire::version::V7`).
    last_seq: u64,
}

/// A sample's stack, from the replay memo or a walk, timed: the one path
/// of malloc samples and stack samples alike. Kept apart from
/// [`ThreadStacks`], whose bytes the stack being unwound may borrow.
#[derive(Debug)]
pub struct Walker {
    /// The process's mappings, modules and memory (loaded at the first
    /// record that needs them, see [`LazyProcess`]).
    process: LazyProcess,
    /// The client library's code (its frames are left out of stacks).
    client_text: Range<u64>,
    /// Stacks and pcs unwound before (see [`StackCache`]).
    pub stacks: StackCache,
    /// Unwinding times.
    hist: UnwindHistogram,
    /// Unwinds that ended in an error.
    pub unwind_errors: u64,
    /// Total unwinding time.
    pub unwind_time: Duration,
    /// Picks the replayed samples that are timed (xorshift, never 0).
    timing_rng: u64,
}

impl Walker {
    /// The stack of the sample that starts at `h` over `stack`: replayed
    /// if the memo knows the walk, else walked (an [`Op::Stack`] pushed to
    /// `ops` when it is new); timed as [`SessionUnwinder::handle_record`]
    /// says.
    fn stack_of(
        &mut self,
        h: &impl WalkStart,
        stack: &[u8],
        cx: &InternCtx<'_>,
        ops: &mut Vec<Op>,
    ) -> StackEntry {
        self.timing_rng ^= self.timing_rng << 13;
        self.timing_rng ^= self.timing_rng >> 7;
        self.timing_rng ^= self.timing_rng << 17;
        let t0 = (self.timing_rng % HIT_TIMING == 0).then(Instant::now);
        let entry = match self.stacks.replay(h, stack) {
            Some(entry) => {
                self.stacks.split.replays += 1;
                if let Some(t0) = t0 {
                    let d = t0.elapsed();
                    self.hist.add_us(d.as_micros() as u64, HIT_TIMING);
                    self.unwind_time += d * HIT_TIMING as u32;
                    self.stacks.split.replay += d * HIT_TIMING as u32;
                }
                entry
            }
            None => {
                let t0 = t0.unwrap_or_else(Instant::now);
                let entry = self.stacks.stack_of_unreplayed(
                    self.process.get(),
                    h,
                    stack,
                    &self.client_text,
                    cx,
                    ops,
                );
                let d = t0.elapsed();
                self.hist.add_us(d.as_micros() as u64, 1);
                self.unwind_time += d;
                entry
            }
        };
        if entry.error.is_some() {
            self.unwind_errors += 1;
        }
        entry
    }
}

impl SessionUnwinder {
    /// A session's unwinder over `process`; frames in `client_text` are
    /// skipped; `seed` picks which replayed samples are timed.
    pub fn new(process: ProcessContext, client_text: Range<u64>, seed: u64) -> Self {
        Self::with_process(LazyProcess::ready(process), client_text, seed)
    }

    /// [`SessionUnwinder::new`] over a process whose modules are loaded
    /// from `pending` when a record first needs them.
    pub fn pending(pending: PendingProcess, client_text: Range<u64>, seed: u64) -> Self {
        Self::with_process(LazyProcess::pending(pending), client_text, seed)
    }

    fn with_process(process: LazyProcess, client_text: Range<u64>, seed: u64) -> Self {
        SessionUnwinder {
            walker: Walker {
                process,
                client_text,
                stacks: StackCache::default(),
                hist: UnwindHistogram::default(),
                unwind_errors: 0,
                unwind_time: Duration::ZERO,
                timing_rng: (0x9e37_79b9_7f4a_7c15 ^ seed) | 1,
            },
            thread_stacks: ThreadStacks::default(),
            resync: false,
            corrupt_records: 0,
            samples: 0,
            stack_samples: 0,
            interner_generation: 0,
            last_seq: 0,
        }
    }

    /// Turns one record into operations.
    ///
    /// Timing (the trace's unwinding-time histogram and total), the same for
    /// malloc and stack samples (see [`Walker`]): a sample that
    /// is walked is timed exactly, two clock reads around the walk and the
    /// interning of a new stack. A replay check (~45 ns for 33 frames) costs
    /// about as much as the two clock reads around it, so only one in
    /// [`HIT_TIMING`] replayed samples, picked at random, is timed (around the
    /// replay check) and counted [`HIT_TIMING`] times: an unbiased estimate of
    /// the replayed samples' count per bucket and total time. The ring copy and decode are never in
    /// it. (One read per sample, the time since the previous one, was tried: it
    /// put the ring copy in the histogram, a mean of 5.2 µs instead of 0.19 µs
    /// for a program with 32 KB stacks.)
    ///
    /// `scratch` is where a record's bytes go when they have no other place
    /// (a stack outside reuse, a record other than a malloc sample): one
    /// buffer per worker, not per session.
    pub fn handle_record<B: RecordBytes + ?Sized>(
        &mut self,
        record: &B,
        scratch: &mut Vec<u8>,
        ops: &mut Vec<Op>,
        cx: &InternCtx<'_>,
    ) {
        // Interned entries were condemned (a retirement pass): frames the
        // caches hold may be dropped soon, so stacks and pcs are forgotten
        // and interned again (see `Interner::retire_unused`).
        let generation = cx.interner.retire_generation();
        if generation != self.interner_generation {
            self.interner_generation = generation;
            self.walker.stacks.clear();
        }
        // A malloc sample's header is copied out on its own and its stack
        // bytes straight to where they are unwound from (see
        // `heapprofd_shmem::RingRecord`); anything else whole.
        let mut fixed = [0u8; MallocHeader::ENCODED_LEN];
        if record.copy_to(0, &mut fixed) && fixed[..4] == (RecordKind::Malloc as u32).to_le_bytes()
        {
            match MallocHeader::decode_fixed(&fixed, record.len()) {
                Ok(h) => self.handle_malloc(&h, record, scratch, ops, cx),
                Err(_) => self.corrupt_records += 1,
            }
            return;
        }
        if record.copy_to_vec(0, record.len(), scratch) {
            self.handle_other(scratch, ops, cx);
        } else {
            self.corrupt_records += 1;
        }
    }

    /// A malloc sample whose header `h` was decoded from `record`: its stack
    /// is put together (the thread's base, or what the record carries) and
    /// unwound.
    fn handle_malloc<B: RecordBytes + ?Sized>(
        &mut self,
        h: &MallocHeader,
        record: &B,
        scratch: &mut Vec<u8>,
        ops: &mut Vec<Op>,
        cx: &InternCtx<'_>,
    ) {
        // `decode_fixed` checked that these bytes are in the record.
        let (start, fresh_len) = (MallocHeader::ENCODED_LEN, h.stack_len as usize);
        let mut whole = Err(Missing);
        if h.flags & MallocHeader::FLAG_STACK_BASE != 0 {
            let (w, resync) = self.thread_stacks.assemble_with(
                h.tid,
                h.stack_pointer,
                fresh_len,
                h.stack_reused as usize,
                |dst| record.copy_to(start, dst),
            );
            self.resync |= resync;
            whole = w;
        }
        // Outside reuse, or without its base: the sample unwinds from what
        // it carries (without its base, its walk ends early, an unwinding
        // error).
        let stack: &[u8] = match whole {
            Ok(w) => w,
            Err(Missing) => {
                record.copy_to_vec(start, fresh_len, scratch);
                scratch
            }
        };
        let entry = self.walker.stack_of(h, stack, cx, ops);
        self.samples += 1;
        self.last_seq += 1;
        ops.push(Op::Malloc {
            heap: h.heap_id,
            seq: self.last_seq,
            address: h.address,
            sample_size: h.sample_size,
            size: h.alloc_size,
            tid: h.tid,
            timestamp_ns: h.timestamp_ns,
            stack: entry.id,
            context: h.context_id,
            interval_shift: h.interval_shift() as u8,
        });
    }

    /// A record other than a malloc sample (or a malformed one), whole.
    fn handle_other(&mut self, bytes: &[u8], ops: &mut Vec<Op>, cx: &InternCtx<'_>) {
        match Record::decode(bytes) {
            // Routed to `handle_malloc`; one too short for its header
            // fails to decode.
            Ok(Record::Malloc(..)) => self.corrupt_records += 1,
            Ok(Record::StackSample(h, _)) if h.flags & StackSampleHeader::FLAG_LOSSES_ONLY != 0 => {
                ops.push(Op::SampleLosses {
                    tid: h.tid,
                    tag: h.tag,
                    lost_overrun: h.lost_overrun,
                    lost_dropped: h.lost_dropped,
                })
            }
            Ok(Record::StackSample(h, stack)) => {
                let entry = self.walker.stack_of(&h, stack, cx, ops);
                self.stack_samples += 1;
                ops.push(Op::StackSample {
                    tid: h.tid,
                    tag: h.tag,
                    timestamp_ns: h.timestamp_ns,
                    cpu_time_ns: h.cpu_time_ns,
                    period: h.period,
                    stack: entry.id,
                    biased: h.flags & StackSampleHeader::FLAG_BIASED != 0,
                    lost_overrun: h.lost_overrun,
                    lost_dropped: h.lost_dropped,
                    unwind_error: entry.error.map(perfetto_unwind_error),
                });
            }
            Ok(Record::EventName(e)) => ops.push(Op::EventName {
                tag: e.tag,
                name: e.name_str().to_owned(),
            }),
            Ok(Record::Free(f)) => {
                self.last_seq += 1;
                ops.push(Op::Free {
                    heap: f.heap_id,
                    seq: self.last_seq,
                    address: f.address,
                })
            }
            Ok(Record::Context(c)) => {
                let labels = if c.flags & ContextRecord::FLAG_OVERFLOW != 0 {
                    context::overflow_labels()
                } else {
                    c.pairs_lossy()
                };
                ops.push(Op::Context {
                    id: c.context_id,
                    frame: context::intern_context_frame(cx.interner, &labels),
                    overflowed: c.overflowed,
                })
            }
            Ok(Record::HeapName(n)) => ops.push(Op::HeapName {
                heap: n.heap_id,
                name: n.name_str().to_owned(),
                interval: n.interval,
            }),
            Err(_) => self.corrupt_records += 1,
        }
    }

    /// The process unloaded an object since the last record (the ring's
    /// unload epoch changed): the maps are re-read before the next record
    /// is unwound, and if they changed, every stack and pc is forgotten
    /// (an object loaded where the unloaded one was must not inherit its
    /// frames).
    pub fn objects_unloaded(&mut self) {
        if self.walker.process.get().objects_unloaded() {
            self.walker.stacks.clear();
        }
    }

    /// The process context, if a record needed it.
    pub fn process(&self) -> Option<&ProcessContext> {
        self.walker.process.loaded()
    }

    /// Whether the client must be told to send whole stacks (the ring's
    /// stack resync); clears the request.
    pub fn take_resync(&mut self) -> bool {
        std::mem::take(&mut self.resync)
    }

    /// The unwinding part of the session's statistics (the ring buffer's
    /// are the worker's).
    pub fn stats(&self) -> SessionStats {
        SessionStats {
            unwinding_errors: self.walker.unwind_errors,
            heap_samples: self.samples,
            map_reparses: self.process().map_or(0, |p| p.stats().map_reparses),
            total_unwinding_time_us: self.walker.unwind_time.as_micros() as u64,
            unwinding_time_us: self.walker.hist.clone(),
            corrupt_records: self.corrupt_records,
            ..SessionStats::default()
        }
    }
}

/// Perfetto's name for why a walk stopped early.
fn perfetto_unwind_error(e: UnwindErrorKind) -> StackUnwindError {
    match e {
        UnwindErrorKind::MemoryInvalid => StackUnwindError::UnwindErrorMemoryInvalid,
        UnwindErrorKind::InvalidMap => StackUnwindError::UnwindErrorInvalidMap,
        UnwindErrorKind::UnwindInfo => StackUnwindError::UnwindErrorUnwindInfo,
        UnwindErrorKind::MaxFramesExceeded => StackUnwindError::UnwindErrorMaxFramesExceeded,
        UnwindErrorKind::InvalidRegisters => StackUnwindError::UnwindErrorInvalidParameter,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use heapprofd_model::profile::Interner;
    use heapprofd_proto::wire::{FreeRecord, HeapNameRecord, MallocHeader, heap_name_field};
    use heapprofd_unwinder::{ModuleCache, NoMemory, StaticMaps};

    use super::*;
    use crate::runtime::stacks::tests::header;
    use crate::runtime::symbolize::Symbolizer;

    /// A malloc record of one frame at `pc` (no stack bytes).
    pub(super) fn malloc(seq: u64, pc: u64) -> Vec<u8> {
        let h = MallocHeader {
            sequence: seq,
            sample_size: 4096,
            address: 0x1000 * seq,
            timestamp_ns: 7,
            ..header(pc)
        };
        Record::Malloc(h, &[]).encode_to_vec()
    }

    /// An unwinder of this process's maps (a static copy) with no memory
    /// reader: records in, operations out, no thread, channel or `/proc` of
    /// another process.
    fn own_maps_unwinder() -> SessionUnwinder {
        let process = ProcessContext::new(
            std::process::id(),
            Box::new(StaticMaps(
                std::fs::read_to_string("/proc/self/maps").unwrap(),
            )),
            Box::new(NoMemory),
            Arc::new(ModuleCache::default()),
        );
        SessionUnwinder::new(process, 0..0, 1)
    }

    /// A fresh interner and symbolizer (names off), for [`InternCtx`]s.
    #[derive(Default)]
    pub(super) struct Names {
        interner: Interner,
        symbolizer: Symbolizer,
    }

    impl Names {
        pub(super) fn cx(&self) -> InternCtx<'_> {
            InternCtx {
                interner: &self.interner,
                symbolizer: &self.symbolizer,
                symbolize: false,
            }
        }
    }

    /// A stack sample is unwound like a malloc sample (its stack defined
    /// first); a losses-only record is passed on without unwinding.
    #[test]
    fn stack_samples_and_losses_become_operations() {
        let mut u = own_maps_unwinder();
        let names = Names::default();
        let cx = names.cx();
        let pc = stack_samples_and_losses_become_operations as *const () as usize as u64 + 4;
        let m = header(pc);
        let sample = StackSampleHeader {
            flags: 0,
            tid: 9,
            tag: 0,
            timestamp_ns: 1,
            cpu_time_ns: 2,
            period: 30,
            lost_overrun: 2,
            lost_dropped: 1,
            arch: m.arch,
            stack_pointer: m.stack_pointer,
            stack_len: 0,
            regs: m.regs,
        };
        let losses = StackSampleHeader {
            flags: StackSampleHeader::FLAG_LOSSES_ONLY | StackSampleHeader::FLAG_NO_STACK,
            tid: 10,
            lost_dropped: 4,
            ..sample
        };
        let mut ops = Vec::new();
        for h in [sample, losses] {
            u.handle_record(
                &Record::StackSample(h, &[]).encode_to_vec(),
                &mut Vec::new(),
                &mut ops,
                &cx,
            );
        }
        assert_eq!(ops.len(), 3, "{ops:?}");
        let Op::Stack { id, .. } = &ops[0] else {
            panic!("{ops:?}")
        };
        assert!(matches!(
            &ops[1],
            Op::StackSample { tid: 9, period: 30, lost_overrun: 2, lost_dropped: 1, stack, .. }
                if stack == id
        ));
        // No stack was copied: the walk stops at the first return address
        // and the sample still goes out, saying why (and is counted).
        let Op::StackSample { unwind_error, .. } = &ops[1] else {
            panic!("{ops:?}")
        };
        assert_eq!(
            *unwind_error,
            Some(StackUnwindError::UnwindErrorMemoryInvalid),
            "{ops:?}"
        );
        assert_eq!(u.walker.unwind_errors, 1);
        assert_eq!(
            ops[2],
            Op::SampleLosses {
                tid: 10,
                tag: 0,
                lost_overrun: 2,
                lost_dropped: 4
            }
        );
        assert_eq!(u.stack_samples, 1);
    }

    /// A free record and a heap declaration (neither needs a walk).
    fn free_and_heap() -> [Vec<u8>; 2] {
        let free = Record::Free(FreeRecord {
            sequence: 3,
            address: 0x1000,
            heap_id: 0,
        });
        let heap = Record::HeapName(HeapNameRecord {
            heap_id: 2,
            interval: 512,
            name: heap_name_field("pool").unwrap(),
        });
        [free.encode_to_vec(), heap.encode_to_vec()]
    }

    /// A session's modules are loaded at the first record that needs a
    /// walk: a free or a heap declaration leaves them alone (a process
    /// that never samples never loads them), and the first malloc sample
    /// is unwound as by an unwinder made loaded.
    #[test]
    fn modules_are_loaded_at_the_first_walk_only() {
        let pending = heapprofd_unwinder::PendingProcess::read(
            std::process::id(),
            Box::new(StaticMaps(
                std::fs::read_to_string("/proc/self/maps").unwrap(),
            )),
            Box::new(NoMemory),
            Arc::new(ModuleCache::default()),
            heapprofd_unwinder::ProcessOptions::default(),
        );
        let mut u = SessionUnwinder::pending(pending, 0..0, 1);
        let names = Names::default();
        let cx = names.cx();
        let mut ops = Vec::new();
        for bytes in free_and_heap() {
            u.handle_record(&bytes, &mut Vec::new(), &mut ops, &cx);
        }
        assert!(u.process().is_none(), "loaded for a free");
        assert_eq!(u.stats().map_reparses, 0);
        let pc = modules_are_loaded_at_the_first_walk_only as *const () as usize as u64 + 4;
        u.handle_record(&malloc(1, pc), &mut Vec::new(), &mut ops, &cx);
        assert!(u.process().is_some(), "not loaded for a walk");
        let mut loaded = own_maps_unwinder();
        let mut expected = Vec::new();
        for bytes in free_and_heap() {
            loaded.handle_record(&bytes, &mut Vec::new(), &mut expected, &cx);
        }
        loaded.handle_record(&malloc(1, pc), &mut Vec::new(), &mut expected, &cx);
        assert_eq!(
            format!("{ops:?}"),
            format!("{expected:?}"),
            "the same stack as an unwinder made loaded"
        );
    }

    /// The daemon numbers a session's mallocs and frees itself, in ring
    /// order, whatever the records say (protocol version 7).
    #[test]
    fn mallocs_and_frees_are_numbered_in_ring_order() {
        let pc = mallocs_and_frees_are_numbered_in_ring_order as *const () as usize as u64 + 4;
        let [free, heap] = free_and_heap();
        let ops = operations_of([malloc(9, pc), heap, free, malloc(4, pc)]);
        let seqs: Vec<u64> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Malloc { seq, .. } | Op::Free { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, [1, 2, 3], "{ops:?}");
    }

    /// The operations of `records`, handled by an unwinder of our own
    /// maps with a fresh interner.
    fn operations_of(records: impl IntoIterator<Item = Vec<u8>>) -> Vec<Op> {
        let mut u = own_maps_unwinder();
        let names = Names::default();
        let cx = names.cx();
        let mut ops = Vec::new();
        for bytes in records {
            u.handle_record(&bytes, &mut Vec::new(), &mut ops, &cx);
        }
        ops
    }

    /// Records in, operations out, with no thread, channel or `/proc` of
    /// another process: the maps are a static copy of our own.
    #[test]
    fn records_become_operations() {
        let mut u = own_maps_unwinder();
        let names = Names::default();
        let cx = names.cx();
        let pc = records_become_operations as *const () as usize as u64 + 4;
        let [free, heap] = free_and_heap();
        let mut ops = Vec::new();
        for bytes in [malloc(1, pc), malloc(2, pc), free, heap, vec![1, 2, 3]] {
            u.handle_record(&bytes, &mut Vec::new(), &mut ops, &cx);
        }
        assert_eq!(ops.len(), 5, "{ops:?}");
        let Op::Stack { id, frames } = &ops[0] else {
            panic!("{ops:?}")
        };
        assert_eq!(
            frames.len(),
            2,
            "the pc and the error frame of an empty copy"
        );
        for (op, seq) in [(&ops[1], 1), (&ops[2], 2)] {
            assert_eq!(
                op,
                &Op::Malloc {
                    heap: 0,
                    seq,
                    address: 0x1000 * seq,
                    sample_size: 4096,
                    size: 8,
                    tid: 1,
                    timestamp_ns: 7,
                    stack: *id,
                    context: 0,
                    interval_shift: 0,
                }
            );
        }
        assert_eq!(
            ops[3],
            Op::Free {
                heap: 0,
                seq: 3,
                address: 0x1000
            }
        );
        assert_eq!(
            ops[4],
            Op::HeapName {
                heap: 2,
                name: "pool".into(),
                interval: 512
            }
        );
        let s = u.stats();
        assert_eq!(
            (s.heap_samples, s.unwinding_errors, s.corrupt_records),
            (2, 2, 1)
        );
        // The walk is timed; a replayed second sample is timed (and counted
        // HIT_TIMING times) one time in HIT_TIMING.
        let timed: u64 = s.unwinding_time_us.0.iter().sum();
        assert!(
            timed == 2 || timed == 1 || timed == 1 + HIT_TIMING,
            "{timed}"
        );
    }
}

#[cfg(test)]
mod unload_tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use heapprofd_model::messages::Op;
    use heapprofd_unwinder::{MapsSource, ModuleCache, NoMemory, ProcessOptions};

    use super::tests::{Names, malloc};
    use super::*;

    /// Maps the test changes under the process context.
    struct SharedMaps(Arc<Mutex<String>>);

    impl MapsSource for SharedMaps {
        fn read_maps(&mut self) -> std::io::Result<String> {
            Ok(self.0.lock().unwrap().clone())
        }
    }

    fn defined(ops: &[Op]) -> usize {
        ops.iter().filter(|o| matches!(o, Op::Stack { .. })).count()
    }

    /// `text` with the file of the mapping that holds `pc` renamed: another
    /// object loaded where that one was.
    fn replaced_at(text: &str, pc: u64) -> String {
        let mut out = String::new();
        for line in text.lines() {
            let range = line.split_whitespace().next().unwrap();
            let (a, b) = range.split_once('-').unwrap();
            let (a, b) = (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            );
            let fields: Vec<&str> = line.split_whitespace().collect();
            if (a..b).contains(&pc) && fields.len() >= 6 {
                out.push_str(&format!("{} /another/library.so\n", fields[..5].join(" ")));
            } else {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// An unload (the ring's epoch changed) re-reads the maps even while
    /// the rate limit would hold a re-read back; maps that did not change
    /// keep the cached stacks, maps that did drop them, so a pc is named
    /// after what is mapped there now.
    #[test]
    fn an_unload_rereads_the_maps_and_forgets_stacks_only_if_they_changed() {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let maps = Arc::new(Mutex::new(text.clone()));
        let process = ProcessContext::with_options(
            std::process::id(),
            Box::new(SharedMaps(Arc::clone(&maps))),
            Box::new(NoMemory),
            Arc::new(ModuleCache::default()),
            ProcessOptions {
                reparse_interval: Duration::from_secs(3600),
                ..Default::default()
            },
        );
        let mut u = SessionUnwinder::new(process, 0..0, 1);
        let names = Names::default();
        let cx = names.cx();
        let pc = malloc as *const () as usize as u64 + 4;
        let mut ops = Vec::new();
        u.handle_record(&malloc(1, pc), &mut Vec::new(), &mut ops, &cx);
        assert_eq!(defined(&ops), 1, "{ops:?}");

        u.objects_unloaded();
        assert_eq!(u.stats().map_reparses, 1);
        ops.clear();
        u.handle_record(&malloc(2, pc), &mut Vec::new(), &mut ops, &cx);
        assert_eq!(defined(&ops), 0, "same maps: the stack is still known");

        *maps.lock().unwrap() = replaced_at(&text, pc);
        u.objects_unloaded();
        assert_eq!(u.stats().map_reparses, 2);
        ops.clear();
        u.handle_record(&malloc(3, pc), &mut Vec::new(), &mut ops, &cx);
        assert_eq!(defined(&ops), 1, "new maps: the stack is walked again");
    }
}
