//! Per-process state: identity, statistics, error flags and heaps.
//!
//! Heap ids come from the profiled process and are not trusted: a process
//! has at most [`MAX_HEAPS_PER_PROCESS`] heaps. Declarations and records
//! of heaps beyond that are dropped (counted in
//! [`OrderStats::over_heap_limit`]) and the process is flagged
//! `hit_guardrail`, which every later dump of it carries. A malloc into a
//! custom heap that was never declared is counted
//! ([`OrderStats::undeclared_heap_ops`]) and flags the process
//! `buffer_corrupted`; it is kept under the heap's default name `heapN`.

use std::collections::BTreeMap;

use super::heap::{HeapState, MallocOp};
use super::histogram::UnwindHistogram;
use super::lifetime::LifetimeTracker;
use super::order::{Release, Reorder};

/// Heaps one process may have: libc.malloc and the custom heaps a client
/// may register (ids 1 to 256, as Perfetto's client allows).
pub const MAX_HEAPS_PER_PROCESS: usize = heapprofd_proto::wire::MAX_CUSTOM_HEAPS as usize + 1;

/// Unwinding statistics of a process (Perfetto's `ProcessStats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessStats {
    /// Samples whose unwinding ended in an error frame.
    pub unwinding_errors: u64,
    /// Samples unwound.
    pub heap_samples: u64,
    /// Times `/proc/PID/maps` was read again.
    pub map_reparses: u64,
    /// Unwinding times.
    pub unwinding_time_us: UnwindHistogram,
    /// Sum of unwinding times.
    pub total_unwinding_time_us: u64,
    /// Time the client spent waiting for the ring buffer's lock.
    pub client_spinlock_blocked_us: u64,
}

impl ProcessStats {
    /// Adds `other`'s counts to these (the sessions of one process: its
    /// images before and after an exec).
    pub fn add(&mut self, other: &ProcessStats) {
        self.unwinding_errors += other.unwinding_errors;
        self.heap_samples += other.heap_samples;
        self.map_reparses += other.map_reparses;
        for (i, n) in other.unwinding_time_us.0.iter().enumerate() {
            self.unwinding_time_us[i] += n;
        }
        self.total_unwinding_time_us = self
            .total_unwinding_time_us
            .saturating_add(other.total_unwinding_time_us);
        self.client_spinlock_blocked_us = self
            .client_spinlock_blocked_us
            .saturating_add(other.client_spinlock_blocked_us);
    }

    /// Counts one unwound sample.
    pub fn record_unwind(&mut self, time_us: u64, error: bool) {
        self.heap_samples += 1;
        if error {
            self.unwinding_errors += 1;
        }
        self.unwinding_time_us.add_us(time_us, 1);
        self.total_unwinding_time_us = self.total_unwinding_time_us.saturating_add(time_us);
    }
}

/// Why the client stopped sending (Perfetto's `ClientError`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClientError {
    /// No error.
    #[default]
    None,
    /// The ring buffer stayed full past the block timeout.
    HitTimeout,
    /// The client could not find its thread's stack.
    InvalidStackBounds,
}

/// What went wrong for a process; written to every dump once set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessFlags {
    /// The client disconnected before the session ended.
    pub disconnected: bool,
    /// Records were lost because the ring buffer was full.
    pub buffer_overran: bool,
    /// The ring buffer held malformed data.
    pub buffer_corrupted: bool,
    /// Profiling stopped at a resource guardrail.
    pub hit_guardrail: bool,
    /// Another session was already profiling the process.
    pub rejected_concurrent: bool,
    /// Error the client reported.
    pub client_error: ClientError,
}

/// Counters of the sequence-ordering step (not part of the trace format).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrderStats {
    /// Frees that matched no live sampled allocation (unsampled memory,
    /// memory allocated before profiling started).
    pub unknown_frees: u64,
    /// Operations that arrived after a later one had been committed
    /// (beyond the reordering window).
    pub late_ops: u64,
    /// Operations with a sequence number already waiting.
    pub duplicate_seqs: u64,
    /// Operations for a heap that was never declared.
    pub undeclared_heap_ops: u64,
    /// Declarations and operations dropped because they named a heap
    /// beyond [`MAX_HEAPS_PER_PROCESS`].
    pub over_heap_limit: u64,
}

/// An operation waiting for its turn.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PendingOp {
    Malloc(MallocOp),
    Free { heap_id: u32, address: u64 },
}

/// What the process tree says about a process besides its command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// Parent process id, if known.
    pub ppid: Option<u32>,
    /// Thread names by thread id (empty name: not known yet).
    pub threads: BTreeMap<u32, String>,
    /// The parent as it was when the process was first seen, so the
    /// process tree names it even when it is not profiled (a shell's
    /// subshell, `record` itself).
    pub parent: Option<ParentProcess>,
}

impl ProcessIdentity {
    /// Takes what `newer` knows (read from `/proc` at a later handshake,
    /// e.g. after an exec): its parent pid and parent if it has them, its
    /// thread names over ours.
    pub fn update(&mut self, newer: ProcessIdentity) {
        self.ppid = newer.ppid.or(self.ppid);
        self.parent = newer.parent.or(self.parent.take());
        self.threads.extend(newer.threads);
    }
}

/// The parent of a profiled process, for the process tree: its pid, its
/// own parent and its command line, read while its child was alive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParentProcess {
    /// Process id.
    pub pid: u32,
    /// Its parent, if known (written only when that process is in the
    /// trace too).
    pub ppid: Option<u32>,
    /// Its command line.
    pub cmdline: Vec<String>,
}

/// One profiled process.
#[derive(Debug)]
pub struct ProcessState {
    /// Process id.
    pub pid: u32,
    /// Command line (argv), if known.
    pub cmdline: Vec<String>,
    /// Profiled from its start rather than attached to while running.
    pub from_startup: bool,
    /// Unwinding statistics.
    pub stats: ProcessStats,
    /// Error flags.
    pub flags: ProcessFlags,
    /// Parent and threads, as the runtime read them from `/proc`.
    pub identity: ProcessIdentity,
    /// When profiling of the process started (MONOTONIC_COARSE ns; 0 if
    /// unknown): the start of its first dump's window.
    pub session_start_ns: u64,
    /// Client sessions it had (its images that were profiled).
    pub sessions: u32,
    /// It ran unprofiled at some point (never profiled when `sessions` is
    /// 0), and why.
    pub unprofilable: Option<heapprofd_proto::wire::Unprofilable>,
    /// The service could not load the client into it (ptrace injection
    /// failed or was refused), and why; it was never profiled.
    pub not_attached: Option<String>,
    /// Its user contexts.
    pub contexts: super::context::ContextStats,
    /// Its stack samples (CPU time, named events).
    pub samples: super::samples::StackSamples,
    pub(crate) heaps: BTreeMap<u32, HeapState>,
    pub(crate) order: Reorder<PendingOp>,
    pub(crate) order_stats: OrderStats,
    pub(crate) lifetimes: LifetimeTracker,
    /// Threads seen in samples whose name the runtime has not looked up.
    pub(crate) unnamed_threads: Vec<u32>,
}

impl ProcessState {
    pub(crate) fn new(pid: u32, window: u64) -> Self {
        ProcessState {
            pid,
            cmdline: Vec::new(),
            from_startup: false,
            stats: ProcessStats::default(),
            flags: ProcessFlags::default(),
            identity: ProcessIdentity::default(),
            session_start_ns: 0,
            sessions: 0,
            unprofilable: None,
            not_attached: None,
            contexts: Default::default(),
            samples: Default::default(),
            heaps: BTreeMap::new(),
            order: Reorder::new(1, window),
            order_stats: OrderStats::default(),
            lifetimes: LifetimeTracker::default(),
            unnamed_threads: Vec::new(),
        }
    }

    /// Sets a thread's name.
    pub fn set_thread_name(&mut self, tid: u32, name: String) {
        self.identity.threads.insert(tid, name);
    }

    /// Notes a thread seen in a sample; new ones wait for a name.
    pub(crate) fn note_thread(&mut self, tid: u32) {
        if tid != 0 && !self.identity.threads.contains_key(&tid) {
            self.identity.threads.insert(tid, String::new());
            self.unnamed_threads.push(tid);
        }
    }

    /// Forgets the threads `alive` says are gone (their names are in the
    /// trace already: call after a dump), so that a program that keeps
    /// starting threads does not grow the profile. A late sample of a
    /// forgotten thread notes it again, without a name.
    pub fn forget_threads(&mut self, alive: impl Fn(u32) -> bool) {
        self.identity.threads.retain(|&tid, _| alive(tid));
    }

    /// Threads seen in samples since the last call, to be named.
    pub fn take_unnamed_threads(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.unnamed_threads)
    }

    /// The heaps, by heap id.
    pub fn heaps(&self) -> impl Iterator<Item = &HeapState> {
        self.heaps.values()
    }

    /// Adds to `keep` every callsite this process still counts under or
    /// will: its heaps' callsites that are not idle (see
    /// [`HeapState::mark_idle`]), its operations waiting for their turn,
    /// its stack samples not written yet.
    pub(crate) fn mark_idle(&mut self, keep: &mut Vec<super::tree::CallsiteId>) {
        for h in self.heaps.values_mut() {
            h.mark_idle(keep);
        }
        keep.extend(self.order.waiting().filter_map(|op| match op {
            PendingOp::Malloc(m) => Some(m.callsite),
            PendingOp::Free { .. } => None,
        }));
        keep.extend(self.samples.pending.iter().map(|s| s.callsite));
    }

    /// Empties the heap slots of callsites no longer in the tree.
    pub(crate) fn retire(&mut self, gone: impl Fn(super::tree::CallsiteId) -> bool + Copy) {
        for h in self.heaps.values_mut() {
            h.retire(gone);
        }
    }

    /// One heap.
    pub fn heap(&self, heap_id: u32) -> Option<&HeapState> {
        self.heaps.get(&heap_id)
    }

    /// Counters of the ordering step.
    pub fn order_stats(&self) -> OrderStats {
        OrderStats {
            late_ops: self.order.late,
            duplicate_seqs: self.order.duplicates,
            ..self.order_stats
        }
    }

    /// Operations waiting for earlier sequence numbers.
    pub fn pending_ops(&self) -> usize {
        self.order.pending()
    }

    /// Sum of live sampled bytes over the heaps.
    pub fn live_bytes(&self) -> u64 {
        self.heaps.values().map(|h| h.live_bytes()).sum()
    }

    /// Heap `heap_id`, created if new; `None` (counted, flagged) when the
    /// process already has [`MAX_HEAPS_PER_PROCESS`] others.
    pub(crate) fn heap_or_default(&mut self, heap_id: u32) -> Option<&mut HeapState> {
        let mut limits = Limits {
            flags: &mut self.flags,
            stats: &mut self.order_stats,
        };
        heap_or_default(&mut self.heaps, &mut limits, heap_id)
    }

    /// Adds an operation; commits whatever is ready.
    pub(crate) fn push(&mut self, seq: u64, op: PendingOp) {
        let Self {
            order,
            heaps,
            order_stats,
            lifetimes,
            flags,
            ..
        } = self;
        let mut cx = Apply {
            heaps,
            limits: Limits {
                flags,
                stats: order_stats,
            },
            lifetimes,
        };
        order.push(seq, op, |s, op, rel| cx.apply(s, op, rel));
    }

    /// Commits everything up to `seq`.
    pub(crate) fn release_through(&mut self, seq: u64) {
        let Self {
            order,
            heaps,
            order_stats,
            lifetimes,
            flags,
            ..
        } = self;
        let mut cx = Apply {
            heaps,
            limits: Limits {
                flags,
                stats: order_stats,
            },
            lifetimes,
        };
        order.release_through(seq, |s, op, rel| cx.apply(s, op, rel));
    }

    /// A new client session for the same pid (the process called exec, or
    /// the pid was reused): commits what is pending, counts the old image's
    /// live allocations freed (exec threw its memory away), and starts a
    /// new sequence-number space at 1.
    pub(crate) fn new_session(&mut self, window: u64) {
        self.flush();
        for h in self.heaps.values_mut() {
            h.release_live();
        }
        self.order = Reorder::new(1, window);
        self.lifetimes = LifetimeTracker::default();
        self.flags.disconnected = false;
    }

    /// Commits everything pending.
    pub(crate) fn flush(&mut self) {
        let Self {
            order,
            heaps,
            order_stats,
            lifetimes,
            flags,
            ..
        } = self;
        let mut cx = Apply {
            heaps,
            limits: Limits {
                flags,
                stats: order_stats,
            },
            lifetimes,
        };
        order.flush(|s, op, rel| cx.apply(s, op, rel));
    }
}

/// What committing an operation may count and flag.
struct Limits<'a> {
    flags: &'a mut ProcessFlags,
    stats: &'a mut OrderStats,
}

fn heap_or_default<'h>(
    heaps: &'h mut BTreeMap<u32, HeapState>,
    limits: &mut Limits<'_>,
    heap_id: u32,
) -> Option<&'h mut HeapState> {
    if !heaps.contains_key(&heap_id) && heaps.len() >= MAX_HEAPS_PER_PROCESS {
        limits.stats.over_heap_limit += 1;
        limits.flags.hit_guardrail = true;
        return None;
    }
    Some(
        heaps
            .entry(heap_id)
            .or_insert_with(|| HeapState::new(heap_id, default_heap_name(heap_id), 0)),
    )
}

/// What committing an operation touches.
struct Apply<'a> {
    heaps: &'a mut BTreeMap<u32, HeapState>,
    limits: Limits<'a>,
    lifetimes: &'a mut LifetimeTracker,
}

impl Apply<'_> {
    fn apply(&mut self, seq: u64, op: PendingOp, release: Release) {
        let in_order = release == Release::InOrder;
        match op {
            PendingOp::Malloc(m) => {
                let declared = self.heaps.contains_key(&m.heap_id);
                let Some(heap) = heap_or_default(self.heaps, &mut self.limits, m.heap_id) else {
                    return;
                };
                if !declared {
                    self.limits.stats.undeclared_heap_ops += 1;
                    // A client declares each custom heap before its first
                    // record (libc.malloc is declared by the session): an
                    // undeclared one is a corrupt (or dropped) record. Its
                    // operations are kept, under `heapN`.
                    if m.heap_id != heapprofd_proto::wire::HEAP_LIBC_MALLOC {
                        self.limits.flags.buffer_corrupted = true;
                    }
                }
                let exact = heap.sampling_interval == 1 && in_order;
                let birth = self.lifetimes.malloc(seq, m.tid, exact);
                heap.commit_malloc(seq, &m, birth, in_order);
            }
            PendingOp::Free { heap_id, address } => {
                let Some(heap) = self.heaps.get_mut(&heap_id) else {
                    self.limits.stats.unknown_frees += 1;
                    return;
                };
                match heap.commit_free(seq, address) {
                    Some(freed) => {
                        if heap.sampling_interval == 1 && in_order {
                            let (lifetime, temporary) = self.lifetimes.free(freed.seq, freed.birth);
                            heap.note_lifetime(freed, lifetime, temporary);
                        }
                    }
                    None => self.limits.stats.unknown_frees += 1,
                }
            }
        }
    }
}

/// Name of a heap that was used before it was declared.
pub fn default_heap_name(heap_id: u32) -> String {
    if heap_id == heapprofd_proto::wire::HEAP_LIBC_MALLOC {
        heapprofd_proto::wire::HEAP_LIBC_MALLOC_NAME.to_owned()
    } else {
        format!("heap{heap_id}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::tree::CallsiteId;

    #[test]
    fn heaps_are_bounded_and_the_excess_flagged() {
        let mut p = ProcessState::new(1, 16);
        for id in 0..MAX_HEAPS_PER_PROCESS as u32 {
            assert!(p.heap_or_default(id * 7).is_some());
        }
        assert!(!p.flags.hit_guardrail);
        // An existing heap is still there; a new one is refused.
        assert!(p.heap_or_default(7).is_some());
        assert!(p.heap_or_default(u32::MAX).is_none());
        assert!(p.flags.hit_guardrail);
        // A malloc into a refused heap is dropped, counted.
        let op = PendingOp::Malloc(MallocOp {
            heap_id: 99_999,
            address: 0x1000,
            sample_size: 1 << 60,
            size: 1 << 60,
            tid: 1,
            timestamp: 1,
            callsite: CallsiteId::ROOT,
            interval_shift: 0,
        });
        p.push(1, op);
        p.flush();
        assert_eq!(p.heaps().count(), MAX_HEAPS_PER_PROCESS);
        assert_eq!(p.order_stats().over_heap_limit, 2);
        assert_eq!(p.live_bytes(), 0);
    }

    #[test]
    fn an_undeclared_custom_heap_is_counted_and_flagged_corrupt() {
        let op = |heap_id, seq| {
            (
                seq,
                PendingOp::Malloc(MallocOp {
                    heap_id,
                    address: 0x1000 * seq,
                    sample_size: 16,
                    size: 16,
                    tid: 1,
                    timestamp: 1,
                    callsite: CallsiteId::ROOT,
                    interval_shift: 0,
                }),
            )
        };
        let mut p = ProcessState::new(1, 16);
        let (seq, m) = op(0, 1);
        p.push(seq, m);
        p.flush();
        assert!(
            !p.flags.buffer_corrupted,
            "libc.malloc needs no declaration"
        );
        let (seq, m) = op(5, 2);
        p.push(seq, m);
        p.flush();
        assert!(p.flags.buffer_corrupted);
        assert_eq!(p.order_stats().undeclared_heap_ops, 2);
        assert_eq!(p.heap(5).map(|h| h.name.as_str()), Some("heap5"));
    }

    #[test]
    fn record_unwind_counts() {
        let mut s = ProcessStats::default();
        s.record_unwind(300, false);
        s.record_unwind(5, true);
        assert_eq!((s.heap_samples, s.unwinding_errors), (2, 1));
        assert_eq!(s.total_unwinding_time_us, 305);
        assert_eq!(s.unwinding_time_us[9], 1); // 256 < 300 <= 512
        assert_eq!(s.unwinding_time_us[3], 1);
    }
}
