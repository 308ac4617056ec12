"""What a recipe becomes for a run: the engine's budget, the model drafter's tree and the n-gram drafter's
share (one field, the budget, read in one place: :func:`plan`), and the drafters built from it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch

import tree_builders
from tree_builders import TreeShape

from ..core.checks import check_list
from ..core.drafting import Drafter
from ..drafters.cross_tokenizer import CrossTokenizerDrafter
from ..drafters.model import ModelDrafter
from ..drafters.ngram import NGramDrafter
from ..models.pair import CrossDraft
from .settings import DraftModel, Recipe, default_budget

@dataclass(frozen=True)
class DraftPlan:
    """What a recipe becomes for a run: the engine's budget and each drafter's exact settings.

    ``model``: the model drafter's keyword arguments besides the model (``shape``/``mode`` or
    ``mode="dynamic", depth, topk, nodes``), None without a draft model; ``ngram``: the n-gram
    drafter's keyword arguments, None without one. Equal plans build equal drafters.
    """

    budget: int
    model: dict[str, Any] | None = None
    ngram: dict[str, Any] | None = None
    shape: TreeShape | None = field(default=None, compare=False)


def check_draft_models(draft_models: Any) -> list[DraftModel]:
    """``draft_models`` as a list, each a model (an ``nn.Module``) or a :class:`CrossDraft`; anything else is refused
    saying what to pass (one model where a list belongs is the usual slip)."""
    return check_list(draft_models, (torch.nn.Module, CrossDraft), "drafts", "draft models",
                      "pass [draft] (or [] for an n-gram-only or plain recipe)",
                      lambda _: "not a draft model: pass models loaded by treespec.models.load (or any HF causal LM), "
                                "or a treespec.models.pair.CrossDraft for a draft of another tokenizer")


def _budget(recipe: Recipe) -> int:
    if recipe.budget is None:
        raise ValueError("this recipe leaves the budget to tuning (budget=None): resolve it first with "
                         "treespec.calibrate.choices.resolve(recipe, target, drafts), or give budget=B")
    return recipe.budget


def _depth_cap(recipe: Recipe, max_new_tokens: int | None) -> int | None:
    caps = [c for c in (recipe.depth, None if max_new_tokens is None else max(1, int(max_new_tokens) - 1))
            if c is not None]
    return min(caps) if caps else None


def ngram_reserve(recipe: Recipe, with_model: bool = True) -> int:
    """Nodes the n-gram drafter gets out of the budget (see the module doc)."""
    budget = _budget(recipe)
    if recipe.ngram is None or budget < 2:
        return 0
    if not with_model:
        return budget - 1
    return max(0, min(recipe.ngram.max_tokens, budget - 2))


def shape_for(recipe: Recipe, max_new_tokens: int | None = None) -> TreeShape | None:
    """The model drafter's static tree (None for ``dynamic`` or when the budget leaves no drafted node)."""
    budget = _budget(recipe) - ngram_reserve(recipe)
    if recipe.tree == "dynamic" or budget < 2:
        return None
    if recipe.tree == "sequoia" and recipe.acceptance is None:
        raise ValueError("the sequoia tree needs an acceptance vector: measure one with `treespec accept` "
                         "(or use the one shipped for the built-in pair)")
    acceptance = [list(r) if isinstance(r, tuple) else r for r in recipe.acceptance] \
        if recipe.tree == "sequoia" else None
    return tree_builders.for_budget(recipe.tree, budget, acceptance, _depth_cap(recipe, max_new_tokens),
                                    kary_width=recipe.kary_width, chains=recipe.chains,
                                    max_width=recipe.max_width,
                                    paths=recipe.paths)


def plan(recipe: Recipe, with_model: bool = True, max_new_tokens: int | None = None) -> DraftPlan:
    """The drafters' settings for ``recipe`` (``with_model``: a draft model is given)."""
    cap = _depth_cap(recipe, max_new_tokens)
    reserve = ngram_reserve(recipe, with_model)
    model_budget = _budget(recipe) - reserve
    model: dict[str, Any] | None = None
    shape = None
    if with_model and model_budget >= 2:
        if recipe.tree == "dynamic":
            depth = min(recipe.dynamic_depth, model_budget - 1, cap if cap is not None else math.inf)
            model = {"mode": "dynamic", "depth": int(depth), "topk": recipe.dynamic_topk, "nodes": model_budget - 1}
        else:
            shape = shape_for(recipe, max_new_tokens)
            model = {"shape": shape, "mode": recipe.mode}
        if recipe.min_confidence is not None:  # a dynamic tree's drafter stops on it too
            model["min_confidence"] = recipe.min_confidence
    ngram = None
    if recipe.ngram is not None and reserve >= 1:
        n = recipe.ngram
        ngram = {"max_order": n.max_order, "max_tokens": min(n.max_tokens, reserve, cap or reserve),
                 "width": n.width, "window": n.window, "mode": n.mode, "max_nodes": reserve}
    return DraftPlan(_budget(recipe), model, ngram, shape)


def build_drafters(recipe: Recipe, draft_models: Sequence[DraftModel], max_new_tokens: int | None = None
                   ) -> list[Drafter]:
    """Drafters for ``recipe``: one :class:`ModelDrafter` per draft model (each expands the same
    tree; the engine's budget keeps the first ones), then the n-gram drafter. :func:`run` runs
    them under the same recipe's budget and sampling; call this directly only to hand the drafters
    to ``treespec.generate`` yourself (then pass ``budget=recipe.budget`` and the recipe's sampling).

    A :class:`CrossDraft` (another tokenizer) becomes a ``CrossTokenizerDrafter`` drafting greedy
    text chains as deep as the recipe's tree (point masses in the target's tokens)."""
    draft_models = check_draft_models(draft_models)
    p = plan(recipe, with_model=bool(draft_models), max_new_tokens=max_new_tokens)
    drafters: list[Drafter] = []
    if p.model is not None:
        depth = p.shape.depth if p.shape is not None else p.model.get("depth", 1)
        for m in draft_models:
            if isinstance(m, CrossDraft):
                drafters.append(CrossTokenizerDrafter(m.model, m.tokenizer, m.target_tokenizer, depth=max(1, depth)))
            else:
                drafters.append(ModelDrafter(m, **p.model))
    if p.ngram is not None:
        drafters.append(NGramDrafter(**p.ngram))
    return drafters


def verified_tokens(recipe: Recipe, with_model: bool) -> int:
    """The most tokens one verification of ``recipe`` holds, root included (its budget, or the default one where it
    leaves the budget to tuning): the budget, or fewer where the drafters cannot fill it: the n-gram drafter alone
    proposes a ``width``-ary tree ``max_tokens`` deep (prompt lookup: ``width`` chains of ``max_tokens``), at most
    ``max_nodes`` nodes (5 tokens by default, of 16)."""
    p = plan(recipe if recipe.budget is not None else replace(recipe, budget=default_budget(recipe)), with_model)
    if p.model is not None or p.ngram is None:
        return p.budget
    n = p.ngram
    most = n["width"] * n["max_tokens"] if n["mode"] == "prompt_lookup" else \
        sum(n["width"] ** k for k in range(1, n["max_tokens"] + 1))
    return 1 + min(n["max_nodes"], most)


def plan_depth(recipe: Recipe, with_model: bool) -> int:
    """The deepest proposal the recipe's drafters can make (its trees' depth)."""
    p = plan(recipe, with_model=with_model)
    model = 0 if p.model is None else (p.shape.depth if p.shape is not None else int(p.model.get("depth", 0)))
    return max(model, p.ngram["max_tokens"] if p.ngram else 0)
