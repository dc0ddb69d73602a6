//! The per-thread slots of the client's stack sampling: a thread's CPU
//! timer (`cputimer`), its perf event (`perfevent`) and the samples it lost (`stacksample`), found by tid
//! without a lock (open addressing, claimed with a compare-exchange;
//! async-signal-safe).

use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Threads that can have a slot at once.
pub(crate) const SLOTS: usize = 4096;
/// A slot whose thread exited (probing goes on past it).
pub(crate) const GONE: u32 = u32::MAX;

/// One thread's slot.
#[derive(Debug)]
pub(crate) struct Slot {
    pub tid: AtomicU32,
    /// `timer` holds a live timer id.
    pub armed: AtomicBool,
    pub timer: AtomicUsize,
    /// The thread's perf event descriptor (-1: none).
    pub perf_fd: AtomicI32,
    /// Someone (the watcher, or the thread at its start) is arming it.
    pub busy: AtomicBool,
    /// The scan that last saw the thread.
    pub seen: AtomicU64,
    pub lost_overrun: AtomicU32,
    pub lost_dropped: AtomicU32,
    /// The event of the thread's last lost sample (its losses go out
    /// under it when no sample carries them: at exit).
    pub loss_tag: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Slot = Slot {
    tid: AtomicU32::new(0),
    armed: AtomicBool::new(false),
    timer: AtomicUsize::new(0),
    perf_fd: AtomicI32::new(-1),
    busy: AtomicBool::new(false),
    seen: AtomicU64::new(0),
    lost_overrun: AtomicU32::new(0),
    lost_dropped: AtomicU32::new(0),
    loss_tag: AtomicU64::new(0),
};
pub(crate) static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
/// Whether a slot may have been claimed since the table was last emptied
/// (set before a claim). While it is clear, the scans at every exit and
/// in every forked child ([`claimed`], [`forget_in_child`]) read nothing:
/// the table is 200 KB of the library's data, and walking it put page
/// faults into the exit of every process the client was loaded into.
static IN_USE: AtomicBool = AtomicBool::new(false);

/// The slots to scan: the table, or none if no thread claimed a slot
/// since it was last emptied.
pub(crate) fn claimed() -> &'static [Slot] {
    if IN_USE.load(Ordering::Acquire) {
        &TABLE
    } else {
        &[]
    }
}
/// Losses of threads that found no slot (table full).
static LOST_UNATTRIBUTED: AtomicU64 = AtomicU64::new(0);

impl Slot {
    /// Empties the slot (its timer and event are someone else's to
    /// delete and close).
    pub(crate) fn reset(&self) {
        self.armed.store(false, Ordering::Relaxed);
        self.perf_fd.store(-1, Ordering::Relaxed);
        self.lost_overrun.store(0, Ordering::Relaxed);
        self.lost_dropped.store(0, Ordering::Relaxed);
        self.loss_tag.store(0, Ordering::Relaxed);
        self.seen.store(0, Ordering::Relaxed);
        self.tid.store(0, Ordering::Release);
    }
}

fn home(tid: u32) -> usize {
    (tid.wrapping_mul(0x9E37_79B1) >> 20) as usize % SLOTS
}

/// The slot of `tid` and its index; with `insert`, claims a free one if it
/// has none.
pub(crate) fn slot_of(tid: u32, insert: bool) -> Option<(usize, &'static Slot)> {
    if tid == 0 || tid == GONE {
        return None;
    }
    if !IN_USE.load(Ordering::Acquire) {
        if !insert {
            return None;
        }
        IN_USE.store(true, Ordering::SeqCst);
    }
    let h = home(tid);
    for i in 0..SLOTS {
        let idx = (h + i) % SLOTS;
        let s = &TABLE[idx];
        match s.tid.load(Ordering::Acquire) {
            t if t == tid => return Some((idx, s)),
            0 if insert => match s
                .tid
                .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some((idx, s)),
                Err(t) if t == tid => return Some((idx, s)),
                Err(_) => continue,
            },
            0 => return None,
            _ => continue,
        }
    }
    None
}

/// Counts samples of event `tag` that `tid` lost (sent with its next
/// sample).
pub(crate) fn count_lost(tid: u32, tag: u64, overrun: u32, dropped: u32) {
    match slot_of(tid, true) {
        Some((_, s)) => {
            s.loss_tag.store(tag, Ordering::Relaxed);
            s.lost_overrun.fetch_add(overrun, Ordering::Relaxed);
            s.lost_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        None => {
            LOST_UNATTRIBUTED.fetch_add(u64::from(overrun) + u64::from(dropped), Ordering::Relaxed);
        }
    }
}

/// Takes the losses counted for `tid` (overruns, dropped).
pub(crate) fn take_lost(tid: u32) -> (u32, u32) {
    match slot_of(tid, false) {
        Some((_, s)) => (
            s.lost_overrun.swap(0, Ordering::Relaxed),
            s.lost_dropped.swap(0, Ordering::Relaxed),
        ),
        None => (0, 0),
    }
}

/// Losses no thread's slot could hold (for tests and debugging).
pub fn lost_unattributed() -> u64 {
    LOST_UNATTRIBUTED.load(Ordering::Relaxed)
}

/// In a forked child: the parent's timers are not ours (not inherited).
pub(crate) fn forget_in_child() {
    claimed().iter().for_each(Slot::reset);
    IN_USE.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_are_kept_per_thread_and_taken_once() {
        count_lost(4242, 0, 2, 1);
        count_lost(4242, 0, 1, 0);
        count_lost(4343, 7, 0, 5);
        // A claimed slot is in what the scans at exit and fork read.
        assert!(
            claimed()
                .iter()
                .any(|s| s.tid.load(Ordering::Relaxed) == 4242)
        );
        assert_eq!(
            slot_of(4343, false)
                .unwrap()
                .1
                .loss_tag
                .load(Ordering::Relaxed),
            7
        );
        assert_eq!(take_lost(4242), (3, 1));
        assert_eq!(take_lost(4242), (0, 0));
        assert_eq!(take_lost(4343), (0, 5));
        assert_eq!(take_lost(1), (0, 0), "a thread with no slot lost nothing");
    }
}
