"""Hardware-aware tree sizing (Sequoia, sec. 4): what drafting and verifying cost on this machine, measured
(``profile``, the per-model precision chosen before it: ``treespec.models.precision.auto_precision``) and kept
as a :class:`Profile`, whose :meth:`Profile.choose` picks the budget, depth and width limit with the best
predicted wall-clock speed (the cost model and its search: ``treespec.calibrate.step_cost``).
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
from ..models.timing import DEFAULT_SIZES, measure_latency, measure_plain_decode, measure_prefill, random_tree
from .acceptance import MeasuredAcceptance
from .step_cost import Choice, choose_tree, cost_curve, draft_seconds

__all__ = ["Profile", "draft_level_cost", "draft_level_latency", "measure_latency", "profile", "random_tree"]

DEFAULT_WIDTHS = (1, 2, 4, 8, 16)  # draft level widths profiled
#: the width limits under which :meth:`Profile.best_branching` builds Sequoia's trees (as the tuner's search does,
#: past a chain's 1): on a machine where width costs, a narrower tree can beat the unlimited one
BRANCHING_WIDTHS = (2, 4, 8, None)


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
    #: seconds per token of the target's own plain decoding (HF ``generate``, ``measure_plain_decode``) at the
    #: profile's context; None: not timed (``t(1)`` + overhead stands for it)
    plain_decode_seconds: float | None = None
    #: prompt length -> seconds of the draft's eager prefill of a prompt that long (``measure_prefill``): what a
    #: speculating run spends before its first step that plain decoding does not; None: not measured
    draft_prefill_latency: dict[int, float] | None = None

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

    def draft_prefill_seconds(self, tokens: float) -> float:
        """Predicted seconds of the draft's prefill of a ``tokens``-token prompt: the measured curve
        (:attr:`draft_prefill_latency`) interpolated; past its longest length, that length's figure plus the growth a
        quadratic fit of the curve gives (attention over the prompt grows with its square: on a Zen 4 host the int4
        draft's prefill of 1,024 tokens took 2.3x its 512-token one, of 1,900 tokens 5.8x; the curve timed at 32,
        128 and 512 tokens predicted those two within 8%, ``experiments/results/prompt-forward-cpu``), and below its
        shortest, that figure scaled down with the length."""
        if not self.draft_prefill_latency:
            raise ValueError("this profile has no draft prefill curve: measure one (costs.profile with a draft, or "
                             "tuning.cached_profile, which adds it to a cached profile without one)")
        n = float(tokens)
        xs = sorted(self.draft_prefill_latency)
        ys = [self.draft_prefill_latency[x] for x in xs]
        if n <= xs[0]:
            return ys[0] * max(n, 0.0) / xs[0]
        if n <= xs[-1]:
            return float(np.interp(n, xs, ys))
        growth = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else ys[-1] / xs[-1]
        growth *= n - xs[-1]
        if len(xs) > 2:  # the quadratic's growth where it is the larger (attention's square term)
            fit = np.polynomial.Polynomial.fit(xs, ys, 2)
            growth = max(growth, float(fit(n) - fit(xs[-1])))
        return ys[-1] + growth

    def at_context(self, context: float) -> "Profile":
        """This profile's costs after ``context`` cached tokens: each point moved along its measured
        slope from the context it was measured at (``meta["context"]``); itself without a slope.
        A floor of a tenth of the measured cost keeps a far extrapolation positive."""
        if not self.context_slope:
            return self
        shift = float(context) - float(self.meta.get("context", 128))

        def moved(points: dict[int, float], slopes: dict[int, float]) -> dict[int, float]:
            return {k: max(v + slopes.get(k, 0.0) * shift, 0.1 * v) for k, v in points.items()}

        curve, plain = self.draft_level_latency, self.plain_decode_seconds
        target = self.context_slope.get("target", {})
        return replace(self, target_latency=moved(self.target_latency, target),
                       draft_level_latency=None if curve is None else moved(curve, self.context_slope.get("draft", {})),
                       meta={**self.meta, "context": float(context)},  # plain decoding grows as a one-token forward
                       plain_decode_seconds=None if plain is None else moved({1: plain}, target)[1])

    def calibrated(self, shape: TreeShape, drafting: float, verifying: float, overhead: float, steps: int,
                   size: float | None = None) -> "Profile":
        """This profile corrected by real steps of ``shape``: measured seconds per step of drafting,
        verifying and engine work.

        The draft's curve is scaled by measured / predicted drafting (what a level really costs in a
        step: the catch-up of the committed tokens, the real context, the selection over the
        vocabulary); the target's curve, plain decoding's size 1 included, by measured / predicted
        verifying (a short run of plain decoding is too noisy to give size 1 a factor of its own:
        one pilot measured 1.5x where others measured 0.85-1.0x); the engine's seconds per step
        become ``overhead``. The timed plain decoding (``plain_decode_seconds``) is kept: it was HF's whole
        decoding loop, with nothing for a real step to add. ``size``: the tokens the real steps verified on
        average (default ``shape.size``; fewer where a confidence stop or the end of generation trimmed trees).
        The factors are measured on one shape and applied to every shape."""
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
        return Profile(lat, curve, meta, float(overhead), slope, self.plain_decode_seconds,
                       self.draft_prefill_latency)

    def for_batch(self, rows: int) -> "Profile":
        """The costs of one step of a batch of ``rows`` prompts (``treespec.core.batch``), each verifying its own
        tree: the target forward over a tree of ``n`` nodes per row is one forward over ``rows * n`` tokens,
        ``t(rows n)``, and a draft level of width ``w`` one draft forward over ``rows * w`` tokens; the engine's
        seconds per step are per row (each row's acceptance and drafting bookkeeping on the host). Plain batched
        decoding then costs ``t(rows)`` per ``rows`` tokens (the one-prompt ``plain_decode_seconds`` is dropped),
        so :meth:`choose` under this profile sizes the tree for the batch, down to plain decoding where ``t`` grows
        with the tokens. Only tree sizes whose
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
        return Profile(batched(sizes, cost_curve(self.target_latency)),
                       None if q is None else batched(list(q), cost_curve(q)),
                       {**self.meta, "batch_rows": rows}, self.step_overhead_seconds * rows, slope,
                       draft_prefill_latency=self.draft_prefill_latency)  # each row's prompt: Tuned charges rows

    def step_seconds(self, shape: TreeShape) -> float:
        """Predicted seconds of one step of ``shape``: drafting, verifying and the engine's fixed seconds."""
        drafting, verifying = self.step_parts(shape)
        return drafting + verifying + self.step_overhead_seconds

    def best_branching(self, acceptance: Any, budget: int, max_depth: int) -> tuple[TreeShape, float, float] | None:
        """The fastest predicted tree of at most ``budget`` nodes (root included) that branches somewhere, under these
        costs: Sequoia's tree at each depth limit below a chain's and each width limit the tuner searches
        (:data:`BRANCHING_WIDTHS`), kept where a node has two or more children.
        Returns (shape, predicted tau, predicted seconds per step), None when no such tree exists: budget < 3, or
        acceptance rows under which a second child adds nothing (Sequoia's trees are then chains).
        What a tuned chain is weighed against: on a machine where width costs, the chain wins by its cheaper
        levels, and this says by how much."""
        best = None
        for depth in range(1, min(int(max_depth), int(budget) - 1) + 1):
            for width in BRANCHING_WIDTHS:
                shape = sequoia(acceptance, int(budget), max_depth=depth, max_width=width)
                if shape.max_width < 2:
                    continue
                tau, seconds = shape.expected_tokens(acceptance), self.step_seconds(shape)
                if best is None or tau / seconds > best[1] / best[2]:
                    best = (shape, tau, seconds)
        return best

    def choose(self, acceptance: MeasuredAcceptance | Any, **kwargs: Any) -> Choice:
        """:func:`choose_tree` with this profile's costs."""
        kwargs.setdefault("overhead", self.step_overhead_seconds)
        kwargs.setdefault("plain", self.plain_decode_seconds)
        return choose_tree(acceptance, self.target_latency, self.draft_cost, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """JSON types (sizes and widths as string keys), read back by :meth:`from_dict`."""
        curve, slope, plain = self.draft_level_latency, self.context_slope, self.plain_decode_seconds
        prefill = self.draft_prefill_latency
        return {"target_latency": {str(k): v for k, v in sorted(self.target_latency.items())},
                "draft_level_latency": None if curve is None else {str(k): v for k, v in sorted(curve.items())},
                "step_overhead_seconds": self.step_overhead_seconds, "meta": self.meta,
                **({} if slope is None else {"context_slope": {
                    part: {str(k): v for k, v in sorted(points.items())} for part, points in slope.items()}}),
                **({} if plain is None else {"plain_decode_seconds": plain}),
                **({} if prefill is None else {"draft_prefill_latency": {
                    str(k): v for k, v in sorted(prefill.items())}})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Profile":
        """The inverse of :meth:`to_dict`; a file from before the per-width curve (one
        ``draft_level_seconds``) reads as that cost at every width."""
        lat = {int(k): float(v) for k, v in d["target_latency"].items()}
        curve = d.get("draft_level_latency")
        if curve is None and d.get("draft_level_seconds") is not None:  # a file from before the curve: one point,
            curve = {d.get("meta", {}).get("draft_tokens", 4): d["draft_level_seconds"]}  # the same cost at every width
        slope, prefill = d.get("context_slope"), d.get("draft_prefill_latency")
        return cls(lat, None if curve is None else {int(k): float(v) for k, v in curve.items()},
                   dict(d.get("meta", {})), float(d.get("step_overhead_seconds", 0.0)),
                   None if slope is None else {part: {int(k): float(v) for k, v in points.items()}
                                               for part, points in slope.items()},
                   None if d.get("plain_decode_seconds") is None else float(d["plain_decode_seconds"]),
                   None if prefill is None else {int(k): float(v) for k, v in prefill.items()})


def _meta(target: torch.nn.Module, draft: torch.nn.Module | None, **extra: Any) -> dict[str, Any]:
    """What a profile was measured on and with (models, precisions, machine, threads, versions, date)."""
    device = next(target.parameters()).device
    return {"target": model_name(target), "draft": None if draft is None else model_name(draft),
            "device": machine(device), "threads": torch.get_num_threads(),
            "dtype": str(next(target.parameters()).dtype),
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
    runs it (a CPU's tuner times eager forwards and calibrates them on real steps). Eager: the target's own plain
    decoding is timed too (``measure_plain_decode``), what the predicted speedups are relative to. With a draft,
    its prefill is timed at a few prompt lengths (``measure_prefill``: ``Profile.draft_prefill_latency``).
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
    plain = None if compiled else measure_plain_decode(target, context)
    prefill = None if draft is None else measure_prefill(draft)
    return Profile(lat, curve, meta, float(step_overhead), slope, plain, prefill)
