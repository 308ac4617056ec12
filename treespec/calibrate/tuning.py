"""The measured-fastest configuration for a (target, draft) pair on this machine.

``tune`` profiles the loaded models in the precisions they were loaded in (``models.load(...,
dtype="auto")`` already kept the fastest precision per model), then ``profile.choose_tree`` picks
the Sequoia tree (budget, depth, width limit) with the most predicted tokens per second under the
acceptance vector, or, for a recipe of another static builder (a chain, a k-ary tree), that
builder's tree (budget, depth) by the same model. Profiles are cached per (models, precisions, device, CPU, threads) in
``<cache root>/profiles.json`` so a second run does not measure again; ``remeasure=True`` forces it.
The result's :meth:`Tuned.settings` are the recipe fields it chose (``treespec.calibrate.choices.resolve``
puts them into the run's recipe, so the CLI, the demo, the sweep and ``treespec.run`` run exactly
the tree that was chosen); ``why`` is a one-line account to print.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from tree_builders import TreeShape

from ..common.files import DAMAGED, read_json_dict, write_json
from ..common.machine import measurement_key, measured_name
from ..common.options import PROFILE_SIZES
from ..core.linear_layout import layout_tags
from ..models.precision import kernel_tags, precision_of
from ..models.timing import measure_prefill
from .acceptance import MeasuredAcceptance
from .costs import Profile, profile
from .step_cost import Builder, Choice, checked_costs, run_speedup
from .pilot import MARGIN, Pilot
from .walk_replay import per_continuation, truncated

PROFILE_WIDTHS = (1, 2, 4, 8, 16)
#: the model drafter's confidence stop in tuned recipes: deeper levels are not drafted once the best
#: path's cumulative draft probability is below this (it saves draft forwards that would rarely pay).
#: Greedy paths follow the draft's top tokens; sampled paths multiply the probabilities of drawn
#: tokens, which are lower, so sampling stops at a lower threshold. ``experiments/results/tuned-vs-grid``
#: (real pair, T=1, 10 prompts x 96 tokens): without a stop the tuned budget-8 chain ran Lee news at
#: 0.75x of the CPU sweep's fastest point, with 0.1 at 0.97x (HumanEval 0.99x -> 1.05x). Only 0.1 is
#: measured there; the sampled threshold is not tuned further.
MIN_CONFIDENCE = 0.3
MIN_CONFIDENCE_SAMPLED = 0.1


@dataclass(frozen=True)
class Prediction:
    """What a tuned run is predicted to do: tokens per step, seconds per step and plain decoding's seconds per
    token, and the model behind them (``"replay"``: the tree replayed over the calibration walk with the run's
    confidence stop, the model the sweep's report validates; ``"rows"``: the tree's expectation over the
    per-depth rows (the Sequoia DP's), every level drafted). ``per_prompt``: the replay's (tokens, steps) on each
    calibration prompt, the spread behind :meth:`tau_range`."""

    tau: float
    step_seconds: float
    plain_seconds: float
    model: str
    per_prompt: tuple[tuple[int, int], ...] = ()
    #: the prediction of plain decoding itself (a tree declined, or none chosen): its run is the target alone's
    plain: bool = False

    @property
    def speedup(self) -> float:
        """Predicted speedup over plain decoding (the target alone, eager)."""
        return self.tau * self.plain_seconds / self.step_seconds

    def run_speedup(self, tokens: float, prefill: float, draft_prefill: float = 0.0) -> float:
        """The predicted speedup of a run of ``tokens`` new tokens whose prompt takes ``prefill`` seconds (the
        run's own prefill: :attr:`speedup` is the decoding's alone, which a short run's or a long prompt's prefill
        dilutes), of which ``draft_prefill`` is the draft's, which plain decoding does not run: the target's prefill
        is charged to both sides, the draft's to the tree's. Plain decoding's prefill gives its first token, so it
        decodes ``tokens - 1`` more (``plain_seconds`` is one decoding step's seconds:
        ``timing.measure_plain_decode``); 1 for plain decoding's own prediction (:attr:`plain`)."""
        if self.plain:
            return 1.0
        return run_speedup(tokens, self.step_seconds, self.tau, self.plain_seconds, prefill, draft_prefill)

    def tau_range(self, prompts: int, level: float = 0.9) -> tuple[float, float] | None:
        """The central ``level`` range of the tokens per step of a run over ``prompts`` prompts like the
        calibration's: prompts accept differently (code that goes on as it began accepts more), so a run over a
        few lands away from :attr:`tau` by chance. The calibration prompts' replayed (tokens, steps), ``prompts``
        of them drawn with replacement 4,000 times (a fixed seed: the same range every time). None without a
        replay."""
        if not self.per_prompt:
            return None
        if prompts < 1 or not 0 < level < 1:
            raise ValueError(f"tau_range needs prompts >= 1 and 0 < level < 1, got {prompts} and {level}")
        tokens, steps = np.array(self.per_prompt, dtype=np.float64).T
        draws = np.random.default_rng(0).integers(0, len(tokens), (4000, prompts))
        taus = tokens[draws].sum(1) / np.maximum(steps[draws].sum(1), 1)
        low, high = np.quantile(taus, [(1 - level) / 2, (1 + level) / 2])
        return float(low), float(high)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (``treespec generate --json``: one prompt's record, so the tau range of one prompt)."""
        one = self.tau_range(1)
        return {"tau": self.tau, "step_seconds": self.step_seconds, "plain_seconds": self.plain_seconds,
                "speedup": self.speedup, "model": self.model, **({"tau_range_90_one_prompt": one} if one else {})}


@dataclass(frozen=True)
class Tuned:
    """What ``tune`` chose: the choice table, the profile it used, and the confidence stop it adds."""

    choice: Choice
    profile: Profile
    min_confidence: float | None = None
    #: the chosen tree's seconds per step measured compiled (:meth:`on_compiled_steps`); None: eager steps
    compiled_step_seconds: float | None = None
    #: the calibration walk the run is predicted over (:meth:`with_walk`); None: the rows' expectation
    walk: MeasuredAcceptance | None = None
    #: the run's new tokens, predicted over the walk's first ``horizon`` positions (None: the whole walk)
    horizon: int | None = None
    #: the tuning whose tree was declined for plain decoding (:meth:`plain_unless`), its prediction kept
    declined: "Tuned | None" = None
    #: the run's prompts' mean length in tokens (:meth:`with_walk`), whose prefill by the draft the run's
    #: prediction charges (:attr:`draft_prefill`); None: not known, nothing charged
    prompt_tokens: float | None = None
    #: the builder whose trees were sized (a chain, a k-ary tree: ``step_cost.Builder``); None:
    #: Sequoia's DP. Every choice made again (:func:`calibrate`, :meth:`for_batch`) sizes the same builder's trees
    builder: Builder | None = None

    @property
    def draft_prefill(self) -> float:
        """Predicted seconds of the draft's prefill of the run's prompt (one per row of a batch), which plain
        decoding does not spend (``Profile.draft_prefill_seconds``); 0 without the prompt's length or the curve."""
        return 0.0 if self.prompt_tokens is None else self.draft_prefill_of(self.prompt_tokens)

    def draft_prefill_of(self, prompt_tokens: float) -> float:
        """Predicted seconds of the draft's prefill of a ``prompt_tokens``-token prompt (one per row of a batch); 0
        where the profile has no prefill curve (a profile made before it, read without ``cached_profile``)."""
        if not self.profile.draft_prefill_latency:
            return 0.0
        return int(self.profile.meta.get("batch_rows", 1)) * self.profile.draft_prefill_seconds(prompt_tokens)

    @property
    def run_speedup(self) -> float:
        """The run's predicted speedup over plain decoding, what :meth:`plain_unless` decides by: over the run's
        ``horizon`` new tokens, the draft's prefill of its prompt charged to the tree (:attr:`draft_prefill`; the
        target's prefill is the same on both sides and left out: ``Prediction.run_speedup`` with the draft's
        prefill alone), plain decoding's first token from its prefill; without a horizon the decoding's own
        (``Prediction.speedup``)."""
        p = self.prediction
        return p.speedup if self.horizon is None else p.run_speedup(self.horizon, self.draft_prefill,
                                                                     self.draft_prefill)

    @cached_property
    def prediction(self) -> Prediction:
        """The run's predicted tau and seconds per step. Over the calibration walk (:meth:`with_walk`): the
        chosen tree replayed with the confidence stop the run uses (``treespec.calibrate.walk_replay``) over the
        run's horizon (every step of a run of that many tokens, the last ones included: the run's tokens per
        step over all its steps), each replayed step costed by the profile at the depth it drafted (or, on the
        compiled route, the compiled steps' measured seconds, which ran with the stop). Otherwise the choice's
        own figures (the DP's expectation over the rows, every level drafted: optimistic where a stop cuts
        levels)."""
        c, walk = self.choice, self.walk
        usable = walk is not None and walk.ranks and c.shape.depth > 0 and c.shape.max_width <= walk.width and (
            self.min_confidence is None or walk.confidence)
        steps = walk.replay(c.shape, self.min_confidence, self.horizon) if usable else []
        if c.depth == 0:  # plain decoding: the target alone, as a declined tree's plain decoding is predicted
            return Prediction(1.0, c.plain_seconds, c.plain_seconds, "rows", plain=True)
        if not steps:
            return Prediction(c.tau, c.step_seconds, c.plain_seconds, "rows")
        tau = sum(s.tokens for s in steps) / len(steps)
        if self.compiled_step_seconds is not None:
            seconds = self.compiled_step_seconds
        else:
            depths = [s.drafted_depth for s in steps]
            seconds = sum(depths.count(d) * self.profile.step_seconds(truncated(c.shape, d))
                          for d in set(depths)) / len(steps)
        per_prompt = tuple(zip(*per_continuation(steps, len(walk.ranks))))
        return Prediction(tau, seconds, c.plain_seconds, "replay", per_prompt)

    def plain_unless(self, margin: float = MARGIN) -> "Tuned":
        """This tuning, or plain decoding where its tree's predicted speedup for the run (:attr:`run_speedup`: over
        the calibration walk when there is one, the draft's prefill of the run's prompt charged) falls short of
        ``margin``. The prediction errs by a few percent, and by more on prompts unlike the calibration's, and a
        default must not lose to the target alone: the rule a pilot's choice follows too
        (``treespec.calibrate.pilot.choose``). A short run or a long prompt can decline a tree whose decoding
        alone would pay: the draft's prefill is not earned back. The declined tree stays in the why-line."""
        c = self.choice
        if c.depth == 0 or self.run_speedup >= margin:
            return self
        plain = replace(c, budget=1, depth=0, shape=TreeShape.from_paths([]), tau=1.0, speedup=1.0,
                        step_seconds=c.plain_seconds)
        return replace(self, choice=plain, declined=self)

    def with_walk(self, walk: MeasuredAcceptance | None, horizon: int | None = None,
                  prompt_tokens: float | None = None) -> "Tuned":
        """This tuning predicted over ``walk`` (the measurement its acceptance rows came from; :attr:`prediction`)
        for a run of ``horizon`` new tokens (None: over the whole walk, uncut steps) after prompts of
        ``prompt_tokens`` tokens on average (their prefill by the draft charged: :attr:`run_speedup`)."""
        if prompt_tokens is not None and prompt_tokens < 1:
            raise ValueError(f"a prompt has >= 1 tokens, got a mean of {prompt_tokens}")
        return replace(self, walk=walk, horizon=horizon, prompt_tokens=prompt_tokens)

    @property
    def calibration(self) -> dict[str, Any] | None:
        """The real-step correction of the profile (:func:`calibrate`), None before it."""
        return self.profile.meta.get("calibration")

    def settings(self) -> dict[str, Any]:
        """The recipe fields of the choice: ``budget``, ``depth``, ``max_width``, ``min_confidence``
        (budget 1 when speculation does not pay here). The same DP call as the choice's cell
        (budget, depth limit, width limit) gives the same shape."""
        c = self.choice
        return {"budget": c.budget if c.depth else 1, "depth": max(1, c.depth),
                "max_width": int(c.width) if self.builder is None and c.depth and c.width > 0 else None,
                "min_confidence": self.min_confidence}

    def on_compiled_steps(self, step_seconds: float) -> "Tuned":
        """This choice costed by its compiled steps: ``step_seconds`` measured per step of the chosen tree
        on the compiled route (``treespec.calibrate.compile_choice``). The tree is kept (it was chosen
        with the eager costs); its predicted seconds per step and speedup over plain (eager) decoding
        become the compiled ones, so the prediction printed beside a compiled run is that run's."""
        if step_seconds <= 0:
            raise ValueError(f"a compiled step takes > 0 seconds, got {step_seconds}")
        c = self.choice
        choice = replace(c, step_seconds=float(step_seconds), speedup=c.tau * c.plain_seconds / step_seconds)
        return replace(self, choice=choice, compiled_step_seconds=float(step_seconds))

    def for_batch(self, rows: int, acceptance: Sequence[float] | Any, max_depth: int = 8) -> "Tuned":
        """This tuning's tree chosen again for steps of ``rows`` prompts at once (``Profile.for_batch``: one
        target forward over ``rows`` trees, the engine's seconds per row), under the same ``acceptance`` rows (a
        row's acceptance does not depend on its batch mates). Itself for one row."""
        if int(rows) == 1:
            return self
        if self.compiled_step_seconds is not None:
            raise ValueError("a batch's tree is sized on eager costs (Profile.for_batch): size it before costing "
                             "compiled steps (resolve(batch_size=B), then the compile choice)")
        prof = self.profile.for_batch(rows)
        return replace(self, choice=prof.choose(acceptance, max_depth=max_depth, builder=self.builder), profile=prof)

    @property
    def why(self) -> str:
        if self.declined is not None:
            return (f"{self.declined.why}; so plain decoding runs (the target alone: {self.declined.run_speedup:.2f}x "
                    f"is under the {MARGIN:.2f}x a tuned tree must be predicted to reach, the prediction's error)")
        c, m, s, p = self.choice, self.profile.meta, self.settings(), self.prediction
        cal = self.calibration
        fixed = "" if cal is None else (
            f"; costs calibrated on {cal['steps']} real steps (drafting x{cal['draft_factor']:.2f}, target forwards "
            f"x{cal['verify_factor']:.2f} of the isolated ones)")
        if cal is None and m.get("compiled"):
            fixed = "; costs of compiled forwards timed alone (not calibrated on real steps)"
        step = ("s per step" if self.compiled_step_seconds is None else
                "s per compiled step (this tree's compiled steps on the pilot prompts)")
        rows_only = " (the acceptance rows' expectation, every level drafted: no calibration walk to replay it over)"
        how = ((rows_only if c.depth else "") if p.model == "rows" else
               f" (the tree replayed over the calibration walk{_walk_source(self.walk)}" +
               ("" if self.min_confidence is None else f" with the confidence stop at {self.min_confidence:g}") +
               ("" if self.horizon is None else f", a run of {self.horizon} tokens") +
               "; 90% of single prompts {:.2f}-{:.2f}".format(*p.tau_range(1)) + ")")
        rows = int(m.get("batch_rows", 1))
        batch = "" if rows == 1 else (f" for steps of {rows} prompts at once (one target forward over {rows} trees; "
                                      f"costs of {rows}x the tokens)")
        plain = (f"step of plain batched decoding ({rows} tokens)" if rows > 1 else "token of the target's own decoding"
                 + (" (HF generate, timed)" if self.profile.plain_decode_seconds else " (a one-token forward)"))
        alone = "the target alone" if rows == 1 else "plain batched decoding"
        tree = ("Sequoia tree" if self.builder is None else self.builder.describe()) + f" of budget {c.shape.size}"
        limit = f" (width limit {s['max_width'] or 'none'})" if self.builder is None else ""
        return (f"target {m.get('target_precision')}, draft {m.get('draft_precision')}; {tree}, depth "
                f"{c.shape.depth}{limit}{batch}: "
                f"predicted tau {p.tau:.2f}{how}, {p.step_seconds:.3f} {step} vs {p.plain_seconds:.3f} s per {plain}, "
                f"predicted {p.speedup:.2f}x over {alone} in the same precision{fixed}{self._run_note()}")

    def _run_note(self) -> str:
        """The why-line's account of the run's own prediction (:attr:`run_speedup`), where it charges a prefill."""
        if self.horizon is None or not self.draft_prefill:
            return ""
        rows = int(self.profile.meta.get("batch_rows", 1))
        prompts = f"{rows} prompts of {self.prompt_tokens:.0f} tokens" if rows > 1 else (
            f"its {self.prompt_tokens:.0f}-token prompt")
        return (f"; {self.run_speedup:.2f}x for this run's {self.horizon} tokens with the draft's prefill of "
                f"{prompts} ({self.draft_prefill:.2f} s) charged (the target's prefill, the same on both sides, "
                "left out)")


def _walk_source(walk: MeasuredAcceptance | None) -> str:
    """Which prompts a calibration walk ran, as the why-line names them (" on humaneval (40 prompts)"): a tree
    sized from code's acceptance is sized for code, and a run on other prompts should see so."""
    label = "" if walk is None else str(walk.meta.get("prompts_label") or "")
    name, count = label.split("[")[0].strip(), walk.meta.get("prompts") if walk is not None else None
    if not name:
        return ""
    chat = " in the chat template" if "[" in label and label.endswith(" in the chat template") else ""
    return f" on {name} ({count} prompts){chat}" if "[" in label and count else f" on {name}"


def _key(target: torch.nn.Module, draft: torch.nn.Module) -> str:
    # v2: sizes timed in alternating rounds, 5 of them (``measure_latency``); v3: HF's own plain decoding timed
    # (``measure_plain_decode``). Older profiles are measured again.
    # On CUDA the profile times compiled forwards (``costs.profile``): "compiled" in the key
    device = next(target.parameters()).device
    return measurement_key("profile-v3" + ("-compiled" if device.type == "cuda" else ""), measured_name(target),
                           precision_of(target), measured_name(draft), precision_of(draft), *layout_tags(target, draft),
                           *kernel_tags(target, draft), device=device)


def _decoded(entry: Any) -> Profile | None:
    """A cached profile entry, None where it is none or damaged (what ``Profile.from_dict`` or the costs' own
    checks reject: a hand edit, a file cut short; ``common.files.DAMAGED``)."""
    if entry is None:
        return None
    try:
        prof = Profile.from_dict(entry)
        checked_costs(prof.target_latency, prof.draft_cost, prof.step_overhead_seconds)
        # what a profile of a pair always holds, and what its costs must be (an entry missing them would size every
        # tree from a part of its costs: free drafting, plain decoding only, a NaN margin)
        if len(prof.target_latency) < 2 or not prof.draft_level_latency:
            raise ValueError("a pair's profile times several target sizes and the draft's levels")
        extra = [prof.plain_decode_seconds] if prof.plain_decode_seconds is not None else []
        if not all(math.isfinite(float(v)) and float(v) > 0 for v in extra) or not all(
                math.isfinite(float(v)) and float(v) >= 0 for v in (prof.draft_prefill_latency or {}).values()):
            raise ValueError("plain decoding's and the draft prefill's seconds are finite numbers > 0")
    except DAMAGED:
        return None
    return prof


def cached_profile(target: torch.nn.Module, draft: torch.nn.Module, cache_file: Path | None,
                   remeasure: bool = False, **kwargs: Any) -> Profile:
    """``profile(target, draft, ...)``, read from / written to ``cache_file`` (None: no cache). A cached profile
    from before the draft's prefill curve gets it measured and added (``Profile.draft_prefill_latency``). ``kwargs``
    (``profile``'s: other sizes, widths, repeats) are part of the key: the default profile is not replaced by one of
    other sizes."""
    key = _key(target, draft) + "".join(f"|{k}={kwargs[k]!r}" for k in sorted(kwargs))
    saved = {} if cache_file is None else read_json_dict(cache_file)  # a damaged cache is measured again
    prof = None if remeasure else _decoded(saved.get(key))  # so is a damaged entry
    if prof is not None:
        if prof.draft_prefill_latency is not None:
            return prof
        prof = replace(prof, draft_prefill_latency=measure_prefill(draft))
    else:
        kwargs.setdefault("sizes", PROFILE_SIZES)
        kwargs.setdefault("draft_widths", PROFILE_WIDTHS)
        prof = profile(target, draft, **kwargs)
    if cache_file is not None:
        write_json(cache_file, {**saved, key: prof.to_dict()})
    return prof


def calibrate(tuned: Tuned, measured: Pilot, acceptance: Sequence[float], max_depth: int = 8) -> Tuned:
    """``tuned`` with its profile corrected by real steps of its own tree (``measured``: a pilot of
    the tuned recipe without its confidence stop, so that every level is drafted as the DP assumes,
    ``treespec.calibrate.pilot.run_pilot``) and the tree chosen again under the
    corrected costs (``Profile.calibrated``). The isolated forwards the profile times miss what a
    real step adds (the draft's catch-up over the committed tokens, the real context length, the
    selection over the vocabulary, the engine), which made predictions optimistic."""
    if measured.steps == 0:
        return tuned
    shape = tuned.choice.shape
    prof = tuned.profile.calibrated(shape, measured.draft_per_step, measured.verify_per_step,
                                    measured.engine_per_step, measured.steps, size=measured.mean_tree_size or None)
    return Tuned(prof.choose(acceptance, max_depth=max_depth, builder=tuned.builder), prof, tuned.min_confidence,
                 builder=tuned.builder)


def tune(target: torch.nn.Module, draft: torch.nn.Module, acceptance: Sequence[float], *, temperature: float = 0.0,
         max_depth: int = 8, cache_file: Path | None = None, remeasure: bool = False,
         min_confidence: float | None | str = "auto", builder: Builder | None = None,
         **profile_kwargs: Any) -> Tuned:
    """Measure (or read) this machine's costs and choose the fastest predicted Sequoia tree, or with ``builder``
    the fastest predicted tree of that builder (a chain, a k-ary tree: its budget and depth).

    ``min_confidence``: the confidence stop the tuned recipe adds; ``"auto"``: :data:`MIN_CONFIDENCE`
    for greedy decoding, :data:`MIN_CONFIDENCE_SAMPLED` when sampling; None: no stop."""
    if min_confidence == "auto":
        min_confidence = MIN_CONFIDENCE if temperature == 0 else MIN_CONFIDENCE_SAMPLED
    prof = cached_profile(target, draft, cache_file, remeasure, **profile_kwargs)
    choice = prof.choose(acceptance, max_depth=max_depth, builder=builder)
    return Tuned(choice, prof, min_confidence, builder=builder)
