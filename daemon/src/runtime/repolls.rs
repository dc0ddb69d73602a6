//! A worker's sessions waiting for their next poll: a session whose poll
//! found records and emptied its ring is polled again a moment later (the
//! worker's `REPOLL`) instead of asking its client for a wake-up.
//!
//! At most one entry per session: a session scheduled again before its
//! poll came keeps its first time. The entries were once pushed on every
//! such poll and never taken off, so nothing re-polled (the next read waited
//! for the 100 ms tick or a half-full ring) and the queue grew by one entry
//! per such poll for as long as a profile ran.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};
use std::time::Instant;

use heapprofd_model::messages::SessionId;

/// Sessions with a poll due at a time, earliest first.
#[derive(Debug, Default)]
pub struct Repolls {
    due: BinaryHeap<Reverse<(Instant, SessionId)>>,
    queued: HashSet<SessionId>,
}

impl Repolls {
    /// Polls session `id` again at `at`, unless a poll is due for it already.
    pub fn schedule(&mut self, id: SessionId, at: Instant) {
        if self.queued.insert(id) {
            self.due.push(Reverse((at, id)));
        }
    }

    /// Moves the sessions due at `now` to the back of `ready`, earliest
    /// first.
    pub fn take_due(&mut self, now: Instant, ready: &mut VecDeque<SessionId>) {
        while let Some(&Reverse((at, id))) = self.due.peek() {
            if at > now {
                break;
            }
            self.due.pop();
            self.queued.remove(&id);
            ready.push_back(id);
        }
    }

    /// When the next poll is due, if any is.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.peek().map(|&Reverse((at, _))| at)
    }

    /// Number of sessions waiting (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.due.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_session_waits_once_and_polls_come_due_in_time_order() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = Repolls::default();
        assert_eq!(r.next_due(), None);
        r.schedule(1, t0 + ms(20));
        r.schedule(2, t0 + ms(10));
        // Again before its poll: still one entry, at its first time.
        for _ in 0..1000 {
            r.schedule(1, t0 + ms(5));
        }
        assert_eq!(r.len(), 2);
        assert_eq!(r.next_due(), Some(t0 + ms(10)));
        let mut ready = VecDeque::new();
        r.take_due(t0 + ms(9), &mut ready);
        assert!(ready.is_empty());
        r.take_due(t0 + ms(20), &mut ready);
        assert_eq!(ready, [2, 1]);
        assert_eq!((r.len(), r.next_due()), (0, None));
        // Polled: it can wait again.
        r.schedule(1, t0 + ms(30));
        assert_eq!(r.len(), 1);
        r.take_due(t0 + ms(30), &mut ready);
        assert_eq!(ready, [2, 1, 1]);
    }
}
