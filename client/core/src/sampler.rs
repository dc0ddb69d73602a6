//! Poisson sampling of allocations proportional to their size.
//!
//! Think of the bytes a thread allocates as one long stream, and pick each
//! byte independently with probability `p = 1 / interval`. An allocation is
//! sampled when at least one of its bytes is picked, and then stands for
//! `interval * (number of picked bytes)` bytes. The gaps between picked bytes
//! are geometric (mean `interval`, at least 1), so the sampler only keeps a
//! countdown to the next picked byte: the fast path is one subtraction and
//! one compare, with no lock and no shared cache line (one sampler per thread).
//!
//! * An allocation of at least `interval` bytes is always recorded, with its
//!   real size (heapprofd does the same; sampling it would only add noise).
//!   It does not touch the countdown.
//! * `interval == 1` records every allocation, zero-sized ones included, with
//!   its real size.
//!
//! The gap is drawn as `floor(X) + 1` with `X` exponential of rate
//! `lambda = -ln(1 - p)`. That is exactly geometric with success probability
//! `p` (`P(floor(X) >= k) = e^(-lambda k) = (1 - p)^k`). heapprofd uses
//! `lambda = 1 / interval`, whose gaps average about `interval + 1/2`; the
//! difference is tiny, but with the exact rate the estimator below is exactly
//! unbiased, which the statistical test checks.

/// A per-thread sampler; 40 bytes, lives in the thread's TLS block.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// Allocations at least this large are recorded with their real size:
    /// the interval, or 0 when the interval is 1 (so that all are).
    threshold: u64,
    /// `1 / ln(1 - 1/interval)` (negative), precomputed for the gap draws.
    inv_ln_q: f64,
    /// Bytes until the next picked byte (picked when it reaches <= 0).
    remaining: i64,
    /// The gap after that one, drawn ahead (see [`Sampler::crossed`]).
    next: i64,
    /// splitmix64 state.
    rng: u64,
}

/// Largest interval honoured (keeps all arithmetic far from overflow).
pub const MAX_INTERVAL: u64 = 1 << 48;

/// Most doublings [`Sampler::thinned`] applies at once.
pub const MAX_THINNING: u32 = 16;

impl Sampler {
    /// A sampler that never samples. (The zero-initialised TLS state is not
    /// one: the hooks set a thread's sampler up before its first decision.)
    pub const fn disabled() -> Sampler {
        Sampler {
            threshold: u64::MAX,
            inv_ln_q: -1.0,
            remaining: i64::MAX,
            next: i64::MAX,
            rng: 0,
        }
    }

    /// A sampler with mean `interval` bytes between samples, seeded with `seed`.
    pub fn new(interval: u64, seed: u64) -> Sampler {
        let interval = interval.clamp(1, MAX_INTERVAL);
        let mut s = Sampler {
            threshold: if interval == 1 { 0 } else { interval },
            inv_ln_q: 1.0 / crate::logarithm::ln_1p(-1.0 / interval as f64),
            remaining: 0,
            next: 0,
            rng: seed,
        };
        if interval > 1 {
            s.remaining = s.next_gap();
            s.next = s.next_gap();
        }
        s
    }

    /// This sampler at mean `interval`: the random state goes on, both
    /// gaps at hand are drawn afresh at the new rate (the gaps are
    /// memoryless, so the picks stay a Poisson process whose rate changes
    /// here; see `adaptive`).
    pub fn retuned(&self, interval: u64) -> Sampler {
        Sampler::new(interval, self.rng)
    }

    /// The sampling interval.
    pub fn interval(&self) -> u64 {
        self.threshold.max(1)
    }

    /// The fast path: accounts an allocation of `size` bytes and returns
    /// true if it is certainly not sampled. Returns false, changing nothing,
    /// when [`Self::sample_size`] must decide.
    #[inline(always)]
    pub fn skip(&mut self, size: usize) -> bool {
        let size = size as u64;
        if size < self.threshold {
            // As in sample_size: size < threshold <= MAX_INTERVAL.
            let r = self.remaining - size as i64;
            if r > 0 {
                self.remaining = r;
                return true;
            }
        }
        false
    }

    /// Accounts an allocation of `size` bytes. Returns 0 if it is not
    /// sampled, otherwise the number of bytes the sample stands for.
    #[inline(always)]
    pub fn sample_size(&mut self, size: usize) -> u64 {
        let size = size as u64;
        if size >= self.threshold {
            return size;
        }
        // size < threshold <= MAX_INTERVAL, so it fits an i64; `remaining`
        // stays within (-MAX_INTERVAL, 40 * MAX_INTERVAL).
        self.remaining -= size as i64;
        if self.remaining > 0 {
            return 0;
        }
        self.crossed()
    }

    /// The countdown ran out: count the picked bytes inside this allocation.
    ///
    /// The gap added is the one drawn at the previous crossing, and the
    /// draw for the next crossing comes after it. So the loop's exit (one
    /// pick or more, at random) is decided on a value at hand, not at the
    /// end of a draw: a draw is a chain of dependent operations (splitmix,
    /// a division, a polynomial: about 34 ns from start to result here),
    /// and a mispredicted exit used to wait for all of it. Nothing waits for
    /// the new draw. The gaps are the same i.i.d. draws, one crossing early.
    #[cold]
    #[inline(never)]
    fn crossed(&mut self) -> u64 {
        let mut n: u64 = 0;
        while self.remaining <= 0 {
            self.remaining += self.next;
            self.next = self.next_gap();
            n += 1;
        }
        // Only reached when threshold == interval (> 1).
        self.threshold.saturating_mul(n)
    }

    /// A sample this sampler gave `sample_size` for an allocation of
    /// `size` bytes, thinned to at most `doublings` doublings of the
    /// interval: returns the sample size at the raised interval (0: no byte
    /// of it is picked at that rate, so it is not a sample) and the
    /// doublings applied.
    ///
    /// Picking each byte with probability `1/m` and then keeping each pick
    /// with probability `2^-k` picks each byte with probability
    /// `1/(m 2^k)`: exactly the sampler of the raised interval. So a thinned
    /// sample is weighted like one drawn at the raised interval, as long as
    /// the choice to thin does not depend on this allocation's picks.
    /// * An allocation of at least the raised interval is certain at both
    ///   rates: unchanged, 0 doublings.
    /// * One certain at `m` but not at the raised interval had no picks
    ///   drawn: its picks at the raised rate are drawn afresh.
    /// * A record of a size exactly (`sample_size == size` below `m`: a
    ///   block recorded again after a failed realloc) is not thinned.
    ///
    /// The doublings are capped so that the raised interval stays within
    /// [`MAX_INTERVAL`].
    pub fn thinned(&mut self, size: u64, sample_size: u64, doublings: u32) -> (u64, u32) {
        let m = self.threshold;
        let mut k = doublings.min(MAX_THINNING);
        while k > 0 && m > MAX_INTERVAL >> k {
            k -= 1;
        }
        if m <= 1 || k == 0 || (sample_size == size && size < m) {
            return (sample_size, 0);
        }
        let raised = m << k;
        if size >= raised {
            return (sample_size, 0);
        }
        let picks = if size >= m {
            let inv_ln_q = 1.0 / crate::logarithm::ln_1p(-1.0 / raised as f64);
            let mut n = 0u64;
            let mut at = self.gap(inv_ln_q) as u64;
            while at <= size {
                n += 1;
                at += self.gap(inv_ln_q) as u64;
            }
            n
        } else {
            let mask = (1u64 << k) - 1;
            (0..sample_size / m)
                .filter(|_| self.next_u64() & mask == 0)
                .count() as u64
        };
        (picks.saturating_mul(raised), k)
    }

    /// Next gap between picked bytes: geometric with mean `interval`, >= 1.
    fn next_gap(&mut self) -> i64 {
        self.gap(self.inv_ln_q)
    }

    /// A gap between picked bytes of the interval whose `1 / ln(1 - p)` is
    /// `inv_ln_q`.
    fn gap(&mut self, inv_ln_q: f64) -> i64 {
        // Uniform in (0, 1]: never 0, so the logarithm is finite.
        let u = ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
        // X = -ln(u) / lambda with lambda = -ln(1 - p); -ln(u) <= 36.8.
        let x = crate::logarithm::ln_unit(u) * inv_ln_q;
        // x >= 0 and at most 36.8 * ~MAX_INTERVAL: the cast cannot saturate.
        (x as i64).saturating_add(1)
    }

    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.rng)
    }
}

/// splitmix64's finaliser: a good 64-bit mixer, also used to derive seeds.
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic mixed sizes: mostly small, a long tail, some above the interval.
    fn sizes(n: usize, seed: u64) -> impl Iterator<Item = usize> {
        let mut s = seed;
        (0..n).map(move |_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let r = mix64(s);
            match r % 100 {
                0..=59 => 1 + (r >> 8) as usize % 64,
                60..=89 => 64 + (r >> 8) as usize % 4096,
                90..=98 => 4096 + (r >> 8) as usize % 65536,
                _ => 65536 + (r >> 8) as usize % (1 << 20),
            }
        })
    }

    /// The estimate of the total is within 3 sigma of the truth.
    ///
    /// Derivation of sigma. Every byte of an allocation smaller than the
    /// interval `m` is picked independently with probability `p = 1/m` (the
    /// gaps are exactly geometric, so the picks form a Bernoulli process
    /// over the byte stream, and the countdown carried across allocations
    /// does not correlate them). For such an allocation of `s` bytes the
    /// number of picked bytes is `N ~ Binomial(s, p)` and its estimate is
    /// `m N`, with `E[m N] = m s p = s` (unbiased) and
    /// `Var[m N] = m^2 s p (1 - p) = s (m - 1)`. Allocations of at least `m`
    /// bytes contribute their exact size (variance 0). The allocations cover
    /// disjoint stretches of the stream, so the variances add:
    ///
    /// `sigma^2 = (m - 1) * S_small`, `S_small` = total bytes of the
    /// allocations smaller than `m`.
    ///
    /// The seeds are fixed, so the test is deterministic; it checks several
    /// intervals and seeds so a biased sampler cannot pass by luck.
    #[test]
    fn estimate_of_total_bytes_is_within_three_sigma() {
        for &(interval, seed) in &[
            (4096u64, 1u64),
            (32 * 1024, 2),
            (512 * 1024, 3),
            (100, 4),
            (4096, 0xdead_beef),
        ] {
            let mut sampler = Sampler::new(interval, seed);
            let (mut truth, mut small, mut estimate) = (0u64, 0u64, 0u64);
            let mut samples = 0u64;
            for size in sizes(1_000_000, seed ^ 0x5555) {
                truth += size as u64;
                if (size as u64) < interval {
                    small += size as u64;
                }
                let s = sampler.sample_size(size);
                if s != 0 {
                    samples += 1;
                    estimate += s;
                }
            }
            let sigma = (((interval - 1) as f64) * small as f64).sqrt();
            let err = estimate as f64 - truth as f64;
            assert!(
                err.abs() <= 3.0 * sigma,
                "interval {interval} seed {seed}: estimate {estimate}, truth {truth}, \
                 error {err}, sigma {sigma}, samples {samples}"
            );
            assert!(samples > 0);
        }
    }

    /// A sampler retuned between two intervals every few thousand
    /// allocations (as `adaptive` does under load) stays unbiased: each
    /// stretch is Poisson at its own rate, so the variances of the
    /// stretches add (bounded here by the larger interval's).
    #[test]
    fn retuning_mid_stream_keeps_the_estimate_unbiased() {
        for seed in [7u64, 8, 9] {
            let (lo, hi) = (4096u64, 65536u64);
            let mut sampler = Sampler::new(lo, seed);
            let (mut truth, mut small, mut estimate) = (0u64, 0u64, 0u64);
            for (i, size) in sizes(1_000_000, seed ^ 0x7777).enumerate() {
                if i % 5000 == 0 {
                    let next = if (i / 5000) % 2 == 0 { hi } else { lo };
                    sampler = sampler.retuned(next);
                    assert_eq!(sampler.interval(), next);
                }
                truth += size as u64;
                if (size as u64) < hi {
                    small += size as u64;
                }
                estimate += sampler.sample_size(size);
            }
            let sigma = (((hi - 1) as f64) * small as f64).sqrt();
            let err = estimate as f64 - truth as f64;
            assert!(
                err.abs() <= 3.0 * sigma,
                "seed {seed}: estimate {estimate}, truth {truth}, error {err}, sigma {sigma}"
            );
        }
    }

    /// Samples thinned by 4 doublings in every other stretch of a thousand
    /// allocations (a choice that does not look at the picks, as the
    /// session's "the ring is full" does not), weighted at the interval
    /// each was kept at, estimate the bytes and the count without bias:
    /// both within 4 sigma, where sigma sums each allocation's exact
    /// variance at the rate it was drawn at (bytes: `size (I - 1)` below
    /// `I`; count: `(1 - p) / p` with `p = 1 - (1 - 1/I)^size`). The
    /// allocations from the interval up to the raised one, certain before
    /// thinning, check the fresh draw.
    #[test]
    fn thinned_samples_estimate_bytes_and_count_without_bias() {
        for seed in [11u64, 12, 13] {
            let m = 4096u64;
            let mut sampler = Sampler::new(m, seed);
            let (mut truth_b, mut truth_n) = (0f64, 0f64);
            let (mut est_b, mut est_n) = (0f64, 0f64);
            let (mut var_b, mut var_n) = (0f64, 0f64);
            let (mut thinned, mut dropped) = (0u64, 0u64);
            let p = |size: u64, i: u64| {
                if size >= i {
                    1.0
                } else {
                    1.0 - (1.0 - 1.0 / i as f64).powf(size as f64)
                }
            };
            for (i, size) in sizes(400_000, seed ^ 0x3333).enumerate() {
                let size = size as u64;
                let thin = (i / 1000) % 2 == 1;
                let at = if thin { m << 4 } else { m };
                truth_b += size as f64;
                truth_n += 1.0;
                if size < at {
                    var_b += (size * (at - 1)) as f64;
                }
                var_n += (1.0 - p(size, at)) / p(size, at);
                let mut ss = sampler.sample_size(size as usize);
                let mut k = 0;
                if ss != 0 && thin {
                    (ss, k) = sampler.thinned(size, ss, 4);
                    thinned += 1;
                    if ss == 0 {
                        dropped += 1;
                    }
                }
                if ss != 0 {
                    est_b += ss as f64;
                    est_n += if ss == size {
                        1.0
                    } else {
                        1.0 / p(size, m << k)
                    };
                }
            }
            for (what, est, truth, var) in [
                ("bytes", est_b, truth_b, var_b),
                ("count", est_n, truth_n, var_n),
            ] {
                let sigma = var.sqrt();
                assert!(
                    (est - truth).abs() <= 4.0 * sigma,
                    "seed {seed} {what}: estimate {est}, truth {truth}, sigma {sigma}"
                );
            }
            assert!(dropped > thinned / 2, "{dropped} of {thinned} dropped");
        }
    }

    /// What thinning leaves alone: no doublings, interval 1, an exact record
    /// (a block recorded again after a failed realloc), an allocation
    /// certain at the raised interval; and the doublings stop at the
    /// largest interval.
    #[test]
    fn thinning_leaves_exact_records_alone_and_caps_the_interval() {
        let mut s = Sampler::new(4096, 5);
        assert_eq!(s.thinned(100, 4096, 0), (4096, 0));
        assert_eq!(s.thinned(100, 100, 4), (100, 0));
        assert_eq!(s.thinned(1 << 20, 1 << 20, 4), (1 << 20, 0));
        let mut one = Sampler::new(1, 5);
        assert_eq!(one.thinned(100, 100, 4), (100, 0));
        let mut big = Sampler::new(MAX_INTERVAL >> 2, 5);
        let (ss, k) = big.thinned(100, MAX_INTERVAL >> 2, 10);
        assert_eq!(k, 2);
        assert!(ss == 0 || ss % MAX_INTERVAL == 0, "{ss}");
    }

    /// The mean gap is the interval, and gaps are at least 1.
    #[test]
    fn gaps_are_geometric_with_mean_interval() {
        let mut s = Sampler::new(1000, 42);
        let n = 200_000;
        let mut sum = 0f64;
        let mut sumsq = 0f64;
        for _ in 0..n {
            let g = s.next_gap();
            assert!(g >= 1);
            sum += g as f64;
            sumsq += (g as f64) * (g as f64);
        }
        let mean = sum / n as f64;
        // Geometric(p): variance (1 - p) / p^2 ~ 999000; standard error of the
        // mean = sqrt(999000 / n) ~ 2.2.
        assert!((mean - 1000.0).abs() < 5.0 * 2.24, "mean {mean}");
        let var = sumsq / n as f64 - mean * mean;
        assert!((var / 999_000.0 - 1.0).abs() < 0.05, "variance {var}");
    }

    #[test]
    fn skip_then_sample_size_decides_like_sample_size_alone() {
        let mut a = Sampler::new(300, 21);
        let mut b = Sampler::new(300, 21);
        for size in sizes(50_000, 8) {
            let via_skip = if a.skip(size) { 0 } else { a.sample_size(size) };
            assert_eq!(via_skip, b.sample_size(size));
        }
        assert_eq!(a, b);
    }

    /// Drawing a gap one crossing ahead changes no decision: the countdown
    /// still adds the gaps in the order they are drawn (first `remaining`,
    /// then `next`, then each later draw), as a sampler that draws at the
    /// crossing would.
    #[test]
    fn gaps_are_used_in_the_order_they_are_drawn() {
        for (interval, seed) in [(4096u64, 3u64), (300, 9), (64, 1)] {
            let s = Sampler::new(interval, seed);
            let mut draws = s;
            let mut gaps = vec![s.remaining, s.next];
            gaps.extend((0..400_000).map(|_| draws.next_gap()));
            let mut gaps = gaps.into_iter();
            let mut sampler = s;
            let mut countdown = s.remaining;
            gaps.next();
            for size in sizes(100_000, seed) {
                let expected = if size as u64 >= interval {
                    size as u64
                } else {
                    countdown -= size as i64;
                    let mut n = 0;
                    while countdown <= 0 {
                        countdown += gaps.next().expect("enough gaps drawn");
                        n += 1;
                    }
                    interval * n
                };
                assert_eq!(sampler.sample_size(size), expected, "interval {interval}");
            }
        }
    }

    #[test]
    fn interval_one_records_everything_exactly() {
        let mut s = Sampler::new(1, 9);
        for size in [0usize, 1, 2, 17, 4096, 1 << 30] {
            assert_eq!(s.sample_size(size), size as u64);
        }
    }

    #[test]
    fn large_allocations_pass_through_without_touching_the_countdown() {
        let mut s = Sampler::new(4096, 5);
        let before = s;
        assert_eq!(s.sample_size(4096), 4096);
        assert_eq!(s.sample_size(1 << 20), 1 << 20);
        assert_eq!(s, before);
    }

    #[test]
    fn small_samples_are_multiples_of_the_interval() {
        let mut s = Sampler::new(64, 11);
        let mut seen = 0;
        for _ in 0..10_000 {
            let v = s.sample_size(48);
            if v != 0 {
                assert_eq!(v % 64, 0);
                seen += 1;
            }
        }
        // 480000 bytes / 64 = 7500 picked bytes expected in ~ 5000+ allocations.
        assert!(seen > 4000, "{seen}");
    }

    #[test]
    fn same_seed_same_decisions_and_disabled_never_samples() {
        let mut a = Sampler::new(512, 77);
        let mut b = Sampler::new(512, 77);
        for size in sizes(10_000, 3) {
            assert_eq!(a.sample_size(size), b.sample_size(size));
        }
        let mut d = Sampler::disabled();
        for size in sizes(10_000, 3) {
            assert_eq!(d.sample_size(size), 0);
        }
    }
}
