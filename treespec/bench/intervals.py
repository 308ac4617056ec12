"""Spread over prompts: bootstrap confidence intervals for the figures treespec reports.

Every figure a run reports is a ratio of sums over its prompts: tau = committed tokens / steps,
tok/s = tokens / seconds, and a speedup over a baseline = baseline seconds / treespec seconds
(both generate the same number of tokens per prompt). The prompt is the unit of variation, so the
interval resamples prompts with replacement and recomputes the ratio of sums on each resample
(paired: a prompt's numerator and denominator travel together, which is what makes a speedup's
interval much narrower than the two tok/s intervals it comes from). ``scipy.stats.bootstrap``
does the resampling; the default is the bias-corrected and accelerated (BCa) interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval ``[low, high]``.

    ``low``/``high`` are NaN when the spread cannot be estimated (fewer than two prompts).
    """

    estimate: float
    low: float
    high: float
    confidence: float = CONFIDENCE
    n: int = 0  # prompts the estimate is over

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def known(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))

    def fmt(self, digits: int = 2) -> str:
        """``"2.31 [2.10, 2.52]"`` (just the estimate when the spread is unknown)."""
        if not self.known:
            return f"{self.estimate:.{digits}f}"
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    def as_dict(self) -> dict[str, float]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high,
                "confidence": self.confidence, "n": self.n}


def _check(values: np.ndarray, name: str) -> np.ndarray:
    if values.ndim != 1:
        raise ValueError(f"{name} must be a flat sequence of per-prompt values, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} has non-finite values: {values.tolist()}")
    return values


def ratio_of_sums(numerator: Sequence[float], denominator: Sequence[float], *, confidence: float = CONFIDENCE,
                  resamples: int = RESAMPLES, seed: int = 0, method: str = "BCa") -> Interval:
    """``sum(numerator) / sum(denominator)`` over prompts, with a paired bootstrap interval.

    ``numerator[i]`` and ``denominator[i]`` belong to prompt ``i`` (tokens and steps for tau,
    tokens and seconds for tok/s, baseline seconds and treespec seconds for a speedup).
    """
    num = _check(np.asarray(numerator, dtype=np.float64), "numerator")
    den = _check(np.asarray(denominator, dtype=np.float64), "denominator")
    if num.shape != den.shape or num.size == 0:
        raise ValueError(f"numerator and denominator need the same non-zero length, got {num.size} and {den.size}")
    if den.sum() <= 0 or np.any(den < 0):
        raise ValueError("denominator values must be >= 0 with a positive sum")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    estimate = float(num.sum() / den.sum())
    nan = float("nan")
    if num.size < 2:
        return Interval(estimate, nan, nan, confidence, int(num.size))
    ratios_equal = np.allclose(num * den.sum(), den * num.sum())
    if ratios_equal:  # every prompt has the same ratio: every resample gives the estimate
        return Interval(estimate, estimate, estimate, confidence, int(num.size))

    def statistic(n: np.ndarray, d: np.ndarray, axis: int = -1) -> np.ndarray:
        return n.sum(axis=axis) / d.sum(axis=axis)

    res = stats.bootstrap((num, den), statistic, paired=True, vectorized=True, n_resamples=resamples,
                          confidence_level=confidence, method=method, rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isnan(low) or math.isnan(high):  # BCa can fail on near-degenerate data; percentile cannot
        res = stats.bootstrap((num, den), statistic, paired=True, vectorized=True, n_resamples=resamples,
                              confidence_level=confidence, method="percentile", rng=np.random.default_rng(seed))
        low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Interval(estimate, low, high, confidence, int(num.size))


def mean(values: Sequence[float], **kwargs) -> Interval:
    """The mean of per-prompt values with a bootstrap interval (``ratio_of_sums`` over ones)."""
    v = np.asarray(values, dtype=np.float64)
    return ratio_of_sums(v, np.ones_like(v), **kwargs)


def ratio_of_ratios(numerator: Sequence[float], denominator: Sequence[float], ref_numerator: Sequence[float],
                    ref_denominator: Sequence[float], *, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                    seed: int = 0) -> Interval:
    """``(sum(numerator) / sum(denominator)) / (sum(ref_numerator) / sum(ref_denominator))`` over two
    *independent* sets of prompts, with a percentile bootstrap interval that resamples each set on its own.

    What it is for: a measured figure over the evaluation prompts against a prediction made from other
    (calibration) prompts, e.g. measured tau over the tau a tree replays to on the calibration walk. Both
    carry the spread of their own prompts; an interval that holds 1 says the two cannot be told apart.
    """
    a_num, a_den = (_check(np.asarray(x, dtype=np.float64), name) for x, name in
                    ((numerator, "numerator"), (denominator, "denominator")))
    b_num, b_den = (_check(np.asarray(x, dtype=np.float64), name) for x, name in
                    ((ref_numerator, "ref_numerator"), (ref_denominator, "ref_denominator")))
    if a_num.shape != a_den.shape or b_num.shape != b_den.shape or not a_num.size or not b_num.size:
        raise ValueError("each numerator needs its denominator's length, and both sets at least one prompt")
    if a_den.sum() <= 0 or b_den.sum() <= 0 or b_num.sum() <= 0:
        raise ValueError("denominators (and the reference's numerator) must have positive sums")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    estimate = float(a_num.sum() / a_den.sum() / (b_num.sum() / b_den.sum()))
    if a_num.size < 2 or b_num.size < 2:
        return Interval(estimate, float("nan"), float("nan"), confidence, int(a_num.size))

    def statistic(ia: np.ndarray, ib: np.ndarray, axis: int = -1) -> np.ndarray:
        ia, ib = ia.astype(np.int64), ib.astype(np.int64)  # the prompts of each resample
        return (a_num[ia].sum(axis) / a_den[ia].sum(axis)) / (b_num[ib].sum(axis) / b_den[ib].sum(axis))

    res = stats.bootstrap((np.arange(a_num.size), np.arange(b_num.size)), statistic, paired=False, vectorized=True,
                          n_resamples=resamples, confidence_level=confidence, method="percentile",
                          rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return Interval(estimate, low, high, confidence, int(a_num.size))
