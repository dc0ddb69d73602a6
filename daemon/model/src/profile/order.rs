//! Putting a process's operations back in sequence order.
//!
//! Every malloc and free of a process carries a sequence number from one
//! per-process counter (starting at 1). They reach the bookkeeping thread
//! roughly but not exactly in that order: several threads share a ring
//! buffer, and mallocs wait for unwinding while frees do not, so a free
//! often arrives before the malloc it frees. [`Reorder`] holds operations
//! until every earlier one has arrived and then releases them in order, so
//! the result is the same as processing them in sequence order.
//!
//! Sequence numbers may have gaps (records dropped when a ring buffer was
//! full), so waiting is bounded: an operation is released at the latest
//! once one `window` sequence numbers later has arrived, and
//! [`Reorder::flush`] / [`Reorder::release_through`] release everything up
//! to a point the caller knows is complete. Operations older than what has
//! already been released ("late") are handed back separately so the caller
//! can apply them with care. Memory: at most `window` slots.

use std::collections::VecDeque;

/// Default reordering window, in sequence numbers.
pub const DEFAULT_WINDOW: u64 = 1 << 16;

/// Where an operation handed out by [`Reorder`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Every operation with a lower sequence number was released before it
    /// (or is known missing).
    InOrder,
    /// An operation with a higher sequence number was already released.
    Late,
}

/// Sequence-ordering buffer; see the module docs.
#[derive(Debug)]
pub struct Reorder<T> {
    /// Sequence number of `slots[0]`: the next one to release.
    base: u64,
    slots: VecDeque<Option<(u64, T)>>,
    window: u64,
    /// Operations whose sequence number was already pending (corrupt input).
    pub duplicates: u64,
    /// Operations that arrived after a later one was released.
    pub late: u64,
}

impl<T> Reorder<T> {
    /// A buffer expecting sequence number `first` next; `window` >= 1.
    pub fn new(first: u64, window: u64) -> Self {
        Reorder {
            base: first,
            slots: VecDeque::new(),
            window: window.max(1),
            duplicates: 0,
            late: 0,
        }
    }

    /// The operations waiting, in no particular order.
    pub fn waiting(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().flatten().map(|(_, op)| op)
    }

    /// Number of operations waiting.
    pub fn pending(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// The next sequence number to release.
    pub fn next_seq(&self) -> u64 {
        self.base
    }

    /// Adds operation `seq` and hands every operation that can be released
    /// to `out`, in order.
    pub fn push(&mut self, seq: u64, op: T, mut out: impl FnMut(u64, T, Release)) {
        // The common case since the daemon numbers the records in the
        // order it reads them: the next one, nothing waiting.
        if seq == self.base && self.slots.is_empty() {
            self.base += 1;
            out(seq, op, Release::InOrder);
            return;
        }
        if seq < self.base {
            self.late += 1;
            out(seq, op, Release::Late);
            return;
        }
        // Make room: everything more than `window` behind `seq` goes now.
        if seq - self.base >= self.window {
            self.advance_to(seq - self.window + 1, &mut out);
        }
        let idx = (seq - self.base) as usize; // < window
        if self.slots.len() <= idx {
            self.slots.resize_with(idx + 1, || None);
        }
        if let Some((old_seq, old)) = self.slots[idx].replace((seq, op)) {
            // Two operations with one sequence number: release the first
            // now rather than lose it.
            self.duplicates += 1;
            out(old_seq, old, Release::Late);
        }
        self.drain_ready(&mut out);
    }

    /// Releases everything with a sequence number <= `seq`, as if the
    /// operations missing below it will never come.
    pub fn release_through(&mut self, seq: u64, mut out: impl FnMut(u64, T, Release)) {
        if seq >= self.base {
            self.advance_to(seq.saturating_add(1), &mut out);
        }
        self.drain_ready(&mut out);
    }

    /// Releases everything pending.
    pub fn flush(&mut self, mut out: impl FnMut(u64, T, Release)) {
        let end = self.base.saturating_add(self.slots.len() as u64);
        self.advance_to(end, &mut out);
    }

    fn advance_to(&mut self, new_base: u64, out: &mut impl FnMut(u64, T, Release)) {
        while self.base < new_base {
            match self.slots.pop_front() {
                Some(slot) => {
                    if let Some((s, op)) = slot {
                        out(s, op, Release::InOrder);
                    }
                    self.base += 1;
                }
                None => {
                    self.base = new_base;
                    break;
                }
            }
        }
    }

    fn drain_ready(&mut self, out: &mut impl FnMut(u64, T, Release)) {
        while let Some(Some(_)) = self.slots.front() {
            if let Some(Some((s, op))) = self.slots.pop_front() {
                out(s, op, Release::InOrder);
            }
            self.base += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(r: &mut Reorder<u64>, seqs: &[u64]) -> Vec<(u64, Release)> {
        let mut got = Vec::new();
        for &s in seqs {
            r.push(s, s, |s, _, rel| got.push((s, rel)));
        }
        got
    }

    #[test]
    fn in_order_input_passes_straight_through() {
        let mut r = Reorder::new(1, 4);
        let got = run(&mut r, &[1, 2, 3]);
        assert_eq!(got.len(), 3);
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn holds_until_the_gap_fills() {
        let mut r = Reorder::new(1, 8);
        assert!(run(&mut r, &[3, 2]).is_empty());
        let got: Vec<u64> = run(&mut r, &[1]).into_iter().map(|x| x.0).collect();
        assert_eq!(got, [1, 2, 3]);
    }

    #[test]
    fn gaps_are_skipped_after_the_window() {
        let mut r = Reorder::new(1, 4);
        assert!(run(&mut r, &[2, 3, 4]).is_empty());
        let got: Vec<u64> = run(&mut r, &[5]).into_iter().map(|x| x.0).collect();
        // 5 - 4 + 1 = 2 is the new base: seq 1 is given up; 2..=5 flow.
        assert_eq!(got, [2, 3, 4, 5]);
        let late = run(&mut r, &[1]);
        assert_eq!(late, [(1, Release::Late)]);
        assert_eq!(r.late, 1);
    }

    #[test]
    fn huge_jumps_do_not_iterate() {
        let mut r = Reorder::new(1, 4);
        run(&mut r, &[u64::MAX - 1]);
        assert_eq!(r.next_seq(), u64::MAX - 4);
        assert_eq!(r.pending(), 1);
        let mut n = 0;
        r.flush(|_, _, _| n += 1);
        assert_eq!(n, 1);
    }

    #[test]
    fn duplicates_and_release_through() {
        let mut r = Reorder::new(1, 16);
        let got = run(&mut r, &[3, 3]);
        assert_eq!(got, [(3, Release::Late)]);
        assert_eq!(r.duplicates, 1);
        let mut rel = Vec::new();
        r.release_through(2, |s, _, _| rel.push(s));
        assert_eq!(rel, [3], "1 and 2 given up, 3 ready");
        assert_eq!(r.next_seq(), 4);
    }
}
