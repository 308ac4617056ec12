"""The step cost model behind tree sizing (Sequoia, sec. 4) and the choice it makes: the budget, depth and width
limit with the best predicted wall-clock speed under a machine's measured costs (``treespec.calibrate.costs``).

One step with a tree ``T`` of ``n`` nodes and depth ``D`` costs (seconds)

    time(T) = t(n) + [D >= 1] (t_q(1) + sum_{l=1}^{D-1} t_q(f_l)) + o,

where ``t(n)`` is one target forward over ``n`` tree tokens, ``t_q(w)`` one draft forward over
``w`` tokens (``t_q(1)``: the root, fed at the start of the step; ``f_l``: the nodes of level
``l`` that have children, the ones ``ModelDrafter`` forwards), and ``o`` a fixed per-step
overhead. It commits ``G(T)`` tokens on average (the Sequoia DP's best shape for a budget, depth
and width limit under a positional acceptance vector). Plain decoding commits one token per
``p`` seconds (the target's own decoding, timed: ``measure_plain_decode``; ``t(1) + o`` where it was not), so

    speedup(T) = G(T) p / time(T),      tokens per second = G(T) / time(T).

A run of ``N`` new tokens after a prompt also pays its prefill: ``P`` seconds in all, ``P_d`` of them the
drafters' pass over the prompt, which plain decoding does not run. Plain decoding's prefill gives its first
token, so (``run_speedup``)

    run speedup = ((P - P_d) + (N - 1) p) / (P + N time(T) / G(T)).

Where ``t(n)`` is flat (a GPU, or bfloat16 matmuls on a CPU with wide bf16 units) wide, shallow
trees pay; where it grows from the start (float32 on a small CPU) the best tree is a short chain.
A draft whose ``t_q(w)`` grows with ``w`` favours narrow levels: the chooser searches the DP's
width limit too. ``t_q = 0`` for model-free drafters (n-gram).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from tree_builders import SequoiaDP, TreeShape, for_budget

from ..core.checks import check_int
from .acceptance import MeasuredAcceptance


def run_speedup(tokens: float, step_seconds: float, tau: float, plain_seconds: float, prefill: float = 0.0,
                draft_prefill: float = 0.0) -> float:
    """The predicted speedup over plain decoding of a run of ``tokens`` new tokens (module docstring: the run
    speedup): ``prefill`` seconds before the first step, ``draft_prefill`` of them the drafters' (charged to the tree
    alone), then steps of ``step_seconds`` committing ``tau`` tokens each, against ``plain_seconds`` per token."""
    plain = prefill - draft_prefill + (tokens - 1) * plain_seconds
    return plain / (prefill + tokens * step_seconds / tau)


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
    sizes = sorted(check_int("a target_latency size", s, 1, "its keys are tree sizes, ints such as 1, 4, 16")
                   for s in target_latency)
    if 1 not in sizes:
        raise ValueError("target_latency must include size 1 (the cost of plain decoding)")
    lat = np.array([float(target_latency[s]) for s in sizes])
    if not np.all(np.isfinite(lat)) or np.any(lat <= 0):
        raise ValueError(f"latencies must be finite and > 0, got {dict(target_latency)}")
    if not math.isfinite(overhead) or overhead < 0:
        raise ValueError(f"overhead must be finite and >= 0 seconds, got {overhead}")
    if isinstance(draft_cost, Mapping):
        if not draft_cost:
            raise ValueError("draft_cost is an empty dict; give width -> seconds, one number, or None")
        return sizes, lat, cost_curve(draft_cost)
    if draft_cost is not None and not (math.isfinite(float(draft_cost)) and float(draft_cost) >= 0):  # NaN too
        raise ValueError(f"draft_cost must be finite and >= 0, got {draft_cost}")
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


@dataclass(frozen=True)
class Builder:
    """A static tree builder sized in place of Sequoia's DP (a chain, SpecInfer's k-ary tree), its tree in a (budget,
    depth limit) cell the one a run of that budget and depth drafts (``tree_builders.for_budget(name, budget,
    max_depth=depth)``, as ``recipes.shape_for`` builds it)."""

    name: str
    kary_width: int = 2

    def shape(self, budget: int, depth: int) -> TreeShape:
        return for_budget(self.name, budget, None, depth, kary_width=self.kary_width)

    def describe(self) -> str:
        """What the why-lines call it."""
        return f"k-ary tree (width {self.kary_width})" if self.name == "kary" else self.name


def search_builder(rows: Any, bs: list[int], depths: list[int], builder: Builder, t_of: Callable[[float], float],
                   t_q: Callable[[Any], Any], root_seconds: np.ndarray, overhead: float
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Callable[[int, int], TreeShape]]:
    """:func:`search` for a ``builder``'s own trees: each (depth limit, budget) cell holds the tree the builder makes
    there, scored by its expected tokens under the same rows and costed by the same step model (its size, its
    levels' widths) as the DP's trees are, so that every builder is sized by one model. ``widths``: the tree's widest
    node."""
    taus = np.ones((len(depths), len(bs)))
    seconds = np.tile(root_seconds, (len(depths), 1))
    widths = np.zeros((len(depths), len(bs)), dtype=np.int64)
    shapes: dict[tuple[int, int], TreeShape] = {}
    for i, d in enumerate(depths[1:], start=1):
        for j, n in enumerate(bs):
            shape = builder.shape(n, d) if n >= 2 else TreeShape()
            if not shape.depth:
                continue
            taus[i, j] = shape.expected_tokens(rows)
            seconds[i, j] = t_of(shape.size) + draft_seconds(t_q, shape) + overhead
            widths[i, j], shapes[i, j] = shape.max_width, shape
    return taus, seconds, widths, lambda i, j: shapes.get((i, j), TreeShape())


@dataclass
class Choice:
    """The tree ``choose_tree`` picked and the table it picked it from.

    ``taus[i, j]``, ``seconds[i, j]`` and ``speedups[i, j]`` are for depth limit ``depths[i]`` and
    budget ``budgets[j]`` (best over the width limits searched; ``widths[i, j]`` is the one kept);
    depth 0 is plain decoding (tau 1). When the choice is depth 0 (``shape`` is the root alone),
    speculation does not pay here: generate with no drafter.
    """

    budget: int
    depth: int
    shape: TreeShape
    tau: float  # predicted tokens per step of ``shape``
    speedup: float  # predicted, versus plain decoding with the target
    budgets: list[int]
    depths: list[int]
    taus: np.ndarray  # [len(depths), len(budgets)]
    speedups: np.ndarray  # [len(depths), len(budgets)]
    cost_ratio: np.ndarray  # [len(budgets)]: t(n) / t(1)
    c: float  # draft seconds of a one-token level / t(1)
    seconds: np.ndarray | None = None  # [len(depths), len(budgets)]: predicted seconds per step
    widths: np.ndarray | None = None  # [len(depths), len(budgets)]: the width limit of each cell
    step_seconds: float = 0.0  # predicted seconds per step of ``shape``
    plain_seconds: float = 0.0  # seconds per token of plain decoding (``choose_tree``'s ``plain``)

    @property
    def width(self) -> int:
        """The width limit the chosen shape was built under."""
        return int(self.widths[self.depths.index(self.depth), self.budgets.index(self.budget)])

    @property
    def tokens_per_second(self) -> float:
        """Predicted tokens per second of ``shape`` (``tau / step_seconds``)."""
        return self.tau / self.step_seconds if self.step_seconds else 0.0

    def rows(self) -> list[dict[str, float]]:
        """The table as records (depth, budget, tau, relative cost, seconds, speedup)."""
        return [
            {"depth": d, "budget": n, "tau": float(self.taus[i, j]),
             "cost": float(self.seconds[i, j] / self.plain_seconds), "seconds": float(self.seconds[i, j]),
             "max_width": int(self.widths[i, j]), "speedup": float(self.speedups[i, j])}
            for i, d in enumerate(self.depths) for j, n in enumerate(self.budgets)
        ]

    def as_dict(self) -> dict[str, Any]:
        """The choice and its whole table as JSON types (the demo's ``report.json``)."""
        return {"budget": self.budget, "depth": self.depth, "max_width": self.width,
                "size": self.shape.size, "paths": [list(p) for p in self.shape.paths], "tau": self.tau,
                "speedup": self.speedup, "step_seconds": self.step_seconds,
                "tokens_per_second": self.tokens_per_second, "plain_seconds": self.plain_seconds, "c": self.c,
                "budgets": self.budgets, "depths": self.depths, "taus": self.taus.tolist(),
                "speedups": self.speedups.tolist(), "seconds": self.seconds.tolist(),
                "widths": self.widths.tolist(), "cost_ratio": self.cost_ratio.tolist()}

    def __repr__(self) -> str:
        return (f"Choice(budget={self.budget}, depth={self.depth}, size={self.shape.size}, "
                f"widths={self.shape.widths}, tau={self.tau:.3f}, speedup={self.speedup:.3f}, "
                f"{self.tokens_per_second:.2f} tok/s)")


def _rows(acceptance: MeasuredAcceptance | Any, per_depth: bool) -> Any:
    if isinstance(acceptance, MeasuredAcceptance):
        return acceptance.matrix if per_depth else acceptance.vector
    return acceptance


def _search_space(largest: int, budgets: Sequence[int] | None, max_depth: int, max_width: int | None,
                  width_limits: Sequence[int | None] | None, per_width: bool
                  ) -> tuple[list[int], list[int], Sequence[int | None]]:
    """``choose_tree``'s budgets, depths and width limits, checked against the ``largest`` measured size."""
    bs = list(range(1, largest + 1)) if budgets is None else sorted(
        {check_int("a budget", b, 1, "budgets are tree sizes in tokens, ints such as 8") for b in budgets})
    if not bs or bs[-1] > largest:
        raise ValueError(f"budgets must lie in [1, {largest}] (the largest measured size), got {bs}")
    max_depth = check_int("max_depth", max_depth, 0)
    if width_limits is None:
        top = 16 if max_width is None else int(max_width)
        width_limits = [w for w in (1, 2, 4, 8, 16, 32, 64) if w < top] + [max_width] if per_width else [max_width]
    return bs, list(range(int(max_depth) + 1)), width_limits


def choose_tree(
    acceptance: MeasuredAcceptance | Any,
    target_latency: Mapping[int, float],
    draft_cost: float | Mapping[int, float] | None,
    budgets: Sequence[int] | None = None,
    max_depth: int = 12,
    max_width: int | None = 16,
    per_depth: bool = False,
    *,
    width_limits: Sequence[int | None] | None = None,
    overhead: float = 0.0,
    plain: float | None = None,
    builder: Builder | None = None,
) -> Choice:
    """The tree with the best predicted speed ``G(T) / time(T)`` (module docstring).

    Args:
        acceptance: a measured :class:`~treespec.calibrate.acceptance.MeasuredAcceptance` (its vector, or its per-depth
            matrix with ``per_depth=True``) or a raw vector / matrix.
        target_latency: seconds of one target forward per tree size (``measure_latency``); must
            include size 1. ``t(n)`` is interpolated linearly between measured sizes.
        draft_cost: the draft's seconds per forward: per level width (``draft_level_latency``, a
            dict ``width -> seconds``), one number for every width (``draft_level_cost``), or
            ``None`` / 0 for a model-free drafter.
        budgets: candidate budgets (tokens per verification, root included), each within the
            measured sizes; default every integer from 1 to the largest measured size.
        max_depth, max_width: limits of the Sequoia DP (depths ``0..max_depth`` are tabulated).
        per_depth: use the acceptance's per-depth matrix instead of its vector.
        width_limits: DP width limits to search (narrow levels cost less with a width-dependent
            draft); default ``1, 2, 4, ... max_width`` for a per-width ``draft_cost``, else ``max_width``.
        overhead: fixed seconds per step (engine bookkeeping), added to every step.
        plain: seconds per token of plain decoding, what speedups are relative to (the choice does not depend on
            it); None: ``t(1) + overhead``, the engine's own step without a draft.
        builder: size this builder's trees (a chain, a k-ary tree: :class:`Builder`) instead of the
            Sequoia DP's; the width limits are then not searched (``widths`` holds each tree's widest node).

    Each cell's shape is the DP's smallest optimal one, costed at its own size and depth. Ties go
    to the smaller budget, then the smaller depth, then the narrower width limit.
    """
    sizes, lat, t_q = checked_costs(target_latency, draft_cost, overhead)
    t1 = float(target_latency[1])
    c = float(t_q(1)) / t1
    bs, depths, width_limits = _search_space(sizes[-1], budgets, max_depth, max_width, width_limits,
                                             isinstance(draft_cost, Mapping))
    t_of = lambda n: float(np.interp(n, sizes, lat))  # noqa: E731
    ratio = np.array([t_of(n) for n in bs]) / t1
    plain = t1 + overhead if plain is None else float(plain)
    if not (math.isfinite(plain) and plain > 0):
        raise ValueError(f"plain decoding takes a finite number > 0 of seconds per token, got {plain}")
    # depth 0 at any budget is the root alone: one forward of one token, whatever the budget would allow
    rows, root = _rows(acceptance, per_depth), np.full(len(bs), t1 + overhead)
    taus, seconds, widths, shape_of = (
        search(rows, bs, depths, width_limits, t_of, t_q, root, overhead) if builder is None
        else search_builder(rows, bs, depths, builder, t_of, t_q, root, overhead))
    speedups = taus * plain / seconds
    top = float(speedups.max())
    # first in (budget, depth) order reaching the maximum (up to rounding)
    hits = np.argwhere(speedups.T >= top - 1e-12 * max(1.0, top))
    j, i = (int(v) for v in hits[0])
    return Choice(budget=bs[j], depth=depths[i], shape=shape_of(i, j), tau=float(taus[i, j]),
                  speedup=float(speedups[i, j]), budgets=bs, depths=depths, taus=taus, speedups=speedups,
                  cost_ratio=ratio, c=c, seconds=seconds, widths=widths, step_seconds=float(seconds[i, j]),
                  plain_seconds=plain)
