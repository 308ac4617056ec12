"""``TreeShape``: the shape of a token tree, as a set of child-rank paths.

A path is a tuple of child ranks read from the root: ``()`` is the root (the last committed
token), ``(0,)`` its first child, ``(0, 1)`` the second child of that child. A node's children
always hold the ranks ``0..b-1``; rank ``k`` is the ``k``-th proposal of its parent, whose
probability of being the accepted child is ``a_k`` under a positional acceptance vector ``a``
(see ``docs/design.md``, "Definitions").
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Union

import numpy as np

Path = tuple[int, ...]
#: a positional acceptance vector ``a[k]`` or a per-depth matrix ``a[d][k]`` (child at depth d+1)
Acceptance = Union[Sequence[float], Sequence[Sequence[float]], np.ndarray]

_ROW_SUM_TOL = 1e-6


def acceptance_rows(acceptance: Acceptance) -> np.ndarray:
    """Normalise ``acceptance`` to a 2D float array ``rows[d, k]`` (one row for a vector).

    Row ``d`` holds the acceptance of the children of a node at depth ``d`` (the children sit at
    depth ``d + 1``); ragged rows are padded with zeros (a rank beyond a row has probability 0).
    Entries must lie in ``[0, 1]`` and each row must sum to at most 1: the ranks of one sibling
    group are disjoint events ("the child of rank k is the accepted one").
    """
    if isinstance(acceptance, (str, bytes, dict)) or not hasattr(acceptance, "__iter__"):
        raise ValueError(f"acceptance must be a vector a[k] or a per-depth matrix a[d][k] of probabilities, "
                         f"got {type(acceptance).__name__}")
    try:
        arr = _acceptance_array(acceptance)
    except (TypeError, ValueError) as exc:
        if "acceptance" in str(exc):
            raise
        raise ValueError(f"acceptance must hold numbers (probabilities in [0, 1]): {exc}") from None
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"acceptance must be a non-empty vector or matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0) or np.any(arr > 1):
        raise ValueError("acceptance probabilities must be finite and in [0, 1]")
    sums = arr.sum(axis=1)
    if np.any(sums > 1 + _ROW_SUM_TOL):
        d = int(np.argmax(sums))
        raise ValueError(
            f"acceptance row {d} sums to {sums[d]:.6g} > 1; a[k] are probabilities of disjoint "
            "events (the accepted child is the one of rank k)"
        )
    return arr


def _acceptance_array(acceptance: Acceptance) -> np.ndarray:
    """``acceptance`` as a float array (one row for a vector); numbers only, ragged rows zero-padded."""
    if isinstance(acceptance, np.ndarray):
        if acceptance.dtype.kind not in "iuf":
            raise ValueError(f"acceptance must be a numeric array, got dtype {acceptance.dtype}")
        arr = np.asarray(acceptance, dtype=np.float64)
        return arr[None, :] if arr.ndim == 1 else arr
    items = list(acceptance)
    if not items:
        raise ValueError("acceptance must not be empty")
    if all(np.ndim(x) == 0 for x in items):
        return np.asarray([_probability(x) for x in items], dtype=np.float64)[None, :]
    if all(np.ndim(x) == 1 for x in items):
        width = max(len(x) for x in items)
        arr = np.zeros((len(items), width), dtype=np.float64)
        for d, row in enumerate(items):
            arr[d, : len(row)] = [_probability(x) for x in row]
        return arr
    raise ValueError("acceptance must be a vector a[k] or a per-depth matrix a[d][k]")


def _probability(x: object) -> float:
    if hasattr(x, "item") and np.ndim(x) == 0:  # numpy scalars, 0-d arrays and tensors
        x = x.item()
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise ValueError(f"acceptance entries must be numbers in [0, 1], got {x!r} ({type(x).__name__})")
    return float(x)


def _is_int(x: object) -> bool:
    """A Python or numpy integer (not a bool, not a float such as 1.0)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


_INT = {int}


def _as_path(raw: object) -> Path:
    """``raw`` as a tuple of Python ints, or the error saying what it is instead."""
    if isinstance(raw, (str, bytes)) or not hasattr(raw, "__iter__"):
        raise ValueError(f"a path must be a sequence of ints, got {raw!r}")
    items = tuple(raw)
    if not all(_is_int(r) for r in items):
        raise ValueError(f"path {raw!r} has non-integer ranks: a path must be a sequence of ints, e.g. (0, 1)")
    return tuple(int(r) for r in items)


def _path_key(path: Path) -> tuple[int, Path]:
    return (len(path), path)


class TreeShape:
    """An immutable, hashable token-tree shape: an ancestor-closed set of child-rank paths.

    ``paths`` excludes the root and is in canonical BFS order (by depth, then lexicographic), so
    ``list(shape.paths)`` can be handed to a drafter. ``size`` counts the root: it is the node
    budget the shape uses in one verification pass.
    """

    __slots__ = ("_paths", "_index", "_nchildren", "_hash")

    def __init__(self, paths: Iterable[Sequence[int]] = ()) -> None:
        """Build from child-rank paths (root excluded; pass ``()`` via :meth:`from_paths`).

        Raises ``ValueError`` unless the set is ancestor-closed, each node's children have the
        contiguous ranks ``0..b-1``, and no path repeats.
        """
        seen: set[Path] = set()
        for raw in paths:
            # a tuple of Python ints (what the builders make, thousands per tuning) is checked in C; others in full
            p = raw if type(raw) is tuple and set(map(type, raw)) <= _INT else _as_path(raw)
            if len(p) == 0:
                raise ValueError("the root () is implicit; use TreeShape.from_paths to pass it")
            if min(p) < 0:
                raise ValueError(f"path {p} has a negative rank")
            if p in seen:
                raise ValueError(f"path {p} appears twice")
            seen.add(p)
        for p in seen:
            parent = p[:-1]
            if parent and parent not in seen:
                raise ValueError(f"path {p} has no parent {parent}: the set is not ancestor-closed")
            if p[-1] > 0 and parent + (p[-1] - 1,) not in seen:
                raise ValueError(
                    f"path {p} has rank {p[-1]} but its sibling of rank {p[-1] - 1} is missing: "
                    "children ranks must be contiguous 0..b-1"
                )
        self._paths: tuple[Path, ...] = tuple(sorted(seen, key=_path_key))
        self._index: dict[Path, int] = {p: i for i, p in enumerate(self._paths)}
        nchildren: dict[Path, int] = {}
        for p in self._paths:
            nchildren[p[:-1]] = max(nchildren.get(p[:-1], 0), p[-1] + 1)
        self._nchildren = nchildren
        self._hash = hash(self._paths)

    # ----------------------------------------------------------------- constructors
    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]]) -> "TreeShape":
        """Build from a Medusa-style list of paths (tuples or lists); the root ``()`` is optional."""
        return cls(p for p in paths if not (hasattr(p, "__len__") and len(p) == 0))  # each path checked there

    @classmethod
    def from_parents(cls, parents: Sequence[int]) -> "TreeShape":
        """Build from parent indices: node ``i``'s parent is ``parents[i]`` (-1 = the root).

        Parents must precede children (the ``DraftProposals`` convention); a node's rank is its
        order among its siblings.
        """
        paths: list[Path] = []
        counts: dict[int, int] = {}
        for i, par in enumerate(parents):
            if not _is_int(par):
                raise ValueError(f"node {i} has parent {par!r}; parents are ints (-1 = the root)")
            par = int(par)
            if not (par == -1 or 0 <= par < i):
                raise ValueError(f"node {i} has parent {par}; parents must precede children")
            rank = counts.get(par, 0)
            counts[par] = rank + 1
            paths.append((paths[par] if par >= 0 else ()) + (rank,))
        return cls(paths)

    # ----------------------------------------------------------------- basic properties
    @property
    def paths(self) -> tuple[Path, ...]:
        """All non-root paths in canonical BFS order (by depth, then lexicographic)."""
        return self._paths

    @property
    def size(self) -> int:
        """Number of nodes, root included (the verification budget this shape uses)."""
        return len(self._paths) + 1

    @property
    def depth(self) -> int:
        """Number of drafted levels below the root (a chain of gamma tokens has depth gamma)."""
        return len(self._paths[-1]) if self._paths else 0

    @property
    def widths(self) -> tuple[int, ...]:
        """Number of nodes at each level ``1..depth``."""
        out = [0] * self.depth
        for p in self._paths:
            out[len(p) - 1] += 1
        return tuple(out)

    @property
    def max_width(self) -> int:
        """Largest number of children of any node (0 for the root alone)."""
        return max(self._nchildren.values(), default=0)

    def num_children(self, path: Sequence[int] = ()) -> int:
        """Number of children of the node at ``path`` (``()`` = the root)."""
        p = tuple(path)
        if p and p not in self._index:
            raise KeyError(f"{p} is not a node of this shape")
        return self._nchildren.get(p, 0)

    def children(self, path: Sequence[int] = ()) -> tuple[Path, ...]:
        """Paths of the children of ``path``, by rank."""
        p = tuple(path)
        return tuple(p + (k,) for k in range(self.num_children(p)))

    def index(self, path: Sequence[int]) -> int:
        """Position of ``path`` in :attr:`paths` (-1 for the root)."""
        p = tuple(path)
        return -1 if not p else self._index[p]

    def parents(self) -> list[int]:
        """Parent index of every path in :attr:`paths` order (-1 = the root); see :meth:`from_parents`."""
        return [self.index(p[:-1]) for p in self._paths]

    def node_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The tree as node arrays, node 0 the root and then :attr:`paths` in order (BFS): each node's parent
        (-1 for the root) and its child rank (0 for the root)."""
        parent = np.array([-1] + [i + 1 for i in self.parents()], dtype=np.int64)
        return parent, np.array([0] + [p[-1] for p in self._paths], dtype=np.int64)

    def leaves(self) -> tuple[Path, ...]:
        """Paths with no children (the root alone counts as a leaf)."""
        if not self._paths:
            return ((),)
        return tuple(p for p in self._paths if p not in self._nchildren)

    # ----------------------------------------------------------------- value
    def node_values(self, acceptance: Acceptance) -> dict[Path, float]:
        """Probability that each node is reached (accepted), root included with value 1.

        The value of ``v`` is ``prod a[depth(u) - 1][rank(u)]`` over the nodes ``u`` on the path
        root -> v (``docs/design.md``, "Definitions"); rows past the matrix reuse the last row and
        ranks past a row have probability 0.
        """
        rows = acceptance_rows(acceptance)
        values: dict[Path, float] = {(): 1.0}
        for p in self._paths:  # BFS order: a parent is always valued before its child
            d = min(len(p) - 1, rows.shape[0] - 1)
            k = p[-1]
            a = float(rows[d, k]) if k < rows.shape[1] else 0.0
            values[p] = values[p[:-1]] * a
        return values

    def expected_tokens(self, acceptance: Acceptance) -> float:
        """Expected tokens committed per step (tau), the bonus/correction token included.

        ``sum_v prod_{u on root->v} a_{rank(u)}``; the root term is 1.
        """
        return float(sum(self.node_values(acceptance).values()))

    def depth_acceptance(self, acceptance: Acceptance) -> list[float]:
        """Predicted per-depth acceptance: entry ``d - 1`` is the probability that a step whose walk
        reached a node at depth ``d - 1`` with children accepts one of them.

        Under the positional model a node ``v`` with ``c`` children accepts one with probability
        ``sum_{k < c} a[depth(v)][k]``; averaging over the nodes at depth ``d - 1`` that have
        children, weighted by their reach probabilities (:meth:`node_values`), gives the rate a run
        measures as ``treespec.core.stats.Stats.depth_acceptance``.
        """
        rows = acceptance_rows(acceptance)
        values = self.node_values(acceptance)
        reached = [0.0] * self.depth
        accepted = [0.0] * self.depth
        for v, value in values.items():
            c = self.num_children(v)
            if c == 0:
                continue
            d = len(v)
            row = rows[min(d, rows.shape[0] - 1)]
            reached[d] += value
            accepted[d] += value * float(row[:c].sum())
        return [a / r if r > 0 else 0.0 for a, r in zip(accepted, reached)]

    # ----------------------------------------------------------------- conversions
    def to_networkx(self) -> Any:
        """A ``networkx.DiGraph`` with nodes = path tuples (root ``()``), attrs ``rank``, ``depth``.

        The root has ``rank = -1``; edges go parent -> child.
        """
        import networkx as nx

        g = nx.DiGraph()
        g.add_node((), rank=-1, depth=0)
        for p in self._paths:
            g.add_node(p, rank=p[-1], depth=len(p))
            g.add_edge(p[:-1], p)
        return g

    def layout(self) -> dict[Path, tuple[float, float]]:
        """Layered layout: ``y = -depth``; leaves spaced 1 apart in DFS order, parents centred."""
        pos: dict[Path, tuple[float, float]] = {}
        next_x = 0.0
        # iterative post-order DFS (the tree may be hundreds of levels deep)
        stack: list[tuple[Path, bool]] = [((), False)]
        while stack:
            node, done = stack.pop()
            kids = self.children(node)
            if not kids:
                pos[node] = (next_x, -float(len(node)))
                next_x += 1.0
            elif done:
                xs = [pos[c][0] for c in kids]
                pos[node] = ((xs[0] + xs[-1]) / 2.0, -float(len(node)))
            else:
                stack.append((node, True))
                for c in reversed(kids):
                    stack.append((c, False))
        return pos

    def draw(self, path_png: str, acceptance: Acceptance | None = None, title: str | None = None) -> str:
        """Draw the tree to a PNG (matplotlib, Agg canvas, no graphviz); returns ``path_png``.

        With ``acceptance``, nodes are coloured by their probability of being reached and the
        title shows the expected tokens.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        pos = self.layout()
        nleaves = len(self.leaves())
        fig = Figure(figsize=(min(40.0, max(4.0, 0.35 * nleaves + 1.0)), min(30.0, max(3.0, 0.8 * self.depth + 1.5))))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot(1, 1, 1)
        for p in self._paths:
            (x0, y0), (x1, y1) = pos[p[:-1]], pos[p]
            ax.plot([x0, x1], [y0, y1], color="0.6", linewidth=0.8, zorder=1)
        nodes = [()] + list(self._paths)
        xs = [pos[p][0] for p in nodes]
        ys = [pos[p][1] for p in nodes]
        small = self.size <= 64
        marker = 160 if small else max(6.0, 4000.0 / self.size)
        if acceptance is not None:
            vals = self.node_values(acceptance)
            cs = [vals[p] for p in nodes]
            sc = ax.scatter(xs, ys, c=cs, cmap="viridis", vmin=0.0, vmax=1.0, s=marker, zorder=2, edgecolors="k",
                            linewidths=0.3)
            fig.colorbar(sc, ax=ax, label="P(node accepted)")
            label = f"tau = {sum(vals.values()):.3f}"
        else:
            ax.scatter(xs, ys, color="tab:blue", s=marker, zorder=2, edgecolors="k", linewidths=0.3)
            label = ""
        if small:
            for p in nodes:
                ax.annotate("R" if not p else str(p[-1]), pos[p], ha="center", va="center", fontsize=7, color="w",
                            zorder=3)
        head = title if title is not None else repr(self)
        ax.set_title(f"{head}\n{label}" if label else head, fontsize=9)
        ax.set_ylabel("depth")
        ax.set_yticks([-float(d) for d in range(self.depth + 1)])
        ax.set_yticklabels([str(d) for d in range(self.depth + 1)])
        ax.set_xticks([])
        for side in ("top", "right", "bottom"):
            ax.spines[side].set_visible(False)
        fig.tight_layout()
        fig.savefig(path_png, dpi=100)
        return path_png

    # ----------------------------------------------------------------- dunder
    def __iter__(self) -> Iterator[Path]:
        return iter(self._paths)

    def __contains__(self, path: object) -> bool:
        return isinstance(path, tuple) and (path == () or path in self._index)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TreeShape) and self._paths == other._paths

    def __hash__(self) -> int:
        return self._hash

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, "_hash"):
            raise AttributeError("TreeShape is immutable")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"TreeShape(size={self.size}, depth={self.depth}, widths={self.widths})"

    def __str__(self) -> str:
        """An indented drawing: one line per node, labelled by its child rank."""
        lines = [repr(self), "root"]
        stack: list[tuple[Path, str]] = [(c, "") for c in reversed(self.children(()))]
        while stack:
            node, prefix = stack.pop()
            last = node[-1] == self.num_children(node[:-1]) - 1
            lines.append(f"{prefix}{'└── ' if last else '├── '}{node[-1]}")
            child_prefix = prefix + ("    " if last else "│   ")
            stack.extend((c, child_prefix) for c in reversed(self.children(node)))
        return "\n".join(lines)
