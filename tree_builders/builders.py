"""Simple shape builders: chain, k-ary (SpecInfer), independent chains, path lists (Medusa),
and greedy best-first growth under a positional acceptance vector."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from .args import check_count, check_optional_count
from .sequoia import MAX_BUDGET
from .shape import Acceptance, Path, TreeShape, acceptance_rows

#: refuse to materialise k-ary trees larger than this (a typo in the widths can explode)
MAX_KARY_SIZE = 1_000_000


def _check_chain_nodes(nodes: int, what: str) -> None:
    """Refuse chains past the Sequoia DP's largest budget: a shape holds every node's whole path, so a chain of
    ``n`` nodes holds ``n^2 / 2`` entries (hundreds of MiB at 8,000 nodes) and no step drafts that deep."""
    if nodes > MAX_BUDGET:
        raise ValueError(f"{what} would have {nodes} drafted nodes (> {MAX_BUDGET}, the largest tree treespec "
                         "sizes); a step never drafts that deep: give fewer")


def chain(gamma: int) -> TreeShape:
    """A chain of ``gamma`` drafted tokens (classic speculative decoding): size ``gamma + 1``."""
    gamma = check_count("gamma", gamma, 0, "it is the number of drafted tokens")
    _check_chain_nodes(gamma, f"chain({gamma})")
    return TreeShape((0,) * i for i in range(1, gamma + 1))


def kary(widths: Sequence[int]) -> TreeShape:
    """SpecInfer's expansion config: every node at level ``i`` (root = level 0) has ``widths[i]``
    children, e.g. ``kary((1, 1, 3, 1, 1, 1, 1, 1))``. Size ``1 + w0 + w0*w1 + ...``."""
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence):
        raise ValueError(f"widths must be a sequence of ints (children per level), got {widths!r}; e.g. kary((2, 2))")
    ws = [check_count(f"widths[{i}]", w, 0, "it is the number of children per node at that level")
          for i, w in enumerate(widths)]
    size, level = 1, 1
    for w in ws:
        level *= w
        size += level
    if size > MAX_KARY_SIZE:
        raise ValueError(f"kary({tuple(ws)}) would have {size} nodes (> {MAX_KARY_SIZE})")
    paths: list[Path] = []
    frontier: list[Path] = [()]
    for w in ws:
        frontier = [p + (k,) for p in frontier for k in range(w)]
        paths.extend(frontier)
    return TreeShape(paths)


def independent_chains(k: int, depth: int) -> TreeShape:
    """``k`` root children, each the head of a chain of ``depth`` tokens: size ``1 + k*depth``
    (e.g. ``k`` independent samples of a chain drafter merged at the root)."""
    k = check_count("k", k, 0, "it is the number of chains")
    depth = check_count("depth", depth, 0, "it is the length of each chain")
    _check_chain_nodes(k * depth, f"independent_chains({k}, {depth})")
    if depth == 0:
        return TreeShape()
    return TreeShape((i,) + (0,) * j for i in range(k) for j in range(depth))


def from_paths(paths: Iterable[Sequence[int]]) -> TreeShape:
    """A shape from a Medusa-style path list (tuples or lists); the root ``()`` is optional.
    Raises ``ValueError`` on a set that is not ancestor-closed or has non-contiguous ranks."""
    return TreeShape.from_paths(paths)


def priority_paths(paths: Iterable[Sequence[int]]) -> tuple[Path, ...]:
    """``paths`` checked as a static tree in priority order (Medusa's path lists are: most valuable first), so that
    every prefix of the list is a tree: each path comes after its parent and after its sibling of the rank below.
    Returns the paths as tuples of ints, in the list's order; raises ``ValueError`` naming the first path out of
    order (and, through :class:`TreeShape`, on a list that is no tree at all)."""
    listed = [p for p in paths if not (hasattr(p, "__len__") and len(p) == 0)]  # the root () is optional
    TreeShape(listed)  # ancestor-closed, contiguous ranks, whole numbers, no repeats
    ordered = tuple(tuple(int(r) for r in p) for p in listed)
    seen: set[Path] = {()}
    for p in ordered:
        needed = [p[:-1]] + ([p[:-1] + (p[-1] - 1,)] if p[-1] > 0 else [])
        missing = [q for q in needed if q not in seen]
        if missing:
            raise ValueError(f"path {p} comes before {missing[0]} in the list: a static tree's paths are in priority "
                             "order, each after its parent and its sibling of the rank below (as Medusa's lists "
                             "are), so that the first B - 1 paths make the tree of budget B")
        seen.add(p)
    return ordered


def paths_prefix(paths: Sequence[Sequence[int]], budget: int, max_depth: int | None = None) -> TreeShape:
    """The static tree ``paths`` (a list in priority order, :func:`priority_paths`) cut to ``budget`` nodes, root
    included: its first paths no deeper than ``max_depth`` (None: no limit) while they fit."""
    budget = check_count("budget", budget, 1, "it counts the root")
    max_depth = check_optional_count("max_depth", max_depth, 0)
    kept = [p for p in priority_paths(paths) if max_depth is None or len(p) <= max_depth][: budget - 1]
    return TreeShape(kept)


def greedy_best_first(
    acceptance: Acceptance,
    budget: int,
    max_depth: int | None = None,
    max_width: int | None = None,
) -> TreeShape:
    """Grow from the root, adding the candidate of highest path value until ``budget`` nodes.

    A candidate is the next-rank child of an existing node (respecting the limits); its value is
    the parent's path value times ``a[depth][rank]``. Zero-valued candidates are never added, so
    the shape may be smaller than ``budget``. Optimal when every row is non-increasing and rows
    do not grow with depth (then the top-``budget`` nodes by value form a valid tree); not in
    general, unlike :func:`tree_builders.sequoia`.
    """
    budget = check_count("budget", budget, 1, "it counts the root")
    D = check_optional_count("max_depth", max_depth, 0)
    max_width = check_optional_count("max_width", max_width, 0)
    rows = acceptance_rows(acceptance)
    R, K = rows.shape
    W = K if max_width is None else min(K, max_width)

    def acc(depth: int, rank: int) -> float:  # parent at ``depth``, child of ``rank``
        return float(rows[min(depth, R - 1), rank]) if rank < W else 0.0

    paths: list[Path] = []
    value: dict[Path, float] = {(): 1.0}
    heap: list[tuple[float, int, Path]] = []  # (-value, tiebreak, candidate path)
    tick = 0

    def push(parent: Path, rank: int) -> None:
        nonlocal tick
        if rank >= W or (D is not None and len(parent) >= D):
            return
        v = value[parent] * acc(len(parent), rank)
        if v > 0.0:
            heapq.heappush(heap, (-v, tick, parent + (rank,)))
            tick += 1

    push((), 0)
    while heap and len(paths) + 1 < budget:
        negv, _, p = heapq.heappop(heap)
        paths.append(p)
        value[p] = -negv
        push(p, 0)  # its first child
        push(p[:-1], p[-1] + 1)  # its next sibling
    return TreeShape(paths)
