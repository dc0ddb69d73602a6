//! A `libc.malloc` sample that finds the ring (nearly) full is thinned
//! rather than waited for.
//!
//! Before its record is reserved, a sample of a session that adapts its
//! interval (see `adaptive`) asks the ring whether the record would leave
//! a [`RESERVE`]th of it free. If not, it keeps each of its picked bytes
//! with probability `2^-k`, where `k` takes its interval to the largest
//! ([`MallocHeader::MAX_INTERVAL_SHIFT`] doublings in all; see
//! `Sampler::thinned`): most such samples then have no pick left and need
//! no room at all, and the rest are sent as drawn at the largest interval,
//! where the daemon weights them.
//!
//! * Unbiased: every byte is then picked with probability `1/(I 2^k)`,
//!   exactly the raised interval's process, and whether the ring is full
//!   does not depend on this allocation's picks.
//! * Why not wait: a waiting writer stops the program, and four threads on
//!   two cores waited 14-16% of their wall time (summed over threads) at
//!   the start of a run while the daemon loaded the modules, and whenever
//!   new stacks came faster than it walked them, before the interval was
//!   raised enough.
//! * Why leave a reserve: the free of a sampled block cannot be thinned
//!   (the daemon holds its allocation) and would wait instead.
//! * A dropped sample's stack snapshot is left as it was (see
//!   `stackreuse`: it changes only once a record is reserved), and the
//!   block is not put in the free set (its free is not wanted).
//! * It counts as a wait for room for the adaptive interval (which then
//!   raises from half full).
//!
//! Never at interval 1, with a fixed interval or seed (the session does
//! not adapt), or for custom heaps.

use heapprofd_proto::wire::MallocHeader;
use heapprofd_shmem::RingBuffer;

use crate::adaptive::AdaptiveInterval;
use crate::sampler::Sampler;

/// A sample is thinned when its record would leave less than this
/// fraction of the ring free.
pub const RESERVE: u64 = 16;

/// The sample (`sample_size` bytes for an allocation of `size`, drawn at
/// `shift` doublings of the session's interval, whose record has
/// `record_len` bytes) as it is to be sent: `Some((sample_size, shift))`,
/// unchanged while the ring has room; `None` if thinning left no pick.
#[inline]
pub fn thin(
    rb: &RingBuffer,
    adaptive: &AdaptiveInterval,
    sampler: &mut Sampler,
    shift: u32,
    size: u64,
    sample_size: u64,
    record_len: usize,
) -> Option<(u64, u32)> {
    if !adaptive.enabled() || rb.has_room(record_len, rb.size() as u64 / RESERVE) {
        return Some((sample_size, shift));
    }
    adaptive.note_full();
    let room = MallocHeader::MAX_INTERVAL_SHIFT.saturating_sub(shift);
    match sampler.thinned(size, sample_size, room) {
        (0, _) => {
            rb.note_thinned();
            None
        }
        (ss, k) => Some((ss, shift + k)),
    }
}

#[cfg(test)]
mod tests {
    use heapprofd_shmem::WriteMode;

    use super::*;

    /// A ring of 64 KiB with `used` bytes of filler records in it.
    fn ring_with(used: usize) -> RingBuffer {
        let (rb, _fd) = RingBuffer::create(64 * 1024).unwrap();
        let mut left = used;
        while left >= 1024 {
            rb.write_parts(&[&[0u8; 1000]], WriteMode::Drop).unwrap();
            left -= 1024;
        }
        rb
    }

    /// With room, or in a session that does not adapt, a sample goes as
    /// drawn.
    #[test]
    fn a_sample_with_room_or_a_fixed_interval_goes_as_drawn() {
        let adaptive = AdaptiveInterval::new(true);
        let fixed = AdaptiveInterval::new(false);
        let mut s = Sampler::new(4096 << 6, 1);
        let roomy = ring_with(32 * 1024);
        let full = ring_with(62 * 1024);
        for _ in 0..1000 {
            assert_eq!(
                thin(&roomy, &adaptive, &mut s, 6, 100, 4096 << 6, 800),
                Some((4096 << 6, 6))
            );
            assert_eq!(
                thin(&full, &fixed, &mut s, 6, 100, 4096 << 6, 800),
                Some((4096 << 6, 6))
            );
        }
    }

    /// A ring short of its reserve: a one-pick sample at 6 doublings is
    /// kept with probability 1/16, at the largest interval, its size the
    /// largest interval; the rest are dropped.
    #[test]
    fn a_sample_short_of_room_is_thinned_to_the_largest_interval() {
        let adaptive = AdaptiveInterval::new(true);
        let mut s = Sampler::new(4096 << 6, 2);
        let rb = ring_with(61 * 1024);
        let max = MallocHeader::MAX_INTERVAL_SHIFT;
        assert_eq!(rb.writer_stats().thinned, 0);
        let mut kept = 0u64;
        for _ in 0..16_000 {
            match thin(&rb, &adaptive, &mut s, 6, 100, 4096 << 6, 800) {
                None => {}
                Some(sent) => {
                    assert_eq!(sent, (4096 << max, max));
                    kept += 1;
                }
            }
        }
        // Binomial(16000, 1/16): mean 1000, sd 31.
        assert!((850..1150).contains(&kept), "{kept} of 16000 kept");
        assert_eq!(rb.writer_stats().thinned, 16_000 - kept);
        // At the largest interval already: nothing left to thin.
        let mut top = Sampler::new(4096 << max, 3);
        assert_eq!(
            thin(&rb, &adaptive, &mut top, max, 100, 4096 << max, 800),
            Some((4096 << max, max))
        );
    }
}
