"""Tree shapes and builders: invariants, validation, and the Sequoia DP against exhaustive search."""

from __future__ import annotations

import itertools
from functools import lru_cache

import networkx as nx
import numpy as np
import pytest

from tree_builders import (
    SequoiaDP,
    TreeShape,
    chain,
    from_paths,
    greedy_best_first,
    independent_chains,
    kary,
    sequoia,
    sequoia_values,
)

# ----------------------------------------------------------------------------- exhaustive search


def _compositions(total: int):
    """Ordered tuples of positive ints summing to ``total`` (the empty tuple for 0)."""
    if total == 0:
        yield ()
        return
    for first in range(1, total + 1):
        for rest in _compositions(total - first):
            yield (first,) + rest


@lru_cache(maxsize=None)
def _ordered_trees(n: int) -> tuple:
    """Every ordered (plane) tree with exactly ``n`` nodes, as nested tuples of children."""
    if n == 1:
        return ((),)
    out = []
    for parts in _compositions(n - 1):
        for kids in itertools.product(*(_ordered_trees(p) for p in parts)):
            out.append(tuple(kids))
    return tuple(out)


def _tree_paths(tree: tuple, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, sub in enumerate(tree):
        out.append(prefix + (k,))
        out.extend(_tree_paths(sub, prefix + (k,)))
    return out


def _tree_depth(tree: tuple) -> int:
    return 0 if not tree else 1 + max(_tree_depth(t) for t in tree)


def _tree_width(tree: tuple) -> int:
    return max([len(tree)] + [_tree_width(t) for t in tree])


def _tree_value(tree: tuple, rows: np.ndarray, depth: int = 0) -> float:
    """Independent recursive evaluation: 1 + sum_k a[depth][k] * value(child k)."""
    row = rows[min(depth, len(rows) - 1)]
    return 1.0 + sum(
        (row[k] if k < len(row) else 0.0) * _tree_value(sub, rows, depth + 1) for k, sub in enumerate(tree)
    )


def _brute_best(rows: np.ndarray, budget: int, max_depth, max_width) -> float:
    best = 0.0
    for n in range(1, budget + 1):
        for t in _ordered_trees(n):
            if max_depth is not None and _tree_depth(t) > max_depth:
                continue
            if max_width is not None and _tree_width(t) > max_width:
                continue
            best = max(best, _tree_value(t, rows))
    return best


def test_enumerator_counts_catalan():
    # plane trees with n nodes: Catalan(n-1)
    assert [len(_ordered_trees(n)) for n in range(1, 9)] == [1, 1, 2, 5, 14, 42, 132, 429]


def _random_rows(rng: np.random.Generator, nrows: int, width: int) -> np.ndarray:
    """Unsorted rows of positional acceptance (each sums to < 1; some entries may be zero)."""
    rows = rng.dirichlet(np.ones(width + 1), size=nrows)[:, :width]
    rows[rng.random(rows.shape) < 0.15] = 0.0
    return rows


_LIMITS = [(None, None), (1, None), (2, None), (3, None), (None, 1), (None, 2), (2, 2), (3, 2), (0, None)]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kind", ["vector", "matrix"])
def test_sequoia_matches_exhaustive_search(seed: int, kind: str):
    rng = np.random.default_rng(1000 + 17 * seed + (kind == "matrix"))
    if kind == "vector":
        rows = _random_rows(rng, 1, int(rng.integers(1, 6)))
        acc = rows[0]
    else:
        rows = _random_rows(rng, int(rng.integers(2, 5)), int(rng.integers(2, 5)))
        acc = rows
    for max_depth, max_width in _LIMITS:
        values = sequoia_values(acc, 8, max_depth=max_depth, max_width=max_width)
        for budget in range(1, 9):
            best = _brute_best(rows, budget, max_depth, max_width)
            shape = sequoia(acc, budget, max_depth=max_depth, max_width=max_width)
            assert shape.size <= budget
            assert max_depth is None or shape.depth <= max_depth
            assert max_width is None or shape.max_width <= max_width
            got = shape.expected_tokens(acc)
            assert got == pytest.approx(best, rel=1e-12, abs=1e-12), (kind, seed, budget, max_depth, max_width)
            assert values[budget] == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_sequoia_needs_a_zero_placeholder_rank():
    # rank 1 is worthless but must exist for rank 2 to be proposed: children ranks are positions
    acc = (0.3, 0.0, 0.6)
    shape = sequoia(acc, 4)
    assert set(shape.paths) == {(0,), (1,), (2,)}
    assert shape.expected_tokens(acc) == pytest.approx(1.9)
    assert shape.expected_tokens(acc) == pytest.approx(_brute_best(np.array([acc]), 4, None, None))
    # greedy never looks past a zero-valued node, so it misses it
    assert greedy_best_first(acc, 4).expected_tokens(acc) < 1.9 - 0.1


def test_sequoia_per_depth_rows_matter():
    # the root's children are poor guesses, deeper ones are excellent: a chain wins at depth
    acc = [[0.5, 0.4], [0.95, 0.01]]
    shape = sequoia(acc, 5)
    assert shape.expected_tokens(acc) == pytest.approx(_brute_best(np.array(acc), 5, None, None))
    # reading the matrix as a single vector (row 0 everywhere) gives a different optimum
    assert sequoia(acc[0], 5) != shape


def test_sequoia_returns_smallest_optimal_shape():
    # ranks past the vector are worth nothing: no budget beyond the useful part is spent
    shape = sequoia((0.5,), 50, max_depth=3)
    assert shape == chain(3)
    # no acceptance at all: the root alone
    assert sequoia((0.0, 0.0), 10) == TreeShape()


def test_expected_tokens_non_decreasing_in_budget():
    rng = np.random.default_rng(7)
    for acc in (_random_rows(rng, 1, 6)[0], _random_rows(rng, 3, 5)):
        vals = [sequoia(acc, b, max_depth=6).expected_tokens(acc) for b in range(1, 41)]
        assert all(y >= x - 1e-12 for x, y in zip(vals, vals[1:]))
        dp_vals = sequoia_values(acc, 40, max_depth=6)
        assert np.all(np.diff(dp_vals[1:]) >= -1e-12)
        np.testing.assert_allclose(dp_vals[1:], vals, rtol=1e-12)


def test_sequoia_equals_greedy_for_sorted_vector_at_scale():
    # with a non-increasing vector a node is never worth more than its parent or elder sibling,
    # so the top-B nodes form a tree and greedy best-first is optimal: an exact reference at scale
    rng = np.random.default_rng(3)
    acc = np.sort(rng.dirichlet(np.ones(12) * 0.5)[:10])[::-1]
    for budget, max_depth, max_width in [(200, None, None), (150, 6, None), (120, None, 3), (100, 5, 4)]:
        s = sequoia(acc, budget, max_depth, max_width)
        g = greedy_best_first(acc, budget, max_depth, max_width)
        assert s.expected_tokens(acc) == pytest.approx(g.expected_tokens(acc), rel=1e-12)


def test_stationary_and_per_depth_paths_agree():
    # a vector without depth limit uses the depth-independent recursion; the same vector repeated
    # as a matrix with a row per reachable depth uses the per-depth levels
    acc = np.array([0.55, 0.2, 0.1, 0.05])
    budget = 60
    a = SequoiaDP(acc, budget)
    b = SequoiaDP(np.tile(acc, (budget, 1)), budget)
    np.testing.assert_allclose(a.values, b.values, rtol=1e-12)
    # and one with a last row reused past the matrix (stationary tail below per-depth levels)
    m = np.array([[0.3, 0.3, 0.2], [0.7, 0.1, 0.0], [0.6, 0.2, 0.1]])
    c = SequoiaDP(m, budget)
    d = SequoiaDP(np.vstack([m, np.tile(m[-1], (budget, 1))]), budget)
    np.testing.assert_allclose(c.values, d.values, rtol=1e-12)
    assert c.shape().expected_tokens(m) == pytest.approx(c.values[budget], rel=1e-12)


def test_sequoia_dp_reuse_for_smaller_budgets():
    acc = (0.6, 0.2, 0.1)
    dp = SequoiaDP(acc, 30, max_depth=5)
    for b in (1, 2, 7, 30):
        assert dp.shape(b) == sequoia(acc, b, max_depth=5)
    with pytest.raises(ValueError):
        dp.shape(31)


def test_sequoia_dp_node_counts_and_branching_read_off_the_tables_match_the_shape():
    """What a tuner costs without building shapes: the smallest optimal shape's node count and, per depth, its
    nodes with children (the draft forwards of a step), over vectors, per-depth matrices and limits."""
    rng = np.random.default_rng(3)
    m = np.array([[0.3, 0.3, 0.2], [0.7, 0.1, 0.0], [0.6, 0.2, 0.1]])
    for acc, max_depth, max_width in [((0.6, 0.2, 0.1), 5, None), ((0.9, 0.05), None, None), (m, None, 2),
                                      (m, 4, None), (np.sort(rng.dirichlet(np.ones(8)))[::-1][:6], 7, 3)]:
        dp = SequoiaDP(acc, 40, max_depth=max_depth, max_width=max_width)
        for b in range(1, 41):
            shape = dp.shape(b)
            assert dp.nodes(b) == shape.size
            with_children = [0] * shape.depth
            for p in {p[:-1] for p in shape.paths}:
                with_children[len(p)] += 1
            assert dp.branching(b) == with_children, (acc, b)

def test_sequoia_large_budget_builds():
    acc = [0.6, 0.15, 0.07, 0.04, 0.025, 0.015, 0.01, 0.008, 0.006, 0.005] + [0.002] * 22
    shape = sequoia(acc, 768, max_depth=20, max_width=32)
    assert shape.size <= 768 and shape.depth <= 20 and shape.max_width <= 32
    assert shape.expected_tokens(acc) >= greedy_best_first(acc, 768, 20, 32).expected_tokens(acc) - 1e-9


def test_sequoia_rejects_bad_input():
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        sequoia((0.5,), 0)
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        sequoia((0.5,), -3)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        sequoia((0.5, -0.1), 4)
    with pytest.raises(ValueError, match="sums to"):
        sequoia((0.7, 0.6), 4)
    with pytest.raises(ValueError, match="max_depth"):
        sequoia((0.5,), 4, max_depth=-1)
    assert sequoia((0.9, 0.05), 1) == TreeShape()


# ----------------------------------------------------------------------------- closed forms


@pytest.mark.parametrize("a", [0.0, 0.3, 0.8, 0.95])
@pytest.mark.parametrize("gamma", [0, 1, 4, 9])
def test_chain_expected_tokens_closed_form(a: float, gamma: int):
    expected = (1 - a ** (gamma + 1)) / (1 - a)
    assert chain(gamma).expected_tokens((a,)) == pytest.approx(expected, rel=1e-12)
    # and the DP with width 1 finds exactly that chain
    if a > 0:
        assert sequoia((a,), gamma + 1, max_width=1) == chain(gamma)


def test_blog_order_matters_per_depth():
    # positions as a per-depth matrix with one column: 0.88, 0.96, 0.65 vs reversed
    assert chain(3).expected_tokens([[0.88], [0.96], [0.65]]) == pytest.approx(3.27392)
    assert chain(3).expected_tokens([[0.65], [0.96], [0.88]]) == pytest.approx(2.82312)


def test_expected_tokens_hand_computed():
    s = from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0)])
    a = (0.5, 0.3)
    # 1 + .5 + .3 + .5*.5 + .5*.3 + .3*.5
    assert s.expected_tokens(a) == pytest.approx(1 + 0.5 + 0.3 + 0.25 + 0.15 + 0.15)
    # a rank past the vector has probability 0; matrix rows past the end reuse the last row
    assert from_paths([(0,), (1,)]).expected_tokens((0.5,)) == pytest.approx(1.5)
    assert chain(3).expected_tokens([[0.5], [0.4]]) == pytest.approx(1 + 0.5 + 0.2 + 0.08)


# ----------------------------------------------------------------------------- shape invariants


def test_builders_shapes():
    c = chain(4)
    assert (c.size, c.depth, c.widths) == (5, 4, (1, 1, 1, 1))
    assert chain(0).size == 1 and chain(0).depth == 0 and chain(0).widths == ()

    k = kary((1, 1, 3, 1, 1, 1, 1, 1))
    assert k.depth == 8 and k.widths == (1, 1, 3, 3, 3, 3, 3, 3) and k.size == 21
    k2 = kary((2, 3))
    assert k2.size == 1 + 2 + 6 and k2.num_children(()) == 2 and k2.num_children((1,)) == 3
    assert kary(()) == TreeShape()

    ic = independent_chains(3, 4)
    assert ic.size == 1 + 3 * 4 and ic.depth == 4 and ic.widths == (3, 3, 3, 3)
    assert all(ic.num_children((i,)) == 1 for i in range(3))
    assert independent_chains(3, 0) == TreeShape() and independent_chains(0, 5) == TreeShape()
    assert independent_chains(1, 5) == chain(5)


def test_paths_canonical_bfs_order_and_roundtrips():
    s = from_paths([[1, 0], [0], (0, 1), (), [1], (0, 0), (0, 1, 0)])
    assert s.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 1, 0))
    assert list(s) == list(s.paths)
    assert s.size == 7 and s.depth == 3 and s.widths == (2, 3, 1)
    assert s.num_children(()) == 2 and s.num_children((0,)) == 2 and s.num_children((0, 0)) == 0
    assert s.children((0,)) == ((0, 0), (0, 1))
    assert s.leaves() == ((0, 0), (1, 0), (0, 1, 0))
    # parent indices round-trip (the DraftProposals convention: -1 = root)
    assert s.parents() == [-1, -1, 0, 0, 1, 3]
    assert TreeShape.from_parents(s.parents()) == s
    assert TreeShape(list(s.paths)) == s
    with pytest.raises(KeyError):
        s.num_children((5,))


def test_shape_is_immutable_and_hashable():
    a = from_paths([(0,), (1,), (0, 0)])
    b = TreeShape([(0, 0), (1,), (0,)])
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != chain(2)
    with pytest.raises(AttributeError):
        a.foo = 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        a._paths = ()  # type: ignore[misc]
    assert (0, 0) in a and () in a and (2,) not in a


@pytest.mark.parametrize(
    "paths, msg",
    [
        ([(0, 0)], "ancestor-closed"),
        ([(0,), (2,)], "contiguous"),
        ([(0,), (0, 1)], "contiguous"),
        ([(0,), (0,)], "twice"),
        ([(0,), (-1,)], "negative"),
        ([(0,), (0.5,)], "non-integer"),
        (["ab"], "sequence of ints"),
    ],
)
def test_shape_validation_errors(paths, msg):
    with pytest.raises(ValueError, match=msg):
        TreeShape.from_paths(paths)


def test_builder_validation_errors():
    with pytest.raises(ValueError):
        chain(-1)
    with pytest.raises(ValueError):
        kary((2, -1))
    with pytest.raises(ValueError):
        kary((100,) * 4)  # 10^8 nodes
    with pytest.raises(ValueError):
        independent_chains(-1, 2)
    with pytest.raises(ValueError):
        TreeShape.from_parents([-1, 3])
    with pytest.raises(ValueError, match="TreeShape.from_paths"):
        TreeShape([()])


def test_to_networkx():
    s = kary((2, 2))
    g = s.to_networkx()
    assert isinstance(g, nx.DiGraph)
    assert g.number_of_nodes() == s.size and g.number_of_edges() == s.size - 1
    assert nx.is_arborescence(g)
    assert g.nodes[()]["depth"] == 0
    assert g.nodes[(1, 0)] == {"rank": 0, "depth": 2}
    assert set(g.successors((1,))) == {(1, 0), (1, 1)}


def test_text_form():
    s = from_paths([(0,), (1,), (0, 0)])
    assert repr(s) == "TreeShape(size=4, depth=2, widths=(2, 1))"
    assert str(s).splitlines() == [
        "TreeShape(size=4, depth=2, widths=(2, 1))",
        "root",
        "├── 0",
        "│   └── 0",
        "└── 1",
    ]
    assert str(TreeShape()).splitlines() == ["TreeShape(size=1, depth=0, widths=())", "root"]


def test_layout_is_layered():
    s = kary((2, 3))
    pos = s.layout()
    assert set(pos) == {()} | set(s.paths)
    for p, (x, y) in pos.items():
        assert y == -len(p)
    # a parent sits centred over its children, which are ordered by rank
    for p in [(), (0,), (1,)]:
        xs = [pos[c][0] for c in s.children(p)]
        assert xs == sorted(xs) and pos[p][0] == pytest.approx((xs[0] + xs[-1]) / 2)


def test_draw_png(tmp_path):
    acc = (0.6, 0.2, 0.1)
    small = sequoia(acc, 12, max_depth=4)
    out = tmp_path / "small.png"
    small.draw(str(out), acceptance=acc, title="sequoia B=12")
    data = out.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    big = tmp_path / "big.png"
    sequoia(acc, 200, max_depth=12).draw(str(big))
    assert big.stat().st_size > 1000
    root_only = tmp_path / "root.png"
    TreeShape().draw(str(root_only))
    assert root_only.stat().st_size > 0


def test_greedy_best_first_basic():
    acc = (0.6, 0.3)
    g = greedy_best_first(acc, 4)
    # values: (0,) .6, (1,) .3, (0,0) .36 -> root + (0,), (0,0), (1,)
    assert set(g.paths) == {(0,), (0, 0), (1,)}
    assert greedy_best_first(acc, 1) == TreeShape()
    assert greedy_best_first(acc, 10, max_depth=1) == from_paths([(0,), (1,)])
    assert greedy_best_first(acc, 4, max_width=1) == chain(3)
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        greedy_best_first(acc, 0)


def test_a_static_tree_in_priority_order_is_cut_to_a_budget_and_a_depth():
    from tree_builders import for_budget, paths_prefix, priority_paths

    medusa_like = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0]]  # each path after its parent and elder sibling
    assert priority_paths(medusa_like) == tuple(tuple(p) for p in medusa_like)
    assert priority_paths([(), *medusa_like]) == priority_paths(medusa_like)  # the root is optional
    assert paths_prefix(medusa_like, 4) == from_paths([[0], [0, 0], [1]])  # the first B - 1 paths
    assert paths_prefix(medusa_like, 100) == from_paths(medusa_like)
    assert paths_prefix(medusa_like, 100, max_depth=1) == from_paths([[0], [1], [2]])
    assert paths_prefix(medusa_like, 3, max_depth=1) == from_paths([[0], [1]])  # depth first, then the budget
    assert paths_prefix(medusa_like, 1).size == 1
    assert for_budget("paths", 5, paths=medusa_like, max_depth=2) == from_paths([[0], [0, 0], [1], [0, 1]])
    with pytest.raises(ValueError, match="needs its static tree"):
        for_budget("paths", 5)


@pytest.mark.parametrize("paths, fragment", [
    ([[0, 0], [0]], r"\(0, 0\) comes before \(0,\)"),  # a child before its parent
    ([[1], [0]], r"\(1,\) comes before \(0,\)"),  # a sibling before its elder
    ([[0], [2], [1]], r"\(2,\) comes before \(1,\)"),
    ([[0], [0]], "appears twice"), ([[1]], "sibling of rank 0 is missing"), ([[0.0]], "non-integer"),
    ([[0], 3], "sequence of ints"),
])
def test_a_static_tree_out_of_order_is_refused_naming_the_path(paths, fragment):
    from tree_builders import priority_paths

    with pytest.raises(ValueError, match=fragment):
        priority_paths(paths)


def test_a_budget_past_the_dps_largest_is_refused_before_its_tables_are_made():
    """``budgets = [100000]`` in a sweep failed each Sequoia point with a MemoryError (75 GiB of tables)."""
    from tree_builders.sequoia import MAX_BUDGET

    with pytest.raises(ValueError, match="budget 100000 is past the 4096 nodes the Sequoia DP sizes"):
        sequoia([0.5, 0.3], 100000)
    assert sequoia([0.5], MAX_BUDGET, max_depth=2, max_width=2).size <= MAX_BUDGET


def test_chains_past_the_largest_budget_are_refused():
    """A chain's shape holds every node's whole path (nodes^2 / 2 entries): chains of more nodes than the Sequoia DP
    sizes are refused with a message, as kary's and sequoia's sizes are (``for_budget("chain", 100000)`` ran out of
    memory instead)."""
    from tree_builders import chain, for_budget
    from tree_builders.builders import independent_chains
    from tree_builders.sequoia import MAX_BUDGET

    assert chain(MAX_BUDGET).size == MAX_BUDGET + 1
    for build in (lambda: chain(MAX_BUDGET + 1), lambda: for_budget("chain", 100_000),
                  lambda: independent_chains(3, 2000), lambda: for_budget("chains", 100_000)):
        with pytest.raises(ValueError, match="the largest tree treespec sizes"):
            build()
