"""Every index a captured step needs, from a fixed tree shape: one pure function, computed once.

A static shape (node 0 = the root, nodes in BFS order, ``parent``/``rank`` per node) fixes the
whole step: which nodes each draft level forwards, where their draft K/V rows go, which rows the
target's mask lets each node see, where each child's token is read from the level's selection, and
the proposal lists the verifier walks. :func:`shape_buffers` turns the shape into those arrays
(Medusa keeps its tree in the same kind of buffers); ``treespec.core.captured`` moves them to the
device once and indexes with them every step.

The draft's tree rows, the *slots*, are laid out as: slot 0 the *pending* token (the last accepted
token of the previous step when the draft never forwarded it, a leaf; otherwise unused), slot 1 the
root, then the forwarded nodes (those with children) depth by depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Level:
    """Drafting depth ``d``: choose the children at depth ``d`` from the previous forward's rows.

    ``children`` are the nodes at depth ``d`` (a contiguous BFS range); child ``i`` is the
    ``rank[i]``-th choice of row ``parent_row[i]`` of the previous forward; ``width`` the most
    children of one parent. ``forward`` are the children that have children of their own (also a
    contiguous range of slots, ``slots``): the draft forwards them next, unless ``d`` is the last depth.
    """

    children: slice
    parent_row: np.ndarray
    rank: np.ndarray
    width: int
    forward: np.ndarray
    slots: slice


@dataclass(frozen=True)
class ShapeBuffers:
    """The arrays of one static tree shape (see the module docstring)."""

    parent: np.ndarray  # [N] parent node, -1 for the root
    depth: np.ndarray  # [N]
    ancestors: np.ndarray  # [N, N] bool: node i may attend to node j (j is i or an ancestor of i)
    levels: tuple[Level, ...]  # depths 1..D
    slot_node: np.ndarray  # [S] node held by each draft slot (-1: the pending slot)
    slot_ancestors: np.ndarray  # [S, S] bool: slot i may attend to slot j (the pending slot: every row)
    slot_depth: np.ndarray  # [S] depth below the root (-1: the pending token)
    next_sibling: np.ndarray  # [N] the next younger sibling of each node, -1 for the last one
    earlier_siblings: np.ndarray  # [N, K - 1] the older siblings of each node, -1 padding
    post_order: np.ndarray  # [N] each node's rank in post-order (traversal verification's leaf tests)

    @property
    def size(self) -> int:
        return len(self.parent)

    @property
    def flat_parent(self) -> np.ndarray:
        """Parents with the root pointing at itself (what the greedy walk indexes with)."""
        return np.maximum(self.parent, 0)


def shape_buffers(parent: np.ndarray, rank: np.ndarray) -> ShapeBuffers:
    """Every buffer of the captured step for the shape ``parent``/``rank`` (BFS order, node 0 the root)."""
    parent = np.asarray(parent, dtype=np.int64)
    rank = np.asarray(rank, dtype=np.int64)
    n = len(parent)
    if n < 2 or parent[0] != -1 or np.any(parent[1:] < 0) or np.any(parent[1:] >= np.arange(1, n)):
        raise ValueError("a captured tree shape needs a root (parent -1) and at least one child, every parent "
                         "before its children")
    depth = np.zeros(n, dtype=np.int64)
    ancestors = np.eye(n, dtype=bool)
    for i in range(1, n):
        depth[i] = depth[parent[i]] + 1
        ancestors[i] |= ancestors[parent[i]]
    if np.any(np.diff(depth) < 0):
        raise ValueError("a captured tree shape must list its nodes in BFS order (depth never decreasing)")
    n_children = np.bincount(parent[1:], minlength=n)
    # draft slots: pending, root, then forwarded nodes depth by depth
    slot_node = [-1, 0]
    levels = []
    prev_forward = np.array([0])
    for d in range(1, int(depth.max()) + 1):
        kids = np.flatnonzero(depth == d)
        row_of = {int(v): j for j, v in enumerate(prev_forward)}
        forward = kids[n_children[kids] > 0]
        start = len(slot_node)
        slot_node += [int(v) for v in forward]
        levels.append(Level(slice(int(kids[0]), int(kids[-1]) + 1), np.array([row_of[int(p)] for p in parent[kids]]),
                            rank[kids], int(rank[kids].max()) + 1, forward, slice(start, len(slot_node))))
        prev_forward = forward
    slot_node = np.array(slot_node, dtype=np.int64)
    s = len(slot_node)
    slot_of = np.full(n, -1)
    slot_of[slot_node[1:]] = np.arange(1, s)
    slot_ancestors = np.eye(s, dtype=bool)
    slot_ancestors[:, 0] = True  # the pending token precedes the root (rows ignore it when it is unused)
    nodes = slot_node[1:]
    slot_ancestors[1:, 1:] = ancestors[np.ix_(nodes, nodes)]
    slot_depth = np.r_[-1, depth[nodes]]
    next_sibling = np.full(n, -1)
    width = int(rank.max()) + 1
    earlier = np.full((n, max(width - 1, 1)), -1)
    for i in range(1, n):
        sibs = np.flatnonzero(parent == parent[i])
        later = sibs[sibs > i]
        next_sibling[i] = later[0] if later.size else -1
        older = sibs[sibs < i]
        earlier[i, : len(older)] = older
    return ShapeBuffers(parent, depth, ancestors, tuple(levels), slot_node, slot_ancestors, slot_depth, next_sibling,
                        earlier, post_order(parent))


def post_order(parent: np.ndarray) -> np.ndarray:
    """Each node's rank in the post-order of the tree ``parent`` (node 0 the root, its parent entry ignored;
    every parent before its children), siblings in index order: the order in which traversal verification
    tests its nodes as leaves (``compiled.traversal_path``). Serves a static shape (BFS) and a flat tree (DFS)."""
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
