"""A small HF model as a drafter: static tree shapes (three modes) or EAGLE-2 dynamic trees."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generator, Iterable, Sequence

import numpy as np
import torch

from tree_builders import TreeShape

from ..common.device import execution_device
from ..common.machine import model_name
from ..common.options import STATIC_MODES
from ..core.checks import check_int, check_probability, has_dynamic_int8, vocab_size
from ..core.drafting import ROOT, Capture, DraftProposals, Drafter, Drafting, Forward, drive
from ..core.kv import TreeCache, causal_allowed, forward_masked, forward_prompt
from ..core.sampling import SamplingParams, draw_children
from ..core.tree import layout

#: the modes of a static tree shape (the dynamic EAGLE-2 tree grows its own)
MODES = (*STATIC_MODES, "dynamic")

Path = tuple[int, ...]


@dataclass(frozen=True)
class _Level:
    """The nodes one depth of a static shape draws (computed once per shape, read at every step)."""

    parents: np.ndarray  # the nodes one level up that have children (the rows of the level's q), increasing
    width: int  # the most children one of them has (draws per row)
    kids: np.ndarray  # this level's nodes
    slot: np.ndarray  # [kids] the row of each one's parent in ``parents``
    rank: np.ndarray  # [kids] each one's child rank: its column of the draws
    fwd: np.ndarray  # the kids with children of their own (forwarded to draw the next level)


@dataclass(frozen=True)
class _Layout:
    """A ``TreeShape``'s nodes as arrays (node 0 = the root, then ``shape.paths`` in BFS order)."""

    shape: TreeShape
    parent: np.ndarray  # [N] parent node (-1 for the root)
    rank: np.ndarray  # [N] child rank under its parent
    depth: np.ndarray  # [N]
    n_children: np.ndarray  # [N]
    ancestors: np.ndarray  # [N, N] bool, self included
    levels: tuple[_Level, ...]  # depth d at ``levels[d - 1]``

    @classmethod
    def of(cls, shape: TreeShape) -> "_Layout":
        parent, rank = shape.node_arrays()
        depth, ancestors = layout(parent)
        n_children = np.bincount(parent[1:], minlength=len(parent))
        levels = []
        for d in range(1, int(depth.max()) + 1):
            parents = np.flatnonzero((depth == d - 1) & (n_children > 0))
            kids = np.flatnonzero(depth == d)
            levels.append(_Level(parents, int(n_children[parents].max()), kids,
                                 np.searchsorted(parents, parent[kids]), rank[kids], kids[n_children[kids] > 0]))
        return cls(shape, parent, rank, depth, n_children, ancestors, tuple(levels))


def _share_rows_of_equal_contexts(nodes: np.ndarray, parent: np.ndarray, tokens: np.ndarray,
                                  q_row: np.ndarray) -> None:
    """Point every node of ``nodes`` whose path repeats an earlier one's (same parent context, same
    token: i.i.d. siblings that drew the same token) at that node's distribution row.

    Their contexts are equal, so their draft distributions are one ``q``; computed per copy in one
    batched forward they can differ in the last bits (int8 activation scales depend on the batch),
    and verifiers that need i.i.d. draws from one ``q`` (``spectr``) would refuse the tree.
    """
    first: dict[tuple[int, int], int] = {}
    for v in nodes:
        key = (int(q_row[parent[v]]), int(tokens[v]))
        q_row[v] = first.setdefault(key, int(q_row[v]))


def as_shape(shape: TreeShape | Iterable[Sequence[int]] | None) -> TreeShape:
    """A drafter shape as a ``TreeShape`` (child-rank paths, or anything with ``.paths``; None = one token)."""
    if shape is None:
        return TreeShape([(0,)])
    if not isinstance(shape, TreeShape):
        shape = TreeShape.from_paths(getattr(shape, "paths", shape))
    if shape.size == 1:
        raise ValueError(
            "the drafter shape is empty: give at least one child-rank path, e.g. shape=[(0,)] "
            "for a one-token chain or shape=[(0,), (0, 0), (0, 0, 0)] for a 3-token chain"
        )
    return shape


class ModelDrafter(Drafter):
    """A draft model that proposes a token tree, one draft forward per depth.

    Static shapes (``shape`` = a ``TreeShape`` or its child-rank paths) in three modes: ``topk``
    (the ``b`` children of a node are its ``b`` most likely tokens; point-mass proposals),
    ``sample`` (``b`` i.i.d. draws from the draft distribution ``q``) and
    ``sample_without_replacement`` (Sequoia: draws from ``q`` with earlier draws removed). ``k``
    independent chains of length ``d`` (SpecInfer's baseline) are the shape
    ``tree_builders.independent_chains(k, d)`` in ``sample`` mode.

    ``mode="dynamic"`` builds an EAGLE-2 style tree instead: ``depth`` times, expand the ``topk``
    frontier nodes of highest cumulative draft confidence by their ``topk`` most likely tokens, then
    keep the ``nodes`` candidates of highest confidence. Its proposals are point masses, so the
    selection keeps the output exact.

    ``min_confidence``: stop growing deeper levels once the best frontier path's cumulative draft
    probability (the product of ``q`` of its tokens) is below it; None never stops early. Exact in
    every mode: the stop is a function of tokens already drawn, never of the draws it would cut,
    and the verifier's rule at a node holds for any number of children fixed before they are drawn
    (see docs/design.md, "Exactness rule").

    The model may be float32, bfloat16/float16, or int8- or int4-quantised (``treespec.models.precision``); draft
    probabilities are float32 whatever its dtype. The draft keeps its own KV cache across steps:
    the rows of its last tree that lie on the committed path are kept, committed tokens it never
    saw are fed at the start of the next step.
    """

    def __init__(self, model: torch.nn.Module, shape: TreeShape | Iterable[Sequence[int]] | None = None,
                 mode: str = "topk", *, depth: int = 6, topk: int = 8, nodes: int = 32,
                 min_confidence: float | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown ModelDrafter mode {mode!r}; choose one of {', '.join(MODES)}")
        self.model = model
        self.mode = mode
        self.min_confidence = check_probability("min_confidence", min_confidence)
        if mode == "dynamic":
            if shape is not None:
                raise ValueError("mode='dynamic' grows its own tree: give depth=, topk= and nodes=, not a shape")
            self.depth, self.topk, self.nodes = (check_int(name, value, 1, f"the dynamic tree's {what}.") for
                                                 name, value, what in (("depth", depth, "levels"),
                                                                       ("topk", topk, "children per expanded node"),
                                                                       ("nodes", nodes, "drafted nodes")))
        else:
            self.layout = _Layout.of(as_shape(shape))
        self.vocab_size = vocab_size(model)
        self.device = execution_device(model)
        self.sampling = SamplingParams(1.0)
        self.generator = torch.Generator(self.device)
        self.cache = TreeCache()
        self.levels_forwarded = 0  # draft forwards over tree levels since reset (the confidence stop saves these)
        self._base = 0  # committed tokens whose K/V rows precede this step's rows
        self._seen = 0  # length of the context at the last step
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # parent, tokens, rows

    def describe(self) -> str:
        name = model_name(self.model)
        stop = "" if self.min_confidence is None else f", min_confidence={self.min_confidence:g}"
        if self.mode == "dynamic":
            return f"model({name}, dynamic, depth={self.depth}, topk={self.topk}, nodes={self.nodes}{stop})"
        return f"model({name}, {self.mode}, size={self.layout.shape.size}, depth={self.layout.shape.depth}{stop})"

    def capture(self) -> Capture | str:
        """The static shape for the captured step; dynamic trees, i.i.d. sampling (siblings may repeat a
        token, which the host trie merges) and a subclass with a propose of its own draft on the host."""
        if self.mode not in ("topk", "sample_without_replacement"):
            return f"mode={self.mode!r} drafts on the host (captured: topk, sample_without_replacement)"
        if not self._stock_propose():  # the captured step drafts the shape: a propose of its own would not run
            return f"{type(self).__name__} proposes with a propose of its own: it drafts on the host"
        return Capture(self.model, self.layout.parent, self.layout.rank, self.mode, self.min_confidence)

    def reset(self, prompt: Sequence[int], *, sampling: SamplingParams, seed: int) -> None:
        self.sampling = sampling
        self.generator = torch.Generator(self.device).manual_seed(seed)
        self.cache = TreeCache()
        self.levels_forwarded = 0
        self._base = self._seen = 0
        self._last = None

    @torch.inference_mode()
    def prefill(self, prompt: Sequence[int]) -> None:
        """Cache ``prompt[:-1]`` (the first step feeds the root, as every step does)."""
        drive(self.prefilling(prompt), self._forward)

    def prefilling(self, prompt: Sequence[int]) -> Generator[Forward, torch.Tensor, None]:
        n = len(prompt) - 1
        if n > 0 and self.cache.length == 0:  # a fresh generation (``reset``): nothing cached yet
            dev = self.device
            yield Forward(torch.as_tensor(list(prompt[:-1]), dtype=torch.long, device=dev),
                          torch.arange(n, device=dev), causal_allowed(0, n, dev), last=True, prompt=True)
            self._base = self._seen = n

    @torch.inference_mode()
    def propose(self, context: Sequence[int]) -> DraftProposals:
        return drive(self.drafting(context), self._forward)

    def _stock_propose(self) -> bool:
        """Whether this drafter proposes with :meth:`propose` as defined here (a subclass may edit the proposals)."""
        return type(self).propose is ModelDrafter.propose

    def drafts_in_forwards(self) -> bool:
        # a subclass whose propose is its own drafts row by row in a batch, so that its rows propose what it proposes
        # alone; so does a torch.ao int8 draft, whose forward quantises its activations with one scale for all its
        # rows (each row's q would move with the rows beside it)
        return self._stock_propose() and not has_dynamic_int8(self.model)

    def drafting(self, context: Sequence[int]) -> Drafting:
        """The step's drafting as a coroutine of draft forwards (``propose`` answers them on :attr:`cache`; a
        batch of prompts answers every row's at once, ``treespec.core.batch``)."""
        q_root = self.sampling.probs((yield from self._start_step(context)))
        if self.mode == "dynamic":
            return (yield from self._propose_dynamic(context, q_root))
        return (yield from self._propose_static(context, q_root))

    def _forward(self, ask: Forward) -> torch.Tensor:
        if ask.prompt:
            return forward_prompt(self.model, self.cache, ask.ids, logits_to_keep=1 if ask.last else 0)
        return forward_masked(self.model, self.cache, ask.ids, ask.positions, ask.allowed,
                              logits_to_keep=1 if ask.last else 0)

    def _stop(self, confidence: float) -> bool:
        """The confidence stop: the best frontier path's cumulative draft probability is too low."""
        return self.min_confidence is not None and confidence < self.min_confidence

    # -- cache bookkeeping shared by both kinds of tree -------------------------------------------

    def _start_step(self, context: Sequence[int]) -> Generator[Forward, torch.Tensor, torch.Tensor]:
        """Keep last step's rows on the committed path, feed the tokens not yet cached.

        Returns the draft's logits ``[1, V]`` for the token after ``context`` (from its cache).
        """
        self._base = min(self._base, len(context) - 1)  # the root is fed even when called twice
        if self._last is not None:
            parent, tokens, rows = self._last
            keep: list[int] = []
            node = 0
            # the new root (context[-1]) is always fed again, even where it lands on a forwarded
            # node of the last tree: its logits are this step's first need
            for tok in context[self._seen : -1]:
                kids = np.flatnonzero((parent == node) & (tokens == tok) & (rows >= 0))
                if kids.size == 0:
                    break
                node = int(kids[0])
                keep.append(int(rows[node]))
            self.cache.keep(self._seen, keep)
            self._base = self._seen + len(keep)
            self._last = None
        else:
            self.cache.keep(self._base, [])  # rows past the committed prefix (none within generate)
        dev = self.device
        pending = torch.as_tensor(list(context[self._base :]), dtype=torch.long, device=dev)
        past = self.cache.length
        logits = yield Forward(pending, torch.arange(past, past + len(pending), device=dev),
                               causal_allowed(past, len(pending), dev), last=True)
        self._seen = len(context)
        self._base = len(context)  # every committed token is cached now
        return logits[-1:]

    def _forward_level(self, ctx_len: int, fwd: np.ndarray, tokens: np.ndarray, depth: np.ndarray,
                       rows: np.ndarray, ancestors: np.ndarray) -> Generator[Forward, torch.Tensor, torch.Tensor]:
        """One draft forward over tree nodes ``fwd`` whose ancestors are cached; sets their rows.

        Each node attends to the committed context, its cached tree ancestors and itself.
        Returns the nodes' draft distributions (float32).
        """
        base = self.cache.length
        cached = np.flatnonzero(rows >= ctx_len)  # tree nodes (below the root) already in the cache
        allowed = np.zeros((len(fwd), base + len(fwd)), dtype=bool)
        allowed[:, :ctx_len] = True
        allowed[:, rows[cached]] = ancestors[np.ix_(fwd, cached)]
        allowed[:, base:] = np.eye(len(fwd), dtype=bool)
        allowed = torch.from_numpy(allowed)
        ids = torch.as_tensor(np.maximum(tokens[fwd], 0), device=self.device)
        pos = torch.as_tensor(ctx_len - 1 + depth[fwd], device=self.device)
        out = yield Forward(ids, pos, allowed)
        rows[fwd] = base + np.arange(len(fwd))
        self.levels_forwarded += 1
        return self.sampling.probs(out)

    # -- static shapes ---------------------------------------------------------------------------

    def _propose_static(self, context: Sequence[int], q_root: torch.Tensor) -> Drafting:
        layout, ctx_len = self.layout, len(context)
        n, max_depth = layout.shape.size, len(layout.levels)
        tokens = np.full(n, -1, dtype=np.int64)
        tokens[0] = context[-1]
        rows = np.full(n, -1, dtype=np.int64)  # cache row of each forwarded node
        rows[0] = ctx_len - 1
        q_row = np.full(n, -1, dtype=np.int64)  # row of `dists` holding the node's draft distribution
        q_row[0] = 0
        conf = np.zeros(n)  # cumulative draft probability of each node's path (confidence stop only)
        conf[0] = 1.0
        dists = [q_root]
        for d, level in enumerate(layout.levels, start=1):
            kids, slot, fwd = level.kids, level.slot, level.fwd
            q = dists[0] if d == 1 else torch.cat(dists)[q_row[level.parents]]
            drawn = draw_children(q, level.width, self.mode, self.generator)
            tokens[kids] = np.where(tokens[layout.parent[kids]] >= 0, drawn.cpu().numpy()[slot, level.rank], -1)
            if d == max_depth or fwd.size == 0:
                break
            if self.min_confidence is not None:
                at = torch.as_tensor(np.stack([slot, np.maximum(tokens[kids], 0)]), device=q.device)
                q_tok = q[at[0], at[1]].double().cpu().numpy()
                conf[kids] = np.where(tokens[kids] >= 0, conf[layout.parent[kids]] * q_tok, 0.0)
                if self._stop(float(conf[fwd].max())):
                    break
            q_row[fwd] = sum(len(t) for t in dists) + np.arange(len(fwd))
            dists.append((yield from self._forward_level(ctx_len, fwd, tokens, layout.depth, rows, layout.ancestors)))
            _share_rows_of_equal_contexts(fwd, layout.parent, tokens, q_row)
        self._last = (layout.parent, tokens, rows)
        return self._static_proposals(tokens, q_row, torch.cat(dists))

    def _static_proposals(self, tokens: np.ndarray, q_row: np.ndarray, dists: torch.Tensor) -> DraftProposals:
        layout = self.layout
        # a draw q could not support, or a level the confidence stop did not draw, drops its subtree
        kept = np.flatnonzero(tokens[1:] >= 0) + 1
        index = {int(node): j for j, node in enumerate(kept)}
        parents = [ROOT if layout.parent[v] == 0 else index[int(layout.parent[v])] for v in kept]
        toks = [int(tokens[v]) for v in kept]
        if self.mode == "topk":
            return DraftProposals(toks, parents)
        rows = [int(q_row[layout.parent[v]]) for v in kept]
        exclude: list[tuple[int, ...]] = [()] * len(kept)
        if self.mode == "sample_without_replacement":
            for j, v in enumerate(kept):
                r = int(layout.rank[v])
                if r:  # earlier siblings are the previous r nodes in BFS order
                    exclude[j] = tuple(int(t) for t in tokens[v - r : v])
        return DraftProposals(toks, parents, dists, rows, exclude)

    # -- dynamic trees (EAGLE-2) -----------------------------------------------------------------

    def _propose_dynamic(self, context: Sequence[int], q_root: torch.Tensor) -> Drafting:
        k, ctx_len = self.topk, len(context)
        cap = 1 + k + (self.depth - 1) * k * k
        parent = np.full(cap, -1, dtype=np.int64)
        tokens = np.full(cap, -1, dtype=np.int64)
        depth = np.zeros(cap, dtype=np.int64)
        rows = np.full(cap, -1, dtype=np.int64)
        score = np.zeros(cap)  # log of the cumulative draft confidence along the path
        ancestors = np.zeros((cap, cap), dtype=bool)
        tokens[0], rows[0], ancestors[0, 0] = context[-1], ctx_len - 1, True
        n, frontier, q = 1, np.array([0]), q_root
        for d in range(1, self.depth + 1):
            top = torch.topk(q, min(k, q.shape[-1]), dim=-1)
            width = top.indices.shape[-1]
            new = np.arange(n, n + len(frontier) * width)
            parent[new] = np.repeat(frontier, width)
            tokens[new] = top.indices.cpu().numpy().ravel()
            depth[new] = d
            score[new] = score[parent[new]] + top.values.clamp_min(1e-30).log().double().cpu().numpy().ravel()
            ancestors[new] = ancestors[parent[new]]
            ancestors[new, new] = True
            n += len(new)
            if d == self.depth:
                break
            frontier = new[np.argsort(-score[new], kind="stable")[:k]]
            if self._stop(math.exp(score[frontier[0]])):
                break
            q = yield from self._forward_level(ctx_len, frontier, tokens, depth, rows, ancestors)
        self._last = (parent[:n], tokens[:n], rows[:n])
        # Rerank: the `nodes` most confident candidates, proposed most confident first (a budget that cuts the
        # tree keeps the most confident, as EAGLE-2's rerank would). Confidence never grows along a path and ties
        # go to the shallower node, so the kept set is ancestor-closed and a parent comes before its children.
        cand = np.arange(1, n)
        best = cand[np.lexsort((depth[cand], -score[cand]))][: self.nodes]
        index = {int(v): j for j, v in enumerate(best)}
        parents = [ROOT if parent[v] == 0 else index[int(parent[v])] for v in best]
        return DraftProposals([int(tokens[v]) for v in best], parents)
