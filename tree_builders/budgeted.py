"""One shape per (builder, budget): the rule sweeps, the CLI and the demo share for "equal budgets"."""

from __future__ import annotations

from collections.abc import Sequence

from .args import check_count, check_optional_count
from .builders import chain, independent_chains, kary, paths_prefix
from .sequoia import sequoia
from .shape import Acceptance, TreeShape

#: static builders that ``for_budget`` knows (the dynamic EAGLE-2 tree is a drafter mode, not a shape)
STATIC_BUILDERS = ("sequoia", "chain", "kary", "chains", "paths")


def kary_widths(budget: int, width: int, max_depth: int | None = None) -> tuple[int, ...]:
    """Per-level widths of the SpecInfer k-ary tree that fits ``budget``: full ``width``-ary levels
    while they fit, then the largest width that still fits, e.g. budget 8, width 2 -> (2, 2)."""
    budget = check_count("budget", budget, 1, "it counts the root")
    width = check_count("width", width, 1, "it is the number of children per node")
    max_depth = check_optional_count("max_depth", max_depth, 0)
    widths: list[int] = []
    size, level = 1, 1
    while max_depth is None or len(widths) < max_depth:
        w = min(width, (budget - size) // level)
        if w <= 0:
            break
        widths.append(w)
        level *= w
        size += level
        if w < width:
            break
    return tuple(widths)


def for_budget(builder: str, budget: int, acceptance: Acceptance | None = None, max_depth: int | None = None,
               *, kary_width: int = 2, chains: int | None = None, max_width: int | None = None,
               paths: Sequence[Sequence[int]] | None = None) -> TreeShape:
    """The ``builder``'s tree of at most ``budget`` nodes (root included).

    * ``sequoia``: the DP optimum for ``acceptance`` (required) under ``max_depth`` and ``max_width``
      (children per node; None: no limit);
    * ``chain``: ``budget - 1`` tokens (at most ``max_depth``);
    * ``kary``: ``kary(kary_widths(budget, kary_width, max_depth))``;
    * ``chains``: ``k`` independent chains of ``(budget - 1) // k`` tokens (SpecInfer's k x d
      baseline; use it with a sampling drafter mode); ``k = chains``, by default 2 up to budget 16,
      else 4;
    * ``paths``: the static tree ``paths`` (required; Medusa style, in priority order) cut to the budget and depth
      (``paths_prefix``).
    """
    if builder == "dynamic":
        raise ValueError("the dynamic tree (EAGLE-2's) is grown by the drafter at every step, not built for a budget "
                         "here: draft it with a model drafter in mode 'dynamic'; this builds "
                         f"{', '.join(STATIC_BUILDERS)}")
    if not isinstance(builder, str) or builder not in STATIC_BUILDERS:
        raise ValueError(f"unknown tree builder {builder!r}; choose one of {', '.join(STATIC_BUILDERS)} "
                         "(or 'dynamic', a drafter mode)")
    budget = check_count("budget", budget, 2, "a drafted tree needs the root and at least one token")
    max_depth = check_optional_count("max_depth", max_depth, 1, "a drafted tree has depth >= 1; None for no limit")
    kary_width = check_count("kary_width", kary_width, 1, "it is the number of children per node")
    chains = check_optional_count("chains", chains, 1, "it is the number of independent chains; None for the default")
    max_width = check_optional_count("max_width", max_width, 1,
                                     "it is the number of children per node; None for no limit")
    cap = budget - 1 if max_depth is None else min(budget - 1, max_depth)
    if builder == "sequoia":
        if acceptance is None:
            raise ValueError("the sequoia builder needs an acceptance vector (see `treespec accept`)")
        return sequoia(acceptance, budget, max_depth=max_depth, max_width=max_width)
    if builder == "chain":
        return chain(cap)
    if builder == "kary":
        return kary(kary_widths(budget, kary_width, max_depth))
    if builder == "paths":
        if paths is None:
            raise ValueError("the paths builder needs its static tree: a list of child-rank paths in priority order, "
                             "e.g. [[0], [1], [0, 0]]")
        return paths_prefix(paths, budget, max_depth)
    k = min(chains if chains is not None else (2 if budget <= 16 else 4), budget - 1)
    return independent_chains(k, min((budget - 1) // k, cap))
