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
    # Self-check: a constant shift is its own interval; noise widens it.
    assert paired_median_interval([5.0] * 20) == (5.0, 5.0)
    lo, hi = paired_median_interval([5.0 + (i % 7 - 3) for i in range(40)])
    assert lo < 5.0 < hi or lo <= 5.0 <= hi, (lo, hi)
    print("bench_stats: ok")
