"""Token-tree shapes and the builders that choose them (pure numpy/networkx; no torch)."""

from .budgeted import STATIC_BUILDERS, for_budget, kary_widths
from .builders import chain, from_paths, greedy_best_first, independent_chains, kary, paths_prefix, priority_paths
from .sequoia import SequoiaDP, sequoia, sequoia_values
from .shape import Acceptance, Path, TreeShape, acceptance_rows

__all__ = [
    "Acceptance",
    "STATIC_BUILDERS",
    "for_budget",
    "Path",
    "SequoiaDP",
    "TreeShape",
    "acceptance_rows",
    "chain",
    "from_paths",
    "greedy_best_first",
    "independent_chains",
    "kary",
    "kary_widths",
    "paths_prefix",
    "priority_paths",
    "sequoia",
    "sequoia_values",
]
