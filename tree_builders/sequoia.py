"""Sequoia-style dynamic program: the tree shape with the most expected tokens for a budget.

Definitions (``docs/design.md``): a shape's expected tokens is ``sum_v prod_{u on root->v} a[rank(u)]``,
root included. Children ranks are fixed positions: a child of rank ``k`` gets ``a[k]`` whatever the
other entries are (the vector need not be sorted). With a per-depth matrix, the child of a node at
depth ``d`` with rank ``k`` gets ``a[d][k]`` (rows past the last reuse the last row).

Recursion. ``F_d[n]`` = best value of a subtree whose root is at depth ``d`` and that uses at most
``n`` nodes (root included). With ``G_{d,j}[m]`` = best total value of exactly ``j`` children
(ranks ``0..j-1``, each a non-empty subtree at depth ``d+1``) using at most ``m`` nodes:

    G_{d,0}[m] = 0
    G_{d,j}[m] = max_{1 <= s <= m-j+1} G_{d,j-1}[m-s] + a[d][j-1] * F_{d+1}[s]     (knapsack)
    F_d[n]     = 1 + max_{0 <= j <= W} G_{d,j}[n-1]
    F_D[n]     = 1                                                                 (depth limit D)

(a subtree's value is 1 for its root plus ``a_k`` times each child subtree's value, since every
path through child ``k`` carries the factor ``a_k``). Each ``G_{d,j}`` is one max-plus
convolution, vectorised over ``m`` with a sliding-window view: ``O(D * W * B^2)`` flops. Without a
depth limit, every depth at or past the matrix's last row has the same ``F`` (a subtree can never
be deeper than the budget), which is computed once by an ``O(W * B^2)`` recursion over ``n``.
Ties are broken towards fewer children and fewer nodes, so the shape returned is the smallest one
achieving the optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .args import check_count, check_optional_count
from .shape import Acceptance, Path, TreeShape, acceptance_rows

_TIE = 1e-12  # a strictly better value must beat the incumbent by more than this


@dataclass
class _Level:
    """DP tables of one depth: ``F[n]``, the best number of children ``nkids[n]`` for budget ``n``
    and ``split[j-1][m]``: nodes given to child rank ``j-1`` when the first ``j`` children share ``m``
    (Python lists: the traceback reads them an element at a time, thousands of shapes per tuning)."""

    F: np.ndarray  # [B+1], F[0] = -inf
    nkids: list[int]  # [B+1]
    split: list[list[int]]  # [W][B]


#: the largest budget the DP sizes: its tables hold about budget x width numbers (a budget of 100,000 asked for
#: 75 GiB), and no verification pass is that wide
MAX_BUDGET = 4096


def _check_limits(budget: int, max_depth: int | None, max_width: int | None) -> None:
    check_count("budget", budget, 1, "it counts the root")
    if budget > MAX_BUDGET:
        raise ValueError(f"budget {budget} is past the {MAX_BUDGET} nodes the Sequoia DP sizes (its tables grow with "
                         "budget x width); a verification pass holds tens to hundreds of tokens: give a smaller budget")
    check_optional_count("max_depth", max_depth, 0)
    check_optional_count("max_width", max_width, 0)


def _level(F_child: np.ndarray, a: np.ndarray, B: int) -> _Level:
    """One depth of the recursion, given the children's ``F_{d+1}`` (vectorised over budgets)."""
    W = len(a)
    G_prev = np.zeros(B)  # G_{d,0}[m] = 0, m = 0..B-1
    best = G_prev.copy()
    nkids = np.zeros(B + 1, dtype=np.int64)
    split = np.zeros((W, B), dtype=np.int32)
    pad = np.full(B - 1, -np.inf)
    rows = np.arange(B)
    for j in range(1, W + 1):
        c = np.empty(B)  # c[s]: child of rank j-1 with at most s nodes
        c[0] = -np.inf  # a child has at least one node
        c[1:] = a[j - 1] * F_child[1:B]
        # T[m, s] = G_prev[m - s] (-inf where m < s): a zero-copy Toeplitz view
        T = sliding_window_view(np.concatenate([pad, G_prev]), B)[:, ::-1]
        M = T + c[None, :]
        arg = M.argmax(axis=1)  # first maximum: fewest nodes to this child
        G = M[rows, arg]
        split[j - 1] = arg
        better = G > best + _TIE
        best = np.where(better, G, best)
        nkids[1:][better] = j
        G_prev = G
    F = np.concatenate([[-np.inf], 1.0 + best])
    return _Level(F=F, nkids=nkids.tolist(), split=split.tolist())


def _stationary(a: np.ndarray, B: int) -> _Level:
    """``F`` of a depth-independent subtree (same row at every depth, no depth limit).

    ``F[n]`` only needs ``F[1..n-1]``, so the recursion runs over ``n`` (vectorised over ``s``).
    """
    W = len(a)
    F = np.full(B + 1, -np.inf)
    nkids = np.zeros(B + 1, dtype=np.int64)
    split = np.zeros((W, B), dtype=np.int32)
    G = np.full((W + 1, B), -np.inf)
    G[0, :] = 0.0
    if B >= 1:
        F[1] = 1.0
    for n in range(2, B + 1):
        m = n - 1
        best, bestj = 0.0, 0
        for j in range(1, min(W, m) + 1):
            # s = 1..m-j+1; G[j-1][m-s] for s ascending is G[j-1][m-1], ..., G[j-1][j-1]
            prev = G[j - 1, j - 1 : m][::-1]
            vals = prev + a[j - 1] * F[1 : m - j + 2]
            k = int(vals.argmax())
            G[j, m] = vals[k]
            split[j - 1, m] = k + 1
            if vals[k] > best + _TIE:
                best, bestj = float(vals[k]), j
        F[n] = 1.0 + best
        nkids[n] = bestj
    return _Level(F=F, nkids=nkids.tolist(), split=split.tolist())


class SequoiaDP:
    """The solved DP for every budget up to ``budget``; :meth:`shape` rebuilds the optimum.

    ``values[n]`` (``n = 0..budget``) is the best expected tokens (root included) of a shape with
    at most ``n`` nodes (``values[0] = 0``).
    """

    def __init__(
        self,
        acceptance: Acceptance,
        budget: int,
        max_depth: int | None = None,
        max_width: int | None = None,
    ) -> None:
        _check_limits(budget, max_depth, max_width)
        rows = acceptance_rows(acceptance)
        B = int(budget)
        # ranks past the last positive entry of every row only add zero-valued nodes
        nz = np.nonzero(rows.max(axis=0) > 0)[0]
        W = int(nz[-1]) + 1 if len(nz) else 0
        if max_width is not None:
            W = min(W, int(max_width))
        W = min(W, B - 1)
        rows = rows[:, :W]
        R = rows.shape[0]
        self.budget = B
        self._shapes: dict[int, TreeShape] = {}  # by node count: budgets past a plateau share one
        self.rows = rows
        # a subtree can never be deeper than the budget: a larger limit is no limit
        D = None if max_depth is None or max_depth >= B - 1 else int(max_depth)
        if D is None and R - 1 >= B - 1:
            D = B - 1  # the matrix has a row for every reachable depth: plain levels, exact
        self.max_depth = D
        self._levels: list[_Level] = []
        self._tail: _Level | None = None  # tables shared by every depth >= len(_levels)
        if W == 0 or B == 1 or D == 0:
            self._tail = None
            self.values = np.concatenate([[0.0], np.ones(B)])
            self._trivial = True
            return
        self._trivial = False
        if D is not None:
            F_child = np.concatenate([[-np.inf], np.ones(B)])  # F_D: leaves
            levels = []
            for d in range(D - 1, -1, -1):
                lvl = _level(F_child, rows[min(d, R - 1)], B)
                levels.append(lvl)
                F_child = lvl.F
            self._levels = levels[::-1]
        else:
            self._tail = _stationary(rows[R - 1], B)
            F_child = self._tail.F
            levels = []
            for d in range(R - 2, -1, -1):
                lvl = _level(F_child, rows[d], B)
                levels.append(lvl)
                F_child = lvl.F
            self._levels = levels[::-1]
        F0 = self._levels[0].F if self._levels else self._tail.F  # type: ignore[union-attr]
        self.values = np.concatenate([[0.0], F0[1:]])

    def _tables(self, d: int) -> _Level | None:
        if self._trivial or (self.max_depth is not None and d >= self.max_depth):
            return None  # a leaf
        return self._levels[d] if d < len(self._levels) else self._tail

    def nodes(self, budget: int | None = None) -> int:
        """Nodes of the smallest optimal shape with at most ``budget`` nodes (default: the DP's budget)."""
        n = self.budget if budget is None else check_count("budget", budget, 1, "it counts the root")
        if n > self.budget:
            raise ValueError(f"budget must be >= 1 and <= {self.budget} (the DP's budget), got {budget!r}")
        # smallest n' <= n reaching the optimum: its optimal shape uses exactly n' nodes
        target = self.values[n] - _TIE * max(1.0, self.values[n])
        return int(np.argmax(self.values[: n + 1] >= target))

    @staticmethod
    def _children(tab: _Level | None, nodes: int) -> list[int]:
        """Nodes of each child's subtree (rank 0 first) of an optimal subtree of ``nodes`` nodes whose depth has
        the tables ``tab`` (None: a leaf)."""
        if tab is None or nodes <= 1:
            return []
        m, out = nodes - 1, []
        for j in range(tab.nkids[nodes], 0, -1):  # the last rank's share first (the knapsack's order)
            out.append(tab.split[j - 1][m])
            m -= out[-1]
        return out[::-1]

    def shape(self, budget: int | None = None) -> TreeShape:
        """The smallest optimal shape with at most ``budget`` nodes (default: the DP's budget)."""
        n = self.nodes(budget)
        if n in self._shapes:
            return self._shapes[n]
        paths: list[Path] = []
        stack: list[tuple[Path, int]] = [((), n)]  # explicit stack: trees may be very deep
        while stack:
            node, nodes = stack.pop()
            for rank, s in enumerate(self._children(self._tables(len(node)), nodes)):
                paths.append(node + (rank,))
                stack.append((paths[-1], s))
        shape = self._shapes[n] = TreeShape(paths)
        return shape

    def branching(self, budget: int | None = None) -> list[int]:
        """Nodes with children at each depth ``0..depth-1`` of :meth:`shape` ``(budget)``, read off the tables
        without building the shape (a tuner costs thousands of shapes and keeps one)."""
        level, out = [self.nodes(budget)], []
        while True:
            tab = self._tables(len(out))
            kids = [self._children(tab, nodes) for nodes in level]
            level = [s for k in kids for s in k]
            if not level:
                return out
            out.append(sum(1 for k in kids if k))


def sequoia_values(
    acceptance: Acceptance,
    budget: int,
    max_depth: int | None = None,
    max_width: int | None = None,
) -> np.ndarray:
    """Best expected tokens for every budget: ``out[n]``, ``n = 0..budget`` (``out[0] = 0``)."""
    return SequoiaDP(acceptance, budget, max_depth, max_width).values.copy()


def sequoia(
    acceptance: Acceptance,
    budget: int,
    max_depth: int | None = None,
    max_width: int | None = None,
) -> TreeShape:
    """The shape maximising expected tokens with ``size <= budget``, ``depth <= max_depth`` and at
    most ``max_width`` children per node, for a positional acceptance vector ``a[k]`` or a
    per-depth matrix ``a[d][k]``. Exact (dynamic program); among optimal shapes, the smallest.
    """
    return SequoiaDP(acceptance, budget, max_depth, max_width).shape()
