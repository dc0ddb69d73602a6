//! One heap of one process: live sampled allocations and per-callsite
//! totals, updated by operations already put in sequence order.
//!
//! ```text
//!  live: address ──► LiveAlloc { seq, sample_size, slot } ─┐
//!                                                          ▼
//!  callsites: [CallsiteTotals { callsite, allocated, freed, counts, live, max… }]
//! ```
//!
//! Values are in *sampled* bytes (`sample_size`): with interval 1 they are
//! the real sizes, otherwise unbiased estimates. The peak for dump_at_max is
//! tracked in O(1) per operation with a version stamp: when the heap reaches
//! a new maximum of live sampled bytes the version goes up, and a callsite's
//! value at the peak is copied lazily the next time it changes.

use rustc_hash::FxHashMap;

use super::callsite_stats::CallsiteStats;
use super::estimate::SampleWeights;
use super::tree::CallsiteId;

/// Cumulative and live values of one callsite in one heap.
#[derive(Debug, Clone, PartialEq)]
pub struct CallsiteTotals {
    /// The stack.
    pub callsite: CallsiteId,
    /// Sampled bytes allocated since the start, cumulative.
    pub allocated: u64,
    /// Sampled bytes freed since the start, cumulative.
    pub freed: u64,
    /// Sampled allocations, cumulative.
    pub alloc_count: u64,
    /// Frees of sampled allocations, cumulative.
    pub free_count: u64,
    /// Sampled bytes live now (`allocated - freed`).
    pub live_bytes: u64,
    /// Sampled allocations live now.
    pub live_count: u64,
    /// Estimated allocations, sizes, lifetimes (see [`CallsiteStats`]).
    pub stats: CallsiteStats,
    max_bytes: u64,
    max_count: u64,
    max_version: u64,
    dumped: Option<(u64, u64)>,
    /// The counts it had, already dumped and with nothing live, at the
    /// last [`HeapState::mark_idle`]: still the same at the next one, it
    /// may be retired.
    idle_at: Option<(u64, u64)>,
}

impl CallsiteTotals {
    fn new(callsite: CallsiteId) -> Self {
        CallsiteTotals {
            callsite,
            allocated: 0,
            freed: 0,
            alloc_count: 0,
            free_count: 0,
            live_bytes: 0,
            live_count: 0,
            stats: CallsiteStats::default(),
            max_bytes: 0,
            max_count: 0,
            max_version: 0,
            dumped: None,
            idle_at: None,
        }
    }

    /// An emptied slot (see [`HeapState::retire`]): zero, never dumped
    /// again, until reused for another callsite.
    fn vacant() -> Self {
        CallsiteTotals {
            dumped: Some((0, 0)),
            ..Self::new(CallsiteId::ROOT)
        }
    }

    fn is_vacant(&self) -> bool {
        self.callsite == CallsiteId::ROOT && self.alloc_count == 0 && self.dumped == Some((0, 0))
    }

    /// Dumped with its final values and nothing live.
    fn settled(&self) -> bool {
        self.live_count == 0 && self.dumped == Some((self.alloc_count, self.free_count))
    }

    /// Whether a dump must include this callsite: it has live allocations,
    /// or it changed since it was last dumped. A callsite left out is
    /// unchanged, so readers that take deltas (trace processor) lose
    /// nothing; its totals are kept, so if it comes back its values go on
    /// growing from where they were.
    pub fn needs_dump(&self) -> bool {
        self.live_count > 0 || self.dumped != Some((self.alloc_count, self.free_count))
    }

    pub(crate) fn mark_dumped(&mut self) {
        self.dumped = Some((self.alloc_count, self.free_count));
    }
}

#[derive(Debug, Clone, Copy)]
struct LiveAlloc {
    seq: u64,
    sample_size: u64,
    slot: u32,
    /// Low 32 bits of the allocation's birth (see [`super::lifetime`]).
    birth: u32,
}

/// A committed malloc (fields as in [`super::Alloc`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MallocOp {
    pub(crate) heap_id: u32,
    pub(crate) address: u64,
    pub(crate) sample_size: u64,
    pub(crate) size: u64,
    pub(crate) tid: u32,
    pub(crate) timestamp: u64,
    pub(crate) callsite: CallsiteId,
    /// Drawn at the heap's interval times `2^interval_shift`.
    pub(crate) interval_shift: u8,
}

/// The samples of a heap whose client raised its interval while its ring
/// was filling (`ClientConfig::FLAG_ADAPTIVE_INTERVAL`): each weighs at the
/// interval it was drawn at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RaisedInterval {
    /// Samples drawn at a raised interval (allocations of at least the
    /// interval, recorded with their own size, not counted).
    pub samples: u64,
    /// The largest interval a sample was drawn at (0: none raised).
    pub max_interval: u64,
}

/// A sampled allocation a free released: what its lifetime needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Freed {
    pub(crate) seq: u64,
    pub(crate) birth: u32,
    slot: u32,
}

/// What the callsites of a heap that were retired had counted (they are in
/// the trace already; the end-of-run summary still adds them up).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RetiredTotals {
    /// Callsites retired.
    pub callsites: u64,
    /// Sampled bytes they allocated.
    pub allocated: u64,
    /// Sampled bytes they freed.
    pub freed: u64,
    /// Their estimated allocations.
    pub estimated_allocs: f64,
}

impl RetiredTotals {
    fn add(&mut self, t: &CallsiteTotals) {
        self.callsites += 1;
        self.allocated = self.allocated.saturating_add(t.allocated);
        self.freed = self.freed.saturating_add(t.freed);
        self.estimated_allocs += t.stats.estimated_allocs;
    }
}

/// Live sampled allocations and per-callsite totals of one heap.
#[derive(Debug)]
pub struct HeapState {
    /// Heap id on the wire.
    pub id: u32,
    /// Heap name (`libc.malloc` for the malloc family).
    pub name: String,
    /// Current sampling interval in bytes.
    pub sampling_interval: u64,
    /// First sampling interval seen (before any adaptive change).
    pub orig_sampling_interval: u64,
    /// Samples its client drew at a raised interval (see [`RaisedInterval`]).
    pub raised: RaisedInterval,
    live: FxHashMap<u64, LiveAlloc>,
    slots: Vec<CallsiteTotals>,
    slot_of: FxHashMap<CallsiteId, u32>,
    /// Slots emptied by [`HeapState::retire`], reused first.
    free_slots: Vec<u32>,
    /// What the retired callsites had counted (see [`RetiredTotals`]).
    pub retired: RetiredTotals,
    live_bytes: u64,
    max_live_bytes: u64,
    max_version: u64,
    max_timestamp: u64,
    first_timestamp: Option<u64>,
    committed_timestamp: u64,
    pub(crate) last_dump_timestamp: Option<u64>,
    /// The weights of the samples (how many allocations each stands for).
    weights: SampleWeights,
}

impl HeapState {
    pub(crate) fn new(id: u32, name: String, sampling_interval: u64) -> Self {
        HeapState {
            id,
            name,
            sampling_interval,
            orig_sampling_interval: sampling_interval,
            raised: RaisedInterval::default(),
            live: FxHashMap::default(),
            slots: Vec::new(),
            slot_of: FxHashMap::default(),
            free_slots: Vec::new(),
            retired: RetiredTotals::default(),
            live_bytes: 0,
            max_live_bytes: 0,
            max_version: 0,
            max_timestamp: 0,
            first_timestamp: None,
            committed_timestamp: 0,
            last_dump_timestamp: None,
            weights: SampleWeights::default(),
        }
    }

    fn slot(&mut self, callsite: CallsiteId) -> u32 {
        if let Some(&s) = self.slot_of.get(&callsite) {
            return s;
        }
        let s = if let Some(s) = self.free_slots.pop() {
            self.slots[s as usize] = CallsiteTotals::new(callsite);
            s
        } else {
            self.slots.push(CallsiteTotals::new(callsite));
            u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
        };
        self.slot_of.insert(callsite, s);
        s
    }

    /// One pass of idle detection, after a dump: adds to `keep` every
    /// callsite that must stay (something live, changed since it was
    /// dumped, or changed since the previous pass). The others are idle:
    /// dumped with final values, nothing live, unchanged for a whole pass.
    pub(crate) fn mark_idle(&mut self, keep: &mut Vec<CallsiteId>) {
        for t in &mut self.slots {
            if t.is_vacant() {
                continue;
            }
            let now = (t.alloc_count, t.free_count);
            if t.settled() && t.idle_at == Some(now) {
                continue;
            }
            t.idle_at = t.settled().then_some(now);
            keep.push(t.callsite);
        }
    }

    /// Empties the slots of callsites that are no longer nodes of the tree
    /// (`gone`), adding what they counted to [`HeapState::retired`]. Only
    /// idle callsites can be gone (see [`HeapState::mark_idle`]).
    pub(crate) fn retire(&mut self, gone: impl Fn(CallsiteId) -> bool) {
        for (i, t) in self.slots.iter_mut().enumerate() {
            if t.is_vacant() || !gone(t.callsite) {
                continue;
            }
            debug_assert!(
                t.settled(),
                "a callsite with live or undumped values retired"
            );
            self.slot_of.remove(&t.callsite);
            self.retired.add(t);
            *t = CallsiteTotals::vacant();
            self.free_slots.push(u32::try_from(i).unwrap_or(u32::MAX));
        }
        if self.slot_of.len() * 4 < self.slot_of.capacity() {
            self.slot_of.shrink_to_fit();
        }
    }

    /// Copies the value at the last peak before a callsite changes.
    #[inline]
    fn touch(&mut self, slot: u32) -> Option<&mut CallsiteTotals> {
        let version = self.max_version;
        let t = self.slots.get_mut(slot as usize)?;
        if t.max_version < version {
            t.max_bytes = t.live_bytes;
            t.max_count = t.live_count;
            t.max_version = version;
        }
        Some(t)
    }

    fn note_time(&mut self, ts: u64) {
        if ts != 0 {
            self.committed_timestamp = self.committed_timestamp.max(ts);
            if self.first_timestamp.is_none() {
                self.first_timestamp = Some(ts);
            }
        }
    }

    /// Counts a sampled allocation at `slot` and makes it live (or not, for
    /// an allocation already superseded).
    fn add_alloc(&mut self, slot: u32, sample_size: u64, live: bool) {
        let Some(t) = self.touch(slot) else { return };
        t.allocated = t.allocated.saturating_add(sample_size);
        t.alloc_count += 1;
        if live {
            t.live_bytes = t.live_bytes.saturating_add(sample_size);
            t.live_count += 1;
            self.live_bytes = self.live_bytes.saturating_add(sample_size);
        } else {
            t.freed = t.freed.saturating_add(sample_size);
            t.free_count += 1;
        }
    }

    fn remove_live(&mut self, a: LiveAlloc) {
        self.live_bytes = self.live_bytes.saturating_sub(a.sample_size);
        let Some(t) = self.touch(a.slot) else { return };
        t.freed = t.freed.saturating_add(a.sample_size);
        t.free_count += 1;
        t.live_bytes = t.live_bytes.saturating_sub(a.sample_size);
        t.live_count = t.live_count.saturating_sub(1);
    }

    fn check_peak(&mut self) {
        if self.live_bytes > self.max_live_bytes {
            self.max_live_bytes = self.live_bytes;
            self.max_version += 1;
            self.max_timestamp = self.committed_timestamp;
        }
    }

    /// Commits a malloc born at `birth` (see [`super::lifetime`]).
    /// `in_order` says every earlier operation has been committed;
    /// otherwise (a late operation) a newer allocation already at the
    /// address wins.
    pub(crate) fn commit_malloc(&mut self, seq: u64, m: &MallocOp, birth: u32, in_order: bool) {
        self.note_time(m.timestamp);
        let slot = self.slot(m.callsite);
        // A sample that stands for exactly its own size is one allocation:
        // the sampler gives that only to allocations of at least the
        // interval (sampled with certainty), and a custom heap's
        // `AHeapProfile_reportSample` (the program sampled it itself) is
        // recorded so. Smaller sampled ones stand for a multiple of the
        // interval.
        let interval = if m.sample_size == m.size {
            1
        } else if m.interval_shift != 0 {
            let i = self
                .sampling_interval
                .saturating_mul(1u64 << m.interval_shift.min(63));
            self.raised.samples += 1;
            self.raised.max_interval = self.raised.max_interval.max(i);
            i
        } else {
            self.sampling_interval
        };
        let w = self.weights.inverse_probability(m.size, interval);
        if let Some(t) = self.slots.get_mut(slot as usize) {
            t.stats.add_weighted_alloc(m.size, w);
        }
        let new = LiveAlloc {
            seq,
            sample_size: m.sample_size,
            slot,
            birth,
        };
        match self.live.get(&m.address).copied() {
            Some(old) if !in_order && old.seq > seq => {
                // Freed implicitly by the newer allocation at the address.
                self.add_alloc(slot, m.sample_size, false);
                return;
            }
            Some(old) => {
                // A malloc at a live address: the old one was freed.
                self.remove_live(old);
            }
            None => {}
        }
        self.live.insert(m.address, new);
        self.add_alloc(slot, m.sample_size, true);
        self.check_peak();
    }

    /// Counts every live allocation freed: the address space it lived in
    /// is gone (the process called exec), and memory exec threw away is not
    /// unreleased. The peak, reached before, stays.
    pub(crate) fn release_live(&mut self) {
        for (_, a) in std::mem::take(&mut self.live) {
            self.remove_live(a);
        }
        self.live_bytes = 0;
    }

    /// Commits a free. Frees of unknown addresses (unsampled allocations,
    /// memory allocated before profiling started) are ignored; so is a
    /// late free older than the allocation now at its address. Returns the
    /// sampled allocation it freed, if any.
    pub(crate) fn commit_free(&mut self, seq: u64, address: u64) -> Option<Freed> {
        match self.live.get(&address) {
            Some(a) if a.seq < seq => {
                let a = *a;
                self.live.remove(&address);
                self.remove_live(a);
                Some(Freed {
                    seq: a.seq,
                    birth: a.birth,
                    slot: a.slot,
                })
            }
            _ => None,
        }
    }

    /// Counts the lifetime of a freed allocation (exact mode).
    pub(crate) fn note_lifetime(&mut self, freed: Freed, lifetime: u64, temporary: bool) {
        if let Some(t) = self.slots.get_mut(freed.slot as usize) {
            t.stats.add_free(lifetime, temporary);
        }
    }

    /// Per-callsite totals, in first-seen order.
    pub fn callsites(&self) -> &[CallsiteTotals] {
        &self.slots
    }

    pub(crate) fn callsites_mut(&mut self) -> &mut [CallsiteTotals] {
        &mut self.slots
    }

    /// Totals of one callsite.
    pub fn callsite(&self, id: CallsiteId) -> Option<&CallsiteTotals> {
        let s = *self.slot_of.get(&id)?;
        self.slots.get(s as usize)
    }

    /// The value of a callsite at the peak of live sampled bytes:
    /// (bytes, count).
    pub fn max_of(&self, t: &CallsiteTotals) -> (u64, u64) {
        if t.max_version < self.max_version {
            (t.live_bytes, t.live_count)
        } else {
            (t.max_bytes, t.max_count)
        }
    }

    /// Live sampled bytes.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Live sampled allocations.
    pub fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Highest live sampled bytes so far.
    pub fn max_live_bytes(&self) -> u64 {
        self.max_live_bytes
    }

    /// Timestamp of the operation that reached the peak.
    pub fn max_timestamp(&self) -> u64 {
        self.max_timestamp
    }

    /// Latest timestamp of a committed malloc (0 if none).
    pub fn committed_timestamp(&self) -> u64 {
        self.committed_timestamp
    }

    /// Timestamp of the first committed malloc.
    pub fn first_timestamp(&self) -> Option<u64> {
        self.first_timestamp
    }

    /// Timestamp of the last dump of this heap.
    pub fn last_dump_timestamp(&self) -> Option<u64> {
        self.last_dump_timestamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cs(n: u32) -> CallsiteId {
        CallsiteId::new(n).unwrap()
    }

    /// `commit_malloc` of `size` bytes (sample size = size).
    fn malloc(
        h: &mut HeapState,
        seq: u64,
        address: u64,
        size: u64,
        c: u32,
        ts: u64,
        in_order: bool,
    ) {
        let m = MallocOp {
            heap_id: h.id,
            address,
            sample_size: size,
            size,
            tid: 1,
            timestamp: ts,
            callsite: cs(c),
            interval_shift: 0,
        };
        h.commit_malloc(seq, &m, 0, in_order);
    }

    #[test]
    fn a_sample_of_its_own_size_is_one_allocation() {
        let mut h = HeapState::new(3, "arena".into(), 4096);
        // reportSample: 100 bytes standing for 100 bytes.
        malloc(&mut h, 1, 0x10, 100, 2, 5, true);
        // The sampler's pick of a 100-byte allocation stands for 4096.
        let m = MallocOp {
            heap_id: 3,
            address: 0x20,
            sample_size: 4096,
            size: 100,
            tid: 1,
            timestamp: 6,
            callsite: cs(3),
            interval_shift: 0,
        };
        h.commit_malloc(2, &m, 0, true);
        let est = |c| h.callsite(cs(c)).unwrap().stats.estimated_allocs;
        assert_eq!(est(2), 1.0);
        let want = super::super::estimate::inverse_probability(100, 4096);
        assert!((est(3) - want).abs() < 1e-9 && want > 40.0, "{}", est(3));
        assert_eq!(h.raised, RaisedInterval::default());
    }

    #[test]
    fn a_sample_drawn_at_a_raised_interval_weighs_at_it() {
        let mut h = HeapState::new(0, "libc.malloc".into(), 4096);
        let m = |address, sample_size, size, interval_shift| MallocOp {
            heap_id: 0,
            address,
            sample_size,
            size,
            tid: 1,
            timestamp: 6,
            callsite: cs(4),
            interval_shift,
        };
        // Picked at 4096 << 3: stands for 32 KiB and about 328 allocations.
        h.commit_malloc(1, &m(0x10, 32768, 100, 3), 0, true);
        let est = h.callsite(cs(4)).unwrap().stats.estimated_allocs;
        let want = super::super::estimate::inverse_probability(100, 32768);
        assert!((est - want).abs() < 1e-9 && want > 300.0, "{est}");
        // One of its own size is one allocation, raised or not.
        h.commit_malloc(2, &m(0x20, 40000, 40000, 3), 0, true);
        let est2 = h.callsite(cs(4)).unwrap().stats.estimated_allocs;
        assert!((est2 - want - 1.0).abs() < 1e-9, "{est2}");
        assert_eq!(
            h.raised,
            RaisedInterval {
                samples: 1,
                max_interval: 32768
            }
        );
        assert_eq!(h.live_bytes(), 32768 + 40000);
    }

    #[test]
    fn malloc_free_and_implicit_free() {
        let mut h = HeapState::new(0, "libc.malloc".into(), 1);
        malloc(&mut h, 1, 0x10, 100, 2, 5, true);
        malloc(&mut h, 2, 0x20, 50, 3, 6, true);
        assert_eq!(h.live_bytes(), 150);
        assert!(h.commit_free(3, 0x10).is_some());
        assert!(h.commit_free(4, 0x99).is_none(), "unknown address ignored");
        malloc(&mut h, 5, 0x20, 70, 2, 7, true); // implicit free of seq 2
        let a = h.callsite(cs(2)).unwrap();
        assert_eq!(
            (a.allocated, a.freed, a.alloc_count, a.free_count),
            (170, 100, 2, 1)
        );
        let b = h.callsite(cs(3)).unwrap();
        assert_eq!((b.allocated, b.freed, b.live_count), (50, 50, 0));
        assert_eq!(h.live_bytes(), 70);
        assert_eq!(h.max_live_bytes(), 150);
        assert_eq!(h.max_timestamp(), 6);
        assert_eq!(h.max_of(h.callsite(cs(2)).unwrap()), (100, 1));
        assert_eq!(h.max_of(h.callsite(cs(3)).unwrap()), (50, 1));
    }

    #[test]
    fn late_operations_do_not_undo_newer_ones() {
        let mut h = HeapState::new(0, "x".into(), 1);
        malloc(&mut h, 10, 0x10, 8, 2, 1, true);
        // A late free older than the live allocation: ignored.
        assert!(h.commit_free(5, 0x10).is_none());
        // A late malloc older than the live one: counted and freed.
        malloc(&mut h, 7, 0x10, 4, 3, 1, false);
        let t = h.callsite(cs(3)).unwrap();
        assert_eq!((t.allocated, t.freed, t.live_count), (4, 4, 0));
        assert_eq!(h.live_bytes(), 8);
    }

    #[test]
    fn needs_dump_drops_dead_callsites_once_dumped() {
        let mut h = HeapState::new(0, "x".into(), 1);
        malloc(&mut h, 1, 0x10, 8, 2, 1, true);
        assert!(h.callsites()[0].needs_dump());
        h.callsites_mut()[0].mark_dumped();
        assert!(h.callsites()[0].needs_dump(), "still live");
        h.commit_free(2, 0x10);
        assert!(h.callsites()[0].needs_dump(), "changed");
        h.callsites_mut()[0].mark_dumped();
        assert!(!h.callsites()[0].needs_dump(), "dead and unchanged");
        malloc(&mut h, 3, 0x10, 8, 2, 1, true);
        assert!(h.callsites()[0].needs_dump());
        assert_eq!(h.callsites()[0].allocated, 16, "totals kept");
    }
}
