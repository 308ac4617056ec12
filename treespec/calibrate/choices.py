"""The choices a recipe leaves to measurement on this machine: its budget (the tuner, or a pilot of its real
steps) and whether its steps compile (``compile_choice``). :func:`resolve` and :func:`resolve_compile` return
a :class:`Resolved`: the recipe with the choice made and a line saying what runs and why; :func:`resolve_run` makes
both choices as ``treespec generate`` does."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from ..common.options import TUNED_TREES
from ..core.drafting import Drafter
from ..drafters.cross_tokenizer import CrossTokenizerDrafter
from ..drafters.model import ModelDrafter
from ..drafters.ngram import NGramDrafter
from ..models.pair import CrossDraft, draft_model
from ..core.linear_layout import layout_tags
from ..models.precision import kernel_tags, precision_of
from ..core.batch import BatchOutput
from ..core.checks import check_int, check_model, check_not_empty, checked_prompts
from ..core.stats import GenerateOutput
from ..recipes import (MAX_NEW_TOKENS, DraftModel, Recipe, build_drafters, check_draft_models, default_budget,
                       plan_depth)
from ..recipes import run as run_resolved
from .step_cost import Builder
from .tuning import Tuned, calibrate, tune

if TYPE_CHECKING:
    from .pilot import Pilot

@dataclass(frozen=True)
class Resolved:
    """A recipe with its budget filled in, a line saying what runs and why, and the tuning behind it."""

    recipe: Recipe
    why: str
    tuned: Tuned | None = None
    #: a pilot's choice: its predicted seconds per new token (the target alone's over the chosen speedup)
    pilot_seconds_per_token: float | None = None


def _describe_models(target: torch.nn.Module, drafts: Sequence[DraftModel]) -> str:
    return f"target {precision_of(target)}" + "".join(
        f", draft {precision_of(draft_model(d))}" for d in drafts)




def tunable(recipe: Recipe, drafts: Sequence[DraftModel]) -> bool:
    """Whether :func:`resolve` tunes ``recipe``: no budget given, a tree of :data:`TUNED_TREES` with an acceptance
    vector, one draft model of the target's tokenizer and no n-gram drafter."""
    return (recipe.budget is None and recipe.tree in TUNED_TREES and recipe.acceptance is not None
            and recipe.ngram is None and len(drafts) == 1 and not isinstance(drafts[0], CrossDraft))


def builder_of(recipe: Recipe) -> Builder | None:
    """The builder whose trees the tuner sizes for ``recipe``: None for Sequoia's DP."""
    if recipe.tree == "sequoia":
        return None
    return Builder(recipe.tree, recipe.kary_width)


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
    from .pilot import PILOT_PROMPTS

    return [list(tokenizer(text)["input_ids"]) for text in PILOT_PROMPTS]


def _measurement_key(tag: str, recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel],
                     prompts: Sequence[Sequence[int]]) -> str:
    """The cache key of a measurement of ``recipe`` on ``prompts``: machine, models, precisions, drafters (a model
    drafter's static tree by its paths: two trees of one size and depth are two measurements), budget and
    sampling."""
    from .pilot import prompts_digest
    from ..common.machine import measurement_key, measured_name

    drafters = build_drafters(recipe, drafts)
    trees = [f"tree={prompts_digest(d.layout.shape.paths)}"  # a digest of int lists: the paths
             for d in drafters if isinstance(d, ModelDrafter) and d.mode != "dynamic"]
    return measurement_key(tag, measured_name(target), precision_of(target), f"budget={recipe.budget}",
                           *(f"{measured_name(d)}:{precision_of(d)}" for d in map(draft_model, drafts)),
                           *(d.describe() for d in drafters), *trees, f"T={recipe.temperature}",
                           f"top_p={recipe.top_p}", f"top_k={recipe.top_k}", recipe.verifier, prompts_digest(prompts),
                           *layout_tags(target, *map(draft_model, drafts)),
                           *kernel_tags(target), device=next(target.parameters()).device)


def _measured(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel], tokenizer: Any,
              cache_file: Path | None, *, chain: bool = False, tag: str = "pilot-v5") -> "Pilot":
    """A pilot of ``recipe`` (its eager steps and the target alone on the built-in pilot prompts,
    ``treespec.calibrate.pilot.run_pilot``), cached per machine, models, drafters and sampling. Tags ``-v2``: a
    draft's pass over the prompt is charged to the prefill (``Drafter.prefill``), no longer to the first step's
    drafting; ``-v3``: plain decoding's prefill gives its first token (``EagerStep.prefill``); ``-v4``: the latency
    curve timed at every size up to ``pilot.DENSE_SIZES``; ``-v5``: a draft of another tokenizer's pass over the
    prompt charged to the prefill too. Pilots measured before are measured again."""
    from . import pilot

    prompts = _pilot_prompts(tokenizer)
    eager = replace(recipe, compile=False)  # the pilot times eager steps (compiling costs minutes)
    key = _measurement_key(tag, recipe, target, drafts, prompts)
    return pilot.cached_pilot(key, cache_file, lambda: pilot.run_pilot(
        lambda ids, n: run_resolved(eager, target, drafts, ids, max_new_tokens=n, seed=0),
        lambda ids, n: run_resolved(replace(eager, budget=1), target, drafts, ids, max_new_tokens=n, seed=0),
        target, prompts, depth=plan_depth(recipe, bool(drafts)), chain=chain))


def _pilot_choice(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel], models: str,
                  tokenizer: Any, max_new_tokens: int, cache_file: Path | None,
                  prompt_tokens: float | None = None) -> Resolved:
    """A recipe the tuner cannot size, measured by a pilot (``treespec.calibrate.pilot``): the depth
    predicted fastest on this machine for ``max_new_tokens`` after prompts of ``prompt_tokens`` tokens on average
    (the drafters' prefill scaled from the pilot prompts'; None: as on the pilot prompts), or plain decoding
    (budget 1) when no depth is predicted to pay."""
    from . import pilot

    base = replace(recipe, budget=default_budget(recipe))
    drafters = build_drafters(base, drafts)
    if not drafters:
        return Resolved(base, f"{models}; {recipe.tree} tree, budget {base.budget} (no drafter to measure)")
    depth = plan_depth(base, bool(drafts))
    measured = _measured(base, target, drafts, tokenizer, cache_file, chain=_single_chain(base, drafters))
    pilot_prompts = _pilot_prompts(tokenizer)
    scale = 1.0 if prompt_tokens is None else prompt_tokens / (sum(map(len, pilot_prompts)) / len(pilot_prompts))
    # a depth cap d is only a candidate when the recipe's drafters then really draft d deep, and the run's plan does
    # not cap it under d (``max_new_tokens - 1``: the pilot's tau of a deeper tree is not this run's)
    chosen, table = pilot.choose(measured, max_new_tokens, allowed=lambda d: d < max_new_tokens and (
        d == depth or plan_depth(replace(base, depth=d), bool(drafts)) == d), prompt_scale=scale)
    why = f"{models}; {pilot.why(measured, chosen, table, max_new_tokens, scale)}"
    seconds = measured.plain_per_token / chosen.speedup
    if chosen.depth == 0:
        return Resolved(replace(recipe, budget=1), why, pilot_seconds_per_token=seconds)
    return Resolved(replace(base, depth=chosen.depth if chosen.depth < depth else recipe.depth), why,
                    pilot_seconds_per_token=seconds)


def resolve(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel], *,
            cache_file: Path | None = None, tuner: Callable[..., Tuned] = tune, tokenizer: Any = None,
            max_new_tokens: int = 128, pilot_cache: Path | None = None, walk: Any = None,
            batch_size: int = 1, compiled: bool = False, prompt_tokens: float | None = None) -> Resolved:
    """``recipe`` with a budget: as given; tuned on this machine (:func:`tunable`; the profile is
    cached in ``cache_file``, default ``<treespec cache>/profiles.json``; given the target's
    ``tokenizer``, the profile is then corrected by a pilot of the tuned tree's real steps and the
    tree chosen again); otherwise, given the ``tokenizer``, the depth a short pilot predicts fastest
    for ``max_new_tokens`` new tokens, or plain decoding when speculation is not predicted to pay
    (``treespec.calibrate.pilot``; pilots cached in ``pilot_cache``, default
    ``<treespec cache>/pilots.json``); without a tokenizer, ``recipes.default_budget`` (:data:`DEFAULT_BUDGET`, or a
    static tree's own size). ``walk``: the calibration
    walk the acceptance rows came from (``vectors.calibration_walk``): a tuned run's printed prediction then
    replays the chosen tree over it with the run's confidence stop (``Tuned.prediction``). ``batch_size``: the
    prompts each step decodes at once; a tuned tree is sized for that many rows (``Tuned.for_batch``: the costs
    and the pilot's correction are measured on one row, then costed at ``batch_size`` times the tokens); a pilot
    choice measures one prompt at a time whatever the batch. ``compiled``: the run compiles its steps (asked); a
    profile of compiled forwards (on CUDA) is then not corrected by the pilot's eager steps, which run another
    route (launch-bound there: an eager forward 21-44 ms whatever its tokens on an H100,
    ``experiments/results/gpu-h100/NOTES.md``); the why-line says the costs are uncalibrated. ``prompt_tokens``:
    the run's prompts' mean length, whose prefill by the draft a tuned tree must earn back (``Tuned.run_speedup``:
    a short run after a long prompt may then run plain decoding); None: not charged."""
    drafts = check_draft_models(drafts)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1)
    # a model the engine refuses is refused before the tuner times it (its forwards failed in other words)
    check_model(target)
    for d in drafts:
        check_model(draft_model(d), role="draft")
    models = _describe_models(target, drafts)
    if recipe.budget is not None:
        return Resolved(recipe, f"{models}; {recipe.tree} tree, budget {recipe.budget} (as given)")
    from ..models import cache_root

    if not tunable(recipe, drafts):
        if tokenizer is not None:
            return _pilot_choice(recipe, target, drafts, models, tokenizer, max_new_tokens,
                                 pilot_cache if pilot_cache is not None else cache_root() / "pilots.json",
                                 prompt_tokens)
        budget = default_budget(recipe)
        return Resolved(replace(recipe, budget=budget),
                        f"{models}; {recipe.tree} tree, budget {budget} (the default: tuning needs a "
                        f"{', '.join(TUNED_TREES[:-1])} or {TUNED_TREES[-1]} tree with acceptance rows, one draft "
                        "model of the target's tokenizer and no n-gram; given the target's tokenizer a pilot "
                        "measures whether it pays)")
    if cache_file is None:
        cache_file = cache_root() / "profiles.json"
    acceptance = [list(r) if isinstance(r, tuple) else r for r in recipe.acceptance]
    # the depth the run's plan caps the tree at (``plan``: ``depth``, and ``max_new_tokens - 1``): the tree tuned and
    # predicted is the tree drafted
    max_depth = min(recipe.depth or 8, max(1, max_new_tokens - 1))
    tuned = tuner(target, drafts[0], acceptance, temperature=recipe.temperature, max_depth=max_depth,
                  cache_file=cache_file, builder=builder_of(recipe))
    chosen = replace(recipe, **tuned.settings(), target_dtype=precision_of(target),
                     draft_dtype=precision_of(drafts[0]))
    other_route = compiled and bool(tuned.profile.meta.get("compiled"))  # the pilot's eager steps calibrate no
    # compiled forward
    if tokenizer is not None and chosen.budget > 1 and not other_route:  # correct the isolated costs by real steps
        measured = _measured(replace(chosen, min_confidence=None), target, drafts, tokenizer,
                             pilot_cache if pilot_cache is not None else cache_root() / "pilots.json",
                             tag="calibration-v2")
        tuned = calibrate(tuned, measured, acceptance, max_depth=max_depth)
    # a tree predicted (over the run's horizon) to gain less than the margin runs as plain decoding
    tuned = tuned.for_batch(batch_size, acceptance, max_depth=max_depth).with_walk(walk, max_new_tokens,
                                                                                           prompt_tokens)
    tuned = tuned.plain_unless()
    chosen = replace(recipe, **tuned.settings(), target_dtype=precision_of(target),
                     draft_dtype=precision_of(drafts[0]))
    return Resolved(chosen, tuned.why, tuned)


def resolve_compile(resolved: Resolved, target: torch.nn.Module, drafts: Sequence[DraftModel], tokenizer: Any, *,
                    prompts: int, max_new_tokens: int, cache_file: Path | None = None,
                    measure_from_tokens: int | None = None, backend: bool | str = True,
                    asked: bool | str = False) -> Resolved:
    """``resolved`` with ``compile`` chosen for a run of ``prompts`` prompts of ``max_new_tokens`` new
    tokens: the compiled step when it is measured to pay back its compile on this machine
    (``treespec.calibrate.compile_choice``; measured on the built-in pilot prompts when the run has at
    least ``measure_from_tokens`` new tokens, default ``compile_choice.MEASURE_FROM_TOKENS``, and cached
    in ``cache_file``, default ``<treespec cache>/compile.json``). ``backend``: the compiled recipe's
    ``compile`` (True: the device's default backend). ``asked``: the user asked for compiled steps, so
    nothing is measured and the run compiles (a string: why the caller asks, said in the why-line instead of "as
    asked"). Plain decoding (budget 1) stays eager unless asked.

    When the run compiles and the measurement holds the tuned tree's compiled steps, the tuning's
    prediction is re-costed by them (:meth:`Tuned.on_compiled_steps`): the seconds per step it
    prints are the compiled step's, not the eager step's it was chosen with. Off a CPU a compiled tuned run drops
    its confidence stop, so that the tree runs captured (:func:`compiled_recipe`), and says so."""
    from . import compile_choice
    from ..models import cache_root

    recipe = replace(resolved.recipe, compile=False)
    compiled, dropped = compiled_recipe(recipe, backend, resolved.tuned, next(target.parameters()).device)
    reason = asked if isinstance(asked, str) else "as asked"
    if recipe.budget == 1:
        return (Resolved(compiled, f"{resolved.why}; compiled steps ({reason})", resolved.tuned) if asked else
                Resolved(recipe, f"{resolved.why}; eager steps (plain decoding)", resolved.tuned))
    prompt_ids = _pilot_prompts(tokenizer)
    # v5: the CPU's compiled route freezes its weights (commit f89c7a7); v4's timings ran it unfrozen
    key = _measurement_key(f"compile-v5|backend={backend}" + ("|captured-without-stop" if dropped else ""), recipe,
                           target, drafts, prompt_ids)
    threshold = compile_choice.MEASURE_FROM_TOKENS if measure_from_tokens is None else measure_from_tokens
    measure_now = None
    if prompts * max_new_tokens >= threshold and not asked:
        measure_now = lambda: compile_choice.measure(  # noqa: E731
            lambda ids, n: run_resolved(recipe, target, drafts, ids, max_new_tokens=n, seed=0),
            lambda ids, n: run_resolved(compiled, target, drafts, ids, max_new_tokens=n, seed=0), prompt_ids)
    timing = compile_choice.cached(key, cache_file if cache_file is not None else cache_root() / "compile.json",
                                   measure_now)
    chosen, why = compile_choice.decide(timing, prompts, max_new_tokens)
    if asked:
        chosen = True
        why = f"compiled steps ({reason}" + ("" if timing is None else
                                           f"; {compile_choice.figures(timing, prompts, max_new_tokens)}") + ")"
    tuned = resolved.tuned
    if not chosen or tuned is None:
        return Resolved(compiled if chosen else recipe, f"{resolved.why}; {why}", tuned)
    if dropped:  # the prediction replays the tree as it now runs, every level drafted
        tuned, why = replace(tuned, min_confidence=None), f"{why}; {dropped}"
    if timing is not None and timing.step_compiled > 0:
        tuned = tuned.on_compiled_steps(timing.step_compiled)
    return Resolved(compiled, f"{tuned.why}; {why}", tuned)


def compile_batch(resolved: Resolved, target: torch.nn.Module, backend: bool | str) -> Resolved:
    """``resolved`` compiled with ``backend`` for a batch of prompts, which compiles only when asked (nothing is
    measured: its captured step, ``treespec.core.captured.BatchCapturedStep``); off a CPU a tuned recipe drops its
    confidence stop, as in :func:`resolve_compile`."""
    compiled, dropped = compiled_recipe(resolved.recipe, backend, resolved.tuned, next(target.parameters()).device)
    if not dropped:
        return Resolved(compiled, resolved.why, resolved.tuned)
    tuned = replace(resolved.tuned, min_confidence=None)
    return Resolved(compiled, f"{tuned.why}; {dropped}", tuned)


def compiled_recipe(recipe: Recipe, backend: bool | str, tuned: Tuned | None,
                    device: torch.device) -> tuple[Recipe, str]:
    """``recipe`` compiled with ``backend``, and why it changed beyond that ("" when it did not). A tuned recipe's
    confidence stop is dropped off a CPU: the captured step reads the draft's confidence only where reading a
    number costs no device sync, so elsewhere a step with the stop drafts on the host, level by level uncompiled
    (an eager level 26.7 ms on an H100, ``experiments/results/gpu-h100/NOTES.md``; a captured one 1.53 ms on an
    H200, ``experiments/results/gpu-h200-qkv/NOTES.md``), while the tuner's profile there costs the captured
    step's compiled forwards; without the stop the tuned tree runs captured, every level drafted. A stop the user
    set (no ``tuned``) is kept, and the engine says where the step drafts."""
    compiled = replace(recipe, compile=backend)
    if device.type == "cpu" or tuned is None or recipe.min_confidence is None:
        return compiled, ""
    return (replace(compiled, min_confidence=None),
            f"no confidence stop on {device.type}: the captured step drafts every level (a stop would read the "
            f"draft's confidence from the device after each level, and drafts on the host)")


def resolve_run(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel], tokenizer: Any, *,
                prompts: Sequence[Sequence[int]], max_new_tokens: int = MAX_NEW_TOKENS,
                acceptance_file: str | Path | None = None, chat: bool = False, per_depth: bool = True,
                batch_size: int = 1, compile: bool | str | None = None, reason: str | None = None) -> Resolved:
    """What ``treespec generate`` runs on ``prompts`` (the run's prompts, as token ids: their count and mean length
    enter the choice): the one home of that choice, which the CLI, the demo and the benchmarks share, so that a
    benchmark measures and predicts the configuration a user gets.

    A recipe with acceptance rows (a tuned tree; the rows given are replaced) is sized from the acceptance in
    ``acceptance_file``, else the one shipped for the first draft's precision (chat's with ``chat``; per-depth rows
    unless ``per_depth`` is False), with its calibration walk, so the tau it predicts is the walk replayed through
    the chosen tree with its confidence stop (``vectors.acceptance_for_draft``; the rows' own expectation drafts
    every level and overstates it, the more with another precision's rows: 7.12 against 5.20 measured in
    ``experiments/results/cpu-fastest-zen5``, an int4 draft sized by the int8 draft's rows). Then :func:`resolve`
    for batches of ``batch_size`` (at most the number of prompts), then the compile choice: ``compile`` None
    measures whether compiling pays (:func:`resolve_compile`; a batch stays eager), False keeps eager steps, True
    or a backend name compiles as asked (a batch: :func:`compile_batch`); ``reason``: why it is asked, said in the
    why-line. The recipe names the precisions the models run in."""
    from .vectors import acceptance_for_draft

    if not prompts:
        raise ValueError("resolve_run needs the run's prompts (a list of token id lists) to size the tree for them: "
                         "got none")
    count, prompt_tokens = len(prompts), sum(map(len, prompts)) / len(prompts)
    walk = None
    if recipe.acceptance is not None:
        rows, walk = acceptance_for_draft(acceptance_file, recipe.temperature, drafts[0], per_depth=per_depth,
                                          chat=chat)
        recipe = replace(recipe, acceptance=rows)
    resolved = resolve(recipe, target, drafts, tokenizer=tokenizer, max_new_tokens=max_new_tokens, walk=walk,
                       batch_size=min(batch_size, count), compiled=bool(compile), prompt_tokens=prompt_tokens)
    if compile is not False and batch_size == 1:
        resolved = resolve_compile(resolved, target, drafts, tokenizer, prompts=count,
                                   max_new_tokens=max_new_tokens, backend=compile or True,
                                   asked=(reason or True) if compile is not None else False)
    elif compile:
        resolved = compile_batch(resolved, target, compile)
    return replace(resolved, recipe=replace(resolved.recipe, target_dtype=precision_of(target),
                                            draft_dtype=precision_of(draft_model(drafts[0])) if drafts else None))


def run(recipe: Recipe, target: torch.nn.Module, drafts: Sequence[DraftModel],
        input_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int]],
        **kwargs: Any) -> GenerateOutput | BatchOutput:
    """``treespec.run``: ``treespec.recipes.run`` (same arguments; a list of prompts runs as a batch), after
    :func:`resolve` when the recipe leaves its budget to tuning, for the batch's size (resolve it once yourself to
    print its ``why`` or to run many prompts), for the run's new tokens after its prompts' length."""
    check_not_empty(input_ids)
    if recipe.budget is None:  # the prompts checked before a tuning measures anything
        max_new_tokens = kwargs.get("max_new_tokens", MAX_NEW_TOKENS)
        prompts = checked_prompts(target, input_ids, max_new_tokens,
                                  [(draft_model(d), draft_model(d) is d) for d in check_draft_models(drafts)])
        recipe = resolve(recipe, target, drafts, batch_size=len(prompts), max_new_tokens=max_new_tokens,
                         prompt_tokens=sum(map(len, prompts)) / len(prompts)).recipe
    return run_resolved(recipe, target, drafts, input_ids, **kwargs)
