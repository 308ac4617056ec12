"""Recipes: the one route from what a user says to what the engine runs.

A :class:`Recipe` holds every setting of a run (tree builder, budget, depth, temperature, top-k,
top-p, drafting mode, n-gram, acceptance vector, precisions, verifier, compile), each validated
once, here, by the rule's owner (``treespec.core.checks``, ``SamplingParams``, the verifier
registry, ...; ``treespec.recipes.settings``). ``treespec.calibrate.choices.resolve`` fills the budget a user
left to tuning by measuring, :func:`build_drafters` (``treespec.recipes.plan``) turns a recipe into drafters
and :func:`run` runs it: ``treespec generate``, ``treespec demo``,
``treespec sweep``, the scripts under ``experiments/`` and the README's API example all go through
:func:`run`, so the same recipe gives the same tree, the same cap and the same sampling everywhere.

Rules (also in docs/api.md):

* **Drafting mode** (:func:`draft_mode`): ``dynamic`` trees draft point masses (``"dynamic"``);
  otherwise an explicit mode wins; else ``topk`` at temperature 0 and
  ``sample_without_replacement`` (Sequoia) when sampling, except ``chains``, which sample i.i.d.
  (``"sample"``, SpecInfer's independent chains) when sampling.
* **Budget** ``B``: tokens in one verification pass, root included; the engine never verifies
  more, and the tree is sized for the same ``B`` (one field, read in one place: :func:`plan`).
  ``B = 1`` is plain decoding: no drafter is built. ``budget=None`` lets :func:`resolve` choose:
  the measured-fastest tree of its builder (``treespec.calibrate.tuning``) for a Sequoia, chain or k-ary recipe
  with one draft model of the target's tokenizer, no n-gram and acceptance rows; for other recipes, given the
  target's tokenizer, a pilot's depth or plain decoding (``treespec.calibrate.pilot``); otherwise
  :data:`DEFAULT_BUDGET` (a static tree's own size for ``tree="paths"``: :func:`default_budget`).
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
  per-depth matrix; ``paths`` its static tree, of which a budget ``B`` keeps the first ``B - 1`` paths that fit
  the depth cap); the dynamic tree is a drafter mode, not a shape.

Precision: ``target_dtype`` / ``draft_dtype`` are names for ``treespec.models.load``
(``treespec.common.options.CHOICES``: ``auto``, ``float32``, ``bfloat16``, ``float16``, ``int4`` (a draft's, or a
GGUF target's on its file's own 4-bit blocks), and ``int8`` for drafts only); None means ``auto`` on CPU (measured
here; int8 and int4 are among a draft's candidates) and bfloat16 on CUDA (``treespec.models.pair.default_precision``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..core.batch import BatchOutput
from ..core.buffers import Envelope
from ..core.engine import generate
from ..core.stats import GenerateOutput
from .plan import (DraftPlan, build_drafters, check_draft_models, ngram_reserve, plan, plan_depth, shape_for,
                   verified_tokens)
from .settings import DEFAULT_BUDGET, TREES, DraftModel, NGramSettings, Recipe, default_budget, draft_mode

__all__ = ["DEFAULT_BUDGET", "MAX_NEW_TOKENS", "TREES", "DraftModel", "DraftPlan", "NGramSettings", "Recipe",
           "build_drafters",
           "check_draft_models",
           "default_budget", "draft_mode", "ngram_reserve", "plan", "plan_depth", "run", "shape_for", "verified_tokens"]


#: new tokens a run generates unless told
MAX_NEW_TOKENS = 64


def run(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel],
        input_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int] | torch.Tensor], *,
        max_new_tokens: int = MAX_NEW_TOKENS, seed: int | Sequence[int] | None = None,
        eos_token_id: int | Sequence[int] | torch.Tensor | None = None,
        on_tokens: Callable[[list[int]], None] | Callable[[int, list[int]], None] | None = None,
        envelope: Envelope | None = None) -> GenerateOutput | BatchOutput:
    """Generate from ``target`` with the drafters, cap, sampling, verifier and compile mode of ``recipe``.

    The documented one-call route: the tree is sized and capped from one budget, and sampled with
    the recipe's own temperature/top-k/top-p. The recipe needs a budget: ``treespec.run``
    (``treespec.calibrate.choices.run``) resolves one left to tuning first.
    ``drafts``: draft models (a :class:`CrossDraft` for another tokenizer; none for an n-gram-only
    or plain recipe). The other arguments are those of ``treespec.generate`` (``envelope``: the captured step's
    tree envelope, e.g. a sweep's ``Envelope.for_shapes`` of all its trees). A batch of prompts (a list of token
    lists) decodes at once (``treespec.core.batch``; compiled: its captured step, where the drafters allow).
    """
    return generate(target, input_ids, build_drafters(recipe, drafts, max_new_tokens=max_new_tokens),
                    max_new_tokens=max_new_tokens, temperature=recipe.temperature, top_k=recipe.top_k,
                    top_p=recipe.top_p, eos_token_id=eos_token_id, seed=seed, budget=recipe.budget,
                    on_tokens=on_tokens, verifier=recipe.verifier, compile=recipe.compile, envelope=envelope)
