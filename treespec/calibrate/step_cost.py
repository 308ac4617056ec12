"""The step cost model behind tree sizing (``treespec.calibrate.costs``, whose docstring gives the formula):
the draft's cost curve ``t_q(w)``, the widths a tree's levels forward, a step's draft seconds, and the
search over depth limits, budgets and width limits that ``choose_tree`` reads its choice from."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tree_builders import SequoiaDP, TreeShape


def cost_curve(points: Mapping[int, float]) -> Callable[[float | np.ndarray], float | np.ndarray]:
    """``x -> seconds``: linear between measured points, flat below the first, and extended with the
    slope of the last two points beyond the last (a width past the measured ones costs more)."""
    xs = np.array(sorted(int(k) for k in points), dtype=np.float64)
    ys = np.array([float(points[int(k)]) for k in xs])
    if np.any(ys < 0) or not np.all(np.isfinite(ys)):
        raise ValueError(f"latencies must be finite and >= 0, got {dict(points)}")
    slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else 0.0

    def at(x: float | np.ndarray) -> float | np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return np.where(x <= xs[-1], np.interp(x, xs, ys), ys[-1] + max(slope, 0.0) * (x - xs[-1]))

    return at


def forwarded_widths(shape: TreeShape) -> list[int]:
    """Nodes of each level ``1..depth-1`` that have children: the width of each draft forward."""
    per_level: dict[int, set] = {}
    for p in shape.paths:
        if len(p) > 1:
            per_level.setdefault(len(p) - 1, set()).add(p[:-1])
    return [len(per_level.get(level, ())) for level in range(1, shape.depth)]


def draft_seconds(t_q: Callable[[Any], Any], shape: TreeShape) -> float:
    """Draft seconds of one step of ``shape``: the root's forward and one per level with children."""
    if not shape.depth:
        return 0.0
    return float(t_q(1)) + float(np.sum(t_q(np.array(forwarded_widths(shape)))))


def checked_costs(target_latency: Mapping[int, float], draft_cost: float | Mapping[int, float] | None,
                 overhead: float) -> tuple[list[int], np.ndarray, Callable[[Any], Any]]:
    """``choose_tree``'s costs checked: the measured sizes, their seconds and the draft's ``t_q(width)``."""
    sizes = sorted(int(s) for s in target_latency)
    if 1 not in target_latency:
        raise ValueError("target_latency must include size 1 (the cost of plain decoding)")
    lat = np.array([float(target_latency[s]) for s in sizes])
    if np.any(lat <= 0):
        raise ValueError("latencies must be > 0")
    if overhead < 0:
        raise ValueError(f"overhead must be >= 0 seconds, got {overhead}")
    if isinstance(draft_cost, Mapping):
        if not draft_cost:
            raise ValueError("draft_cost is an empty dict; give width -> seconds, one number, or None")
        return sizes, lat, cost_curve(draft_cost)
    if draft_cost is not None and float(draft_cost) < 0:
        raise ValueError(f"draft_cost must be >= 0, got {draft_cost}")
    flat = 0.0 if draft_cost is None else float(draft_cost)
    return sizes, lat, lambda w: np.full(np.shape(w), flat) if np.ndim(w) else flat


def search(rows: Any, bs: list[int], depths: list[int], width_limits: Sequence[int | None],
            t_of: Callable[[float], float], t_q: Callable[[Any], Any], root_seconds: np.ndarray,
            overhead: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, Callable[[int, int], TreeShape]]:
    """Per (depth, budget) cell, the best predicted tau / seconds over the width limits: ``(taus, seconds,
    widths, shape_of)``, ``shape_of(i, j)`` the cell's shape (built on demand: a search costs thousands and
    keeps one); depth 0 is the root alone at each budget."""
    taus = np.ones((len(depths), len(bs)))
    seconds = np.tile(root_seconds, (len(depths), 1))
    widths = np.zeros((len(depths), len(bs)), dtype=np.int64)
    best_cells: dict[tuple[int, int], tuple[SequoiaDP, int]] = {}
    # seconds per target size and per draft width, tabulated once: the cells cost thousands of shapes
    t_size = [t_of(n) for n in range(bs[-1] + 1)]
    t_width = [float(t) for t in t_q(np.arange(bs[-1] + 1))]
    for i, d in enumerate(depths[1:], start=1):
        best = np.full(len(bs), -np.inf)
        for w in width_limits:
            dp = SequoiaDP(rows, bs[-1], max_depth=d, max_width=w)
            values = dp.values.tolist()
            for j, n in enumerate(bs):
                size = dp.nodes(n)
                branching = dp.branching(size)  # draft forwards: the root's, then one per level with children
                draft = t_width[1] + sum(t_width[b] for b in branching[1:]) if branching else 0.0
                secs = t_size[size] + draft + overhead
                tau = values[n]
                if tau / secs > best[j] * (1 + 1e-12):
                    best[j] = tau / secs
                    taus[i, j], seconds[i, j], widths[i, j] = tau, secs, -1 if w is None else w
                    best_cells[i, j] = dp, size

    def shape_of(i: int, j: int) -> TreeShape:
        dp, size = best_cells.get((i, j), (None, 1))
        return TreeShape() if dp is None else dp.shape(size)

    return taus, seconds, widths, shape_of
