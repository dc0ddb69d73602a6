"""Statistics shared by the interleaved benchmark scripts.

`paired_median_interval` is a 95% percentile-bootstrap interval of the
median of paired differences (one command's time less the baseline's in
the same round). The resampling uses a fixed seed, so the same times
always print the same interval.
"""
import random
import statistics


def paired_median_interval(diffs, resamples=2000):
    """95% percentile-bootstrap interval (low, high) of the median of `diffs`."""
    rng = random.Random(0x5EED)
    n = len(diffs)
    meds = sorted(statistics.median(rng.choices(diffs, k=n)) for _ in range(resamples))
    return meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


if __name__ == "__main__":
    # Self-check: a constant shift is its own interval; noise around a
    # median of 5 gives an interval of some width that holds 5 and stays
    # inside the data's range; a shift moves it by as much.
    assert paired_median_interval([5.0] * 20) == (5.0, 5.0)
    noisy = [5.0 + (i % 7 - 3) for i in range(40)]
    lo, hi = paired_median_interval(noisy)
    assert 2.0 <= lo < 5.0 < hi <= 8.0, (lo, hi)
    assert paired_median_interval([x + 10.0 for x in noisy]) == (lo + 10.0, hi + 10.0)
    print("bench_stats: ok", (lo, hi))
