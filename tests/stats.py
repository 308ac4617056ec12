"""Goodness-of-fit helpers for the exactness tests."""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from scipy import stats

from treespec.core.sampling import standardize

ALPHA = 1e-3  # per-test false alarm rate


def g_test(observed: Counter, expected_p: dict, min_expected: float = 5.0) -> float:
    """G-test p-value of ``observed`` counts against probabilities ``expected_p``.

    Cells whose expected count is below ``min_expected`` are pooled into one cell; a sample that
    lands on a cell of probability 0 fails outright (returns 0.0). Too few samples to leave two cells
    after pooling is an error, not a p-value: such a test would check nothing (scipy's p-value of one
    cell is NaN, which ``p > ALPHA`` reads as a rejection and ``p < ALPHA`` as an acceptance).
    """
    n = sum(observed.values())
    if any(expected_p.get(k, 0.0) <= 0.0 for k in observed):
        return 0.0
    big, rest = _pooled(expected_p, n, min_expected)
    obs = [observed.get(k, 0) for k in big]
    exp = [expected_p[k] * n for k in big]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp)
    if rest:
        obs.append(rest_obs)
        exp.append(rest_exp)
    elif exp:  # fold a tiny remainder into the largest cell
        i = int(np.argmax(exp))
        obs[i] += rest_obs
        exp[i] += rest_exp
    if len(obs) < 2:
        raise ValueError(f"{n} samples leave one cell after pooling cells expected fewer than {min_expected:g} "
                         "times: the G-test checks nothing; sample more")
    return float(stats.power_divergence(obs, exp, lambda_="log-likelihood").pvalue)


def _pooled(exact: dict, n: int, min_expected: float) -> tuple[list, bool]:
    """``g_test``'s cells at ``n`` samples: the cells kept on their own, and whether the rest is one more cell."""
    big = [k for k, p in exact.items() if p * n >= min_expected]
    return big, (n - sum(exact[k] * n for k in big)) >= min_expected


def power(exact: dict, biased: dict, n: int, alpha: float = ALPHA, min_expected: float = 5.0) -> float:
    """The probability that :func:`g_test` rejects ``exact`` at ``n`` samples drawn from ``biased``: the G
    statistic of the pooled table is noncentral chi-square with ``lambda = 2 n KL(biased || exact)`` over its
    cells (the large-sample approximation)."""
    big, rest = _pooled(exact, n, min_expected)
    p = np.array([exact[k] for k in big])
    b = np.array([biased.get(k, 0.0) for k in big])
    if rest:
        p, b = np.append(p, 1 - p.sum()), np.append(b, 1 - b.sum())
    elif len(p):
        i = int(np.argmax(p))
        p[i] += 1 - p.sum()
        b[i] += 1 - b.sum()
    if len(p) < 2:
        return 0.0
    keep = b > 0
    lam = 2 * n * float(np.sum(b[keep] * np.log(b[keep] / p[keep])))
    df = len(p) - 1
    return float(stats.ncx2.sf(stats.chi2.ppf(1 - alpha, df), df, lam))


def trials_to_detect(exact: dict, biased: dict, target_power: float = 0.99, step: int = 50, most: int = 20000) -> int:
    """The smallest multiple of ``step`` at which :func:`g_test` detects samples from ``biased`` with probability
    ``target_power`` (:func:`power`): how many trials a joint-distribution test needs to see a stated error."""
    for n in range(step, most + 1, step):
        if power(exact, biased, n) >= target_power:
            return n
    raise ValueError(f"{most} trials do not detect this error with power {target_power}: state a larger one")


@torch.no_grad()
def root_unverified(target, draft, prompt: list[int], k: int, temperature: float, top_k: int = 0,
                    top_p: float = 1.0) -> dict:
    """The joint law of the first ``k`` tokens of a sampler that emits the draft's first token without verifying
    it and the target's tokens after it: the stated error every joint-distribution test is sized to detect."""
    exact = exact_joint(target, prompt, k, temperature, top_k, top_p)
    at_root = [standardize(m(torch.tensor([prompt])).logits[0, -1], temperature, top_k, top_p).double().numpy()
               for m in (target, draft)]
    p, q = at_root
    return {key: v / p[key[0]] * q[key[0]] for key, v in exact.items() if p[key[0]] > 0}


@torch.no_grad()
def exact_joint(model, prompt: list[int], k: int, temperature: float, top_k: int = 0, top_p: float = 1.0) -> dict:
    """Exact distribution of the first ``k`` sampled tokens of ``model`` (enumerates the vocabulary)."""
    vocab = model.config.vocab_size
    joint = {(): 1.0}
    for _ in range(k):
        prefixes = list(joint)
        ids = torch.tensor([prompt + list(p) for p in prefixes])
        probs = standardize(model(ids).logits[:, -1], temperature, top_k, top_p).double().numpy()
        joint = {p + (t,): joint[p] * probs[i, t] for i, p in enumerate(prefixes) for t in range(vocab)}
    return {key: v for key, v in joint.items() if v > 0}
