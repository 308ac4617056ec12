"""Every index a captured step needs, from a tree shape and the envelope it runs in: one pure function.

A static shape (node 0 = the root, nodes in BFS order, ``parent``/``rank`` per node) fixes the whole
step: which nodes each draft level forwards, where their draft K/V rows go, which rows the target's
mask lets each node see, where each child's token is read from its level's selection, and the proposal
lists the verifier walks. :func:`tree_buffers` turns the shape into those arrays (Medusa keeps its tree
in the same kind of buffers); ``treespec.core.captured`` moves them to the device and passes them to
its compiled calls as *data*: the graphs depend only on the :class:`Envelope`, so every tree inside
one envelope replays the same graphs.

**Envelope.** ``nodes`` (root included), ``rows`` (how many rows each draft level forwards; its length
is the depth) and ``children`` (the most children of one node). The shape's nodes come first, then
padding nodes (never chosen, never existing, attending to themselves only). Level ``d`` forwards
``rows[d]`` rows: level 0 the *pending* token (the last accepted token of the previous step when the
draft never forwarded it; otherwise unused) and the root, level ``d >= 1`` the depth-``d`` nodes that
have children; the rest of a level's rows are padding. Node ``v`` at depth ``d + 1`` is choice
``rank[v]`` of row ``row[v]`` of level ``d``. An *exact* envelope (:meth:`Envelope.exact`) is the
shape's own; a *padded* one (:meth:`Envelope.padded`) gives every level the same rows, so that one
level graph serves every depth and every tree inside it.

**Draft slots.** Level ``d``'s rows write slots ``[start_d, start_d + rows[d])`` of the draft's tree block
(slot 0 the pending token, slot 1 the root).

**A chain of given tokens** (``Envelope.chain``, :func:`with_chain`): a chain of ``chain`` nodes under the root,
the root's youngest child first, whose tokens are not drafted but given to each step as data (an n-gram
drafter's continuation of the committed text). Its nodes keep BFS order (node ``j`` of the chain is the last
node of depth ``j + 1``); level 0 forwards the ones with children after the pending token and the root, so
the draft's cache holds every chain node the target may accept (its leaf, when accepted, is the next pending
token) and the chain costs no draft level of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from tree_builders import TreeShape

from .tree import layout, post_order


@dataclass(frozen=True)
class Envelope:
    """The largest tree one set of compiled graphs serves (see the module docstring)."""

    nodes: int
    rows: tuple[int, ...]
    children: int
    chain: int = 0  # nodes of the chain of given tokens under the root (see the module docstring)

    @property
    def depth(self) -> int:
        return len(self.rows)

    @classmethod
    def exact(cls, parent: np.ndarray, rank: np.ndarray, given: np.ndarray | None = None) -> "Envelope":
        """The shape's own envelope: no padding anywhere. ``given``: each node's place in the chain of given
        tokens (-1: drafted; :func:`with_chain`)."""
        parent, rank = np.asarray(parent), np.asarray(rank)
        given = np.full(len(parent), -1) if given is None else np.asarray(given)
        depth, _ = layout(parent)
        has_children = np.bincount(parent[1:], minlength=len(parent)) > 0
        drafted = given < 0
        rows = [2 + int(np.sum(has_children & ~drafted))]
        rows += [int(np.sum((depth == d) & has_children & drafted)) for d in range(1, int(depth[drafted].max()))]
        return cls(len(parent), tuple(rows), int(rank.max()) + 1, int(np.sum(~drafted)))

    @classmethod
    def for_shapes(cls, shapes: Iterable[Any]) -> "Envelope":
        """The padded envelope of tree shapes (``tree_builders.TreeShape``s, or their child-rank paths): what a
        sweep passes ``generate(envelope=...)`` so that all its trees replay one set of graphs."""
        as_shape = lambda s: s if isinstance(s, TreeShape) else TreeShape.from_paths(getattr(s, "paths", s))  # noqa: E731
        shapes = [as_shape(shape) for shape in shapes]
        if not shapes or not all(s.depth for s in shapes):
            raise ValueError("an envelope covers tree shapes of at least one drafted node each; got "
                             + ("none" if not shapes else "the root alone (plain decoding: no graphs to share)"))
        return cls.padded(cls.exact(*shape.node_arrays()) for shape in shapes)

    @classmethod
    def padded(cls, envelopes: Iterable["Envelope"]) -> "Envelope":
        """The smallest envelope with one row count for every level that covers all of ``envelopes``."""
        envelopes = list(envelopes)
        depth = max(e.depth for e in envelopes)
        return cls(max(e.nodes for e in envelopes), (max(max(e.rows) for e in envelopes),) * depth,
                   max(e.children for e in envelopes), max(e.chain for e in envelopes))

    @property
    def draft_slots(self) -> int:
        """Draft-cache rows a step writes past the draft's committed length: every level's rows (a padded
        envelope's levels can hold more rows than the tree has nodes)."""
        return sum(self.rows)

    def keep_from(self, d: int) -> int:
        """The first row of level ``d`` whose logits are kept: level 0's pending row is never a parent, so where
        level 0 has a graph of its own (levels of different rows) its LM head skips that row."""
        return 1 if d == 0 and len(set(self.rows)) > 1 else 0

    def kept_rows(self, d: int) -> int:
        """Rows of level ``d``'s logits (and of its draft distributions ``q``)."""
        return self.rows[d] - self.keep_from(d)

    def covers(self, other: "Envelope") -> bool:
        """Whether a tree of envelope ``other`` runs in this one."""
        return (self.nodes >= other.nodes and self.depth >= other.depth and self.children >= other.children
                and self.chain >= other.chain and all(a >= b for a, b in zip(self.rows, other.rows)))

    def describe(self) -> str:
        rows = f"{self.rows[0]} rows per level" if len(set(self.rows)) == 1 else f"level rows {list(self.rows)}"
        chain = f", a chain of {self.chain} given tokens" if self.chain else ""
        return f"{self.nodes} nodes, depth {self.depth}, {rows}, {self.children} children per node{chain}"


#: row node ids of a level beyond the tree's nodes ``[0, N)``: the pending token and padding
def pending_id(envelope: Envelope) -> int:
    return envelope.nodes


def padding_id(envelope: Envelope) -> int:
    return envelope.nodes + 1


@dataclass(frozen=True)
class LevelBuffers:
    """One draft level: the node each row forwards (``pending_id``, ``padding_id`` beyond the tree), the rows'
    depth below the root (their positions; the pending token -1), the slot columns each row attends to
    (``[rows, S]``), and the level's first slot."""

    nodes: np.ndarray
    slot_depth: np.ndarray
    block: np.ndarray
    start: int
    forwarded: np.ndarray  # the tree nodes among the rows (what the confidence stop reads before forwarding them)


@dataclass(frozen=True)
class TreeBuffers:
    """The arrays of one tree shape in one envelope (see the module docstring); node arrays are ``[N]``."""

    envelope: Envelope
    size: int  # the shape's nodes (the rest are padding)
    parent: np.ndarray  # parent node; -1 for the root and padding
    depth: np.ndarray  # padding: 0
    ancestors: np.ndarray  # [N, N] bool: node i may attend to node j (j is i or an ancestor; padding: itself)
    chosen_at: np.ndarray  # the level whose choices give the node its token; -1: the root and padding
    row: np.ndarray  # the node's parent's row among that level's kept rows (``Envelope.keep_from``)
    rank: np.ndarray  # which of that row's choices is the node
    q_row: np.ndarray  # the row of the levels' stacked draft distributions the node was drawn from
    post_order: np.ndarray  # rank in post-order (traversal verification's leaf tests; padding last)
    earlier_siblings: np.ndarray  # [N, K - 1] the older siblings, -1 padding
    levels: tuple[LevelBuffers, ...]
    slot_node: np.ndarray  # [S] node held by each draft slot (``pending_id``, ``padding_id``)
    slot_level: np.ndarray  # [S] the level that forwards the slot
    given: np.ndarray  # the node's place in the chain of given tokens; -1: drafted (and padding)

    @property
    def flat_parent(self) -> np.ndarray:
        """Parents with the root and padding pointing at the root (what the greedy walk indexes with)."""
        return np.maximum(self.parent, 0)

    @property
    def depth_of_shape(self) -> int:
        """Draft levels this shape needs (the depth of its drafted nodes)."""
        return int(self.depth[(self.given < 0) & (np.arange(len(self.depth)) < self.size)].max())


def with_chain(parent: np.ndarray, rank: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shape ``parent``/``rank`` (BFS order) with a chain of ``length`` given tokens under the root, in BFS
    order again: ``(parent, rank, given)``, ``given[v]`` the node's place in the chain (-1: drafted). The chain's
    first node is the root's youngest child; node ``j`` of the chain is the last node of depth ``j + 1``."""
    parent, rank = np.asarray(parent, dtype=np.int64), np.asarray(rank, dtype=np.int64)
    depth, _ = layout(parent)
    n = len(parent)
    # order: (depth, drafted before given, index); old ids 0..n-1 drafted, n..n+length-1 the chain
    keys = [(int(depth[v]), 0, v) for v in range(n)] + [(j + 1, 1, n + j) for j in range(length)]
    order = [v for *_, v in sorted(keys)]
    new = {old: i for i, old in enumerate(order)}
    roots_children = int(np.sum(parent[1:] == 0))
    out_parent = np.array([-1 if v == 0 else new[int(parent[v])] if v < n else new[0 if v == n else v - 1]
                           for v in order], dtype=np.int64)
    out_rank = np.array([rank[v] if v < n else (roots_children if v == n else 0) for v in order], dtype=np.int64)
    given = np.array([-1 if v < n else v - n for v in order], dtype=np.int64)
    return out_parent, out_rank, given


def tree_buffers(parent: np.ndarray, rank: np.ndarray, envelope: Envelope | None = None,
                 given: np.ndarray | None = None) -> TreeBuffers:
    """Every buffer of the captured step for the shape ``parent``/``rank`` (BFS order, node 0 the root) in
    ``envelope`` (default: the shape's own, :meth:`Envelope.exact`); ``given``: the chain of given tokens
    (:func:`with_chain`), None for none."""
    parent = np.asarray(parent, dtype=np.int64)
    rank = np.asarray(rank, dtype=np.int64)
    n = len(parent)
    given = np.full(n, -1, dtype=np.int64) if given is None else np.asarray(given, dtype=np.int64)
    if n < 2 or parent[0] != -1 or np.any(parent[1:] < 0) or np.any(parent[1:] >= np.arange(1, n)):
        raise ValueError("a captured tree shape needs a root (parent -1) and at least one child, every parent "
                         "before its children")
    depth, ancestors = layout(parent)
    if np.any(np.diff(depth) < 0):
        raise ValueError("a captured tree shape must list its nodes in BFS order (depth never decreasing)")
    own = Envelope.exact(parent, rank, given)
    env = envelope or own
    if not env.covers(own):
        raise ValueError(f"the tree shape ({own.describe()}) does not fit the envelope ({env.describe()}); "
                         "give an envelope that covers it (Envelope.padded over every shape it should run)")
    N = env.nodes

    def node_array(real: np.ndarray, fill: int) -> np.ndarray:
        out = np.full(N, fill, dtype=real.dtype)
        out[:n] = real
        return out

    levels, slot_node, row_of = _levels(env, parent, depth, ancestors, given)
    # per node: which level chose it, from which row (among the level's kept rows) and which stacked row of q;
    # a given token is chosen by none
    chosen_at = np.where((np.arange(n) > 0) & (given < 0), depth - 1, -1)
    kept_from = np.array([env.keep_from(d) for d in range(env.depth)])
    q_starts = np.r_[0, np.cumsum([env.kept_rows(d) for d in range(env.depth)])[:-1]].astype(np.int64)
    row = np.where(np.arange(n) > 0, row_of[np.maximum(parent, 0)] - kept_from[np.maximum(chosen_at, 0)], 0)
    q_row = np.where(np.arange(n) > 0, q_starts[np.maximum(chosen_at, 0)] + row, 0)
    earlier = _older_siblings(parent, N, env.children)
    anc = np.eye(N, dtype=bool)
    anc[:n, :n] = ancestors
    post = np.arange(N)
    post[:n] = post_order(parent)
    return TreeBuffers(env, n, node_array(parent, -1), node_array(depth, 0), anc, node_array(chosen_at, -1),
                       node_array(row, 0), node_array(rank, 0), node_array(q_row, 0), post,
                       earlier, levels, slot_node, np.repeat(np.arange(env.depth), env.rows), node_array(given, -1))


def _levels(env: Envelope, parent: np.ndarray, depth: np.ndarray, ancestors: np.ndarray, given: np.ndarray
            ) -> tuple[tuple[LevelBuffers, ...], np.ndarray, np.ndarray]:
    """Each level's rows and slots (module docstring), the node each slot holds, and each forwarded node's row."""
    n, pending, pad = len(parent), pending_id(env), padding_id(env)
    has_children = np.bincount(parent[1:], minlength=n) > 0
    drafted = given < 0
    starts = np.r_[0, np.cumsum(env.rows)[:-1]].astype(np.int64)
    S = int(sum(env.rows))
    slot_node = np.full(S, pad, dtype=np.int64)
    row_of = np.zeros(n, dtype=np.int64)
    for d in range(env.depth):
        real = (np.r_[pending, 0, np.flatnonzero(has_children & ~drafted)] if d == 0
                else np.flatnonzero((depth == d) & has_children & drafted))
        slot_node[starts[d] : starts[d] + len(real)] = real
        row_of[real[real < n]] = np.flatnonzero(real < n)
    slot_of = {int(v): s for s, v in enumerate(slot_node) if v < n}
    levels = []
    for d in range(env.depth):
        nodes = slot_node[starts[d] : starts[d] + env.rows[d]]
        block = np.zeros((len(nodes), S), dtype=bool)
        slot_depth = np.zeros(len(nodes), dtype=np.int64)
        for j, v in enumerate(nodes):
            block[j, starts[d] + j] = True  # itself (padding rows: only that)
            if v < n:
                block[j, 0] = True  # the pending token precedes the root (ignored when unused)
                block[j, [slot_of[int(a)] for a in np.flatnonzero(ancestors[v])]] = True
                slot_depth[j] = depth[v]
            elif v == pending:
                slot_depth[j] = -1
        levels.append(LevelBuffers(nodes.copy(), slot_depth, block, int(starts[d]), nodes[nodes < n]))
    return tuple(levels), slot_node, row_of


def _older_siblings(parent: np.ndarray, N: int, K: int) -> np.ndarray:
    """Each node's older siblings ``[N, K - 1]`` (-1 padding)."""
    earlier = np.full((N, max(K - 1, 1)), -1)
    for i in range(1, len(parent)):
        older = np.flatnonzero(parent[:i] == parent[i])
        earlier[i, : len(older)] = older
    return earlier
