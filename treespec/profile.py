"""Hardware-aware tree sizing (Sequoia, sec. 4): measure what a verification pass costs on this
machine and choose the budget and depth that maximise the predicted speedup.

A step verifying an ``n``-node tree of depth ``d`` costs one target forward over ``n`` tokens,
``t(n)``, plus ``d`` draft forwards (one per level, ``ModelDrafter``). It commits ``G(n, d)`` tokens
on average, the Sequoia value of the best shape with at most ``n`` nodes and depth ``d`` under a
positional acceptance vector. Plain decoding commits one token per ``t(1)``, so

    speedup(n, d) = G(n, d) / (t(n) / t(1) + d * c),   c = draft seconds per level / t(1).

On a GPU ``t(n)`` is nearly flat up to a large ``n`` and big trees pay; on a CPU ``t(n)`` grows
almost from the start and the best tree is small. ``c = 0`` for model-free drafters (n-gram).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from tree_builders import SequoiaDP, TreeShape

from .acceptance import Acceptance, model_name, version
from .checks import vocab_size
from .kv import TreeCache, causal_allowed, forward_masked

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_tree(n: int, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random ``n``-node tree (node 0 the root, parents precede children): ``(depth [n], ancestors [n, n])``.

    Each node's parent is uniform over the earlier nodes, so trees are bushy near the root and a
    few levels deep, like the shapes the builders return.
    """
    parent = np.full(n, -1)
    if n > 1:
        u = torch.rand(n - 1, generator=generator).numpy()
        parent[1:] = np.floor(u * np.arange(1, n)).astype(np.int64)
    depth = np.zeros(n, dtype=np.int64)
    ancestors = np.eye(n, dtype=bool)
    for i in range(1, n):
        depth[i] = depth[parent[i]] + 1
        ancestors[i] |= ancestors[parent[i]]
    return depth, ancestors


@torch.inference_mode()
def measure_latency(
    model: torch.nn.Module,
    sizes: Sequence[int] = DEFAULT_SIZES,
    context: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
) -> dict[int, float]:
    """Seconds of one tree forward of ``n`` tokens after ``context`` cached tokens, for each ``n``.

    The new tokens carry a random tree-shaped ancestor mask and tree position ids (as in a
    verification pass, logits for every node included). Median of ``repeats`` timed runs after
    ``warmup`` untimed ones; CUDA is synchronised around each run. The cache is cropped back to
    the context after every run.
    """
    if not sizes or any(int(n) != n or n < 1 for n in sizes):
        raise ValueError(f"sizes must be ints >= 1, got {tuple(sizes)!r}")
    if context < 1 or repeats < 1 or warmup < 0:
        raise ValueError("context and repeats must be >= 1 and warmup >= 0")
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    vocab = vocab_size(model)
    cache = TreeCache()
    ctx = torch.randint(vocab, (context,), generator=gen).to(device)
    forward_masked(model, cache, ctx, torch.arange(context, device=device), causal_allowed(0, context, device),
                   logits_to_keep=1)
    out: dict[int, float] = {}
    for n in sorted({int(s) for s in sizes}):
        depth, anc = random_tree(n, gen)
        ids = torch.randint(vocab, (n,), generator=gen).to(device)
        pos = torch.as_tensor(context + depth, device=device)
        allowed = torch.ones(n, context + n, dtype=torch.bool)
        allowed[:, context:] = torch.from_numpy(anc)
        allowed = allowed.to(device)
        times = []
        for r in range(warmup + repeats):
            _sync(device)
            t0 = time.perf_counter()
            forward_masked(model, cache, ids, pos, allowed)
            _sync(device)
            if r >= warmup:
                times.append(time.perf_counter() - t0)
            cache.keep(context, [])
        out[n] = statistics.median(times)
    return out


def draft_level_cost(draft: torch.nn.Module, tokens: int = 4, context: int = 128, repeats: int = 3) -> float:
    """Seconds of one draft forward over one tree level of ``tokens`` nodes (what ``ModelDrafter``
    spends per depth), after ``context`` cached tokens; median of ``repeats``."""
    return measure_latency(draft, (tokens,), context=context, repeats=repeats)[int(tokens)]


@dataclass
class Choice:
    """The tree ``choose_tree`` picked and the table it picked it from.

    ``taus[i, j]`` and ``speedups[i, j]`` are for depth limit ``depths[i]`` and budget
    ``budgets[j]``; depth 0 is plain decoding (tau 1, speedup ``1 / (t(n)/t(1))``). When the choice
    is depth 0 (``shape`` is the root alone), speculation does not pay here: generate with no drafter.
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
    c: float  # draft seconds per level / t(1)

    def rows(self) -> list[dict[str, float]]:
        """The table as records (depth, budget, tau, relative cost, speedup)."""
        return [
            {"depth": d, "budget": n, "tau": float(self.taus[i, j]),
             "cost": float(self.cost_ratio[j] + d * self.c), "speedup": float(self.speedups[i, j])}
            for i, d in enumerate(self.depths) for j, n in enumerate(self.budgets)
        ]

    def as_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "depth": self.depth, "size": self.shape.size, "paths": [list(p) for p in self.shape.paths],
                "tau": self.tau, "speedup": self.speedup, "c": self.c, "budgets": self.budgets, "depths": self.depths,
                "taus": self.taus.tolist(), "speedups": self.speedups.tolist(), "cost_ratio": self.cost_ratio.tolist()}

    def __repr__(self) -> str:
        return (f"Choice(budget={self.budget}, depth={self.depth}, size={self.shape.size}, tau={self.tau:.3f}, "
                f"speedup={self.speedup:.3f}, c={self.c:.3f})")


def _rows(acceptance: Acceptance | Any, per_depth: bool) -> Any:
    if isinstance(acceptance, Acceptance):
        return acceptance.matrix if per_depth else acceptance.vector
    return acceptance


def choose_tree(
    acceptance: Acceptance | Any,
    target_latency: Mapping[int, float],
    draft_cost: float | None,
    budgets: Sequence[int] | None = None,
    max_depth: int = 12,
    max_width: int | None = 16,
    per_depth: bool = False,
) -> Choice:
    """The (budget, depth) with the best predicted speedup ``G(n, d) / (t(n)/t(1) + d c)``.

    Args:
        acceptance: a measured :class:`~treespec.acceptance.Acceptance` (its vector, or its per-depth
            matrix with ``per_depth=True``) or a raw vector / matrix.
        target_latency: seconds of one target forward per tree size (``measure_latency``); must
            include size 1. ``t(n)`` is interpolated linearly between measured sizes.
        draft_cost: seconds of one draft forward per tree level (``draft_level_cost``); ``None`` or
            0 for a model-free drafter.
        budgets: candidate budgets (tokens per verification, root included), each within the
            measured sizes; default every integer from 1 to the largest measured size.
        max_depth, max_width: limits of the Sequoia DP (depths ``0..max_depth`` are tabulated).
        per_depth: use the acceptance's per-depth matrix instead of its vector.

    Ties go to the smaller budget, then the smaller depth.
    """
    sizes = sorted(int(s) for s in target_latency)
    if 1 not in target_latency:
        raise ValueError("target_latency must include size 1 (the cost of plain decoding)")
    lat = np.array([float(target_latency[s]) for s in sizes])
    if np.any(lat <= 0):
        raise ValueError("latencies must be > 0")
    t1 = float(target_latency[1])
    c = 0.0 if draft_cost is None else float(draft_cost) / t1
    if c < 0:
        raise ValueError(f"draft_cost must be >= 0, got {draft_cost}")
    bs = list(range(1, sizes[-1] + 1)) if budgets is None else sorted({int(b) for b in budgets})
    if not bs or bs[0] < 1 or bs[-1] > sizes[-1]:
        raise ValueError(f"budgets must lie in [1, {sizes[-1]}] (the largest measured size), got {bs}")
    if int(max_depth) != max_depth or max_depth < 0:
        raise ValueError(f"max_depth must be an int >= 0, got {max_depth!r}")
    rows = _rows(acceptance, per_depth)
    ratio = np.interp(bs, sizes, lat) / t1
    depths = list(range(int(max_depth) + 1))
    idx = np.asarray(bs)
    taus = np.ones((len(depths), len(bs)))
    solvers: dict[int, SequoiaDP] = {}
    for d in depths[1:]:
        solvers[d] = SequoiaDP(rows, bs[-1], max_depth=d, max_width=max_width)
        taus[d] = solvers[d].values[idx]
    speedups = taus / (ratio[None, :] + np.asarray(depths, dtype=np.float64)[:, None] * c)
    best = float(speedups.max())
    # first in (budget, depth) order reaching the maximum (up to rounding)
    hits = np.argwhere(speedups.T >= best - 1e-12 * max(1.0, best))
    j, i = (int(v) for v in hits[0])
    d, n = depths[i], bs[j]
    shape = solvers[d].shape(n) if d > 0 else TreeShape()
    return Choice(budget=n, depth=d, shape=shape, tau=float(taus[i, j]), speedup=float(speedups[i, j]), budgets=bs,
                  depths=depths, taus=taus, speedups=speedups, cost_ratio=ratio, c=c)


@dataclass
class Profile:
    """Measured costs of a target (and its draft) on one machine; JSON round trip with save/load."""

    target_latency: dict[int, float]  # tree size -> seconds of one target forward
    draft_level_seconds: float | None  # one draft forward per tree level; None without a draft
    meta: dict[str, Any] = field(default_factory=dict)

    def choose(self, acceptance: Acceptance | Any, **kwargs: Any) -> Choice:
        """:func:`choose_tree` with this profile's costs."""
        return choose_tree(acceptance, self.target_latency, self.draft_level_seconds, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {"target_latency": {str(k): v for k, v in sorted(self.target_latency.items())},
                "draft_level_seconds": self.draft_level_seconds, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Profile":
        lat = {int(k): float(v) for k, v in d["target_latency"].items()}
        dc = d.get("draft_level_seconds")
        return cls(lat, None if dc is None else float(dc), dict(d.get("meta", {})))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Profile":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads)"


def profile(
    target: torch.nn.Module,
    draft: torch.nn.Module | None = None,
    sizes: Sequence[int] = DEFAULT_SIZES,
    context: int = 128,
    repeats: int = 3,
    draft_tokens: int = 4,
) -> Profile:
    """Measure the target's tree-forward latency per size and the draft's cost per level."""
    device = next(target.parameters()).device
    lat = measure_latency(target, sizes, context=context, repeats=repeats)
    dc = None if draft is None else draft_level_cost(draft, draft_tokens, context=context, repeats=repeats)
    meta = {"target": model_name(target), "draft": None if draft is None else model_name(draft),
            "device": device_name(device), "dtype": str(next(target.parameters()).dtype), "context": context,
            "repeats": repeats, "draft_tokens": draft_tokens, "torch": torch.__version__, "treespec": version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return Profile(lat, dc, meta)
