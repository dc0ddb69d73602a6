//! What the profile knows about a callsite beyond Perfetto's four counters:
//! the estimated number of allocations its samples stand for, a histogram
//! of the sizes the program asked for, and, in exact mode (interval 1), how
//! long its allocations lived, counted in allocations of the process, and
//! how many were temporary.
//!
//! * **Estimated allocations**: the sum of `1/p(size)` over the samples
//!   ([`super::estimate`]); the exact count at interval 1.
//! * **Sizes**: per [`log2_bucket`] of the requested size, the samples and
//!   the allocations they stand for.
//! * **Lifetimes** (exact mode only): per log2 bucket of the number of
//!   allocations the process made between an allocation and its free, the
//!   frees. An allocation freed within `N` allocations is *short-lived*.
//! * **Temporary** (exact mode only): heaptrack's temporary allocations, an
//!   allocation freed before the thread that made it allocates again.
//!
//! Histograms are sparse (a callsite usually sees few size classes): a
//! small vector sorted by bucket.

use super::estimate::{inverse_probability, log2_bucket};

/// One size bucket of a callsite.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeBucket {
    /// [`log2_bucket`] of the requested sizes.
    pub log2: u8,
    /// Samples.
    pub samples: u64,
    /// Allocations the samples stand for (estimated; exact at interval 1).
    pub estimated: f64,
}

/// One lifetime bucket of a callsite (exact mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LifetimeBucket {
    /// [`log2_bucket`] of the allocations made between malloc and free.
    pub log2: u8,
    /// Frees.
    pub frees: u64,
}

/// The statistics of one callsite in one heap; see the module docs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallsiteStats {
    /// Allocations the samples stand for.
    pub estimated_allocs: f64,
    /// Requested sizes, by log2 bucket (sorted).
    pub sizes: Vec<SizeBucket>,
    /// Lifetimes of freed allocations in allocations, by log2 bucket
    /// (sorted; exact mode only).
    pub lifetimes: Vec<LifetimeBucket>,
    /// Allocations freed before their thread allocated again (exact mode).
    pub temporary: u64,
}

impl CallsiteStats {
    /// Counts a sampled allocation of `size` requested bytes at `interval`.
    pub fn add_alloc(&mut self, size: u64, interval: u64) {
        self.add_weighted_alloc(size, inverse_probability(size, interval));
    }

    /// Counts a sampled allocation of `size` requested bytes that stands
    /// for `w` allocations (its [`inverse_probability`]).
    pub fn add_weighted_alloc(&mut self, size: u64, w: f64) {
        self.estimated_allocs += w;
        let b = log2_bucket(size);
        match self.sizes.binary_search_by_key(&b, |x| x.log2) {
            Ok(i) => {
                self.sizes[i].samples += 1;
                self.sizes[i].estimated += w;
            }
            Err(i) => self.sizes.insert(
                i,
                SizeBucket {
                    log2: b,
                    samples: 1,
                    estimated: w,
                },
            ),
        }
    }

    /// Counts the free of an allocation that lived `lifetime` allocations
    /// (exact mode), temporary or not.
    pub fn add_free(&mut self, lifetime: u64, temporary: bool) {
        let b = log2_bucket(lifetime);
        match self.lifetimes.binary_search_by_key(&b, |x| x.log2) {
            Ok(i) => self.lifetimes[i].frees += 1,
            Err(i) => self
                .lifetimes
                .insert(i, LifetimeBucket { log2: b, frees: 1 }),
        }
        self.temporary += u64::from(temporary);
    }

    /// Adds `other`'s counts (the same stack under two ids).
    pub fn merge(&mut self, other: &CallsiteStats) {
        self.estimated_allocs += other.estimated_allocs;
        self.temporary += other.temporary;
        for b in &other.sizes {
            match self.sizes.binary_search_by_key(&b.log2, |x| x.log2) {
                Ok(i) => {
                    self.sizes[i].samples += b.samples;
                    self.sizes[i].estimated += b.estimated;
                }
                Err(i) => self.sizes.insert(i, *b),
            }
        }
        for b in &other.lifetimes {
            match self.lifetimes.binary_search_by_key(&b.log2, |x| x.log2) {
                Ok(i) => self.lifetimes[i].frees += b.frees,
                Err(i) => self.lifetimes.insert(i, *b),
            }
        }
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty() && self.lifetimes.is_empty()
    }

    /// Frees of allocations that lived fewer than `2^k` allocations, for the
    /// largest `k` with `2^k - 1 <= n`: the short-lived frees within `n`
    /// allocations, exactly when `n + 1` is a power of two. Returns the
    /// count and the `2^k - 1` used.
    pub fn freed_within(&self, n: u64) -> (u64, u64) {
        let (k, bound) = match n.checked_add(1) {
            None => (64, u64::MAX),
            Some(m) => {
                let k = 63 - m.leading_zeros();
                (k, (1u64 << k) - 1)
            }
        };
        let count = self
            .lifetimes
            .iter()
            .filter(|b| u32::from(b.log2) <= k)
            .map(|b| b.frees)
            .sum();
        (count, bound)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_estimates() {
        let mut s = CallsiteStats::default();
        for size in [1, 100, 100, 5000] {
            s.add_alloc(size, 4096);
        }
        let buckets: Vec<(u8, u64)> = s.sizes.iter().map(|b| (b.log2, b.samples)).collect();
        assert_eq!(buckets, [(1, 1), (7, 2), (13, 1)]);
        let expect = 4096.0 + 2.0 * inverse_probability(100, 4096) + 1.0;
        assert!((s.estimated_allocs - expect).abs() < 1e-6);
        let mut exact = CallsiteStats::default();
        exact.add_alloc(0, 1);
        exact.add_alloc(7, 1);
        assert_eq!(exact.estimated_allocs, 2.0);
    }

    #[test]
    fn lifetimes_and_short_lived() {
        let mut s = CallsiteStats::default();
        for l in [0, 0, 1, 2, 3, 4, 100] {
            s.add_free(l, l == 0);
        }
        assert_eq!(s.temporary, 2);
        assert_eq!(s.freed_within(0), (2, 0));
        assert_eq!(s.freed_within(1), (3, 1));
        assert_eq!(s.freed_within(2), (3, 1), "rounded down to 2^k - 1");
        assert_eq!(s.freed_within(3), (5, 3));
        assert_eq!(s.freed_within(127), (7, 127));
        assert_eq!(s.freed_within(u64::MAX), (7, u64::MAX));
    }
}
