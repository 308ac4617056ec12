"""Closed-form speculative-decoding math (numpy; arguments checked by ``treespec.core.checks``).

Conventions (``docs/design.md``, "Definitions"): *expected tokens* and *tau* include the bonus/correction
token, so they are always >= 1; ``gamma`` is the number of drafted tokens; ``c`` is the cost of one
drafter step relative to one target step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.checks import check_int, check_probability

if TYPE_CHECKING:  # pragma: no cover
    from tree_builders import TreeShape

__all__ = [
    "chain_expected_tokens",
    "chain_expected_tokens_alpha",
    "operations_factor",
    "optimal_gamma",
    "predicted_tau",
    "sequoia_speedup",
    "speedup",
    "walltime_improvement",
]


def _probability(name: str, x: float) -> float:
    """``x`` as a probability in [0, 1] (:func:`treespec.core.checks.check_probability`, None refused)."""
    p = check_probability(name, x)
    if p is None:
        raise ValueError(f"{name} must be a probability in [0, 1], got None")
    return p


def chain_expected_tokens(betas: Sequence[float], include_bonus: bool = True) -> float:
    """Expected tokens of a chain whose position ``i`` is accepted with probability ``betas[i]``
    given that every earlier position was accepted.

    ``1 + b1 + b1*b2 + b1*b2*b3 + ...``: a token counts only if every earlier one was accepted
    (left-to-right verification); the leading 1 is the bonus/correction token, dropped with
    ``include_bonus=False`` (then it is the expected number of accepted drafted tokens).
    """
    b = np.asarray(betas, dtype=np.float64)
    if b.ndim != 1 or np.any(b < 0) or np.any(b > 1):
        raise ValueError("betas must be a vector of probabilities in [0, 1]")
    drafted = float(np.cumprod(b).sum())
    return drafted + 1.0 if include_bonus else drafted


def chain_expected_tokens_alpha(alpha: float, gamma: int) -> float:
    """Expected tokens of a ``gamma``-token chain with i.i.d. acceptance ``alpha``, bonus included.

    Leviathan et al. (2023) Eq. (1): ``(1 - alpha^(gamma+1)) / (1 - alpha)``; ``gamma + 1`` when
    ``alpha = 1``.
    """
    a, g = _probability("alpha", alpha), check_int("gamma", gamma, 0)
    if a == 1.0:
        return float(g + 1)
    return (1.0 - a ** (g + 1)) / (1.0 - a)


def speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement factor, Leviathan et al. Theorem 3.8:
    ``(1 - alpha^(gamma+1)) / ((1 - alpha) (gamma c + 1))``.

    One iteration costs one target step plus ``gamma`` drafter steps of relative cost ``c`` and
    yields Eq. (1) tokens; plain decoding costs one target step per token.
    """
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    g = check_int("gamma", gamma, 0)
    return chain_expected_tokens_alpha(alpha, g) / (g * float(c) + 1.0)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Alias of :func:`speedup` (the paper's name for Theorem 3.8's quantity)."""
    return speedup(alpha, gamma, c)


def operations_factor(alpha: float, gamma: int, c_hat: float = 0.0) -> float:
    """Expected factor of increase in arithmetic operations, Leviathan et al. Theorem 3.11:
    ``(1 - alpha) (gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))``.

    ``c_hat``: drafter operations per token relative to the target's. Table 1 uses ``c_hat = 0``.
    """
    if c_hat < 0:
        raise ValueError(f"c_hat must be >= 0, got {c_hat}")
    g = check_int("gamma", gamma, 0)
    return (g * float(c_hat) + g + 1.0) / chain_expected_tokens_alpha(alpha, g)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 100) -> int:
    """The ``gamma`` in ``0..max_gamma`` maximising :func:`speedup` (Leviathan et al. Sec. 3.5,
    Fig. 3); the smallest one on ties.

    Returns 0 when no ``gamma >= 1`` beats plain decoding (speedup 1): by Corollary 3.9 that is
    exactly when ``alpha <= c``. With ``c = 0`` the speedup grows with ``gamma`` for any
    ``alpha > 0``, so the answer is ``max_gamma``.
    """
    _probability("alpha", alpha)
    max_gamma = check_int("max_gamma", max_gamma, 0)
    best_g, best = 0, 1.0
    for g in range(1, max_gamma + 1):
        s = speedup(alpha, g, c)
        if s > best * (1.0 + 1e-12):
            best_g, best = g, s
    return best_g


def predicted_tau(shape: "TreeShape", acceptance: Any) -> float:
    """Predicted tokens per step of a tree shape under a positional acceptance vector or per-depth
    matrix: ``shape.expected_tokens(acceptance)``."""
    return float(shape.expected_tokens(acceptance))


def sequoia_speedup(expected_tokens: Any, t_n_over_t1: Any, depth: Any, c: float) -> Any:
    """Sequoia's hardware-aware speedup of a tree: ``G / (t(n)/t(1) + d c)``.

    ``G``: expected tokens per step; ``t(n)/t(1)``: cost of one target forward over the ``n``-node
    tree relative to a one-token forward; ``d``: drafter steps (tree depth) of relative cost ``c``.
    Broadcasts over numpy arrays (e.g. one entry per candidate budget); returns a float for scalars.
    """
    G = np.asarray(expected_tokens, dtype=np.float64)
    t = np.asarray(t_n_over_t1, dtype=np.float64)
    d = np.asarray(depth, dtype=np.float64)
    if np.any(t <= 0) or np.any(d < 0) or c < 0:
        raise ValueError("t_n_over_t1 must be > 0, depth and c must be >= 0")
    out = G / (t + d * float(c))
    return float(out) if out.ndim == 0 else out
