"""A recipe's settings: every option of a run as a user states it, each checked once on construction by the
rule's owner (``treespec.core.checks``, ``SamplingParams``, the verifier registry, the n-gram drafter).
The rules that turn it into drafters are in ``treespec.recipes.plan``; the package docstring lists them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

import tree_builders

from ..core import checks, verifiers
from ..common.options import STATIC_MODES, TREES
from ..core.sampling import SamplingParams
from ..drafters.ngram import NGramDrafter
from ..models.pair import CrossDraft
from ..models.precision import parse_precision

#: the budget of a recipe that leaves it to tuning when tuning does not apply
DEFAULT_BUDGET = 16

DraftModel = torch.nn.Module | CrossDraft


def draft_mode(tree: str, temperature: float, mode: str | None = None) -> str:
    """How a model drafter proposes children for ``tree`` at ``temperature`` (``mode``: an explicit choice)."""
    if tree == "dynamic":
        return "dynamic"
    if mode is not None:
        return mode
    if float(temperature) == 0:
        return "topk"
    return "sample" if tree == "chains" else "sample_without_replacement"


@dataclass(frozen=True)
class NGramSettings:
    """Options of the n-gram drafter (see ``treespec.NGramDrafter``, which checks them); its node
    budget comes from the recipe."""

    max_order: int = 4
    max_tokens: int = 4
    width: int = 1
    window: int = 512
    mode: str = "ngram"

    def __post_init__(self) -> None:
        NGramDrafter(max_order=self.max_order, max_tokens=self.max_tokens, width=self.width, window=self.window,
                     mode=self.mode)  # the drafter's own checks: one home for its rules


def _frozen(acceptance: Any) -> Any:
    """A vector or per-depth matrix as nested tuples of floats (hashable, comparable), checked."""
    if acceptance is None:
        return None
    tree_builders.acceptance_rows(acceptance)  # probabilities in [0, 1], rows summing to <= 1
    rows = [list(map(float, r)) if hasattr(r, "__len__") else float(r) for r in acceptance]
    return tuple(tuple(r) if isinstance(r, list) else r for r in rows)


def _static_tree(tree: str, paths: Any) -> tuple[tuple[int, ...], ...] | None:
    """``paths`` as the checked static tree of ``tree="paths"`` (tuples, in the list's priority order)."""
    if tree != "paths":
        if paths is not None:
            raise ValueError(f"paths gives the static tree of tree='paths'; the {tree!r} tree builds its own shape")
        return None
    if paths is None or isinstance(paths, (str, bytes)) or not hasattr(paths, "__iter__"):
        raise ValueError("tree='paths' needs paths: its static tree as child-rank paths in priority order, e.g. "
                         f"paths=[[0], [1], [0, 0]], got {paths!r}")
    ordered = tree_builders.priority_paths(paths)
    if not ordered:
        raise ValueError("tree='paths' needs at least one path, e.g. paths=[[0]]")
    return ordered


def default_budget(recipe: "Recipe") -> int:
    """The budget of a recipe that leaves it to tuning where tuning does not apply: a static tree's own size
    (root included), else :data:`DEFAULT_BUDGET`."""
    return len(recipe.paths) + 1 if recipe.paths is not None else DEFAULT_BUDGET


def _optional_count(name: str, value: Any, minimum: int, hint: str) -> int | None:
    return None if value is None else checks.check_int(name, value, minimum, hint)


@dataclass(frozen=True)
class Recipe:
    """The settings of one run, as a user states them; every field is checked on construction.

    ``tree``: one of :data:`TREES`; ``budget``: ``B`` (>= 1, root included; None: :func:`resolve`
    chooses); ``depth``: depth limit (None: none); ``temperature``, ``top_k``, ``top_p``: the target
    distribution (HF conventions); ``draft_mode``: None for the rule of :func:`draft_mode`;
    ``ngram``: the n-gram drafter's options, None for off; ``acceptance``: vector or per-depth
    matrix (``sequoia`` needs one; a ``chain`` or ``kary`` recipe without a budget is tuned with one, a pilot sizes
    it without); ``kary_width``, ``chains``: options of those builders;
    ``dynamic_depth``, ``dynamic_topk``: of the dynamic tree; ``paths``: the static tree of ``tree="paths"``
    (child-rank paths in priority order, Medusa style: ``tree_builders.priority_paths``; a budget keeps its first
    ``B - 1``); ``max_width``: children per node of the sequoia tree (None: no limit); ``min_confidence``: the
    model drafter's confidence stop
    (``ModelDrafter``); ``target_dtype``/``draft_dtype``: precision names (module docstring);
    ``verifier``: the exact rule for sampled steps (``treespec.core.verifiers.VERIFIERS``);
    ``compile``: False, True or a ``torch.compile`` backend name (``treespec.core.captured`` for one
    draft model's static tree, else ``treespec.core.compiled``).
    """

    tree: str = "sequoia"
    budget: int | None = None
    depth: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    draft_mode: str | None = None
    ngram: NGramSettings | None = None
    acceptance: Any = None
    kary_width: int = 2
    chains: int | None = None
    dynamic_depth: int = 6
    dynamic_topk: int = 8
    paths: Any = None
    max_width: int | None = None
    min_confidence: float | None = None
    target_dtype: str | None = None
    draft_dtype: str | None = None
    verifier: str = "rrs"
    compile: bool | str = False

    def __post_init__(self) -> None:
        if self.tree not in TREES:
            raise ValueError(f"unknown tree builder {self.tree!r}; choose one of {', '.join(TREES)}")
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        if self.budget is not None:
            set_("budget", checks.check_budget(self.budget))
        set_("depth", _optional_count("depth", self.depth, 1, "the depth limit of the tree; None for no limit"))
        sampling = SamplingParams(self.temperature, self.top_k, self.top_p)
        set_("temperature", float(sampling.temperature))
        set_("top_p", float(sampling.top_p))
        if self.draft_mode is not None and self.draft_mode not in STATIC_MODES:
            raise ValueError(f"draft_mode must be one of {', '.join(STATIC_MODES)} or None (the rule), "
                             f"got {self.draft_mode!r}")
        if self.draft_mode is not None and self.tree == "dynamic":
            raise ValueError("draft_mode is not read by tree='dynamic': a dynamic tree expands the draft's most likely "
                             "nodes whatever the temperature; drop it")
        for name in ("target_dtype", "draft_dtype"):
            if getattr(self, name) is not None:
                set_(name, parse_precision(getattr(self, name)))
        if self.target_dtype == "int8":  # int4 is a target's too: a GGUF file's own 4-bit blocks (models.load)
            raise ValueError("target_dtype int8 is for drafts only (draft_dtype='int8'); give the target float32, "
                             "bfloat16, int4 (weight-only, a GGUF file's own blocks where it has them) or 'auto'")
        set_("min_confidence", checks.check_probability("min_confidence", self.min_confidence))
        for name, hint in (("kary_width", "children per node of the k-ary tree"),
                           ("dynamic_depth", "levels of the dynamic tree"), ("dynamic_topk", "children per node")):
            set_(name, checks.check_int(name, getattr(self, name), 1, hint))
        set_("chains", _optional_count("chains", self.chains, 1, "independent chains; None for the default"))
        for name, value, default, tree in (("kary_width", self.kary_width, 2, "kary"),
                                           ("chains", self.chains, None, "chains"),
                                           ("max_width", self.max_width, None, "sequoia")):
            if value != default and self.tree != tree:  # as the CLI refuses --kary-width / --chains
                raise ValueError(f"{name} is an option of tree={tree!r}; the {self.tree!r} tree does not read it: "
                                 f"drop it, or give tree={tree!r}")
        if self.ngram is not None and not isinstance(self.ngram, NGramSettings):
            raise ValueError(f"ngram must be treespec.recipes.NGramSettings(...) or None, got {self.ngram!r}")
        set_("paths", _static_tree(self.tree, self.paths))
        set_("max_width", _optional_count("max_width", self.max_width, 1, "children per node; None for no limit"))
        verifiers.get(self.verifier)
        checks.check_compile(self.compile)
        set_("acceptance", _frozen(self.acceptance))

    @property
    def mode(self) -> str:
        """The model drafter's mode under the rule of :func:`draft_mode`."""
        return draft_mode(self.tree, self.temperature, self.draft_mode)

    @property
    def sampling(self) -> SamplingParams:
        """The target distribution this recipe samples from."""
        return SamplingParams(self.temperature, self.top_k, self.top_p)
