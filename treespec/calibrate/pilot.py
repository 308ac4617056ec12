"""Whether speculation pays for a recipe the tuner cannot size, from a short measured pilot.

``treespec.calibrate.tuning`` sizes a Sequoia tree (or a chain, or a k-ary tree) for one draft model of the
target's tokenizer from an acceptance vector and a cost profile. Every other default recipe (a draft with another
tokenizer, the n-gram drafter alone or beside a draft, several drafts, independent chains, a dynamic or path-list
tree, a chain or k-ary tree without acceptance rows) would
otherwise run at a fixed budget, and a weak draft drafting deep chains loses to plain decoding.
Here such a recipe is measured instead, once per machine (cached):

1. **Pilot.** After an untimed warm-up, the recipe at its default budget generates ``tokens`` new
   tokens from each built-in pilot prompt (:data:`PILOT_PROMPTS`: code and prose, in the target's
   tokens), and the target alone (budget 1, the same engine) generates the same prompts. Both are
   timed per part (prefill, drafting, verifying, engine) by the engine's own ``Stats``.
2. **Prediction.** When one drafter proposes one chain per step (a draft of another tokenizer, the
   n-gram drafter alone, a ``chain`` tree), capping the depth at ``d <= D`` keeps the first ``d``
   proposals of every step, so a step commits ``1 + min(A, d)`` tokens, ``A`` the accepted length
   the pilot measured at depth ``D``::

       tau(d)  = 1 + sum_{k=1..d} P(A >= k)                        (over uncut pilot steps)
       time(d) = draft(D) (d + 1) / (D + 1) + verify1 t(d + 1) / t(1) + engine

   ``draft(D)``: the pilot's drafting seconds per step (a catch-up forward and ``D`` levels, hence
   ``d + 1`` of ``D + 1``); ``verify1``: the target alone's verifying seconds per token; ``t(n)``:
   the target's latency curve for ``n`` tree tokens (``treespec.models.timing.measure_latency``);
   ``engine``: the pilot's engine seconds per step. Other recipes are predicted at their own depth
   only (the pilot's tau and seconds per step). Prefill is charged to both sides the same way: ``N``
   new tokens take ``prefill + N time(d) / tau(d)`` against ``prefill_plain + (N - 1) plain``, where
   ``plain`` is the target alone's seconds per token (its prefill gives the first token, as HF's does);
   ``prefill - prefill_plain`` is the drafters' pass over the prompt, scaled to the run's prompts' length
   (``treespec.calibrate.step_cost.run_speedup``).
3. **Choice.** The depth with the highest predicted speedup when it reaches :data:`MARGIN`,
   otherwise plain decoding (budget 1): a default must not lose to the target alone.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..common.files import cached_entry
from ..core.checks import context_of, sliding_window
from ..core.stats import GenerateOutput, Stats
from ..models.timing import measure_latency
from .step_cost import run_speedup

#: the pilot's prompts: short code and prose openings, written for treespec (not from a benchmark set,
#: so they stay disjoint from every evaluation prompt set)
PILOT_PROMPTS = (
    "def moving_average(values, window):\n    \"\"\"Return the averages of every run of `window` consecutive "
    "values.\"\"\"\n",
    "import json\n\n\ndef load_settings(path):\n    \"\"\"Read a JSON settings file and fill in defaults for "
    "missing keys.\"\"\"\n",
    "The town council met on Tuesday evening to discuss the new bridge over the river, which has been "
    "closed for repairs since the spring floods.",
    "Scientists studying a colony of seabirds on a remote island have found that the birds change the "
    "timing of their migration",
)
PILOT_TOKENS = 32
#: the latency curve is timed at every tree size up to this one (then sparser): the shallow depths a chain is cut to
#: are the likely choices, and a kernel's cost can jump between neighbouring sizes (the int4 target on the Zen 4 host:
#: 107 ms for 4 tokens, 200 ms for 5), which a line between sparse points would smear over them
DENSE_SIZES = 8
#: a speculative configuration is chosen only when it is predicted this much faster than plain decoding
#: (the prediction's own error is a few percent; below this margin plain decoding is the safe default)
MARGIN = 1.05

Generate = Callable[[list[int], int], GenerateOutput]


@dataclass
class Pilot:
    """What a pilot measured (seconds; ``survival[k - 1] = P(A >= k)`` over uncut steps)."""

    depth: int  # the deepest proposal of the pilot's trees (D)
    chain: bool  # one drafter proposing one chain: shallower depths are predicted too
    steps: int
    uncut_steps: int
    tau: float
    survival: list[float]
    draft_per_step: float
    verify_per_step: float
    engine_per_step: float
    prefill_per_prompt: float
    plain_per_token: float
    plain_verify_per_token: float
    plain_prefill_per_prompt: float
    latency: dict[int, float]  # t(n) of the target, n = 1 .. D + 1 (measured points)
    mean_tree_size: float = 0.0  # tokens verified per step, root included

    def to_dict(self) -> dict:
        return {**asdict(self), "latency": {str(k): v for k, v in self.latency.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "Pilot":
        """The inverse of :meth:`to_dict`; a damaged record (a hand edit: negative or NaN seconds, counts that are
        not whole numbers, survival outside [0, 1]) raises ``ValueError``, so a cache measures it again."""
        p = cls(**{**d, "latency": {int(k): float(v) for k, v in d["latency"].items()}})
        seconds = [p.draft_per_step, p.verify_per_step, p.engine_per_step, p.prefill_per_prompt, p.plain_per_token,
                   p.plain_verify_per_token, p.plain_prefill_per_prompt, p.tau, p.mean_tree_size, *p.latency.values()]
        counts = [p.depth, p.steps, p.uncut_steps]
        if not (all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                    for x in seconds) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts)
                and all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in p.survival) and p.latency):
            raise ValueError(f"a damaged pilot record: {d!r:.200}")
        return p


@dataclass(frozen=True)
class Prediction:
    """One candidate: ``depth`` 0 is plain decoding."""

    depth: int
    tau: float
    step_seconds: float
    speedup: float  # over the target alone for ``tokens`` new tokens, prefill charged to both


def _t(latency: dict[int, float], n: int) -> float:
    xs = sorted(latency)
    return float(np.interp(n, xs, [latency[x] for x in xs]))


def predict(p: Pilot, tokens: int, prompt_scale: float = 1.0) -> list[Prediction]:
    """Predicted tau, seconds per step and speedup for plain decoding (depth 0), every depth
    ``1..D`` of a chain recipe, or the recipe's own depth otherwise (module docstring, step 2).
    ``prompt_scale``: the run's prompts' mean length over the pilot prompts'; the drafters' part of the prefill
    (the recipe's prefill less the target alone's) is scaled by it, linearly (a model draft's prefill grows faster
    on long prompts: attention's square term), the target's, the same on both sides, kept as measured."""
    drafts = max(p.prefill_per_prompt - p.plain_prefill_per_prompt, 0.0) * prompt_scale
    out = [Prediction(0, 1.0, p.plain_per_token, 1.0)]
    if p.steps == 0:
        return out
    depths = range(1, p.depth + 1) if p.chain else [p.depth]
    for d in depths:
        if p.chain:
            tau = 1.0 + float(sum(p.survival[:d]))
            step = (p.draft_per_step * (d + 1) / (p.depth + 1)
                    + p.plain_verify_per_token * _t(p.latency, d + 1) / _t(p.latency, 1) + p.engine_per_step)
        else:
            tau = p.tau
            step = p.draft_per_step + p.verify_per_step + p.engine_per_step
        speedup = run_speedup(tokens, step, tau, p.plain_per_token, p.plain_prefill_per_prompt + drafts, drafts)
        out.append(Prediction(d, tau, step, speedup))
    return out


def choose(p: Pilot, tokens: int, margin: float = MARGIN, allowed: Callable[[int], bool] = lambda depth: True,
           prompt_scale: float = 1.0) -> tuple[Prediction, list[Prediction]]:
    """The best predicted candidate (of the depths ``allowed``) if it reaches ``margin`` over plain
    decoding, else plain decoding (depth 0); and the table of candidates (``prompt_scale``: :func:`predict`)."""
    table = [c for c in predict(p, tokens, prompt_scale) if c.depth == 0 or allowed(c.depth)]
    best = max(table[1:], key=lambda c: c.speedup, default=table[0])
    return (best if best.speedup >= margin else table[0]), table


def _survival(stats: Stats, depth: int) -> tuple[list[float], int]:
    """``P(A >= k)``, k = 1..depth, over the steps the end of generation did not cut."""
    accepted = [t - 1 for t, cut in zip(stats.step_tokens, stats.step_cut) if not cut]
    if not accepted:
        return [0.0] * depth, 0
    a = np.asarray(accepted)
    return [float(np.mean(a >= k)) for k in range(1, depth + 1)], len(accepted)


def run_pilot(generate_spec: Generate, generate_plain: Generate, target: torch.nn.Module,
              prompts: Sequence[list[int]], *, depth: int, chain: bool, tokens: int = PILOT_TOKENS,
              progress: bool = True) -> Pilot:
    """Measure a recipe (``generate_spec``) and the target alone (``generate_plain``) on ``prompts``.

    ``depth``: the recipe's deepest proposal; ``chain``: whether it proposes one chain per step."""
    if not prompts:
        raise ValueError("the pilot needs at least one prompt")
    # a model of a short context, or a sliding window (runs are held inside it), gets the prompts' ends: what fits
    # beside the pilot's tokens
    limits = {f"context ({n} positions)": n for n in (context_of(target),) if n is not None}
    limits.update({f"sliding window ({n} positions)": n for n in (sliding_window(target),) if n is not None})
    if limits:
        what, limit = min(limits.items(), key=lambda kv: kv[1])
        if limit <= tokens:
            raise ValueError(f"the target's {what} leaves no room for the pilot's {tokens} tokens: give the tree a "
                             "size (--budget B) instead of a pilot's choice")
        prompts = [list(ids)[-(limit - tokens):] for ids in prompts]
    generate_spec(list(prompts[0]), 4), generate_plain(list(prompts[0]), 2)  # warm-up, untimed
    spec_parts, plain_parts = [], []
    for ids in tqdm(prompts, desc="pilot: does speculation pay here", disable=not progress, leave=False):
        spec_parts.append(generate_spec(list(ids), tokens).stats)
        plain_parts.append(generate_plain(list(ids), max(4, tokens // 4)).stats)
    spec, plain = Stats.combined(spec_parts), Stats.combined(plain_parts)
    survival, uncut = _survival(spec, depth)
    sizes = {*range(1, min(depth + 1, DENSE_SIZES) + 1), *range(2, depth + 2, max(1, depth // 4)), depth + 1}
    latency = measure_latency(target, sorted(sizes), repeats=2)
    steps, n = max(spec.steps, 1), len(prompts)
    forwards = max(plain.steps - n, 1)  # plain decoding's first token per prompt comes with its prefill
    return Pilot(depth=depth, chain=chain, steps=spec.steps, uncut_steps=uncut, tau=spec.tau_uncut or spec.tau,
                 survival=survival, draft_per_step=spec.drafting_seconds / steps,
                 verify_per_step=spec.verifying_seconds / steps, engine_per_step=spec.overhead_seconds / steps,
                 prefill_per_prompt=spec.prefill_seconds / n,
                 plain_per_token=(plain.verifying_seconds + plain.overhead_seconds) / forwards,
                 plain_verify_per_token=plain.verifying_seconds / forwards,
                 plain_prefill_per_prompt=plain.prefill_seconds / n, latency=latency,
                 mean_tree_size=spec.mean_tree_size)


def prompts_digest(prompts: Sequence[Sequence[int]]) -> str:
    return hashlib.sha256(json.dumps([list(map(int, p)) for p in prompts]).encode()).hexdigest()[:16]


def cached_pilot(key: str, cache_file: Path | None, measure: Callable[[], Pilot], remeasure: bool = False) -> Pilot:
    """``measure()``, read from / written to ``cache_file`` under ``key`` (None: no cache)."""
    return cached_entry(cache_file, key, measure, Pilot.from_dict, Pilot.to_dict, remeasure)


def why(p: Pilot, chosen: Prediction, table: list[Prediction], tokens: int, prompt_scale: float = 1.0) -> str:
    """One line: what the pilot measured and what it chose."""
    shown = sorted(table[1:], key=lambda c: -c.speedup)[:3]
    alts = ", ".join(f"depth {c.depth}: tau {c.tau:.2f}, {c.speedup:.2f}x" for c in shown)
    prompts = "" if prompt_scale == 1.0 else (f" after prompts {prompt_scale:.1f}x the pilot's (the drafters' "
                                              f"prefill scaled with them)")
    head = (f"pilot ({p.steps} steps on {len(PILOT_PROMPTS)} built-in prompts): tau {p.tau:.2f} at depth {p.depth}, "
            f"{p.draft_per_step + p.verify_per_step + p.engine_per_step:.3f} s per step vs "
            f"{p.plain_per_token:.3f} s per token plain; predicted for {tokens} tokens{prompts}: {alts}")
    if chosen.depth == 0:
        return f"{head}; plain decoding (no configuration predicted {MARGIN:.2f}x or more)"
    return f"{head}; chose depth {chosen.depth}"
