"""Recipes: the one route from what a user says to what the engine runs.

A :class:`Recipe` holds every setting of a run (tree builder, budget, depth, temperature, top-k,
top-p, drafting mode, n-gram, acceptance vector, precisions, verifier, compile), each validated
once, here, by the rule's owner (``treespec.core.checks``, ``SamplingParams``, the verifier
registry, ...). :func:`resolve` fills the budget a user left to tuning, :func:`build_drafters`
turns a recipe into drafters and :func:`run` runs it: ``treespec generate``, ``treespec demo``,
``treespec sweep``, the scripts under ``experiments/`` and the README's API example all go through
:func:`run`, so the same recipe gives the same tree, the same cap and the same sampling everywhere.

Rules (also in the README):

* **Drafting mode** (:func:`draft_mode`): ``dynamic`` trees draft point masses (``"dynamic"``);
  otherwise an explicit mode wins; else ``topk`` at temperature 0 and
  ``sample_without_replacement`` (Sequoia) when sampling, except ``chains``, which sample i.i.d.
  (``"sample"``, SpecInfer's independent chains) when sampling.
* **Budget** ``B``: tokens in one verification pass, root included; the engine never verifies
  more, and the tree is sized for the same ``B`` (one field, read in one place: :func:`plan`).
  ``B = 1`` is plain decoding: no drafter is built. ``budget=None`` lets :func:`resolve` choose:
  the measured-fastest Sequoia tree (``treespec.calibrate.tuning``) for a Sequoia recipe with one
  draft model of the target's tokenizer, no n-gram and an acceptance vector; otherwise
  :data:`DEFAULT_BUDGET`.
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

Precision: ``target_dtype`` / ``draft_dtype`` are names for ``treespec.models.load``
(``treespec.models.precision.CHOICES``: ``auto``, ``float32``, ``bfloat16``, ``float16``, and
``int8`` and ``int4`` for drafts only); None means ``auto`` on CPU (measured here; int8 and int4 are
among a draft's candidates) and bfloat16 on CUDA (``treespec.models.pair.default_precision``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

import tree_builders
from tree_builders import TreeShape

from .calibrate.tuning import Tuned, calibrate, tune
from .core import checks, verifiers
from .core.drafting import Drafter
from .core.engine import generate
from .core.sampling import SamplingParams
from .core.stats import GenerateOutput
from .drafters.cross_tokenizer import CrossTokenizerDrafter
from .drafters.model import STATIC_MODES, ModelDrafter
from .drafters.ngram import NGramDrafter
from .models.pair import CrossDraft
from .models.precision import parse_precision, precision_of

if TYPE_CHECKING:
    from .calibrate.pilot import Pilot

#: tree builders a recipe names: ``tree_builders``' static shapes, and the EAGLE-2 dynamic tree
TREES = (*tree_builders.STATIC_BUILDERS, "dynamic")
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


def _optional_count(name: str, value: Any, minimum: int, hint: str) -> int | None:
    return None if value is None else checks.check_int(name, value, minimum, hint)


@dataclass(frozen=True)
class Recipe:
    """The settings of one run, as a user states them; every field is checked on construction.

    ``tree``: one of :data:`TREES`; ``budget``: ``B`` (>= 1, root included; None: :func:`resolve`
    chooses); ``depth``: depth limit (None: none); ``temperature``, ``top_k``, ``top_p``: the target
    distribution (HF conventions); ``draft_mode``: None for the rule of :func:`draft_mode`;
    ``ngram``: the n-gram drafter's options, None for off; ``acceptance``: vector or per-depth
    matrix (``sequoia`` needs one); ``kary_width``, ``chains``: options of those builders;
    ``dynamic_depth``, ``dynamic_topk``: of the dynamic tree; ``max_width``: children per node of
    the sequoia tree (None: no limit); ``min_confidence``: the model drafter's confidence stop
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
        for name in ("target_dtype", "draft_dtype"):
            if getattr(self, name) is not None:
                set_(name, parse_precision(getattr(self, name)))
        if self.target_dtype in ("int8", "int4"):
            raise ValueError(f"target_dtype {self.target_dtype} would change the target's output; quantise drafts "
                             f"only (draft_dtype='{self.target_dtype}'), and give the target float32, bfloat16 or 'auto'")
        set_("min_confidence", checks.check_probability("min_confidence", self.min_confidence))
        for name, hint in (("kary_width", "children per node of the k-ary tree"),
                           ("dynamic_depth", "levels of the dynamic tree"), ("dynamic_topk", "children per node")):
            set_(name, checks.check_int(name, getattr(self, name), 1, hint))
        set_("chains", _optional_count("chains", self.chains, 1, "independent chains; None for the default"))
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


def _budget(recipe: Recipe) -> int:
    if recipe.budget is None:
        raise ValueError("this recipe leaves the budget to tuning (budget=None): resolve it first with "
                         "treespec.recipes.resolve(recipe, target, drafts), or give budget=B")
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
                                    max_width=recipe.max_width if recipe.tree == "sequoia" else None)


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
            if recipe.min_confidence is not None:
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


@dataclass(frozen=True)
class Resolved:
    """A recipe with its budget filled in, a line saying what runs and why, and the tuning behind it."""

    recipe: Recipe
    why: str
    tuned: Tuned | None = None


def _describe_models(target: torch.nn.Module, drafts: Sequence[DraftModel]) -> str:
    return f"target {precision_of(target)}" + "".join(
        f", draft {precision_of(d.model if isinstance(d, CrossDraft) else d)}" for d in drafts)


def tunable(recipe: Recipe, drafts: Sequence[DraftModel]) -> bool:
    """Whether :func:`resolve` tunes ``recipe``: no budget given, a Sequoia tree with an acceptance
    vector, one draft model of the target's tokenizer and no n-gram drafter."""
    return (recipe.budget is None and recipe.tree == "sequoia" and recipe.acceptance is not None
            and recipe.ngram is None and len(drafts) == 1 and not isinstance(drafts[0], CrossDraft))


def _plan_depth(recipe: Recipe, with_model: bool) -> int:
    """The deepest proposal the recipe's drafters can make (its trees' depth)."""
    p = plan(recipe, with_model=with_model)
    model = 0 if p.model is None else (p.shape.depth if p.shape is not None else int(p.model.get("depth", 0)))
    return max(model, p.ngram["max_tokens"] if p.ngram else 0)


def _single_chain(recipe: Recipe, drafters: Sequence[Drafter]) -> bool:
    """Whether the drafters propose one chain per step (so a depth cap keeps a prefix of each)."""
    if len(drafters) != 1:
        return False
    d = drafters[0]
    if isinstance(d, (CrossTokenizerDrafter, NGramDrafter)):
        return d.width == 1
    return isinstance(d, ModelDrafter) and recipe.tree == "chain"


def _pilot_prompts(tokenizer: Any) -> list[list[int]]:
    """The built-in pilot prompts (``treespec.calibrate.pilot.PILOT_PROMPTS``) in the target's tokens."""
    from .calibrate.pilot import PILOT_PROMPTS

    return [list(tokenizer(text)["input_ids"]) for text in PILOT_PROMPTS]


def _measurement_key(tag: str, recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel],
                     prompts: Sequence[Sequence[int]]) -> str:
    """The cache key of a measurement of ``recipe`` on ``prompts``: machine, models, precisions, drafters,
    budget and sampling."""
    from .calibrate.pilot import prompts_digest
    from .common.machine import measurement_key, model_name

    return measurement_key(tag, model_name(target), precision_of(target), f"budget={recipe.budget}",
                           *(precision_of(m.model if isinstance(m, CrossDraft) else m) for m in drafts),
                           *(d.describe() for d in build_drafters(recipe, drafts)), f"T={recipe.temperature}",
                           f"top_p={recipe.top_p}", f"top_k={recipe.top_k}", recipe.verifier, prompts_digest(prompts),
                           device=next(target.parameters()).device)


def _measured(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel], tokenizer: Any,
              cache_file: Path | None, *, chain: bool = False, tag: str = "pilot-v1") -> "Pilot":
    """A pilot of ``recipe`` (its eager steps and the target alone on the built-in pilot prompts,
    ``treespec.calibrate.pilot.run_pilot``), cached per machine, models, drafters and sampling."""
    from .calibrate import pilot

    prompts = _pilot_prompts(tokenizer)
    eager = replace(recipe, compile=False)  # the pilot times eager steps (compiling costs minutes)
    key = _measurement_key(tag, recipe, target, drafts, prompts)
    return pilot.cached_pilot(key, cache_file, lambda: pilot.run_pilot(
        lambda ids, n: run(eager, target, drafts, ids, max_new_tokens=n, seed=0),
        lambda ids, n: run(replace(eager, budget=1), target, drafts, ids, max_new_tokens=n, seed=0),
        target, prompts, depth=_plan_depth(recipe, bool(drafts)), chain=chain))


def _pilot_choice(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel], models: str,
                  tokenizer: Any, max_new_tokens: int, cache_file: Path | None) -> Resolved:
    """A recipe the tuner cannot size, measured by a pilot (``treespec.calibrate.pilot``): the depth
    predicted fastest on this machine, or plain decoding (budget 1) when no depth is predicted to pay."""
    from .calibrate import pilot

    base = replace(recipe, budget=DEFAULT_BUDGET)
    drafters = build_drafters(base, drafts)
    if not drafters:
        return Resolved(base, f"{models}; {recipe.tree} tree, budget {DEFAULT_BUDGET} (no drafter to measure)")
    depth = _plan_depth(base, bool(drafts))
    measured = _measured(base, target, drafts, tokenizer, cache_file, chain=_single_chain(base, drafters))
    # a depth cap d is only a candidate when the recipe's drafters then really draft d deep
    chosen, table = pilot.choose(measured, max_new_tokens, allowed=lambda d: d == depth or _plan_depth(
        replace(base, depth=d), bool(drafts)) == d)
    why = f"{models}; {pilot.why(measured, chosen, table, max_new_tokens)}"
    if chosen.depth == 0:
        return Resolved(replace(recipe, budget=1), why)
    return Resolved(replace(base, depth=chosen.depth if chosen.depth < depth else recipe.depth), why)


def resolve(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel], *,
            cache_file: Path | None = None, tuner: Callable[..., Tuned] = tune, tokenizer: Any = None,
            max_new_tokens: int = 128, pilot_cache: Path | None = None) -> Resolved:
    """``recipe`` with a budget: as given; tuned on this machine (:func:`tunable`; the profile is
    cached in ``cache_file``, default ``<treespec cache>/profiles.json``; given the target's
    ``tokenizer``, the profile is then corrected by a pilot of the tuned tree's real steps and the
    tree chosen again); otherwise, given the ``tokenizer``, the depth a short pilot predicts fastest
    for ``max_new_tokens`` new tokens, or plain decoding when speculation is not predicted to pay
    (``treespec.calibrate.pilot``; pilots cached in ``pilot_cache``, default
    ``<treespec cache>/pilots.json``); without a tokenizer, :data:`DEFAULT_BUDGET`."""
    models = _describe_models(target, drafts)
    if recipe.budget is not None:
        return Resolved(recipe, f"{models}; {recipe.tree} tree, budget {recipe.budget} (as given)")
    from .models import cache_root

    if not tunable(recipe, drafts):
        if tokenizer is not None:
            return _pilot_choice(recipe, target, drafts, models, tokenizer, max_new_tokens,
                                 pilot_cache if pilot_cache is not None else cache_root() / "pilots.json")
        return Resolved(replace(recipe, budget=DEFAULT_BUDGET),
                        f"{models}; {recipe.tree} tree, budget {DEFAULT_BUDGET} (the default: tuning needs a "
                        "Sequoia tree with one draft model of the target's tokenizer and no n-gram; with the "
                        "target's tokenizer a pilot measures whether it pays)")
    if cache_file is None:
        cache_file = cache_root() / "profiles.json"
    acceptance = [list(r) if isinstance(r, tuple) else r for r in recipe.acceptance]
    tuned = tuner(target, drafts[0], acceptance, temperature=recipe.temperature, max_depth=recipe.depth or 8,
                  cache_file=cache_file)
    chosen = replace(recipe, **tuned.settings(), target_dtype=precision_of(target),
                     draft_dtype=precision_of(drafts[0]))
    if tokenizer is not None and chosen.budget > 1:  # correct the isolated-forward costs by real steps
        measured = _measured(replace(chosen, min_confidence=None), target, drafts, tokenizer,
                             pilot_cache if pilot_cache is not None else cache_root() / "pilots.json",
                             tag="calibration-v1")
        tuned = calibrate(tuned, measured, acceptance, max_depth=recipe.depth or 8)
        chosen = replace(recipe, **tuned.settings(), target_dtype=precision_of(target),
                         draft_dtype=precision_of(drafts[0]))
    return Resolved(chosen, tuned.why, tuned)


def resolve_compile(resolved: Resolved, target: torch.nn.Module, drafts: Sequence[DraftModel], tokenizer: Any, *,
                    prompts: int, max_new_tokens: int, cache_file: Path | None = None,
                    measure_from_tokens: int | None = None, backend: bool | str = True,
                    asked: bool = False) -> Resolved:
    """``resolved`` with ``compile`` chosen for a run of ``prompts`` prompts of ``max_new_tokens`` new
    tokens: the compiled step when it is measured to pay back its compile on this machine
    (``treespec.calibrate.compile_choice``; measured on the built-in pilot prompts when the run has at
    least ``measure_from_tokens`` new tokens, default ``compile_choice.MEASURE_FROM_TOKENS``, and cached
    in ``cache_file``, default ``<treespec cache>/compile.json``). ``backend``: the compiled recipe's
    ``compile`` (True: the device's default backend). ``asked``: the user asked for compiled steps, so
    nothing is measured and the run compiles. Plain decoding (budget 1) stays eager unless asked.

    When the run compiles and the measurement holds the tuned tree's compiled steps, the tuning's
    prediction is re-costed by them (:meth:`Tuned.on_compiled_steps`): the seconds per step it
    prints are the compiled step's, not the eager step's it was chosen with."""
    from .calibrate import compile_choice
    from .models import cache_root

    recipe = replace(resolved.recipe, compile=False)
    compiled = replace(recipe, compile=backend)
    if recipe.budget == 1:
        return (Resolved(compiled, f"{resolved.why}; compiled steps (as asked)", resolved.tuned) if asked else
                Resolved(recipe, f"{resolved.why}; eager steps (plain decoding)", resolved.tuned))
    prompt_ids = _pilot_prompts(tokenizer)
    key = _measurement_key(f"compile-v4|backend={backend}", recipe, target, drafts, prompt_ids)
    threshold = compile_choice.MEASURE_FROM_TOKENS if measure_from_tokens is None else measure_from_tokens
    measure_now = None
    if prompts * max_new_tokens >= threshold and not asked:
        measure_now = lambda: compile_choice.measure(  # noqa: E731
            lambda ids, n: run(recipe, target, drafts, ids, max_new_tokens=n, seed=0),
            lambda ids, n: run(compiled, target, drafts, ids, max_new_tokens=n, seed=0), prompt_ids)
    timing = compile_choice.cached(key, cache_file if cache_file is not None else cache_root() / "compile.json",
                                   measure_now)
    chosen, why = compile_choice.decide(timing, prompts, max_new_tokens)
    if asked:
        chosen = True
        why = "compiled steps (as asked" + ("" if timing is None else
                                           f"; {compile_choice.figures(timing, prompts, max_new_tokens)}") + ")"
    tuned = resolved.tuned
    if not chosen or tuned is None or timing is None or timing.step_compiled <= 0:
        return Resolved(compiled if chosen else recipe, f"{resolved.why}; {why}", tuned)
    tuned = tuned.on_compiled_steps(timing.step_compiled)
    return Resolved(compiled, f"{tuned.why}; {why}", tuned)


def run(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel], input_ids: torch.Tensor | Sequence[int],
        *, max_new_tokens: int = 64, seed: int | None = None, eos_token_id: int | Sequence[int] | None = None,
        on_tokens: Callable[[list[int]], None] | None = None) -> GenerateOutput:
    """Generate from ``target`` with the drafters, cap, sampling, verifier and compile mode of ``recipe``.

    The documented one-call route: the tree is sized and capped from one budget, and sampled with
    the recipe's own temperature/top-k/top-p. A recipe whose budget is None is resolved first
    (:func:`resolve`; resolve it once yourself to print its ``why`` or to run many prompts).
    ``drafts``: draft models (a :class:`CrossDraft` for another tokenizer; none for an n-gram-only
    or plain recipe). The other arguments are those of ``treespec.generate``.
    """
    if recipe.budget is None:
        recipe = resolve(recipe, target, drafts).recipe
    return generate(target, input_ids, build_drafters(recipe, drafts, max_new_tokens=max_new_tokens),
                    max_new_tokens=max_new_tokens, temperature=recipe.temperature, top_k=recipe.top_k,
                    top_p=recipe.top_p, eos_token_id=eos_token_id, seed=seed, budget=recipe.budget,
                    on_tokens=on_tokens, verifier=recipe.verifier, compile=recipe.compile)
