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
    unpaired_width = (intervals.mean(base).high / intervals.mean(spec).low
                      - intervals.mean(base).low / intervals.mean(spec).high)
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


def test_ratio_of_ratios_covers_the_truth_and_resamples_both_sets():
    """Two independent prompt sets with the same true rate: the interval of their ratio holds 1 about as
    often as it should; resampling only one set (the negative control) covers much less often."""
    rng = np.random.default_rng(11)
    hits = one_sided = 0
    trials = 120
    for t in range(trials):
        a_den, b_den = rng.uniform(20, 40, size=20), rng.uniform(20, 40, size=40)
        a_num, b_num = 3.0 * a_den + rng.normal(0, 8, 20), 3.0 * b_den + rng.normal(0, 8, 40)
        iv = intervals.ratio_of_ratios(a_num, a_den, b_num, b_den, resamples=600, seed=t)
        assert iv.estimate == pytest.approx(a_num.sum() / a_den.sum() / (b_num.sum() / b_den.sum()))
        hits += 1.0 in iv
        single = intervals.ratio_of_sums(a_num, a_den, resamples=600, seed=t)  # b's spread ignored
        ref = b_num.sum() / b_den.sum()
        one_sided += single.low / ref <= 1.0 <= single.high / ref
    assert 0.88 <= hits / trials <= 1.0
    assert one_sided < hits - 5


def test_ratio_of_ratios_degenerate_and_bad_input():
    assert intervals.ratio_of_ratios([6, 6], [2, 2], [3, 3, 3], [1, 1, 1]).fmt() == "1.00 [1.00, 1.00]"
    assert not intervals.ratio_of_ratios([6], [2], [3, 3], [1, 1]).known
    with pytest.raises(ValueError, match="its denominator's length"):
        intervals.ratio_of_ratios([1, 2], [1], [1], [1])
    with pytest.raises(ValueError, match="positive sums"):
        intervals.ratio_of_ratios([1, 2], [1, 1], [0, 0], [1, 1])
