"""Bootstrap intervals: known distributions give the known interval; coverage; degenerate cases."""

import math

import numpy as np
import pytest

from treespec.bench import intervals


def test_mean_of_normal_sample_matches_the_textbook_interval():
    x = np.random.default_rng(1).normal(5.0, 2.0, size=400)
    iv = intervals.mean(x)
    half = 1.96 * x.std(ddof=1) / math.sqrt(len(x))  # the t/normal interval for the mean
    assert iv.estimate == pytest.approx(x.mean())
    assert iv.low == pytest.approx(x.mean() - half, abs=0.15 * half)
    assert iv.high == pytest.approx(x.mean() + half, abs=0.15 * half)


def test_coverage_of_a_ratio_of_sums_is_near_nominal():
    rng = np.random.default_rng(7)
    true_ratio, hits, trials = 0.5, 0, 150
    for t in range(trials):
        den = rng.uniform(50, 150, size=25)  # e.g. seconds per prompt
        num = true_ratio * den + rng.normal(0, 5, size=25)  # tokens ~ rate * seconds + noise
        hits += true_ratio in intervals.ratio_of_sums(num, den, resamples=800, seed=t)
    assert 0.85 <= hits / trials <= 0.995


def test_pairing_makes_a_speedup_interval_narrow():
    rng = np.random.default_rng(3)
    base = rng.uniform(10, 40, size=20)  # prompts of very different lengths
    spec = base / 2.0 * rng.normal(1.0, 0.02, size=20)
    paired = intervals.ratio_of_sums(base, spec)
    unpaired_width = intervals.mean(base).high / intervals.mean(spec).low - intervals.mean(base).low / intervals.mean(spec).high
    assert 1.9 < paired.low < 2.0 < paired.high < 2.1
    assert paired.high - paired.low < 0.2 * unpaired_width


def test_degenerate_inputs():
    one = intervals.ratio_of_sums([10], [2])
    assert one.estimate == 5 and not one.known and one.fmt() == "5.00"
    same = intervals.ratio_of_sums([4, 8, 12], [2, 4, 6])
    assert (same.low, same.estimate, same.high) == (2, 2, 2)
    assert intervals.ratio_of_sums([1, 2, 3], [1, 1, 2]).fmt().count("[") == 1


@pytest.mark.parametrize("num, den, fragment", [
    ([1, 2], [1], "same non-zero length"),
    ([], [], "same non-zero length"),
    ([1, float("nan")], [1, 1], "non-finite"),
    ([1, 2], [0, 0], "positive sum"),
])
def test_bad_input_is_a_clear_error(num, den, fragment):
    with pytest.raises(ValueError, match=fragment):
        intervals.ratio_of_sums(num, den)
