"""One shape per (builder, budget): the rule sweeps, the CLI and the demo share for "equal budgets"."""

from __future__ import annotations

from .builders import chain, from_paths, independent_chains
from .sequoia import sequoia
from .shape import Acceptance, TreeShape

#: static builders that ``for_budget`` knows (the dynamic EAGLE-2 tree is a drafter mode, not a shape)
STATIC_BUILDERS = ("sequoia", "chain", "kary", "chains")


def balanced(k: int, budget: int) -> TreeShape:
    """The first ``budget - 1`` nodes, in BFS order, of the infinite complete ``k``-ary tree."""
    paths: list[tuple[int, ...]] = []
    frontier: list[tuple[int, ...]] = [()]
    while len(paths) < budget - 1:
        nxt = []
        for parent in frontier:
            for r in range(k):
                if len(paths) < budget - 1:
                    paths.append(parent + (r,))
                    nxt.append(parent + (r,))
        frontier = nxt
    return from_paths(paths)


def for_budget(builder: str, budget: int, acceptance: Acceptance | None = None,
               max_depth: int | None = None) -> TreeShape:
    """The ``builder``'s tree of at most ``budget`` nodes (root included).

    * ``sequoia``: the DP optimum for ``acceptance`` (required) under ``max_depth``;
    * ``chain``: ``budget - 1`` tokens (at most ``max_depth``);
    * ``kary``: SpecInfer-style k-ary expansion, a balanced binary tree filled in BFS order;
    * ``chains``: ``k`` independent chains of ``(budget - 1) // k`` tokens, ``k = 2`` up to budget 16,
      else 4 (SpecInfer's k x d baseline; use it with a sampling drafter mode).
    """
    if not isinstance(budget, int) or budget < 2:
        raise ValueError(f"a drafted tree needs budget >= 2 (root + one token), got {budget!r}")
    depth_cap = max_depth if max_depth is not None else budget - 1
    if builder == "sequoia":
        if acceptance is None:
            raise ValueError("the sequoia builder needs an acceptance vector (see `treespec accept`)")
        return sequoia(acceptance, budget, max_depth=max_depth)
    if builder == "chain":
        return chain(min(budget - 1, depth_cap))
    if builder == "kary":
        return balanced(2, budget)
    if builder == "chains":
        k = 2 if budget <= 16 else 4
        k = min(k, budget - 1)
        return independent_chains(k, min((budget - 1) // k, depth_cap))
    raise ValueError(f"unknown tree builder {builder!r}; choose one of {', '.join(STATIC_BUILDERS)} (or 'dynamic')")
