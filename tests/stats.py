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
    big = [k for k, p in expected_p.items() if p * n >= min_expected]
    obs = [observed.get(k, 0) for k in big]
    exp = [expected_p[k] * n for k in big]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp)
    if rest_exp >= min_expected:
        obs.append(rest_obs)
        exp.append(rest_exp)
    else:  # fold a tiny remainder into the largest cell
        i = int(np.argmax(exp))
        obs[i] += rest_obs
        exp[i] += rest_exp
    if len(obs) < 2:
        raise ValueError(f"{n} samples leave one cell after pooling cells expected fewer than {min_expected:g} "
                         "times: the G-test checks nothing; sample more")
    return float(stats.power_divergence(obs, exp, lambda_="log-likelihood").pvalue)


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
