//! A worker's memory of walks it can replay: the stack of a sample whose
//! walk would read the same words as an earlier walk, found without
//! walking.
//!
//! The unwinder's [`WalkTrace`] records what a walk depended on (first
//! frame's pc and sp, bp when it mattered, and every stack word read); see
//! `heapprofd_unwinder`'s replay module for why a sample with the same
//! inputs and the same values at those addresses must unwind to the same
//! frames. This table keeps, per (pc, sp), up to [`WAYS`] such traces with
//! what their walk ended in (the worker keeps its stack id and error kind). Checking a trace costs one load
//! and compare per word read (one or two per frame) instead of a walk.
//!
//! Many traces share a (pc, sp): the first frames of every sample are the
//! client's and the allocator's, the same for all, and distinct call
//! stacks of the same depth in bytes meet there (a program with thousands
//! of call sites has dozens per (pc, sp); with 4 ways they evicted each
//! other and 15% of the samples of 2,500 stacks were walked and traced
//! again). So a slot has many ways and a *tag* per way: the slot picks, at
//! its second trace, the first address both traces read with different
//! values (typically the return address into the caller of `malloc`), and
//! each way keeps its trace's value there (or none: it does not read it).
//! A lookup loads the sample's word at that address once and checks in
//! full only the ways whose tag matches, so a hit costs about the same
//! with 64 ways as with one.
//!
//! One tag is not always enough: cc1's thousands of call stacks go through
//! a few allocation wrappers, so most ways of a slot share the wrapper's
//! return address as their tag (10.8 full checks per lookup). A tag with a
//! second trace gets a second address the same way (the first both read
//! differently, typically the wrapper's caller's return address) and each
//! of its ways keeps its value there: 6.5-7.2 checks per lookup, replays
//! 372 -> 306-334 ms on cc1 at `-i 1`. Both filters are exact: a way is
//! skipped only when its trace reads a word the sample has otherwise.
//!
//! Entries are only valid for the stack ids and the mappings they were made
//! with: the owner clears the table whenever it forgets its stacks (new
//! mappings, or its stack table full). Keeping a trace costs a few dozen
//! walks (the unwinder's relevance checks, ~14 µs for 33 frames), so
//! tracing is throttled where it does not pay: while tracing is on, each
//! window of `WINDOW` lookups with fewer than a quarter hits turns it off
//! for a number of samples that starts at `PAUSE` and doubles with each
//! such window in a row (up to `MAX_PAUSE`); a window with enough hits
//! resets it. Lookups go on during a pause (kept traces still hit).

use rustc_hash::FxHashMap;

use heapprofd_unwinder::{WalkTrace, stack_matches};

/// Traces kept per (pc, sp).
pub const WAYS: usize = 64;
/// Traces kept in all before the table starts over.
const MAX_ENTRIES: usize = 1 << 15;
/// Words of traces kept in all before the table starts over.
const MAX_READS: usize = 1 << 21;
/// Lookups per hit-rate window.
const WINDOW: u32 = 256;
/// Samples without tracing after the first window with a poor hit rate.
const PAUSE: u32 = 16 * 1024;
/// Longest pause (after several poor windows in a row).
const MAX_PAUSE: u32 = 1 << 20;

/// The ways of one (pc, sp); see the module docs. Grown as traces come
/// (most slots hold one or two), so memory follows the traces kept.
#[derive(Debug, Clone, Default)]
struct Slot {
    /// (entry index, its value at `disc`, its value at its tag's `disc2`
    /// address if it reads it), most recent first, at most [`WAYS`].
    ways: Vec<(u32, u64, Option<u64>)>,
    /// Per tag, the address whose value tells apart the ways with that tag
    /// (the second level: cc1's thousands of stacks through one allocation
    /// wrapper share its return address, the first-level tag).
    disc2: FxHashMap<u64, u64>,
    /// The address whose value tells the ways apart, once two traces
    /// differed there.
    disc: Option<u64>,
    /// Ways whose trace does not read `disc` (always checked in full),
    /// by position.
    untagged: u64,
}

/// The value `reads` has at `addr`, if they read it.
fn value_at(reads: &[(u64, u64)], addr: u64) -> Option<u64> {
    reads.iter().find(|r| r.0 == addr).map(|r| r.1)
}

/// The word of the copy `[stack_pointer, +stack.len())` at `addr`.
#[inline]
fn word_at(stack_pointer: u64, stack: &[u8], addr: u64) -> Option<u64> {
    let off = usize::try_from(addr.checked_sub(stack_pointer)?).ok()?;
    let b = stack.get(off..off.checked_add(8)?)?;
    Some(u64::from_le_bytes(b.try_into().ok()?))
}

#[derive(Debug, Clone, Copy)]
struct Entry<V> {
    bp: Option<u64>,
    reads_start: u32,
    reads_len: u32,
    value: V,
}

/// See the module docs. `V` is what a walk ended in.
#[derive(Debug)]
pub struct WalkMemo<V> {
    /// (pc, sp) -> its ways.
    slots: FxHashMap<(u64, u64), Slot>,
    entries: Vec<Entry<V>>,
    reads: Vec<(u64, u64)>,
    window_lookups: u32,
    window_hits: u32,
    /// Samples left without tracing.
    paused_for: u32,
    /// The next pause.
    backoff: u32,
    /// Counters for diagnostics.
    pub hits: u64,
    /// Lookups that found no matching trace.
    pub misses: u64,
    /// Traces checked in full (their tags matched), hits and misses.
    pub checks: u64,
}

impl<V> Default for WalkMemo<V> {
    fn default() -> Self {
        WalkMemo {
            slots: FxHashMap::default(),
            entries: Vec::new(),
            reads: Vec::new(),
            window_lookups: 0,
            window_hits: 0,
            paused_for: 0,
            backoff: 0,
            hits: 0,
            misses: 0,
            checks: 0,
        }
    }
}

impl<V: Copy> WalkMemo<V> {
    /// What the walk of a sample with first-frame `(pc, sp, bp)` whose
    /// copy `[stack_pointer, +stack.len())` matches a kept trace ended in.
    #[inline]
    pub fn lookup(
        &mut self,
        (pc, sp, bp): (u64, u64, u64),
        stack_pointer: u64,
        stack: &[u8],
    ) -> Option<V> {
        let mut found = None;
        if let Some(slot) = self.slots.get(&(pc, sp)) {
            let tag = slot.disc.and_then(|a| word_at(stack_pointer, stack, a));
            let tag2 = tag
                .and_then(|t| slot.disc2.get(&t))
                .and_then(|&a| word_at(stack_pointer, stack, a));
            for (i, &(index, t, t2)) in slot.ways.iter().enumerate() {
                if slot.disc.is_some()
                    && slot.untagged & (1 << i) == 0
                    && (tag != Some(t) || t2.is_some_and(|v| tag2 != Some(v)))
                {
                    continue;
                }
                let e = &self.entries[index as usize];
                self.checks += 1;
                if e.bp.is_none_or(|b| b == bp)
                    && stack_matches(
                        trace_reads(&self.entries, &self.reads, index),
                        stack_pointer,
                        stack,
                    )
                {
                    found = Some(e.value);
                    break;
                }
            }
        }
        if found.is_some() {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
        if self.paused_for > 0 {
            self.paused_for -= 1;
            return found;
        }
        self.window_lookups += 1;
        self.window_hits += u32::from(found.is_some());
        if self.window_lookups >= WINDOW {
            if self.window_hits * 4 < self.window_lookups {
                self.paused_for = self.backoff.max(PAUSE);
                self.backoff = (self.backoff.max(PAUSE) * 2).min(MAX_PAUSE);
            } else {
                self.backoff = PAUSE;
            }
            self.window_lookups = 0;
            self.window_hits = 0;
        }
        found
    }

    /// Whether the next miss should be traced (tracing is not paused for
    /// a poor hit rate).
    #[inline]
    pub fn should_trace(&self) -> bool {
        self.paused_for == 0
    }

    /// Keeps `trace` (replayable) as leading to `value`.
    pub fn insert(&mut self, trace: &WalkTrace, value: V) {
        if !trace.replayable {
            return;
        }
        if self.entries.len() >= MAX_ENTRIES || self.reads.len() + trace.reads.len() > MAX_READS {
            self.clear();
        }
        let (Ok(reads_start), Ok(reads_len)) = (
            u32::try_from(self.reads.len()),
            u32::try_from(trace.reads.len()),
        ) else {
            return;
        };
        self.reads.extend_from_slice(&trace.reads);
        self.entries.push(Entry {
            bp: trace.bp,
            reads_start,
            reads_len,
            value,
        });
        let index = self.entries.len() as u32 - 1;
        let slot = self.slots.entry((trace.pc, trace.sp)).or_default();
        if slot.disc.is_none() && !slot.ways.is_empty() {
            // The second trace: the first address both read with
            // different values tells them apart; tag the kept ways.
            let e = &self.entries[slot.ways[0].0 as usize];
            let kept = &self.reads[e.reads_start as usize..(e.reads_start + e.reads_len) as usize];
            slot.disc = trace
                .reads
                .iter()
                .find(|&&(a, v)| value_at(kept, a).is_some_and(|k| k != v))
                .map(|r| r.0);
            if let Some(disc) = slot.disc {
                for i in 0..slot.ways.len() {
                    let e = &self.entries[slot.ways[i].0 as usize];
                    let reads =
                        &self.reads[e.reads_start as usize..(e.reads_start + e.reads_len) as usize];
                    set_tag(slot, i, value_at(reads, disc));
                }
            }
        }
        let tag = slot.disc.and_then(|d| value_at(&trace.reads, d));
        if let Some(t) = tag
            && !slot.disc2.contains_key(&t)
        {
            // The second trace under this tag: as for `disc`, the first
            // address the two read with different values tells the
            // tag's ways apart; tag those kept.
            let kept = slot
                .ways
                .iter()
                .enumerate()
                .find(|&(i, w)| slot.untagged & (1 << i) == 0 && w.1 == t);
            if let Some((_, &(k, _, _))) = kept {
                let reads = trace_reads(&self.entries, &self.reads, k);
                let disc2 = trace
                    .reads
                    .iter()
                    .find(|&&(a, v)| value_at(reads, a).is_some_and(|k| k != v))
                    .map(|r| r.0);
                if let Some(d2) = disc2 {
                    slot.disc2.insert(t, d2);
                    for i in 0..slot.ways.len() {
                        if slot.untagged & (1 << i) == 0 && slot.ways[i].1 == t {
                            let reads = trace_reads(&self.entries, &self.reads, slot.ways[i].0);
                            slot.ways[i].2 = value_at(reads, d2);
                        }
                    }
                }
            }
        }
        let tag2 = tag
            .and_then(|t| slot.disc2.get(&t))
            .and_then(|&d2| value_at(&trace.reads, d2));
        // Most recent first; the oldest falls off (its words stay until the
        // table starts over).
        slot.ways.truncate(WAYS - 1);
        slot.ways.insert(0, (index, 0, tag2));
        slot.untagged <<= 1;
        set_tag(slot, 0, tag);
    }

    /// Forgets every trace.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.entries.clear();
        self.reads.clear();
    }

    /// Traces kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no trace is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The words entry `index`'s trace read.
fn trace_reads<'a, V>(
    entries: &[Entry<V>],
    reads: &'a [(u64, u64)],
    index: u32,
) -> &'a [(u64, u64)] {
    let e = &entries[index as usize];
    &reads[e.reads_start as usize..(e.reads_start + e.reads_len) as usize]
}

/// Way `i`'s tag: its value at the slot's address, or untagged.
fn set_tag(slot: &mut Slot, i: usize, tag: Option<u64>) {
    match tag {
        Some(t) => {
            slot.ways[i].1 = t;
            slot.untagged &= !(1 << i);
        }
        None => slot.untagged |= 1 << i,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(pc: u64, sp: u64, bp: Option<u64>, reads: &[(u64, u64)]) -> WalkTrace {
        let mut t = WalkTrace::default();
        t.replayable = true;
        (t.pc, t.sp, t.bp) = (pc, sp, bp);
        t.reads = reads.to_vec();
        t
    }

    /// A stack id, as the worker keeps (with an error kind).
    #[derive(Debug, Clone, Copy)]
    struct StackEntry {
        id: u32,
    }

    fn entry(id: u32) -> StackEntry {
        StackEntry { id }
    }

    #[test]
    fn hits_need_inputs_and_words() {
        let mut m = WalkMemo::<StackEntry>::default();
        let mut stack = vec![0u8; 64];
        stack[8..16].copy_from_slice(&0xabcu64.to_le_bytes());
        m.insert(&trace(0x40, 0x1000, None, &[(0x1008, 0xabc)]), entry(1));
        m.insert(&trace(0x40, 0x1000, Some(5), &[(0x1000, 0)]), entry(2));
        // Most recent first: the bp-dependent trace matches only with bp 5.
        assert_eq!(m.lookup((0x40, 0x1000, 5), 0x1000, &stack).unwrap().id, 2);
        assert_eq!(m.lookup((0x40, 0x1000, 6), 0x1000, &stack).unwrap().id, 1);
        assert!(m.lookup((0x41, 0x1000, 6), 0x1000, &stack).is_none());
        stack[8] ^= 1;
        assert!(m.lookup((0x40, 0x1000, 6), 0x1000, &stack).is_none());
        // The copy must cover the words.
        assert!(m.lookup((0x40, 0x1000, 5), 0x1008, &stack[8..]).is_none());
        assert_eq!((m.hits, m.misses), (2, 3));
        // Not replayable: not kept.
        let mut t = trace(0x50, 0x1000, None, &[]);
        t.replayable = false;
        m.insert(&t, entry(3));
        assert!(m.lookup((0x50, 0x1000, 0), 0x1000, &stack).is_none());
        m.clear();
        assert!(m.is_empty());
    }

    /// Ways under one first-level tag are told apart by a second address
    /// (cc1: thousands of stacks through one allocation wrapper): a lookup
    /// checks in full only the way whose second tag matches, plus the
    /// ways that do not read that address; the filter never hides a match.
    #[test]
    fn a_second_tag_splits_the_ways_of_one_tag() {
        let (sp, a, b) = (0x1000, 0x1008, 0x1018);
        // Traces 1 and 2 differ at `a` (the slot's tag); 3..=10 share
        // trace 1's tag and differ at `b`.
        let tagged = || {
            let mut m = WalkMemo::<StackEntry>::default();
            m.insert(&trace(0x40, sp, None, &[(a, 1), (b, 100)]), entry(1));
            m.insert(&trace(0x40, sp, None, &[(a, 2), (b, 100)]), entry(2));
            for id in 3..=10u32 {
                let reads = [(a, 1), (b, 100 + u64::from(id))];
                m.insert(&trace(0x40, sp, None, &reads), entry(id));
            }
            m
        };
        let mut m = tagged();
        // Under tag 1 but ending before `b` (an error stack, say).
        m.insert(&trace(0x40, sp, None, &[(a, 1)]), entry(11));
        let sample = |va: u64, vb: u64| {
            let mut stack = vec![0u8; 64];
            stack[8..16].copy_from_slice(&va.to_le_bytes());
            stack[24..32].copy_from_slice(&vb.to_le_bytes());
            stack
        };
        let mut lookup = |va, vb| {
            let before = m.checks;
            let id = m.lookup((0x40, sp, 0), sp, &sample(va, vb)).map(|e| e.id);
            (id, m.checks - before)
        };
        // Way 11 (no second tag) is checked first and matches any `b`.
        assert_eq!(lookup(1, 103), (Some(11), 1));
        assert_eq!(lookup(2, 100), (Some(2), 1));
        assert_eq!(lookup(3, 100), (None, 0));
        let mut m2 = tagged();
        for id in 3..=10u32 {
            let before = m2.checks;
            let found = m2.lookup((0x40, sp, 0), sp, &sample(1, 100 + u64::from(id)));
            assert_eq!(found.map(|e| e.id), Some(id));
            assert_eq!(m2.checks - before, 1, "stack {id}");
        }
        let before = m2.checks;
        assert_eq!(
            m2.lookup((0x40, sp, 0), sp, &sample(1, 100)).map(|e| e.id),
            Some(1)
        );
        assert_eq!(m2.checks - before, 1);
        assert!(m2.lookup((0x40, sp, 0), sp, &sample(1, 555)).is_none());
    }

    /// Dozens of call sites meeting at the same (pc, sp), told apart by the
    /// word at one address: every one of them replays (with 4 ways, 16 of
    /// the 20 were evicted), a trace that does not read that address is
    /// still checked, and the tags never make a hit out of a mismatch.
    #[test]
    fn many_stacks_at_one_first_frame_all_replay() {
        let mut m = WalkMemo::<StackEntry>::default();
        let sp = 0x1000;
        // Every trace reads the client's return address (same value) at
        // sp + 8, then its caller's at sp + 24 (different per stack).
        for id in 1..=20u32 {
            let reads = [(sp + 8, 0xc11e47), (sp + 24, 0x4000 + u64::from(id))];
            m.insert(&trace(0x40, sp, None, &reads), entry(id));
        }
        // One more that ends before sp + 24 (an error stack, say).
        m.insert(&trace(0x40, sp, None, &[(sp + 8, 0xdead)]), entry(99));
        let sample = |ret: u64, first: u64| {
            let mut stack = vec![0u8; 64];
            stack[8..16].copy_from_slice(&first.to_le_bytes());
            stack[24..32].copy_from_slice(&ret.to_le_bytes());
            stack
        };
        for id in 1..=20u32 {
            let stack = sample(0x4000 + u64::from(id), 0xc11e47);
            assert_eq!(m.lookup((0x40, sp, 0), sp, &stack).unwrap().id, id);
        }
        assert_eq!(
            m.lookup((0x40, sp, 0), sp, &sample(7, 0xdead)).unwrap().id,
            99
        );
        assert!(
            m.lookup((0x40, sp, 0), sp, &sample(0x4001, 0xc11e48))
                .is_none()
        );
        assert!(
            m.lookup((0x40, sp, 0), sp, &sample(0x4000, 0xc11e47))
                .is_none()
        );
        // A copy too short to hold the tag's word: only what fits matches.
        assert_eq!(
            m.lookup((0x40, sp, 0), sp, &sample(1, 0xdead)[..16])
                .unwrap()
                .id,
            99
        );
        assert_eq!((m.hits, m.misses), (22, 2));
    }

    #[test]
    fn oldest_way_falls_off() {
        let mut m = WalkMemo::<StackEntry>::default();
        let stack = vec![0u8; 64];
        for id in 1..=WAYS as u32 + 1 {
            m.insert(&trace(0x40, 0x1000, Some(id as u64), &[]), entry(id));
        }
        assert!(m.lookup((0x40, 0x1000, 1), 0x1000, &stack).is_none());
        assert_eq!(m.lookup((0x40, 0x1000, 2), 0x1000, &stack).unwrap().id, 2);
    }

    #[test]
    fn a_poor_hit_rate_pauses_tracing_with_backoff() {
        let mut m = WalkMemo::<StackEntry>::default();
        let stack = vec![0u8; 64];
        let miss = |m: &mut WalkMemo<StackEntry>, n: u32| {
            for _ in 0..n {
                assert!(m.lookup((9, 9, 9), 0x1000, &stack).is_none());
            }
        };
        miss(&mut m, WINDOW - 1);
        assert!(m.should_trace());
        miss(&mut m, 1);
        assert!(!m.should_trace(), "a poor window pauses");
        miss(&mut m, PAUSE);
        assert!(m.should_trace(), "the pause ends");
        miss(&mut m, WINDOW);
        assert!(!m.should_trace());
        miss(&mut m, PAUSE);
        assert!(
            !m.should_trace(),
            "a second poor window in a row: twice as long"
        );
        miss(&mut m, PAUSE);
        assert!(m.should_trace());
        // A good window resets the backoff.
        m.insert(&trace(1, 2, None, &[]), entry(7));
        for _ in 0..WINDOW {
            assert!(m.lookup((1, 2, 3), 0x1000, &stack).is_some());
        }
        miss(&mut m, WINDOW);
        miss(&mut m, PAUSE);
        assert!(m.should_trace(), "back to the first pause length");
    }
}
