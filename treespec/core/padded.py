"""A host-drafted tree as fixed-size device tensors, and the acceptance over them.

The eager step (``treespec.core.engine``) and the compiled step (``treespec.core.compiled``) verify the
same kind of tree, a trie the drafters merged on the host and ``tree.flatten`` laid out in DFS order.
Both hand it to the one tensor implementation of each acceptance rule (``treespec.core.rule``) through
:func:`accept`; the compiled step pads it to a fixed width first (so every step replays one graph), the
eager step does not. Three named containers carry what a rule reads: :class:`PaddedTree` (the nodes),
:class:`Proposals` (the proposal list a sampled walk runs over) and :class:`Noise` (the step's random
numbers, drawn up front by one seeded call each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np
import torch

from . import verifiers
from .drafting import POINT_MASS
from .rule import greedy_path, sampled_path, traversal_path
from .sampling import SamplingParams
from .tree import FlatTree, TokenTree, post_order

if TYPE_CHECKING:
    from .request import Request


def next_pow2(n: int, least: int = 8) -> int:
    """The smallest power of two ``>= n`` and ``>= least``."""
    return max(least, 1 << (max(n, 1) - 1).bit_length())


class PaddedTree(NamedTuple):
    """A flat tree padded to width ``w`` (padding rows: token 0, depth 0, attending to themselves only)."""

    tokens: torch.Tensor  # [w] long
    depth: torch.Tensor  # [w] long
    parent: torch.Tensor  # [w] flat index of each node's parent (the root and padding: 0)
    valid: torch.Tensor  # [w] bool: a node of the tree
    anc: torch.Tensor  # [w, w] bool: row i may attend to column j

    @classmethod
    def of(cls, flat: FlatTree, w: int, device: torch.device) -> "PaddedTree":
        """Two host->device copies."""
        return cls(*(x[0] for x in cls.of_rows([flat], w, device)))

    @classmethod
    def of_rows(cls, flats: Sequence[FlatTree], w: int, device: torch.device) -> "PaddedTree":
        """Several trees as the rows of one (every field with a leading ``[B]``), in two host->device copies."""
        ints = np.zeros((4, len(flats), w), dtype=np.int64)
        anc = np.zeros((len(flats), w, w), dtype=bool)
        anc[:, np.arange(w), np.arange(w)] = True
        for b, flat in enumerate(flats):
            n = len(flat)
            ints[0, b, :n], ints[1, b, :n], ints[2, b, :n], ints[3, b, :n] = flat.tokens, flat.depth, flat.parent, 1
            anc[b, :n, :n] = flat.ancestors
        t = torch.from_numpy(ints).to(device, non_blocking=True)
        return cls(t[0], t[1], t[2], t[3].bool(), torch.from_numpy(anc).to(device, non_blocking=True))


class Proposals(NamedTuple):
    """A tree's proposals as a fixed-size list for ``rule.sampled_path`` and ``rule.traversal_path``: sorted by
    their parent's flat index, each parent's proposals in proposal order; ``parent == -1`` marks padding."""

    q: torch.Tensor  # [P, V] the distribution each proposal was drawn from
    token: torch.Tensor  # [P]
    parent: torch.Tensor  # [P] flat index of the proposing node
    child: torch.Tensor  # [P] flat index of the proposed node
    last: torch.Tensor  # [P] bool: the last proposal of its parent
    has_props: torch.Tensor  # [w] bool: the node proposes children
    post: torch.Tensor  # [w] each node's rank in post-order (padding last)

    @classmethod
    def of(cls, tree: TokenTree, flat: FlatTree, vocab: int, w: int, device: torch.device,
           size: int = 0) -> "Proposals":
        """``P`` is a power of two ``>= w`` (a fixed shape keeps one graph), or ``size`` where that is larger."""
        return cls(*(x[0] for x in cls.of_rows([(tree, flat)], vocab, w, device, size)))

    @classmethod
    def of_rows(cls, trees: Sequence[tuple[TokenTree, FlatTree]], vocab: int, w: int, device: torch.device,
                size: int = 0) -> "Proposals":
        """Several trees' proposals as the rows of one list (every field with a leading ``[B]``; ``P`` fits the
        longest row, as :meth:`of`), in one host->device copy of the integers and one write of each kind of ``q``."""
        props = [[(i, p) for i, node in enumerate(flat.order) for p in tree.proposals[node]] for tree, flat in trees]
        size = max(size, *(next_pow2(len(row), w) for row in props))
        ints = np.zeros((6, len(trees), size), dtype=np.int64)  # token, parent, child, last, (per flat node:
        ints[1] = -1  # has_props, post)
        ints[5, :, :w] = np.arange(w)
        point, dense = [], []  # (row, proposal) of each kind
        for b, ((_, flat), row) in enumerate(zip(trees, props)):
            n = len(row)
            ints[5, b, : len(flat)] = post_order(flat.parent)
            for j, (i, p) in enumerate(row):
                ints[:3, b, j] = (p.token, i, flat.index[p.child])
                (point if p.row == POINT_MASS else dense).append((b, j))
            if n:
                ints[3, b, :n] = np.r_[ints[1, b, 1:n] != ints[1, b, : n - 1], True]
            ints[4, b, ints[1, b, :n]] = 1  # size >= w, so the flat nodes fit in this row
        t = torch.from_numpy(ints).to(device, non_blocking=True)
        q = torch.zeros(len(trees), size, vocab, device=device)
        if point:
            at = torch.tensor(point, device=device).T
            q[at[0], at[1], t[0, at[0], at[1]]] = 1.0
        if dense:
            at = torch.tensor(dense, device=device).T
            q[at[0], at[1]] = torch.stack([props[b][j][1].q(vocab, device) for b, j in dense])
        return cls(q, t[0], t[1], t[2], t[3].bool(), t[4, :, :w].bool(), t[5, :, :w])


class Noise(NamedTuple):
    """A sampled step's random numbers: one uniform per proposal (its test under ``rrs``; under traversal,
    entry ``v - 1`` is node ``v``'s leaf test) and the exponentials ``[V]`` of the correction's race."""

    uniforms: torch.Tensor
    exponentials: torch.Tensor

    @classmethod
    def draw(cls, proposals: int, vocab: int, generator: torch.Generator, device: torch.device) -> "Noise":
        return cls(torch.rand(proposals, generator=generator, device=device),
                   torch.empty(vocab, device=device).exponential_(generator=generator))


def rows_of(*trees: NamedTuple | None) -> list:
    """Each container (``PaddedTree``, ``Proposals``, ``Noise``, or None) as a batch of one row."""
    return [None if t is None else type(t)(*(x[None] for x in t)) for t in trees]


def accept(logits: torch.Tensor, tree: PaddedTree, props: Proposals | None, noise: Noise | None,
           params: SamplingParams, verifier: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(on_path [B, w] bool, extra token [B])`` of ``B`` rows (every tensor with a leading ``[B]``; one tree:
    :func:`rows_of`): the greedy path, or the request's exact rule for a sampled step (``rrs``: the token-level
    rule proposal by proposal; ``traversal``, and ``block``, the same rule on a chain: traversal verification's
    leaf tests). Pure tensors: compiled as a part of a step's graph, or eager."""
    if params.greedy:
        return greedy_path(logits, tree.tokens, tree.parent, tree.anc, tree.valid)
    probs = params.probs(logits)
    if verifier == "rrs":
        return sampled_path(probs, props.q, props.token, props.parent, props.child, props.last, props.has_props,
                            noise.uniforms, noise.exponentials)
    return traversal_path(probs, props.q, props.token, props.parent, props.child, tree.anc, props.post,
                          noise.uniforms, noise.exponentials)


class HostAcceptance:
    """One request's acceptance of an unpadded host-drafted tree (the eager step's, and each row's of a batch,
    :func:`accept_rows`): its random numbers from the request's own generator, its rule by :func:`accept`
    (``spectr``: on the host)."""

    def __init__(self, req: "Request", gen: torch.Generator) -> None:
        self.req, self.gen = req, gen

    def noise(self, props: int) -> Noise:
        """The step's random numbers for ``props`` proposals (the compiled step draws the same ones in the same
        order)."""
        return Noise.draw(props, self.req.vocab, self.gen, self.req.device)

    def accept(self, tree: TokenTree, flat: FlatTree, logits: torch.Tensor) -> tuple[list[int], int]:
        """The accepted path (tree nodes) and the extra token, by the request's rule (``logits``: ``[n, V]``)."""
        return accept_rows([(self, tree, flat, logits)])[0]


def accept_rows(rows: Sequence[tuple[HostAcceptance, TokenTree, FlatTree, torch.Tensor]]
                ) -> list[tuple[list[int], int]]:
    """The acceptances of requests with the same sampling settings (a batch's rows; each its own tree, target
    logits ``[n, V]`` and generator) in one call of the rule: each tree padded to the widest, its proposal list to
    the longest, its random numbers drawn as it draws them alone (padding proposals are never tried:
    ``parent == -1``), so each row's outcome is its outcome alone. ``spectr`` walks each row on the host."""
    req = rows[0][0].req
    if not req.params.greedy and req.verifier == "spectr":
        return [verifiers.spectr(tree, verifiers.node_targets(flat, logits, req.params), verifiers.TorchCoins(acc.gen))
                for acc, tree, flat, logits in rows]
    device, w = req.device, max(len(flat) for _, _, flat, _ in rows)
    padded = PaddedTree.of_rows([flat for _, _, flat, _ in rows], w, device)
    logits = torch.stack([torch.cat([x, x.new_zeros(w - len(x), x.shape[1])]) for *_, x in rows])
    props = noise = None
    if not req.params.greedy:
        count = [sum(len(tree.proposals[v]) for v in flat.order) for _, tree, flat, _ in rows]
        size = max(next_pow2(n, w) for n in count)
        props = Proposals.of_rows([(tree, flat) for _, tree, flat, _ in rows], req.vocab, w, device, size)
        own = [acc.noise(next_pow2(n, len(flat))) for n, (acc, _, flat, _) in zip(count, rows)]  # as drawn alone
        noise = Noise(torch.stack([torch.cat([x.uniforms, x.uniforms.new_ones(size - len(x.uniforms))]) for x in own]),
                      torch.stack([x.exponentials for x in own]))
    on_path, extra = accept(logits, padded, props, noise, req.params, req.verifier)
    out = torch.cat([on_path.long(), extra[:, None]], 1).tolist()  # one device->host copy
    return [([int(flat.order[i]) for i in range(len(flat)) if o[i]], o[-1]) for (_, _, flat, _), o in zip(rows, out)]
