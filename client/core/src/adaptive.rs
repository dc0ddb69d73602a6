//! The `libc.malloc` interval under load: a session whose ring fills faster
//! than the daemon reads it doubles its interval, rather than block the
//! program or drop samples, and halves it again once the ring has room.
//!
//! Each sample says the interval it was drawn at (`MallocHeader`'s interval
//! shift), so the daemon weights it exactly: the bytes a sample stands for
//! are `interval * picks` at its own interval, and its allocation count is
//! `1 / p(size)` at that interval. Nothing is estimated from a rate that
//! changed under it.
//!
//! * The writer of a `libc.malloc` sample looks at how much of the ring is
//!   in use once its record is reserved ([`AdaptiveInterval::observe`]).
//!   - [`RAISE_AT`] eighths or more (half, once a writer of the session has
//!     waited for room: the reader is behind for real) raises the
//!     interval, once the reader has read a 32nd of the ring since the last
//!     raise: a ring still that full then was written about as fast as it
//!     was read, at the new rate. The first raise doubles the interval
//!     once; later ones as many times as the bytes written since the last
//!     raise outnumber those read, rounded up ([`steps`], at most
//!     [`MAX_STEP`]). At most [`MallocHeader::MAX_INTERVAL_SHIFT`]
//!     doublings in all.
//!   - A sixteenth or less halves it, once the last change is
//!     [`LOWER_AFTER_NS`] old.
//!   - Why so: raising at half full from the start raised it for 9-21% of
//!     the samples of sqlite3, cc1 and node at 4 KiB, whose writers never
//!     waited with the interval fixed (a ring absorbs a burst; only a reader
//!     that stays behind needs a lower rate), and raising at seven eighths
//!     throughout left four-thread programs on two cores waiting twice as
//!     long. A clock cannot pace the raises (the coarse one ticks every 4 ms
//!     here, and a ring fills in less); waiting for the reader to read all
//!     that was written before a raise kept an 8 MiB ring full for much of
//!     a run.
//! * A thread takes the session's interval at its next sample (after
//!   writing it: see `session::sampled_alloc`) or when it first samples in
//!   the session. Its sampler keeps its random state and draws its gaps
//!   afresh at the new rate. The gaps are memoryless, so a pick process
//!   whose rate changes at a byte boundary is still a Poisson process with
//!   that piecewise rate, and each pick stands for the interval of the rate
//!   it was drawn at.
//! * Off unless the daemon asks (`ClientConfig::FLAG_ADAPTIVE_INTERVAL`;
//!   never at interval 1, where every allocation is wanted), and never for
//!   custom heaps, whose intervals are their programs' own.
//!
//! Cost: one relaxed load on each sample's path (and a compare of the ring's
//! fill, which the reservation has at hand); the shared words are written
//! only at a change.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use heapprofd_proto::wire::MallocHeader;

/// The share of the ring in use, in eighths, from which a sample raises
/// the interval.
pub const RAISE_AT: u64 = 7;

/// Least time since the last change before a halving.
pub const LOWER_AFTER_NS: u64 = 10_000_000;

/// The session's current interval shift and when it last changed.
#[derive(Debug)]
pub struct AdaptiveInterval {
    enabled: bool,
    /// The interval is the configured one times `2^shift`.
    shift: AtomicU32,
    /// CLOCK_MONOTONIC_COARSE of the last change (0 = never).
    changed_ns: AtomicU64,
    /// The reader's position at the last doubling plus a 32nd of the ring
    /// (0 = never doubled).
    mark: AtomicU64,
    /// The write position at the last doubling.
    mark_write: AtomicU64,
    /// Doublings so far (for tests and debugging).
    raises: AtomicU64,
    /// A writer of the session had to wait for room.
    waited: AtomicBool,
}

impl AdaptiveInterval {
    /// Starts at the configured interval; `enabled` false keeps it there.
    pub const fn new(enabled: bool) -> AdaptiveInterval {
        AdaptiveInterval {
            enabled,
            shift: AtomicU32::new(0),
            changed_ns: AtomicU64::new(0),
            mark: AtomicU64::new(0),
            mark_write: AtomicU64::new(0),
            raises: AtomicU64::new(0),
            waited: AtomicBool::new(false),
        }
    }

    /// The current shift.
    #[inline(always)]
    pub fn shift(&self) -> u32 {
        self.shift.load(Ordering::Relaxed)
    }

    /// Whether the session adapts its interval (and so may thin samples
    /// when the ring is full: see `thinning`).
    #[inline(always)]
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// A writer found the ring full: counted as a wait for room (from now
    /// on a half full ring raises).
    pub fn note_full(&self) {
        if !self.waited.load(Ordering::Relaxed) {
            self.waited.store(true, Ordering::Relaxed);
        }
    }

    /// Doublings so far.
    pub fn raises(&self) -> u64 {
        self.raises.load(Ordering::Relaxed)
    }

    /// After a sample's reservation: `used` of the ring's `size` bytes are
    /// in use, the write position is `end_pos`, the writer `waited` for
    /// room first, at `now_ns` (CLOCK_MONOTONIC_COARSE). May change the
    /// shift.
    #[inline]
    pub fn observe(&self, used: u64, size: u64, end_pos: u64, waited: bool, now_ns: u64) {
        if !self.enabled {
            return;
        }
        let waited_before = self.waited.load(Ordering::Relaxed);
        if waited && !waited_before {
            self.waited.store(true, Ordering::Relaxed);
        }
        let raise_at = if waited || waited_before {
            size / 2
        } else {
            size / 8 * RAISE_AT
        };
        // Between the two thresholds (most samples): nothing to decide.
        if used < raise_at && used > size / 16 {
            return;
        }
        let cur = self.shift();
        let read_pos = end_pos.saturating_sub(used);
        let mark = self.mark.load(Ordering::Relaxed);
        let caught_up = read_pos >= mark;
        let since = now_ns.saturating_sub(self.changed_ns.load(Ordering::Relaxed));
        // Since the last doubling: how much more was written than read.
        let step = if mark == 0 || used < raise_at {
            1
        } else {
            let read = read_pos.saturating_sub(mark - size / 32);
            steps(
                end_pos.saturating_sub(self.mark_write.load(Ordering::Relaxed)),
                read,
            )
        };
        let Some(next) = decide(cur, used, size, raise_at, caught_up, since, step) else {
            return;
        };
        // One thread wins a change; the others see it at their next sample.
        if self
            .shift
            .compare_exchange(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.changed_ns.store(now_ns, Ordering::Relaxed);
            if next > cur {
                self.mark.store(read_pos + size / 32, Ordering::Relaxed);
                self.mark_write.store(end_pos, Ordering::Relaxed);
                self.raises.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Doublings that bring a rate that wrote `written` bytes while the reader
/// read `read` down to the reader's: `ceil(log2(written / read))`, 1 to
/// [`MAX_STEP`].
pub fn steps(written: u64, read: u64) -> u32 {
    let mut step = 1;
    while step < MAX_STEP && read.checked_shl(step).is_some_and(|r| r < written) {
        step += 1;
    }
    step
}

/// Most doublings at once.
pub const MAX_STEP: u32 = 4;

/// The shift after a sample found `used` of `size` ring bytes in use (a
/// raise from `raise_at`), `since_ns` after the last change, at shift
/// `cur`; `caught_up`: the reader has read a 32nd of the ring since the
/// last doubling; `step`: doublings if raised. `None` = unchanged.
pub fn decide(
    cur: u32,
    used: u64,
    size: u64,
    raise_at: u64,
    caught_up: bool,
    since_ns: u64,
    step: u32,
) -> Option<u32> {
    if used >= raise_at {
        (cur < MallocHeader::MAX_INTERVAL_SHIFT && caught_up)
            .then(|| (cur + step).min(MallocHeader::MAX_INTERVAL_SHIFT))
    } else if used <= size / 16 {
        (cur > 0 && since_ns >= LOWER_AFTER_NS).then(|| cur - 1)
    } else {
        None
    }
}

/// The interval at `shift` doublings of `base` (capped at the sampler's
/// largest).
pub fn raised(base: u64, shift: u32) -> u64 {
    base.saturating_mul(1u64 << shift.min(MallocHeader::MAX_INTERVAL_SHIFT))
        .min(crate::sampler::MAX_INTERVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const MAX: u32 = MallocHeader::MAX_INTERVAL_SHIFT;

    #[test]
    fn a_filling_ring_doubles_once_the_reader_caught_up_and_up_to_the_cap() {
        let at = MIB / 8 * RAISE_AT;
        assert_eq!(decide(0, at, MIB, MIB / 8 * RAISE_AT, true, 0, 1), Some(1));
        assert_eq!(
            decide(0, at - 8, MIB, MIB / 8 * RAISE_AT, true, u64::MAX, 1),
            None
        );
        assert_eq!(
            decide(0, MIB, MIB, MIB / 8 * RAISE_AT, true, u64::MAX, 3),
            Some(3)
        );
        assert_eq!(
            decide(3, MIB, MIB, MIB / 8 * RAISE_AT, false, u64::MAX, 1),
            None
        );
        assert_eq!(
            decide(MAX - 1, MIB, MIB, MIB / 8 * RAISE_AT, true, 0, 4),
            Some(MAX)
        );
        assert_eq!(
            decide(MAX, MIB, MIB, MIB / 8 * RAISE_AT, true, u64::MAX, 1),
            None
        );
    }

    #[test]
    fn steps_catch_the_writers_up_with_the_reader() {
        assert_eq!(steps(100, 100), 1);
        assert_eq!(steps(200, 100), 1);
        assert_eq!(steps(201, 100), 2);
        assert_eq!(steps(800, 100), 3);
        assert_eq!(steps(u64::MAX, 1), MAX_STEP);
        assert_eq!(steps(u64::MAX, 0), MAX_STEP);
        assert_eq!(steps(0, 0), 1);
    }

    #[test]
    fn an_emptied_ring_halves_after_a_while_and_the_middle_holds() {
        assert_eq!(
            decide(
                2,
                MIB / 16,
                MIB,
                MIB / 8 * RAISE_AT,
                true,
                LOWER_AFTER_NS,
                1
            ),
            Some(1)
        );
        assert_eq!(
            decide(2, 0, MIB, MIB / 8 * RAISE_AT, true, LOWER_AFTER_NS - 1, 1),
            None
        );
        assert_eq!(
            decide(0, 0, MIB, MIB / 8 * RAISE_AT, true, u64::MAX, 1),
            None
        );
        assert_eq!(
            decide(2, MIB / 2, MIB, MIB / 8 * RAISE_AT, true, u64::MAX, 1),
            None
        );
        assert_eq!(
            decide(0, MIB / 16 + 8, MIB, MIB / 8 * RAISE_AT, true, u64::MAX, 1),
            None
        );
    }

    #[test]
    fn observe_changes_the_shared_shift_only_when_enabled() {
        let off = AdaptiveInterval::new(false);
        off.observe(MIB, MIB, 5 * MIB, true, 10 * LOWER_AFTER_NS);
        assert_eq!(off.shift(), 0);
        let on = AdaptiveInterval::new(true);
        let t0 = 10 * LOWER_AFTER_NS;
        let at = MIB / 8 * RAISE_AT;
        // Half full: unchanged.
        on.observe(MIB / 2, MIB, 5 * MIB, false, t0);
        assert_eq!(on.shift(), 0);
        // 7/8 full at write position 5 MiB (the reader 7/8 MiB behind): doubled.
        on.observe(at, MIB, 5 * MIB, false, t0);
        assert_eq!(on.shift(), 1);
        // Still that full, the reader not yet a 32nd further: unchanged.
        let mark = 5 * MIB - at + MIB / 32;
        on.observe(at, MIB, mark + at - 8, false, t0);
        assert_eq!(on.shift(), 1);
        // The reader a 32nd further, as much written: doubled once more.
        on.observe(at, MIB, mark + at, false, t0);
        assert_eq!((on.shift(), on.raises()), (2, 2));
        // A 32nd read while five 32nds were written: three doublings.
        let mark = mark + MIB / 32;
        on.observe(at + MIB / 8 - 8, MIB, mark + at + MIB / 8 - 8, false, t0);
        assert_eq!((on.shift(), on.raises()), (5, 3));
        // Empty, but too soon to halve; then halved.
        on.observe(0, MIB, 6 * MIB, false, t0 + 1);
        assert_eq!(on.shift(), 5);
        on.observe(0, MIB, 6 * MIB, false, t0 + LOWER_AFTER_NS);
        assert_eq!((on.shift(), on.raises()), (4, 3));
        // Once a writer waited, half full is enough.
        let half = AdaptiveInterval::new(true);
        half.observe(MIB / 2, MIB, 5 * MIB, false, t0);
        assert_eq!(half.shift(), 0);
        half.observe(MIB / 2, MIB, 5 * MIB, true, t0);
        assert_eq!(half.shift(), 1);
    }

    #[test]
    fn raised_intervals_double_and_stay_within_the_sampler() {
        assert_eq!(raised(4096, 0), 4096);
        assert_eq!(raised(4096, 4), 65536);
        assert_eq!(raised(4096, 99), 4096 << MAX);
        assert_eq!(raised(u64::MAX / 2, 3), crate::sampler::MAX_INTERVAL);
    }
}
