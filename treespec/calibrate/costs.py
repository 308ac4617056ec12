"""Hardware-aware tree sizing (Sequoia, sec. 4): measure what drafting and verifying cost on this
machine and choose the budget, depth and width limit with the best predicted wall-clock speed (the
precision is chosen before, per model: ``treespec.models.precision.auto_precision``).

One step with a tree ``T`` of ``n`` nodes and depth ``D`` costs (seconds)

    time(T) = t(n) + [D >= 1] (t_q(1) + sum_{l=1}^{D-1} t_q(f_l)) + o,

where ``t(n)`` is one target forward over ``n`` tree tokens, ``t_q(w)`` one draft forward over
``w`` tokens (``t_q(1)``: the root, fed at the start of the step; ``f_l``: the nodes of level
``l`` that have children, the ones ``ModelDrafter`` forwards), and ``o`` a fixed per-step
overhead. It commits ``G(T)`` tokens on average (the Sequoia DP's best shape for a budget, depth
and width limit under a positional acceptance vector). Plain decoding commits one token per
``t(1) + o``, so

    speedup(T) = G(T) (t(1) + o) / time(T),      tokens per second = G(T) / time(T).

Where ``t(n)`` is flat (a GPU, or bfloat16 matmuls on a CPU with wide bf16 units) wide, shallow
trees pay; where it grows from the start (float32 on a small CPU) the best tree is a short chain.
A draft whose ``t_q(w)`` grows with ``w`` favours narrow levels: the chooser searches the DP's
width limit too. ``t_q = 0`` for model-free drafters (n-gram).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from tree_builders import TreeShape, sequoia

from ..common.files import JSONFile
from ..common.machine import machine, model_name, version
from ..models.precision import precision_of
from ..models.timing import DEFAULT_SIZES, measure_latency, random_tree
from .acceptance import MeasuredAcceptance
from .step_cost import checked_costs, cost_curve, draft_seconds, search

__all__ = ["Choice", "Profile", "choose_tree", "draft_level_cost", "draft_level_latency", "measure_latency", "profile",
           "random_tree"]

DEFAULT_WIDTHS = (1, 2, 4, 8, 16)  # draft level widths profiled


def draft_level_cost(draft: torch.nn.Module, tokens: int = 4, context: int = 128, repeats: int = 3) -> float:
    """Seconds of one draft forward over one tree level of ``tokens`` nodes (what ``ModelDrafter``
    spends per depth), after ``context`` cached tokens; median of ``repeats``."""
    return measure_latency(draft, (tokens,), context=context, repeats=repeats)[int(tokens)]


def draft_level_latency(draft: torch.nn.Module, widths: Sequence[int] = DEFAULT_WIDTHS, context: int = 128,
                        repeats: int = 3, compiled: bool | str = False) -> dict[int, float]:
    """Seconds of one draft forward over a tree level of each width in ``widths`` (the draft's cost curve);
    ``compiled``: as ``measure_latency``."""
    return measure_latency(draft, widths, context=context, repeats=repeats, compiled=compiled)


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
    plain_seconds: float = 0.0  # seconds per token of plain decoding, t(1) + overhead

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
        overhead: fixed seconds per step (engine bookkeeping), added to every step and to plain decoding.

    Each cell's shape is the DP's smallest optimal one, costed at its own size and depth. Ties go
    to the smaller budget, then the smaller depth, then the narrower width limit.
    """
    sizes, lat, t_q = checked_costs(target_latency, draft_cost, overhead)
    t1 = float(target_latency[1])
    c = float(t_q(1)) / t1
    bs = list(range(1, sizes[-1] + 1)) if budgets is None else sorted({int(b) for b in budgets})
    if not bs or bs[0] < 1 or bs[-1] > sizes[-1]:
        raise ValueError(f"budgets must lie in [1, {sizes[-1]}] (the largest measured size), got {bs}")
    if int(max_depth) != max_depth or max_depth < 0:
        raise ValueError(f"max_depth must be an int >= 0, got {max_depth!r}")
    if width_limits is None:
        top = 16 if max_width is None else int(max_width)
        width_limits = ([w for w in (1, 2, 4, 8, 16, 32, 64) if w < top] + [max_width]
                        if isinstance(draft_cost, Mapping) else [max_width])
    t_of = lambda n: float(np.interp(n, sizes, lat))  # noqa: E731
    ratio = np.array([t_of(n) for n in bs]) / t1
    depths = list(range(int(max_depth) + 1))
    plain = t1 + overhead
    taus, seconds, widths, shape_of = search(_rows(acceptance, per_depth), bs, depths, width_limits, t_of, t_q,
                                            ratio * t1 + overhead, overhead)
    speedups = taus * plain / seconds
    top = float(speedups.max())
    # first in (budget, depth) order reaching the maximum (up to rounding)
    hits = np.argwhere(speedups.T >= top - 1e-12 * max(1.0, top))
    j, i = (int(v) for v in hits[0])
    return Choice(budget=bs[j], depth=depths[i], shape=shape_of(i, j), tau=float(taus[i, j]),
                  speedup=float(speedups[i, j]), budgets=bs, depths=depths, taus=taus, speedups=speedups,
                  cost_ratio=ratio, c=c, seconds=seconds, widths=widths, step_seconds=float(seconds[i, j]),
                  plain_seconds=plain)


@dataclass
class Profile(JSONFile):
    """Measured costs of a target (and its draft) on one machine; JSON round trip with save/load.

    ``draft_level_latency`` (width -> seconds) is the draft's cost curve, None without a draft.
    """

    target_latency: dict[int, float]  # tree size -> seconds of one target forward
    draft_level_latency: dict[int, float] | None = None  # level width -> seconds of one draft forward
    meta: dict[str, Any] = field(default_factory=dict)
    step_overhead_seconds: float = 0.0  # fixed engine seconds per step
    #: seconds per cached token by which each point grows with the context ("target": size -> slope,
    #: "draft": width -> slope), measured at a second context (:func:`profile`); None: not measured
    context_slope: dict[str, dict[int, float]] | None = None

    @property
    def draft_cost(self) -> dict[int, float] | None:
        """What ``choose_tree`` is given: the draft's cost curve (None: a model-free drafter)."""
        return self.draft_level_latency or None

    def step_parts(self, shape: TreeShape) -> tuple[float, float]:
        """Predicted (drafting, verifying) seconds of one step of ``shape`` under this profile."""
        sizes = sorted(self.target_latency)
        verify = float(np.interp(shape.size, sizes, [self.target_latency[s] for s in sizes]))
        t_q = cost_curve(self.draft_level_latency) if self.draft_level_latency else (lambda w: np.zeros(np.shape(w)))
        return draft_seconds(t_q, shape), verify

    def at_context(self, context: float) -> "Profile":
        """This profile's costs after ``context`` cached tokens: each point moved along its measured
        slope from the context it was measured at (``meta["context"]``); itself without a slope.
        A floor of a tenth of the measured cost keeps a far extrapolation positive."""
        if not self.context_slope:
            return self
        shift = float(context) - float(self.meta.get("context", 128))

        def moved(points: dict[int, float], slopes: dict[int, float]) -> dict[int, float]:
            return {k: max(v + slopes.get(k, 0.0) * shift, 0.1 * v) for k, v in points.items()}

        curve = self.draft_level_latency
        return replace(self, target_latency=moved(self.target_latency, self.context_slope.get("target", {})),
                       draft_level_latency=None if curve is None else moved(curve, self.context_slope.get("draft", {})),
                       meta={**self.meta, "context": float(context)})

    def calibrated(self, shape: TreeShape, drafting: float, verifying: float, overhead: float, steps: int,
                   size: float | None = None) -> "Profile":
        """This profile corrected by real steps of ``shape``: measured seconds per step of drafting,
        verifying and engine work.

        The draft's curve is scaled by measured / predicted drafting (what a level really costs in a
        step: the catch-up of the committed tokens, the real context, the selection over the
        vocabulary); the target's curve, plain decoding's size 1 included, by measured / predicted
        verifying (a short run of plain decoding is too noisy to give size 1 a factor of its own:
        one pilot measured 1.5x where others measured 0.85-1.0x); the engine's seconds per step
        become ``overhead``. ``size``: the tokens the real steps verified on average (default ``shape.size``;
        fewer where a confidence stop or the end of generation trimmed trees). The factors are measured
        on one shape and applied to every shape."""
        draft, _ = self.step_parts(shape)
        size = float(size or shape.size)
        sizes = sorted(self.target_latency)
        verify = float(np.interp(size, sizes, [self.target_latency[s] for s in sizes]))
        d_factor = drafting / draft if draft > 0 else 1.0
        v_factor = verifying / verify if verify > 0 else 1.0
        lat = {k: v * v_factor for k, v in self.target_latency.items()}
        curve = None if self.draft_level_latency is None else {
            k: v * d_factor for k, v in self.draft_level_latency.items()}
        meta = {**self.meta, "calibration": {"steps": int(steps), "size": size, "draft_factor": d_factor,
                                             "verify_factor": v_factor,
                                             "overhead": float(overhead)}}
        slope = None if self.context_slope is None else {  # the factors scale the growth with the context too
            "target": {k: v * v_factor for k, v in self.context_slope.get("target", {}).items()},
            "draft": {k: v * d_factor for k, v in self.context_slope.get("draft", {}).items()}}
        return Profile(lat, curve, meta, float(overhead), slope)

    def for_batch(self, rows: int) -> "Profile":
        """The costs of one step of a batch of ``rows`` prompts (``treespec.core.batch``), each verifying its own
        tree: the target forward over a tree of ``n`` nodes per row is one forward over ``rows * n`` tokens,
        ``t(rows n)``, and a draft level of width ``w`` one draft forward over ``rows * w`` tokens; the engine's
        seconds per step are per row (each row's acceptance and drafting bookkeeping on the host). Plain batched
        decoding then costs ``t(rows)`` per ``rows`` tokens, so :meth:`choose` under this profile sizes the tree
        for the batch, down to plain decoding where ``t`` grows with the tokens. Only tree sizes whose
        ``rows * n`` was measured are kept (the target's curve is not extrapolated); the draft's curve is, as
        :func:`choose_tree` extends it past its widest level. Attention over each row's own context costs what
        one row's ``rows * n`` tokens over one context cost, so the context slopes carry over the same way."""
        rows = int(rows)
        if rows < 1:
            raise ValueError(f"a batch has >= 1 rows, got {rows}")
        if rows == 1:
            return self
        top = max(self.target_latency)
        if rows > top:
            raise ValueError(f"a step of {rows} rows verifies >= {rows} tokens; this profile measured the target up "
                             f"to {top}: profile larger sizes (costs.profile(sizes=...)) or use a smaller batch")
        sizes = [n for n in sorted(self.target_latency) if n * rows <= top]
        q, slopes = self.draft_level_latency, self.context_slope

        def batched(keys: Sequence[int], curve: Callable[[float], Any]) -> dict[int, float]:
            return {k: float(curve(k * rows)) for k in keys}

        def flat(points: Mapping[int, float]) -> Callable[[float], Any]:  # a slope may be < 0: no cost_curve
            xs = sorted(points)
            return lambda x: np.interp(x, xs, [points[k] for k in xs])

        slope = None if slopes is None else {part: batched(sizes if part == "target" else list(points), flat(points))
                                             for part, points in slopes.items() if points}
        return Profile(batched(sizes, cost_curve(self.target_latency)), None if q is None else batched(list(q), cost_curve(q)),
                       {**self.meta, "batch_rows": rows}, self.step_overhead_seconds * rows, slope)

    def step_seconds(self, shape: TreeShape) -> float:
        """Predicted seconds of one step of ``shape``: drafting, verifying and the engine's fixed seconds."""
        drafting, verifying = self.step_parts(shape)
        return drafting + verifying + self.step_overhead_seconds

    def best_branching(self, acceptance: Any, budget: int, max_depth: int) -> tuple[TreeShape, float, float] | None:
        """The fastest predicted tree of ``budget`` nodes (root included) that branches somewhere, under these
        costs: Sequoia's tree at each depth limit below a chain's, kept where a node has two or more children.
        Returns (shape, predicted tau, predicted seconds per step), None when no such tree exists (budget < 3).
        What a tuned chain is weighed against: on a machine where width costs, the chain wins by its cheaper
        levels, and this says by how much."""
        best = None
        for depth in range(1, min(int(max_depth), int(budget) - 1) + 1):
            shape = sequoia(acceptance, int(budget), max_depth=depth)
            if shape.max_width < 2:
                continue
            tau, seconds = shape.expected_tokens(acceptance), self.step_seconds(shape)
            if best is None or tau / seconds > best[1] / best[2]:
                best = (shape, tau, seconds)
        return best

    def choose(self, acceptance: MeasuredAcceptance | Any, **kwargs: Any) -> Choice:
        """:func:`choose_tree` with this profile's costs."""
        kwargs.setdefault("overhead", self.step_overhead_seconds)
        return choose_tree(acceptance, self.target_latency, self.draft_cost, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """JSON types (sizes and widths as string keys), read back by :meth:`from_dict`."""
        curve, slope = self.draft_level_latency, self.context_slope
        return {"target_latency": {str(k): v for k, v in sorted(self.target_latency.items())},
                "draft_level_latency": None if curve is None else {str(k): v for k, v in sorted(curve.items())},
                "step_overhead_seconds": self.step_overhead_seconds, "meta": self.meta,
                **({} if slope is None else {"context_slope": {
                    part: {str(k): v for k, v in sorted(points.items())} for part, points in slope.items()}})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Profile":
        """The inverse of :meth:`to_dict`; a file from before the per-width curve (one
        ``draft_level_seconds``) reads as that cost at every width."""
        lat = {int(k): float(v) for k, v in d["target_latency"].items()}
        curve = d.get("draft_level_latency")
        if curve is None and d.get("draft_level_seconds") is not None:  # a file from before the curve: one point,
            curve = {d.get("meta", {}).get("draft_tokens", 4): d["draft_level_seconds"]}  # the same cost at every width
        slope = d.get("context_slope")
        return cls(lat, None if curve is None else {int(k): float(v) for k, v in curve.items()},
                   dict(d.get("meta", {})), float(d.get("step_overhead_seconds", 0.0)),
                   None if slope is None else {part: {int(k): float(v) for k, v in points.items()}
                                               for part, points in slope.items()})


def _meta(target: torch.nn.Module, draft: torch.nn.Module | None, **extra: Any) -> dict[str, Any]:
    """What a profile was measured on and with (models, precisions, machine, threads, versions, date)."""
    device = next(target.parameters()).device
    return {"target": model_name(target), "draft": None if draft is None else model_name(draft),
            "device": machine(device), "threads": torch.get_num_threads(), "dtype": str(next(target.parameters()).dtype),
            "target_precision": precision_of(target), "draft_precision": None if draft is None else precision_of(draft),
            **extra, "torch": torch.__version__, "treespec": version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def profile(
    target: torch.nn.Module,
    draft: torch.nn.Module | None = None,
    sizes: Sequence[int] = DEFAULT_SIZES,
    context: int = 128,
    repeats: int = 5,
    draft_tokens: int = 4,
    draft_widths: Sequence[int] = DEFAULT_WIDTHS,
    step_overhead: float = 0.0,
    second_context: int | None = None,
    compiled: bool | str | None = None,
) -> Profile:
    """Measure the target's tree-forward latency per size and the draft's cost per level width.

    The models are measured in the precision they are in (``treespec.models.precision.auto_precision``
    chooses it). ``draft_tokens`` is one more width measured beside ``draft_widths``;
    ``step_overhead`` is a fixed per-step cost to add (seconds). ``second_context``: every point is
    measured again after that many cached tokens, and the profile keeps each point's growth per
    cached token (``Profile.context_slope``, read by ``Profile.at_context``). ``compiled``: measure the compiled
    steps' forwards (``measure_latency``); None: on CUDA, where an eager forward is launch-bound and no GPU user
    runs it (a CPU's tuner times eager forwards and calibrates them on real steps).
    """
    widths = sorted({*map(int, draft_widths), int(draft_tokens)})
    if compiled is None:
        compiled = next(target.parameters()).device.type == "cuda"
    lat = measure_latency(target, sizes, context=context, repeats=repeats, compiled=compiled)
    curve = None if draft is None else draft_level_latency(draft, widths, context=context, repeats=repeats,
                                                           compiled=compiled)
    slope = None
    if second_context is not None:
        if second_context == context:
            raise ValueError(f"second_context must differ from context ({context}) to give a slope")
        span = float(second_context - context)
        far = measure_latency(target, sizes, context=second_context, repeats=repeats, compiled=compiled)
        slope = {"target": {n: (far[n] - lat[n]) / span for n in lat}}
        if draft is not None:
            far_q = draft_level_latency(draft, widths, context=second_context, repeats=repeats, compiled=compiled)
            slope["draft"] = {w: (far_q[w] - curve[w]) / span for w in curve}
    meta = _meta(target, draft, context=context, repeats=repeats, draft_tokens=draft_tokens,
                 second_context=second_context, compiled=compiled)
    return Profile(lat, curve, meta, float(step_overhead), slope)
