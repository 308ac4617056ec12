"""The figures a sweep report shows, computed from its records: intervals over prompts (tau, tok/s,
speedups paired with the baseline run on the same prompts), where a tau gap lies in depth, and
greedy agreement with the baselines."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from tree_builders import TreeShape

from ...calibrate.acceptance import MeasuredAcceptance
from ..intervals import Interval, ratio_of_sums
from .points import batch_size, tree_label
from .records import fastest, machine_of

#: what a baseline shares with the treespec points it is compared with (same prompts, same settings)
_SAME_RUN = ("target", "dataset", "eval", "max_new_tokens", "max_prompt_tokens", "temperature", "top_p", "seed",
             "device", "dtype", "batch_size")


def panel(params: dict[str, Any]) -> tuple:
    """The report panel a point belongs to: (target, dataset, temperature, top-p, batch size)."""
    return (params["target"], params["dataset"], params["temperature"], params["top_p"], batch_size(params))


def _units(r: dict[str, Any]) -> tuple[list[float], list[float]]:
    """A record's (tokens, seconds) per timed unit: per prompt, or per batch of prompts decoded at once (a batch
    point's prompts share their seconds: its batches are what a baseline on the same batches pairs with)."""
    if "per_batch_seconds" in r["timing"]:
        return r["result"]["tokens_per_batch"], r["timing"]["per_batch_seconds"]
    return r["result"]["tokens_per_prompt"], r["timing"]["per_prompt_seconds"]


# -- figures with their spread over prompts (treespec.bench.intervals) ---------------------------------------
def _pooled(records: list[dict[str, Any]], numerator: Callable[[dict[str, Any]], list[float]],
            denominator: Callable[[dict[str, Any]], list[float]]) -> Interval | None:
    """Ratio of sums over the prompts of ``records`` (seeds pooled: each prompt x seed is a unit), with
    its bootstrap interval; None when a record lacks the per-prompt figures (written before they were)."""
    try:
        num = [x for r in records for x in numerator(r)]
        den = [x for r in records for x in denominator(r)]
    except KeyError:
        return None
    if not num or len(num) != len(den) or sum(den) <= 0:
        return None
    return ratio_of_sums(num, den)


def tau_interval(records: list[dict[str, Any]], uncut: bool = False) -> Interval | None:
    """Tokens per step of treespec ``records`` over all steps, or (``uncut=True``) over the steps that
    the end of generation did not shorten (``treespec.core.stats.Stats.tau_uncut``)."""
    if uncut:
        return _pooled(records, lambda r: r["result"]["uncut_tokens_per_prompt"],
                       lambda r: r["result"]["uncut_steps_per_prompt"])
    return _pooled(records, lambda r: r["result"]["tokens_per_prompt"], lambda r: r["result"]["steps_per_prompt"])


def speed_interval(records: list[dict[str, Any]]) -> Interval | None:
    """Tokens per second over the prompts (or batches) of ``records``."""
    return _pooled(records, lambda r: _units(r)[0], lambda r: _units(r)[1])


def baseline_of(record: dict[str, Any], bases: list[dict[str, Any]], method: str | None) -> dict[str, Any] | None:
    """The finished ``method`` baseline measured on the same prompts and settings as ``record``, on the
    same machine (a speedup across two machines measures the machines, not the method), HF assisted with the same
    draft (:func:`_same_draft`); of several settings of one method (HF assisted generation's, prompt lookup's) the
    fastest (``records.fastest``). ``method`` None: the fastest of every HF method run there (what a user would run
    instead)."""
    p = record["params"]
    return fastest([b for b in bases if method in (None, b["params"]["method"]) and b is not record
                    and all(b["params"].get(k) == p.get(k) for k in _SAME_RUN) and _same_draft(b, p)
                    and machine_of(b) == machine_of(record)])


def _same_draft(base: dict[str, Any], params: dict[str, Any]) -> bool:
    """HF assisted generation compared only with the draft of the point's own pair: two pairs of a sweep may share
    a target (``models.pairs``). A point without a draft (the n-gram drafter alone) takes any."""
    b = base["params"]
    return b["method"] != "assisted" or "draft" not in params or b.get("draft") == params["draft"]


def is_fastest(base: dict[str, Any], bases: list[dict[str, Any]]) -> bool:
    """Whether baseline record ``base`` is the one :func:`baseline_of` pairs its prompts with (not a slower setting
    of HF assisted generation or prompt lookup)."""
    other = baseline_of(base, bases, base["params"]["method"])
    return other is None or fastest([base, other]) is base


def speedup_interval(records: list[dict[str, Any]], bases: list[dict[str, Any]], method: str | None
                     ) -> Interval | None:
    """Baseline seconds / treespec seconds over the prompts of ``records``, paired per prompt, or per batch
    for a batch point (each record with the ``method`` baseline of its own prompts, batch size and seed; None: the
    fastest HF method there, :func:`baseline_of`). None unless every record has that baseline, finished, with
    exactly the same token count per prompt."""
    pairs = []
    for r in records:
        b = baseline_of(r, bases, method)
        if (b is None or not (r["result"]["complete"] and b["result"]["complete"])
                or b["result"]["tokens_per_prompt"] != r["result"]["tokens_per_prompt"]):
            return None
        pairs.append((b, r))
    return _pooled(pairs, lambda br: _units(br[0])[1], lambda br: _units(br[1])[1])


def depth_rows(record: dict[str, Any]) -> list[tuple[int, int, float, float | None]]:
    """Per depth d: (d, steps whose walk reached depth d - 1 with children, measured acceptance rate,
    predicted rate from the calibration vector or None)."""
    res = record["result"]
    tried, accepted = res.get("depth_tried", []), res.get("depth_accepted", [])
    predicted = res.get("predicted_depth_acceptance") or []
    return [(d + 1, t, a / t if t else 0.0, predicted[d] if d < len(predicted) else None)
            for d, (t, a) in enumerate(zip(tried, accepted))]


def where_the_gap_is(rows: list[tuple[int, int, float, float | None]], *, threshold: float = 0.05) -> str:
    """One sentence locating a predicted-vs-measured gap from ``depth_rows``: a gap already at depth 1
    is a shift between calibration and evaluation prompts (the first draft token's acceptance does not
    depend on the tree); a gap that grows with depth means acceptance is correlated along a path
    (a walk that got deep is in text the draft predicts well), which a positional vector (one rate
    per child rank, the same at every depth) cannot express. ``threshold``: the smallest difference
    in acceptance rate called a gap."""
    diffs = [(d, rate - pred) for d, tried, rate, pred in rows if pred is not None and tried]
    if not diffs:
        return ""
    first = diffs[0][1]
    deeper = [x for d, x in diffs[1:]]
    parts = []
    if abs(first) >= threshold:
        parts.append(f"the rate is already {first:+.3f} off at depth 1, where the tree's shape plays no part: "
                     f"the evaluation prompts accept a first draft token {'more' if first > 0 else 'less'} often "
                     "than the calibration prompts did")
    if deeper:
        mean_deeper = sum(deeper) / len(deeper)
        if mean_deeper - first >= threshold:
            parts.append(f"the gap grows with depth ({first:+.3f} at depth 1, {mean_deeper:+.3f} on average below): "
                         "acceptance is correlated along a path, which the positional vector (the same rate at "
                         "every depth) cannot express" + (", so it underrates deep trees" if mean_deeper > 0 else ""))
        elif first - mean_deeper >= threshold:
            parts.append(f"the gap opens below depth 1 ({first:+.3f} at depth 1, {mean_deeper:+.3f} on average "
                         "below): deep drafts are accepted less often than the vector assumes")
    if not parts:
        d, worst = max(diffs, key=lambda dx: abs(dx[1]))
        if abs(worst) >= threshold:
            return (f"Where: mostly at depth {d} ({worst:+.3f}), with no trend over depth: one level's rate, "
                    f"over {dict((dd, t) for dd, t, _, _ in rows)[d]} steps, is noisier than the tree's tau.")
        return (f"Where: no depth is off by {threshold:g} or more (largest {worst:+.3f} at depth {d}); small "
                "differences at every depth add up to a gap the tight interval can tell apart.")
    return "Where: " + "; ".join(parts) + "."


def baseline_speedup(r: dict[str, Any], bases: list[dict[str, Any]]) -> Interval | None:
    """Speedup of baseline record ``r`` over the target-alone record of the same prompts and settings."""
    if r["params"]["method"] == "target":
        return None
    return speedup_interval([r], bases, "target")


def same_greedy_outputs(r: dict[str, Any], bases: list[dict[str, Any]]) -> str | None:
    """"same/total" prompts on which greedy record ``r`` (a treespec point or a speculative baseline)
    produced exactly the target-alone baseline's output; None when not greedy or not comparable."""
    p = r["params"]
    if p["temperature"] != 0 or p.get("method") == "target":
        return None
    target = baseline_of(r, bases, "target")
    mine = r["result"].get("output_digests")
    if target is None or not mine or not target["result"].get("output_digests"):
        return None
    same = sum(a == b for a, b in zip(mine, target["result"]["output_digests"]))
    return f"{same}/{len(mine)}"


def agreement(record: dict[str, Any]) -> dict[str, Any] | None:
    """Predicted vs measured tau of a treespec record: the measured tau over uncut steps with its
    interval, the relative gap, whether the prediction lies inside the interval (None where the interval is
    unknown: one prompt), and how far the tau over all steps sits from the uncut one (the cost of the cut
    last steps)."""
    predicted = record["result"].get("predicted_tau")
    uncut = tau_interval([record], uncut=True)
    if predicted is None or uncut is None:
        return None
    every = tau_interval([record])
    return {"predicted": float(predicted), "measured": uncut, "gap": uncut.estimate / predicted - 1.0,
            "agrees": predicted in uncut if uncut.known else None,
            "cut_cost": (every.estimate / uncut.estimate - 1.0) if every and uncut.estimate else None}


def per_depth_prediction(record: dict[str, Any], directory: Path) -> float | None:
    """The record's tree's expected tokens per step under the per-depth acceptance matrix of the same
    calibration (acceptance conditional on the walk reaching each depth), read from the acceptance file
    beside the results; None without a static tree or the file."""
    res = record["result"]
    name = (res.get("acceptance") or {}).get("file")
    if "tree" not in res or not name or not (directory / name).is_file():
        return None
    matrix = MeasuredAcceptance.load(directory / name).matrix.tolist()
    return float(TreeShape.from_paths([tuple(p) for p in res["tree"]["paths"]]).expected_tokens(matrix))


# -- tree or chain? -------------------------------------------------------------------------------------------
def _levels(record: dict[str, Any]) -> int:
    """Draft forwards per step of a static tree: the root's (with the catch-up) and one per level with children."""
    tree = record["result"].get("tree")
    return int(tree["depth"]) if tree else 0


def _per_step(record: dict[str, Any], part: str) -> float:
    return record["timing"][f"{part}_seconds"] / max(record["result"]["steps"], 1)


def _sibling_acceptance(record: dict[str, Any]) -> float | None:
    """How often a child other than the draft's first choice is the accepted one (calibration vector)."""
    a = record["result"].get("acceptance")
    return None if not a else float(sum(a["vector"][1:]))


def tree_vs_chain(tres: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per panel and budget with a model-drafted chain and at least one model-drafted tree: the chain
    against the tree measured fastest at that budget, with the paired speed ratio over the same
    prompts (tree over chain: > 1 means the tree wins; when the builder's best tree *is* the chain, the
    ratio only measures how much the machine's speed drifted between the two runs), the predicted
    tau of both, and the facts
    that decide the winner: verification seconds per step of each (``t(n)`` at the two sizes, as
    the run paid it), the draft's seconds per forward level, and the calibration's sibling acceptance
    (the tokens only a tree can win)."""
    groups: dict[tuple, dict[int, dict[str, list[dict[str, Any]]]]] = {}
    for r in tres:
        p = r["params"]
        if p["drafters"] != "model" or (p["temperature"] > 0 and p.get("verifier", "rrs") != "rrs"):
            continue  # sampled: the rrs points; greedy: whichever verifier ran it (none decides at T=0)
        groups.setdefault(panel(p), {}).setdefault(p["budget"], {}).setdefault(tree_label(p), []).append(r)
    rows = []
    for pn in sorted(groups, key=str):
        for budget, by_builder in sorted(groups[pn].items()):
            chains = by_builder.get("chain")
            trees = {b: rs for b, rs in by_builder.items() if b != "chain"}
            if not chains or not trees:
                continue
            speeds = {b: speed_interval(rs) for b, rs in trees.items()}
            best = max((b for b in trees if speeds[b] is not None), key=lambda b: speeds[b].estimate, default=None)
            if best is None:
                continue
            tree, chain = trees[best], chains
            same_prompts = all(t["result"]["tokens_per_prompt"] == c["result"]["tokens_per_prompt"]
                               for t, c in zip(tree, chain)) and len(tree) == len(chain)
            ratio = _pooled(list(zip(chain, tree)), lambda ct: ct[0]["timing"]["per_prompt_seconds"],
                            lambda ct: ct[1]["timing"]["per_prompt_seconds"]) if same_prompts else None
            t0, c0 = tree[0], chain[0]
            same_shape = bool(t0["result"].get("tree")) and (t0["result"]["tree"].get("paths")
                                                               == c0["result"].get("tree", {}).get("paths"))
            rows.append({
                "same_shape": same_shape,
                "panel": pn, "budget": budget, "tree": best, "ratio": ratio,
                "winner": (None if ratio is None or not ratio.known
                           else "same shape: the ratio is timing drift between the two runs" if same_shape
                           else "tree" if ratio.low > 1
                           else "chain" if ratio.high < 1 else "neither (the interval holds 1)"),
                "speed": {"tree": speeds[best], "chain": speed_interval(chain)},
                "tau": {"tree": tau_interval(tree, uncut=True), "chain": tau_interval(chain, uncut=True)},
                "predicted_tau": {"tree": t0["result"].get("predicted_tau"),
                                  "chain": c0["result"].get("predicted_tau")},
                "size": {"tree": t0["result"]["mean_tree_size"], "chain": c0["result"]["mean_tree_size"]},
                "verify": {"tree": _per_step(t0, "verifying"), "chain": _per_step(c0, "verifying")},
                "draft_level": {k: (_per_step(r, "drafting") / _levels(r) if _levels(r) else None)
                                for k, r in (("tree", t0), ("chain", c0))},
                "siblings": _sibling_acceptance(t0) or _sibling_acceptance(c0),
            })
    return rows


# -- seconds per step: predicted vs measured -------------------------------------------------------------------
def measured_step(record: dict[str, Any]) -> tuple[float, float, float]:
    """Measured (drafting, verifying, engine) seconds per step of a record."""
    return _per_step(record, "drafting"), _per_step(record, "verifying"), _per_step(record, "overhead")


def mean_context(record: dict[str, Any]) -> float:
    """The tokens cached before a step of ``record``, on average: its prompts' mean length plus half
    the tokens generated per prompt."""
    r = record["result"]
    prompts, made = r["prompt_tokens"], r["tokens_per_prompt"]
    return sum(prompts) / max(len(prompts), 1) + sum(made) / max(len(made), 1) / 2


def _step_weighted(records: list[dict[str, Any]], value: Any) -> float:
    """``value(record)`` averaged over ``records``' steps (each record weighted by its step count)."""
    return sum(value(r) * r["result"]["steps"] for r in records) / sum(r["result"]["steps"] for r in records)


def _at_context(profile: Any, records: list[dict[str, Any]]) -> Any:
    """``profile`` at the mean context of ``records``' steps (itself where no context slope was measured)."""
    return profile.at_context(_step_weighted(records, mean_context)) if profile.context_slope else profile


def step_cost_rows(tres: list[dict[str, Any]], profile: Any) -> list[dict[str, Any]]:
    """Seconds per step predicted by ``profile`` (a ``treespec.calibrate.costs.Profile`` of the sweep's
    pair) for every static-tree point, calibrated by real steps the way ``treespec generate`` does it
    (``Profile.calibrated``, from a pilot of real steps of one tree on code and prose prompts at the
    run's temperature): per machine and temperature, by the pooled steps of every point that runs the
    tree of the smallest-budget chain (the first static point's tree if there is no chain), then every
    other point of that machine and temperature is predicted. Pooling the points that share the
    calibration tree (e.g. the chain and the Sequoia tree of budget 4, on each prompt set) gives the
    calibration the steps of several runs: one run alone was measured up to 7% off an identical tree's.
    A profile with context slopes (``Profile.at_context``) is moved to each point's :func:`mean_context`
    (the calibration's factors found at the calibration steps' mean context). Rows: the point,
    predicted and measured seconds per step (total and by part), the relative gap, and whether it is
    a calibration point."""
    static = [r for r in tres if r["result"].get("tree") and r["result"]["steps"]]
    rows = []
    groups = sorted({(machine_of(r), r["params"]["temperature"]) for r in static}, key=str)
    for machine, temperature in groups:
        mine = [r for r in static if (machine_of(r), r["params"]["temperature"]) == (machine, temperature)]
        first = min(mine, key=lambda r: (r["params"]["builder"] != "chain", r["params"]["budget"],
                                         str(panel(r["params"]))))
        calib = [r for r in mine if r["result"]["tree"]["paths"] == first["result"]["tree"]["paths"]]
        shape = TreeShape.from_paths([tuple(p) for p in first["result"]["tree"]["paths"]])
        parts = [_step_weighted(calib, lambda r, part=part: _per_step(r, part))
                 for part in ("drafting", "verifying", "overhead")]
        size = _step_weighted(calib, lambda r: r["result"]["mean_tree_size"])
        cal = _at_context(profile, calib).calibrated(shape, *parts, sum(r["result"]["steps"] for r in calib),
                                                     size=size)
        for r in mine:
            s = TreeShape.from_paths([tuple(p) for p in r["result"]["tree"]["paths"]])
            here = _at_context(cal, [r])
            d_pred, _ = here.step_parts(s)
            sizes = sorted(here.target_latency)
            v_pred = float(np.interp(r["result"]["mean_tree_size"], sizes, [here.target_latency[k] for k in sizes]))
            predicted = d_pred + v_pred + here.step_overhead_seconds
            d_meas, v_meas, e_meas = measured_step(r)
            measured = d_meas + v_meas + e_meas
            rows.append({"record": r, "machine": machine, "calibration": any(r is c for c in calib),
                         "predicted": predicted, "measured": measured, "gap": predicted / measured - 1.0,
                         "parts": {"drafting": (d_pred, d_meas), "verifying": (v_pred, v_meas)}})
    return rows
