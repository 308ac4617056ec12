"""Recipes: the one translation from user-facing settings to drafters, shapes and the budget.

``treespec generate``, ``treespec demo``, ``treespec accept``/``profile``, ``treespec sweep`` and
the scripts under ``experiments/`` describe a run by the same words (tree builder, budget, depth,
temperature, drafting mode, n-gram on or off, acceptance vector, precision); a :class:`Recipe`
holds them and :func:`build_drafters` turns them into drafters, so the same words give the same
tree everywhere.

Rules (also in the README):

* **Drafting mode** (:func:`draft_mode`): ``dynamic`` trees draft point masses (``"dynamic"``);
  otherwise an explicit mode wins; else ``topk`` at temperature 0 and
  ``sample_without_replacement`` (Sequoia) when sampling, except ``chains``, which sample i.i.d.
  (``"sample"``, SpecInfer's independent chains) when sampling.
* **Budget** ``B``: tokens in one verification pass, root included; the engine never verifies
  more. ``B = 1`` is plain decoding: no drafter is built (nothing it drafted could be verified).
* **The n-gram drafter shares the budget**: beside a draft model it reserves
  ``r = min(ngram.max_tokens, B - 2)`` nodes (so at least one node is left for the model's tree;
  at ``B = 2`` it gets none and is left out); the model's tree (or the dynamic tree's ``nodes=``)
  is sized for ``B - r``; the n-gram drafter runs with ``max_tokens = max_nodes = r`` and merges
  *after* the model drafter, so guesses that agree with the model's tree cost no node. Alone, the
  n-gram drafter gets ``B - 1`` nodes.
* **Depth**: ``depth`` (None: no limit) caps every drafter's depth; when the caller gives
  ``max_new_tokens``, the depth is also capped at ``max_new_tokens - 1`` (a step commits at most
  depth + 1 tokens; deeper nodes could never be kept). The dynamic tree's depth is
  ``min(dynamic_depth, depth cap, model budget - 1)``.
* **Shapes** come from ``tree_builders.for_budget`` (``sequoia`` needs the acceptance vector or
  per-depth matrix); the dynamic tree is a drafter mode, not a shape.

Precision: ``target_dtype`` / ``draft_dtype`` are names (``"float32"``, ``"bfloat16"``,
``"float16"``; None: float32 on CPU, bfloat16 on CUDA) passed to ``treespec.models.load``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import torch

import tree_builders
from tree_builders import TreeShape

from .core.drafting import Drafter
from .drafters.model import ModelDrafter
from .drafters.ngram import NGramDrafter
from .models.precision import parse_precision

TREES = ("sequoia", "chain", "kary", "chains", "dynamic")
STATIC_MODES = ("topk", "sample", "sample_without_replacement")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # the sweep's names


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
    """Options of the n-gram drafter (see ``treespec.NGramDrafter``); its node budget comes from the recipe."""

    max_order: int = 4
    max_tokens: int = 4
    width: int = 1
    window: int = 512
    mode: str = "ngram"


def _frozen(acceptance: Any) -> Any:
    """A vector or per-depth matrix as nested tuples of floats (hashable, comparable)."""
    if acceptance is None:
        return None
    rows = [list(map(float, r)) if hasattr(r, "__len__") else float(r) for r in acceptance]
    return tuple(tuple(r) if isinstance(r, list) else r for r in rows)


@dataclass(frozen=True)
class Recipe:
    """The settings of one run, as a user states them.

    ``tree``: one of :data:`TREES`; ``budget``: ``B`` (>= 1, root included); ``depth``: depth limit
    (None: none); ``draft_mode``: None for the rule of :func:`draft_mode`; ``ngram``: the n-gram
    drafter's options, None for off; ``acceptance``: vector or per-depth matrix (``sequoia`` needs
    one); ``kary_width``, ``chains``: options of those builders; ``dynamic_depth``,
    ``dynamic_topk``: of the dynamic tree; ``max_width``: children per node of the sequoia tree
    (None: no limit); ``min_confidence``: the model drafter's confidence stop (``ModelDrafter``);
    ``target_dtype``/``draft_dtype``: precision names (``treespec.models.precision``; ``"auto"`` measures).
    """

    tree: str = "sequoia"
    budget: int = 16
    depth: int | None = None
    temperature: float = 0.0
    draft_mode: str | None = None
    ngram: NGramSettings | None = None
    acceptance: Any = None
    kary_width: int = 2
    chains: int | None = None
    dynamic_depth: int = 6
    dynamic_topk: int = 8
    max_width: int | None = None
    min_confidence: float | None = None
    target_dtype: str | None = None
    draft_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.tree not in TREES:
            raise ValueError(f"unknown tree builder {self.tree!r}; choose one of {', '.join(TREES)}")
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ValueError(f"budget must be an int >= 1 (tokens per verification pass, root included), "
                             f"got {self.budget!r}")
        if self.depth is not None and (not isinstance(self.depth, int) or self.depth < 1):
            raise ValueError(f"depth must be an int >= 1 or None (no limit), got {self.depth!r}")
        if not float(self.temperature) >= 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature!r}")
        if self.draft_mode is not None and self.draft_mode not in STATIC_MODES:
            raise ValueError(f"draft_mode must be one of {', '.join(STATIC_MODES)} or None (the rule), "
                             f"got {self.draft_mode!r}")
        for name in ("target_dtype", "draft_dtype"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, parse_precision(value))
        if self.target_dtype == "int8":
            raise ValueError("target_dtype int8 would change the target's output; quantise drafts only "
                             "(draft_dtype='int8'), and give the target float32, bfloat16 or 'auto'")
        if self.min_confidence is not None and not 0 <= float(self.min_confidence) <= 1:
            raise ValueError(f"min_confidence must be a probability in [0, 1] or None, got {self.min_confidence!r}")
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "acceptance", _frozen(self.acceptance))

    @property
    def mode(self) -> str:
        """The model drafter's mode under the rule of :func:`draft_mode`."""
        return draft_mode(self.tree, self.temperature, self.draft_mode)


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

    def key(self) -> tuple:
        """A comparable summary: budget, model drafter (static paths or dynamic settings), n-gram settings."""
        model = None
        if self.model is not None:
            model = tuple(sorted((k, tuple(v.paths) if isinstance(v, TreeShape) else v) for k, v in self.model.items()))
        ngram = None if self.ngram is None else tuple(sorted(self.ngram.items()))
        return (self.budget, model, ngram)


def _depth_cap(recipe: Recipe, max_new_tokens: int | None) -> int | None:
    caps = [c for c in (recipe.depth, None if max_new_tokens is None else max(1, int(max_new_tokens) - 1))
            if c is not None]
    return min(caps) if caps else None


def ngram_reserve(recipe: Recipe, with_model: bool = True) -> int:
    """Nodes the n-gram drafter gets out of the budget (see the module doc)."""
    if recipe.ngram is None or recipe.budget < 2:
        return 0
    if not with_model:
        return recipe.budget - 1
    return max(0, min(recipe.ngram.max_tokens, recipe.budget - 2))


def shape_for(recipe: Recipe, max_new_tokens: int | None = None) -> TreeShape | None:
    """The model drafter's static tree (None for ``dynamic`` or when the budget leaves no drafted node)."""
    budget = recipe.budget - ngram_reserve(recipe)
    if recipe.tree == "dynamic" or budget < 2:
        return None
    if recipe.tree == "sequoia" and recipe.acceptance is None:
        raise ValueError("the sequoia tree needs an acceptance vector: measure one with `treespec accept` "
                         "(or use the one shipped for the built-in pair)")
    acceptance = [list(r) if isinstance(r, tuple) else r for r in recipe.acceptance] \
        if recipe.tree == "sequoia" else None
    return tree_builders.for_budget(recipe.tree, budget, acceptance, _depth_cap(recipe, max_new_tokens),
                                    kary_width=recipe.kary_width, chains=recipe.chains,
                                    max_width=recipe.max_width if recipe.tree == "sequoia" else None)


def plan(recipe: Recipe, with_model: bool = True, max_new_tokens: int | None = None) -> DraftPlan:
    """The drafters' settings for ``recipe`` (``with_model``: a draft model is given)."""
    cap = _depth_cap(recipe, max_new_tokens)
    reserve = ngram_reserve(recipe, with_model)
    model_budget = recipe.budget - reserve
    model: dict[str, Any] | None = None
    shape = None
    if with_model and model_budget >= 2:
        if recipe.tree == "dynamic":
            depth = min(recipe.dynamic_depth, model_budget - 1, cap if cap is not None else math.inf)
            model = {"mode": "dynamic", "depth": int(depth), "topk": recipe.dynamic_topk, "nodes": model_budget - 1}
        else:
            shape = shape_for(recipe, max_new_tokens)
            model = {"shape": shape, "mode": recipe.mode}
            if recipe.min_confidence is not None:
                model["min_confidence"] = recipe.min_confidence
    ngram = None
    if recipe.ngram is not None and reserve >= 1:
        n = recipe.ngram
        ngram = {"max_order": n.max_order, "max_tokens": min(n.max_tokens, reserve, cap or reserve),
                 "width": n.width, "window": n.window, "mode": n.mode, "max_nodes": reserve}
    return DraftPlan(recipe.budget, model, ngram, shape)


def build_drafters(recipe: Recipe, draft_models: Sequence[torch.nn.Module | CrossDraft],
                   max_new_tokens: int | None = None) -> list[Drafter]:
    """Drafters for ``recipe``: one :class:`ModelDrafter` per draft model (each expands the same
    tree; the engine's budget keeps the first ones), then the n-gram drafter. Run them with
    ``generate(..., budget=recipe.budget)``.

    A :class:`CrossDraft` (another tokenizer) becomes a ``CrossTokenizerDrafter`` drafting greedy
    text chains as deep as the recipe's tree (point masses in the target's tokens)."""
    from .drafters.cross_tokenizer import CrossTokenizerDrafter

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


# ---------------------------------------------------------------------------------------------
# Inputs a recipe needs: models, the default acceptance vector, end-of-sequence ids


@dataclass(frozen=True)
class CrossDraft:
    """A draft model whose tokenizer differs from the target's (``treespec.drafters.cross_tokenizer``)."""

    model: torch.nn.Module
    tokenizer: Any
    target_tokenizer: Any


def default_precision(name: str | None, device: str | torch.device) -> str:
    """A precision name for ``treespec.models.load``; None: ``auto`` (measured) on CPU, bfloat16 on CUDA."""
    if name is None:
        return "bfloat16" if str(device).startswith("cuda") else "auto"
    return parse_precision(name)


def load_pair(target: str, drafts: Sequence[str], *, device: str = "cpu", target_dtype: str | None = None,
              draft_dtype: str | None = None) -> tuple[torch.nn.Module, Any, list[torch.nn.Module | CrossDraft]]:
    """The target, its tokenizer and the drafts: a model where it shares the target's tokenizer, a
    :class:`CrossDraft` where it does not (it then drafts text, proposed in the target's tokens).

    Precisions: names as in ``treespec.models.load`` (``"auto"`` times the candidates on this machine
    and keeps the fastest; the decision is cached); None means ``auto`` on CPU, bfloat16 on CUDA.
    The draft's precision defaults to ``auto`` too (int8 is among its candidates, not the target's).
    """
    from .drafters.cross_tokenizer import tokenizers_match
    from .models.loading import load

    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine has no CUDA device (torch sees none); use --device cpu")
    model, tok = load(target, device=device, dtype=default_precision(target_dtype, device), role="target")
    out: list[torch.nn.Module | CrossDraft] = []
    for name in drafts:
        draft, draft_tok = load(name, device=device, dtype=default_precision(draft_dtype, device), role="draft")
        out.append(draft if tokenizers_match(tok, draft_tok) else CrossDraft(draft, draft_tok, tok))
    return model, tok, out


def default_acceptance(path: str | Path | None, temperature: float) -> list[float]:
    """The vector in ``path`` (JSON from ``treespec accept``), else the one shipped for the built-in pair."""
    if path is None:
        name = f"data/acceptance-qwen2.5-coder-t{0 if temperature == 0 else 1}.json"
        text = resources.files("treespec").joinpath(name).read_text()
        where = name
    else:
        text = Path(path).read_text()
        where = str(path)
    try:
        vector = json.loads(text)["vector"]
    except json.JSONDecodeError as error:
        raise ValueError(f"acceptance file {where} is not valid JSON ({error}); write one with `treespec accept`") \
            from error
    except (KeyError, TypeError) as error:
        raise ValueError(f"acceptance file {where} has no \"vector\" entry; write one with `treespec accept`") \
            from error
    return vector


def eos_ids(model: torch.nn.Module, tok: Any) -> list[int]:
    """The model's end-of-sequence ids (its generation config's, else the tokenizer's)."""
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return eos or ([tok.eos_token_id] if tok.eos_token_id is not None else [])
