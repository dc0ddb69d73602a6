//! The unwinding-time histogram of a process: heapprofd's 20 log2 buckets
//! of microseconds (Perfetto's `ProcessStats.unwinding_time_us`). The
//! workers fill one per session; the trace writes it, the reader reads it
//! back. The only histogram of the project.

use std::ops::{Index, IndexMut};

/// Number of buckets of the unwinding time histogram (heapprofd's layout).
pub const UNWIND_HISTOGRAM_BUCKETS: usize = 20;

/// Upper limit in microseconds of histogram bucket `i`: `1 << i` for the
/// first 19 buckets; the last one has no limit (`None`).
pub const fn unwind_bucket_limit(i: usize) -> Option<u64> {
    if i + 1 < UNWIND_HISTOGRAM_BUCKETS {
        Some(1 << i)
    } else {
        None
    }
}

/// Bucket of a duration: the first whose limit is >= `us`.
pub fn unwind_bucket(us: u64) -> usize {
    if us <= 1 {
        return 0;
    }
    // ceil(log2(us)) for us >= 2.
    let b = (64 - (us - 1).leading_zeros()) as usize;
    b.min(UNWIND_HISTOGRAM_BUCKETS - 1)
}

/// Counts of unwinding times: bucket `i` < 19 counts times up to `2^i` us
/// (see [`unwind_bucket`]), the last one everything longer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnwindHistogram(pub [u64; UNWIND_HISTOGRAM_BUCKETS]);

impl UnwindHistogram {
    /// Adds `n` measurements of `us` microseconds (one timed sample may
    /// stand for `n`).
    pub fn add_us(&mut self, us: u64, n: u64) {
        let b = &mut self.0[unwind_bucket(us)];
        *b = b.saturating_add(n);
    }
}

impl Index<usize> for UnwindHistogram {
    type Output = u64;

    fn index(&self, i: usize) -> &u64 {
        &self.0[i]
    }
}

impl IndexMut<usize> for UnwindHistogram {
    fn index_mut(&mut self, i: usize) -> &mut u64 {
        &mut self.0[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        assert_eq!(unwind_bucket(0), 0);
        assert_eq!(unwind_bucket(1), 0);
        assert_eq!(unwind_bucket(2), 1);
        assert_eq!(unwind_bucket(3), 2);
        assert_eq!(unwind_bucket(4), 2);
        assert_eq!(unwind_bucket(5), 3);
        assert_eq!(unwind_bucket(1 << 18), 18);
        assert_eq!(unwind_bucket((1 << 18) + 1), 19);
        assert_eq!(unwind_bucket(u64::MAX), 19);
        assert_eq!(unwind_bucket_limit(18), Some(1 << 18));
        assert_eq!(unwind_bucket_limit(19), None);
        for us in [0, 1, 2, 3, 100, 1 << 18] {
            assert!(us <= unwind_bucket_limit(unwind_bucket(us)).unwrap());
        }
    }

    #[test]
    fn add_counts_into_the_bucket_of_the_time() {
        let mut h = UnwindHistogram::default();
        h.add_us(300, 1);
        h.add_us(300, 16);
        h.add_us(u64::MAX, 2);
        assert_eq!((h[9], h[19]), (17, 2));
        assert_eq!(h.0.iter().sum::<u64>(), 19);
    }
}
