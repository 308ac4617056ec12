"""The token tree: a prefix trie of proposals, and its flattening for one verification pass.

Node 0 is the root (the last committed token). A node owns the *proposals* of its children in
proposal order; two proposals of the same token share one child node and both stay in the list,
because verification must apply both residual updates (``docs/design.md``, "Exactness rule").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from .drafting import POINT_MASS, ROOT, DraftProposals
from .rule import draw_without_replacement_q


@dataclass
class Proposal:
    """One proposed child: its token, the node it leads to, and the distribution it was drawn from."""

    token: int
    child: int
    drafter: int
    dists: torch.Tensor | None = None  # the drafter's [rows, V] tensor, None for a point mass
    row: int = POINT_MASS
    exclude: tuple[int, ...] = ()

    def q(self, vocab_size: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The proposal distribution ``q_i`` as a dense vector on ``device`` (float32 unless ``dtype``)."""
        if self.row == POINT_MASS:
            q = torch.zeros(vocab_size, device=device, dtype=dtype)
            q[self.token] = 1.0
            return q
        return draw_without_replacement_q(self.dists[self.row].to(device, dtype), self.exclude)


@dataclass
class TokenTree:
    """Prefix trie rooted at the last committed token."""

    tokens: list[int]
    parent: list[int] = field(default_factory=lambda: [-1])
    depth: list[int] = field(default_factory=lambda: [0])
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])
    proposals: list[list[Proposal]] = field(default_factory=lambda: [[]])
    proposed_by: list[int] = field(default_factory=lambda: [0])  # bitmask of drafters per node

    @classmethod
    def rooted_at(cls, token: int) -> "TokenTree":
        return cls(tokens=[int(token)])

    @property
    def size(self) -> int:
        """Number of nodes, root included (the tokens of one verification pass)."""
        return len(self.tokens)

    def add(self, parent: int, proposal: Proposal) -> int:
        """Attach ``proposal`` under ``parent``; returns the (possibly shared) child node."""
        child = self.children[parent].get(proposal.token)
        if child is None:
            child = self.size
            self.tokens.append(proposal.token)
            self.parent.append(parent)
            self.depth.append(self.depth[parent] + 1)
            self.children.append({})
            self.proposals.append([])
            self.proposed_by.append(0)
            self.children[parent][proposal.token] = child
        proposal.child = child
        self.proposals[parent].append(proposal)
        self.proposed_by[child] |= 1 << proposal.drafter
        return child

    def merge(self, drafts: Sequence[DraftProposals], budget: int | None = None,
              max_depth: int | None = None) -> int:
        """Merge drafters' proposals in drafter order, then each drafter's proposal order.

        A proposal deeper than ``max_depth`` is dropped, with its subtree. With a ``budget``, a
        proposal is kept iff the tree has room for one more node when its turn comes (and its parent
        was kept). Neither decision looks at the proposal's own token (only at its depth and its
        turn), so the kept proposals are still draws from their ``q`` and the output stays exact;
        a depth cut drops every sibling of a group alike, so sampling without replacement keeps its
        ``exclude`` lists. Returns the number of proposals dropped by ``max_depth`` (subtrees included).
        """
        too_deep = 0
        for d, draft in enumerate(drafts):
            node_of: list[int | None] = []
            deep: set[int] = set()  # this draft's proposals dropped by depth (their subtrees too)
            for j, (token, par) in enumerate(zip(draft.tokens, draft.parents)):
                parent = 0 if par == ROOT else node_of[par]
                if (par != ROOT and par in deep) or (
                        parent is not None and max_depth is not None and self.depth[parent] >= max_depth):
                    too_deep += 1
                    deep.add(j)
                    parent = None
                if parent is None or (budget is not None and self.size >= budget):
                    node_of.append(None)
                    continue
                row = draft.dist_row(j)
                node_of.append(
                    self.add(parent, Proposal(int(token), -1, d, draft.dists if row != POINT_MASS else None,
                                              row, draft.excluded(j)))
                )
        return too_deep


@dataclass
class FlatTree:
    """A token tree laid out for one forward pass, in DFS order (every parent before its children)."""

    order: np.ndarray  # flat index -> tree node
    index: np.ndarray  # tree node -> flat index
    tokens: np.ndarray  # [n] in flat order
    depth: np.ndarray  # [n] in flat order
    parent: np.ndarray  # [n] flat index of each node's parent (the root: 0, itself)
    ancestors: np.ndarray  # [n, n] bool: row i may attend to column j (j is i or an ancestor of i)

    def __len__(self) -> int:
        return len(self.order)


def layout(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each node's depth ``[n]`` and the ancestor matrix ``[n, n]`` (row ``i``: ``i`` and its ancestors) of the
    tree ``parent`` (node 0 the root, its entry ignored; every parent listed before its children). The one
    tree-layout loop of the package: flat trees, captured shapes, the draft's static shapes and timing all
    call it."""
    parent = np.asarray(parent, dtype=np.int64)
    n = len(parent)
    depth = np.zeros(n, dtype=np.int64)
    ancestors = np.eye(n, dtype=bool)
    for i in range(1, n):
        depth[i] = depth[parent[i]] + 1
        ancestors[i] |= ancestors[parent[i]]
    return depth, ancestors


def post_order(parent: np.ndarray) -> np.ndarray:
    """Each node's rank in the post-order of the tree ``parent`` (as :func:`layout`), siblings in index order:
    the order in which traversal verification tests its nodes as leaves (``rule.traversal_path``). Serves a
    captured shape (BFS) and a flat tree (DFS)."""
    n = len(parent)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[int(parent[i])].append(i)
    # pre-order with the last child first, reversed, is post-order with the first child first
    order, stack = [], [0]
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(children[v])
    rank = np.empty(n, dtype=np.int64)
    rank[order[::-1]] = np.arange(n)
    return rank


def flatten(tree: TokenTree) -> FlatTree:
    """DFS order (children in first-proposal order) and the ancestor-only attention mask."""
    n = tree.size
    order = np.empty(n, dtype=np.int64)
    stack, k = [0], 0
    while stack:
        node = stack.pop()
        order[k] = node
        k += 1
        stack.extend(reversed(tree.children[node].values()))
    index = np.empty(n, dtype=np.int64)
    index[order] = np.arange(n)
    parent = np.asarray(tree.parent, dtype=np.int64)[order]
    flat_parent = np.where(parent < 0, 0, index[np.maximum(parent, 0)])
    depth, ancestors = layout(flat_parent)
    tokens = np.asarray(tree.tokens, dtype=np.int64)[order]
    return FlatTree(order, index, tokens, depth, flat_parent, ancestors)
