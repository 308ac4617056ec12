"""Closed-form math against the worked numbers of the seeds (blog post, Leviathan et al. 2023)."""

from __future__ import annotations

import numpy as np
import pytest

from tree_builders import chain, kary
from treespec.calibrate.analysis import (
    chain_expected_tokens,
    chain_expected_tokens_alpha,
    operations_factor,
    optimal_gamma,
    predicted_tau,
    sequoia_speedup,
    speedup,
    walltime_improvement,
)


def test_blog_worked_example():
    betas = [0.88, 0.96, 0.65]
    # E[n] = .88 + .88*.96 + .88*.96*.65 = 0.88 + 0.8448 + 0.54912
    assert chain_expected_tokens(betas, include_bonus=False) == pytest.approx(2.27392)
    assert round(chain_expected_tokens(betas, include_bonus=False), 3) == 2.274
    # plus the guaranteed bonus/correction token
    assert round(chain_expected_tokens(betas), 2) == 3.27
    # "reversed order": the weak 0.65 proposed first, i.e. betas [0.65, 0.96, 0.88]
    reversed_betas = betas[::-1]
    assert reversed_betas == [0.65, 0.96, 0.88]
    assert chain_expected_tokens(reversed_betas, include_bonus=False) == pytest.approx(1.82312)
    assert round(chain_expected_tokens(reversed_betas, include_bonus=False), 2) == 1.82


def test_chain_expected_tokens_edges():
    assert chain_expected_tokens([]) == 1.0
    assert chain_expected_tokens([1.0, 1.0, 1.0]) == 4.0
    assert chain_expected_tokens([0.0, 1.0]) == 1.0
    with pytest.raises(ValueError):
        chain_expected_tokens([1.2])


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.5, 0.8, 0.99])
@pytest.mark.parametrize("gamma", [0, 1, 3, 7])
def test_alpha_formula_is_iid_chain(alpha: float, gamma: int):
    # Eq. (1) is the chain formula with every beta equal to alpha
    assert chain_expected_tokens_alpha(alpha, gamma) == pytest.approx(chain_expected_tokens([alpha] * gamma))
    assert chain_expected_tokens_alpha(alpha, gamma) == pytest.approx(chain(gamma).expected_tokens((alpha,)))


def test_alpha_one():
    assert chain_expected_tokens_alpha(1.0, 5) == 6.0
    assert speedup(1.0, 5, 0.0) == 6.0
    with pytest.raises(ValueError):
        chain_expected_tokens_alpha(1.5, 2)
    with pytest.raises(ValueError):
        chain_expected_tokens_alpha(0.5, -1)
    with pytest.raises(ValueError, match="gamma must be an int >= 0, got 2.0"):  # never truncated
        chain_expected_tokens_alpha(0.5, 2.0)
    with pytest.raises(ValueError, match="alpha must be a probability in \\[0, 1\\], got None"):
        chain_expected_tokens_alpha(None, 2)


# Leviathan et al. 2023, Table 1 (c = c_hat = 0): alpha, gamma, OPERATIONS, SPEED
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize("alpha, gamma, ops, speed", TABLE_1)
def test_leviathan_table_1(alpha: float, gamma: int, ops: float, speed: float):
    assert round(speedup(alpha, gamma, 0.0), 2) == speed
    assert round(walltime_improvement(alpha, gamma, 0.0), 2) == speed
    assert round(operations_factor(alpha, gamma, 0.0), 2) == ops


def test_leviathan_speedups_with_drafter_cost():
    # Appendix A.5 (temperature-0 lenience): c = 0.015, gamma = 8, alpha .75/.8/.87 -> 3.3X/3.9X/4.9X
    for alpha, printed in [(0.75, 3.3), (0.8, 3.9), (0.87, 4.9)]:
        assert round(speedup(alpha, 8, 0.015), 1) == printed
    # Sec. 3.6: a bigram drafter, alpha ~ 0.2, c = 0, gamma = 3 -> 1.25X
    assert round(speedup(0.2, 3, 0.0), 2) == 1.25
    # Corollary 3.9: gamma = 1 gives (1 + alpha) / (1 + c)
    assert speedup(0.6, 1, 0.1) == pytest.approx(1.6 / 1.1)
    # Table 4, "Exp" column: the paper's c is rounded to 2 decimals, so only +-0.07 is reproducible
    for alpha, gamma, c, exp in [(0.75, 7, 0.02, 3.2), (0.82, 7, 0.11, 2.5), (0.65, 5, 0.02, 2.4),
                                 (0.73, 5, 0.04, 2.6)]:
        assert speedup(alpha, gamma, c) == pytest.approx(exp, abs=0.05)


def test_optimal_gamma_hand_checked_points():
    # alpha 0.8, c 0.1: E = 5 (1 - 0.8^(g+1)); g=5: 3.68928/1.5 = 2.4595, g=6: 3.951424/1.6 = 2.4696,
    # g=7: 4.1611392/1.7 = 2.4477 -> 6
    assert optimal_gamma(0.8, 0.1) == 6
    # alpha 0.5, c 0.2: g=1: 1.5/1.2 = 1.25, g=2: 1.75/1.4 = 1.25 (tie), g=3: 1.875/1.6 -> smallest, 1
    assert optimal_gamma(0.5, 0.2) == 1
    # Corollary 3.9: no improvement when alpha <= c
    assert optimal_gamma(0.3, 0.3) == 0
    assert optimal_gamma(0.2, 0.5) == 0
    assert optimal_gamma(0.31, 0.3) >= 1
    # c = 0: more drafting always pays, up to the cap
    assert optimal_gamma(0.7, 0.0, max_gamma=40) == 40


@pytest.mark.parametrize("alpha", [0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("c", [0.01, 0.02, 0.05, 0.1, 0.2])
def test_optimal_gamma_is_argmax_and_monotone(alpha: float, c: float):
    g = optimal_gamma(alpha, c, max_gamma=200)
    s = [speedup(alpha, k, c) for k in range(0, 201)]
    assert s[g] == pytest.approx(max(s), rel=1e-12)
    # Fig. 3: the optimal gamma grows with alpha and shrinks with c
    assert optimal_gamma(min(alpha + 0.04, 1.0), c, 200) >= g
    assert optimal_gamma(alpha, c * 2, 200) <= g


def test_predicted_tau_and_sequoia_speedup():
    acc = (0.6, 0.2)
    shape = kary((2, 1))
    assert predicted_tau(shape, acc) == pytest.approx(1 + 0.6 + 0.2 + 0.36 + 0.12)
    # G / (t(n)/t(1) + d c)
    assert sequoia_speedup(5.08, 1.1, 8, 0.02) == pytest.approx(5.08 / (1.1 + 0.16))
    assert isinstance(sequoia_speedup(2.0, 1.0, 1, 0.0), float)
    out = sequoia_speedup(np.array([2.0, 3.0]), np.array([1.0, 2.0]), np.array([1, 3]), 0.1)
    np.testing.assert_allclose(out, [2.0 / 1.1, 3.0 / 2.3])
    # a chain with t(n) = t(1) (enough parallel compute) is Theorem 3.8
    assert sequoia_speedup(chain_expected_tokens_alpha(0.8, 5), 1.0, 5, 0.05) == pytest.approx(speedup(0.8, 5, 0.05))
    with pytest.raises(ValueError):
        sequoia_speedup(2.0, 0.0, 1, 0.1)
