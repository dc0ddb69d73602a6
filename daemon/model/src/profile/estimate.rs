//! How many allocations a set of samples stands for.
//!
//! # The estimator
//!
//! The client samples bytes, not allocations: each byte of the stream of
//! allocations smaller than the interval `I` is picked independently with
//! probability `1/I`, and an allocation is sampled when one of its bytes is
//! picked; an allocation of at least `I` bytes is always recorded (see the
//! client's `sampler.rs`). So an allocation of `s` bytes is sampled with
//! probability
//!
//! ```text
//! p(s) = 1                      if I == 1 or s >= I
//! p(s) = 1 - (1 - 1/I)^s        otherwise
//! ```
//!
//! and the allocations of a callsite are independent draws. The
//! Horvitz-Thompson estimator of their number `N` counts each sampled
//! allocation `1/p(s)` times: with `X_j` the indicator that allocation `j`
//! (size `s_j`) is sampled, `E[sum_j X_j / p(s_j)] = sum_j p(s_j) / p(s_j) =
//! N`, so it is unbiased whatever the sizes are, and its variance is
//! `sum_j (1 - p(s_j)) / p(s_j)` (0 at `I == 1`, where it is the exact
//! count). [`inverse_probability`] is `1/p(s)`; a zero-sized sample (only
//! possible at `I == 1`, or from a confused peer) counts as size 1.
//!
//! The sample count alone is not an allocation count: at the default
//! 4096-byte interval a 100-byte allocation is sampled with probability
//! 2.4%, so 1000 samples of it stand for about 41,000 allocations.

/// Probability that an allocation of `size` bytes is sampled at `interval`
/// (see the module docs).
pub fn sample_probability(size: u64, interval: u64) -> f64 {
    if interval <= 1 || size >= interval {
        return 1.0;
    }
    let s = size.max(1) as f64;
    // 1 - (1 - 1/I)^s, computed without cancellation for small s/I.
    -(s * (-1.0 / interval as f64).ln_1p()).exp_m1()
}

/// How many allocations one sampled allocation of `size` bytes stands for:
/// `1 / p(size)`.
pub fn inverse_probability(size: u64, interval: u64) -> f64 {
    1.0 / sample_probability(size, interval)
}

/// [`inverse_probability`] for one heap, with `ln(1 - 1/I)` worked out once
/// per interval and the weights of the sizes seen most recently kept in a
/// small direct-mapped memo: a heap sees the same sizes again and again,
/// and the two calls into libm (`log1p`, `expm1`) were 4% of the daemon's
/// CPU in `record` of a program taking 10 million samples. Gives exactly
/// the values of [`inverse_probability`].
#[derive(Debug, Clone, Default)]
pub struct SampleWeights {
    /// The interval `ln_q` and `memo` are for (0: none yet).
    interval: u64,
    ln_q: f64,
    /// `(size, weight)` at `size`'s slot; size 0 = empty. Made at the
    /// first weight that needs it.
    memo: Vec<(u64, f64)>,
}

/// Slots of [`SampleWeights`]'s memo (12 KiB).
const MEMO_SLOTS: usize = 1024;

impl SampleWeights {
    /// `1 / p(size)` at `interval` (see [`inverse_probability`]).
    pub fn inverse_probability(&mut self, size: u64, interval: u64) -> f64 {
        if interval <= 1 || size >= interval {
            return 1.0;
        }
        let size = size.max(1);
        if interval != self.interval {
            self.interval = interval;
            self.ln_q = (-1.0 / interval as f64).ln_1p();
            self.memo.clear();
        }
        if self.memo.is_empty() {
            self.memo.resize(MEMO_SLOTS, (0, 0.0));
        }
        let slot = (size.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) as usize % MEMO_SLOTS;
        let e = &mut self.memo[slot];
        if e.0 != size {
            *e = (size, 1.0 / -(size as f64 * self.ln_q).exp_m1());
        }
        e.1
    }
}

/// Log2 bucket of a size (or a count): 0 for 0, else `b` with `2^(b-1) <=
/// v < 2^b` (1 -> 1, 2..=3 -> 2, 4..=7 -> 3, ...; at most 64).
pub fn log2_bucket(v: u64) -> u8 {
    (64 - v.leading_zeros()) as u8
}

/// The values bucket `b` of [`log2_bucket`] holds: `(low, high)`, inclusive.
pub fn log2_bucket_range(b: u8) -> (u64, u64) {
    match b {
        0 => (0, 0),
        64.. => (1 << 63, u64::MAX),
        b => (1 << (b - 1), (1 << b) - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_weights_are_exactly_the_inverse_probabilities() {
        let mut w = SampleWeights::default();
        let mut z = 7u64;
        for interval in [4096u64, 1, 512 * 1024, 4096, 32 * 1024] {
            for _ in 0..20_000 {
                z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
                let size = (z >> 40) % (2 * interval + 3);
                let (memo, direct) = (
                    w.inverse_probability(size, interval),
                    inverse_probability(size, interval),
                );
                assert_eq!(memo.to_bits(), direct.to_bits(), "{size} at {interval}");
            }
        }
    }

    /// splitmix64: deterministic, good enough for a statistical test.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// The client's sampler, restated: a countdown to the next picked byte
    /// over the stream of allocations below the interval, geometric gaps.
    struct Sampler {
        interval: u64,
        remaining: i64,
        ln_q: f64,
    }

    impl Sampler {
        fn new(interval: u64, rng: &mut Rng) -> Sampler {
            let ln_q = (-1.0 / interval as f64).ln_1p();
            let mut s = Sampler {
                interval,
                remaining: 0,
                ln_q,
            };
            s.remaining = s.gap(rng);
            s
        }

        fn gap(&self, rng: &mut Rng) -> i64 {
            let u = 1.0 - rng.unit(); // (0, 1]
            (u.ln() / self.ln_q).floor() as i64 + 1
        }

        fn sampled(&mut self, size: u64, rng: &mut Rng) -> bool {
            if size >= self.interval {
                return true;
            }
            self.remaining -= size as i64;
            if self.remaining > 0 {
                return false;
            }
            while self.remaining <= 0 {
                self.remaining += self.gap(rng);
            }
            true
        }
    }

    #[test]
    fn probability_edges() {
        assert_eq!(sample_probability(0, 1), 1.0);
        assert_eq!(sample_probability(5, 1), 1.0);
        assert_eq!(sample_probability(4096, 4096), 1.0);
        assert_eq!(sample_probability(1 << 20, 4096), 1.0);
        let p1 = sample_probability(1, 4096);
        assert!((p1 - 1.0 / 4096.0).abs() < 1e-15, "{p1}");
        // 1 - (1 - 1/I)^s by the naive formula, for a mid-sized allocation.
        let naive = 1.0 - (1.0 - 1.0 / 4096.0f64).powi(100);
        assert!((sample_probability(100, 4096) - naive).abs() < 1e-12);
        assert_eq!(sample_probability(0, 4096), sample_probability(1, 4096));
        assert!((inverse_probability(100, 4096) - 1.0 / naive).abs() < 1e-6);
    }

    #[test]
    fn buckets() {
        assert_eq!(log2_bucket(0), 0);
        assert_eq!(log2_bucket(1), 1);
        assert_eq!(log2_bucket(3), 2);
        assert_eq!(log2_bucket(4), 3);
        assert_eq!(log2_bucket(4095), 12);
        assert_eq!(log2_bucket(4096), 13);
        assert_eq!(log2_bucket(u64::MAX), 64);
        for v in [0, 1, 2, 7, 8, 1000, 1 << 40, u64::MAX] {
            let (lo, hi) = log2_bucket_range(log2_bucket(v));
            assert!(lo <= v && v <= hi, "{v} in {lo}..={hi}");
        }
    }

    /// The estimate over runs of the client's sampler is unbiased: its mean
    /// over 400 runs of a mixed workload is within 4 standard errors of the
    /// true count, where the standard error comes from the variance formula
    /// of the module docs, `sum (1-p)/p`, divided by the number of runs.
    /// The same check fails for the raw sample count (biased by far).
    #[test]
    fn horvitz_thompson_is_unbiased_for_the_clients_sampler() {
        let interval = 4096;
        // 30000 allocations: many small, some mid, a few above the interval.
        let sizes: Vec<u64> = (0..30_000u64)
            .map(|i| match i % 100 {
                0 => 10_000,
                1..=10 => 1000 + i % 7,
                _ => 16 + (i % 13) * 8,
            })
            .collect();
        let truth = sizes.len() as f64;
        let variance: f64 = sizes
            .iter()
            .map(|&s| {
                let p = sample_probability(s, interval);
                (1.0 - p) / p
            })
            .sum();
        let runs = 400;
        let mut rng = Rng(7);
        let (mut sum_est, mut sum_samples) = (0.0, 0.0);
        for _ in 0..runs {
            let mut sampler = Sampler::new(interval, &mut rng);
            for &s in &sizes {
                if sampler.sampled(s, &mut rng) {
                    sum_est += inverse_probability(s, interval);
                    sum_samples += 1.0;
                }
            }
        }
        let mean = sum_est / runs as f64;
        let se = (variance / runs as f64).sqrt();
        assert!(
            (mean - truth).abs() < 4.0 * se,
            "mean estimate {mean:.0} vs {truth} (se {se:.0})"
        );
        let mean_samples = sum_samples / runs as f64;
        assert!(
            (mean_samples - truth).abs() > 100.0 * se,
            "the sample count ({mean_samples:.0}) is not an estimate of {truth}"
        );
    }
}
