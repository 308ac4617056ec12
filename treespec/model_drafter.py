"""A small HF model that expands a static tree shape, one draft forward per depth."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import torch

from .drafting import ROOT, DraftProposals, Drafter
from .kv import TreeCache, causal_allowed, forward_masked
from .sampling import SamplingParams

MODES = ("topk", "sample", "sample_without_replacement")

Path = tuple[int, ...]


@dataclass(frozen=True)
class ShapePlan:
    """A shape's nodes in BFS order (node 0 = root) with what a level-by-level expansion needs."""

    paths: tuple[Path, ...]  # BFS order: by depth, then lexicographic
    parent: np.ndarray  # [N] parent node (-1 for the root)
    rank: np.ndarray  # [N] child rank under its parent
    depth: np.ndarray  # [N]
    n_children: np.ndarray  # [N]
    ancestors: np.ndarray  # [N, N] bool, self included

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    def level(self, d: int) -> np.ndarray:
        return np.flatnonzero(self.depth == d)


def plan_shape(shape: Iterable[Sequence[int]] | object) -> ShapePlan:
    """Validate a shape (child-rank paths, or anything with ``.paths``) and lay it out."""
    raw = getattr(shape, "paths", shape)
    paths = {tuple(int(r) for r in p) for p in raw} - {()}
    if not paths:
        raise ValueError(
            "the drafter shape is empty: give at least one child-rank path, e.g. shape=[(0,)] "
            "for a one-token chain or shape=[(0,), (0, 0), (0, 0, 0)] for a 3-token chain"
        )
    for p in paths:
        if min(p) < 0:
            raise ValueError(f"shape path {p} has a negative rank")
        if len(p) > 1 and p[:-1] not in paths:
            raise ValueError(f"shape is not ancestor-closed: {p} is listed but its parent {p[:-1]} is not")
        if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in paths:
            raise ValueError(f"shape ranks must be contiguous: {p} is listed but {p[:-1] + (p[-1] - 1,)} is not")
    ordered = [()] + sorted(paths, key=lambda p: (len(p), p))
    node = {p: i for i, p in enumerate(ordered)}
    n = len(ordered)
    parent = np.array([-1] + [node[p[:-1]] for p in ordered[1:]])
    rank = np.array([0] + [p[-1] for p in ordered[1:]])
    depth = np.array([len(p) for p in ordered])
    n_children = np.bincount(parent[1:], minlength=n)
    ancestors = np.zeros((n, n), dtype=bool)
    for i in range(n):  # once per drafter, at construction
        j = i
        while j >= 0:
            ancestors[i, j] = True
            j = parent[j]
    return ShapePlan(tuple(ordered[1:]), parent, rank, depth, n_children, ancestors)


class ModelDrafter(Drafter):
    """Expands ``shape`` with a draft model: level ``d`` costs one draft forward.

    Modes: ``topk`` (children of a node are its ``b`` most likely tokens; point-mass proposals),
    ``sample`` (``b`` i.i.d. draws from the draft distribution ``q``) and
    ``sample_without_replacement`` (Sequoia: draws from ``q`` with earlier draws removed).
    ``k`` independent chains of length ``d`` (SpecInfer's baseline) are the shape
    ``tree_builders.independent_chains(k, d)`` in ``sample`` mode.

    The draft keeps its own KV cache across steps: rows for the accepted part of its last tree are
    kept, committed tokens it never saw are fed at the start of the next step.
    """

    def __init__(self, model: torch.nn.Module, shape=((0,),), mode: str = "topk") -> None:
        if mode not in MODES:
            raise ValueError(f"unknown ModelDrafter mode {mode!r}; choose one of {', '.join(MODES)}")
        self.model = model
        self.mode = mode
        self.plan = plan_shape(shape)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.sampling = SamplingParams(1.0)
        self.generator = torch.Generator(self.device)
        self.cache = TreeCache()
        self._base = 0  # committed tokens whose K/V rows precede this step's rows
        self._seen = 0  # length of the context at the last step
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # tokens, rows, valid

    def describe(self) -> str:
        name = getattr(self.model.config, "_name_or_path", "") or self.model.config.model_type
        return f"model({name}, {self.mode}, size={len(self.plan.paths) + 1}, depth={self.plan.max_depth})"

    def reset(self, prompt: Sequence[int], *, sampling: SamplingParams, seed: int) -> None:
        self.sampling = sampling
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.cache = TreeCache()
        self._base = self._seen = 0
        self._last = None

    def _sync_cache(self, context: Sequence[int]) -> None:
        """Keep the rows of last step's tree that lie on the committed path; drop the rest.

        The new root (``context[-1]``) is always fed again: its logits are this step's first need.
        """
        if self._last is None:
            return
        tokens, rows, valid = self._last
        plan = self.plan
        keep: list[int] = []
        node = 0
        for tok in context[self._seen : -1]:
            kids = np.flatnonzero((plan.parent == node) & valid & (tokens == tok))
            if kids.size == 0 or rows[kids[0]] < 0:
                break
            node = int(kids[0])
            keep.append(int(rows[node]))
        self.cache.keep(self._seen, keep)
        self._base = self._seen + len(keep)
        self._last = None

    @torch.inference_mode()
    def propose(self, context: Sequence[int]) -> DraftProposals:
        plan, dev = self.plan, self.device
        self._sync_cache(context)
        pending = torch.as_tensor(list(context[self._base :]), dtype=torch.long, device=dev)
        past = self.cache.length
        logits = forward_masked(self.model, self.cache, pending, torch.arange(past, past + len(pending), device=dev),
                                causal_allowed(past, len(pending), dev), logits_to_keep=1)
        self._seen = len(context)

        n = len(plan.depth)
        tokens = np.full(n, -1, dtype=np.int64)
        tokens[0] = context[-1]
        valid = np.ones(n, dtype=bool)
        rows = np.full(n, -1, dtype=np.int64)  # cache row of each forwarded node
        rows[0] = len(context) - 1
        q_row = np.full(n, -1, dtype=np.int64)  # row of `dists` holding the node's draft distribution
        dists = [self.sampling.probs(logits[-1:])]
        q_row[0] = 0
        n_rows = 1
        for d in range(1, plan.max_depth + 1):
            parents = plan.level(d - 1)
            parents = parents[plan.n_children[parents] > 0]
            q = torch.cat(dists)[q_row[parents]] if d > 1 else dists[0]
            kids = plan.level(d)
            drawn = self._draw(q, int(plan.n_children[parents].max())).cpu().numpy()
            slot = np.searchsorted(parents, plan.parent[kids])
            tokens[kids] = drawn[slot, plan.rank[kids]]
            valid[kids] = valid[plan.parent[kids]] & (tokens[kids] >= 0)
            if d == plan.max_depth:
                break
            fwd = kids[plan.n_children[kids] > 0]
            if fwd.size == 0:
                break
            base_len = self.cache.length
            past_tree = np.flatnonzero(rows >= len(context))  # tree nodes already in the cache
            allowed = torch.zeros(len(fwd), base_len + len(fwd), dtype=torch.bool)
            allowed[:, : len(context)] = True
            sub = plan.ancestors[np.ix_(fwd, past_tree)]
            allowed[:, torch.as_tensor(rows[past_tree])] = torch.as_tensor(sub)
            allowed[:, base_len:] = torch.eye(len(fwd), dtype=torch.bool)
            ids = torch.as_tensor(np.maximum(tokens[fwd], 0), device=dev)
            pos = torch.as_tensor(len(context) - 1 + plan.depth[fwd], device=dev)
            out = forward_masked(self.model, self.cache, ids, pos, allowed)
            rows[fwd] = base_len + np.arange(len(fwd))
            dists.append(self.sampling.probs(out))
            q_row[fwd] = n_rows + np.arange(len(fwd))
            n_rows += len(fwd)
        self._last = (tokens, rows, valid)
        return self._proposals(tokens, valid, q_row, torch.cat(dists))

    def _draw(self, q: torch.Tensor, b: int) -> torch.Tensor:
        """``b`` children per row of ``q`` ([P, V]); -1 marks a draw that ``q`` cannot support."""
        if self.mode == "topk":
            return torch.topk(q, b, dim=-1).indices
        if self.mode == "sample":
            return torch.multinomial(q, b, replacement=True, generator=self.generator)
        # Gumbel-top-k: the order of the top keys is the order of sequential draws without replacement.
        u = torch.rand(q.shape, generator=self.generator, device=q.device).clamp_(1e-20, 1.0)
        keys = q.log() - (-u.log()).log()
        top = torch.topk(keys, b, dim=-1)
        return torch.where(torch.isfinite(top.values), top.indices, -1)

    def _proposals(self, tokens, valid, q_row, dists) -> DraftProposals:
        plan = self.plan
        kept = np.flatnonzero(valid[1:]) + 1
        index = {int(node): j for j, node in enumerate(kept)}
        parents = [ROOT if plan.parent[v] == 0 else index[int(plan.parent[v])] for v in kept]
        toks = [int(tokens[v]) for v in kept]
        if self.mode == "topk":
            return DraftProposals(toks, parents)
        rows = [int(q_row[plan.parent[v]]) for v in kept]
        exclude: list[tuple[int, ...]] = [()] * len(kept)
        if self.mode == "sample_without_replacement":
            for j, v in enumerate(kept):
                r = int(plan.rank[v])
                if r:  # earlier siblings are the previous r nodes in BFS order
                    exclude[j] = tuple(int(t) for t in tokens[v - r : v])
        return DraftProposals(toks, parents, dists, rows, exclude)
