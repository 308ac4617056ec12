"""Do the printed predictions hold on held-out prompts? The default configuration of ``treespec generate`` and
``treespec demo`` (the built-in pair loaded as they load it: the target in the precision whose tuned tree is
predicted fastest here, ``target_precision.load_pair_tuned``; the tuned tree, the compile choice for this many
prompts) run on HumanEval prompts the calibration did not see, beside HF ``generate`` eager in the target's
precision (the "target alone" the predicted speedup is over), interleaved per prompt. ``--target-dtype`` holds
the target in one precision instead (``bfloat16``, or ``int4`` on its file's own blocks).

Predicted: what the CLI prints and ``--json`` records (``Tuned.prediction``): the tree replayed over the shipped
calibration walk of the draft's precision (40 prompts drawn from HumanEval 0-99) with the run's confidence stop
over the run's horizon (every step of a run of ``--max-new-tokens`` tokens); the old model beside it (the whole
96-token walk, uncut steps). Measured: tokens per step over all steps, seconds per step, and the speedup over
the target alone with each prompt's prefill charged to both (the demo's table). Intervals: 95%, the measured
tau over the predicted one resampling the evaluation prompts and the calibration continuations each on its own
(``intervals.ratio_of_ratios``): an interval holding 1 cannot be told from prompt sampling.

Results are appended per (prompt, method) to ``<out>/results.jsonl``; a re-run resumes.

    python experiments/prediction_holdout.py --out experiments/results/prediction-holdout-cpu-zen4-int4 \
        --prompts 106:130

Measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from treespec.bench import compare
from treespec.bench.datasets import humaneval_prompts
from treespec.bench.demo import predicted_and_measured, retimed
from treespec.bench.intervals import ratio_of_ratios, ratio_of_sums
from treespec.calibrate.choices import resolve_run
from treespec.calibrate.target_precision import load_pair_tuned
from treespec.calibrate.vectors import default_acceptance
from treespec.common.machine import machine
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from treespec.models.pair import load_pair
from treespec.models.precision import precision_of
from treespec.recipes import Recipe, run


def prompt_range(text: str) -> tuple[int, int]:
    start, _, stop = text.partition(":")
    if not (start.isdigit() and stop.isdigit() and int(start) < int(stop)):
        raise argparse.ArgumentTypeError(f"expected A:B with A < B (HumanEval prompts A to B-1), got {text!r}")
    return int(start), int(stop)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=prompt_range, default=(106, 130),
                    help="HumanEval prompts A:B (default 106:130; the calibration drew from 0-99, the demo: 100 on)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--target-dtype", choices=("auto", "bfloat16", "int4"), default="auto",
                    help="the target's precision: auto (default) as the demo chooses it, else held in this one")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    if args.target_dtype == "auto":
        target, tok, drafts = load_pair_tuned(DEFAULT_TARGET, DEFAULT_DRAFT)
    else:
        target, tok, drafts = load_pair(DEFAULT_TARGET, [DEFAULT_DRAFT], target_dtype=args.target_dtype)
    start, stop = args.prompts
    texts = humaneval_prompts(start, stop)
    prompts = [("humaneval", start + i, tok(text)["input_ids"]) for i, text in enumerate(texts)]
    # as the CLI and the demo: the draft precision's files, the draft's prefill of these prompts, the compile choice
    resolved = resolve_run(Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0)), target, drafts, tok,
                           prompts=[ids for *_, ids in prompts], max_new_tokens=args.max_new_tokens)
    tuned, recipe = resolved.tuned, resolved.recipe
    walk = tuned.walk  # the calibration walk the rows came from, which the prediction replays
    print(f"configuration: {resolved.why}", flush=True)

    prediction = retimed(tuned.prediction, target, [ids for _, _, ids in prompts])  # as the demo: timed now
    methods = [compare.hf_method(target),
               compare.treespec_method(lambda ids, n: run(recipe, target, drafts, ids, max_new_tokens=n),
                                       precision_of(target))]
    records = compare.run(methods, prompts, args.max_new_tokens, args.out / "results.jsonl", on_record=lambda r: print(
        f"  HumanEval/{r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s"
        + (f", tau {r['tau']:.2f}" if "tau" in r else ""), flush=True))
    mine = sorted((r for r in records if r["method"] == "treespec"), key=lambda r: r["prompt"])

    shape, stop_at = tuned.choice.shape, tuned.min_confidence
    horizon = walk.replayed_steps(shape, stop_at, args.max_new_tokens)
    whole = walk.replayed_steps(shape, stop_at)
    measured = ([r["tokens"] for r in mine], [r["steps"] for r in mine])
    kept = [[t for t, cut in zip(r["step_tokens"], r["step_cut"]) if not cut] for r in mine]
    uncut = ([sum(k) for k in kept], [len(k) for k in kept])
    gap = ratio_of_ratios(*measured, *horizon)
    gap_old = ratio_of_ratios(*uncut, *whole)
    tau = ratio_of_sums(*measured)
    alone = [r for r in records if r["method"] == compare.hf_method(target).name]
    plain = sum(r["seconds"] for r in alone) / sum(r["tokens"] for r in alone)
    # side by side, as every benchmark here: each prompt's whole run (its own prefill in it), paired per prompt
    summary = compare.summarize(records, "humaneval")
    side = summary["speedups"][f"treespec vs {compare.hf_method(target).name}"]
    rates = {m: summary["methods"][m]["tokens_per_second"]["estimate"] for m in summary["methods"]}
    draft_prefill = tuned.draft_prefill if recipe.budget > 1 else 0.0  # treespec's alone, as the demo charges it
    lines = [
        "# Predicted vs measured on held-out prompts", "",
        f"Machine: {machine('cpu')}. HumanEval {start}-{stop - 1}, {args.max_new_tokens} greedy tokens each "
        f"(calibration: {walk.meta.get('prompts_label')}, draft {walk.meta.get('draft_precision', 'int8')}); "
        f"target {precision_of(target)}.", "",
        f"Configuration: {resolved.why}.", "",
        "Command: `python experiments/prediction_holdout.py --out " + str(args.out) +
        f" --prompts {start}:{stop} --max-new-tokens {args.max_new_tokens} --target-dtype {args.target_dtype}`", "",
        predicted_and_measured(prediction, records, compare.hf_method(target).name, draft_prefill), "",
        f"Side by side (tok/s over each prompt's whole run, its own prefill in it; ratio paired per prompt): treespec "
        f"{rates['treespec']:.2f}, {compare.hf_method(target).name} {rates[compare.hf_method(target).name]:.2f}, "
        f"**{side['estimate']:.2f}x [{side['low']:.2f}, {side['high']:.2f}]**. The table's speedups are the "
        "prediction's model (the target's prefill charged to both sides, the draft's to treespec) with the measured "
        "decoding in it: they test the model, the side-by-side ratio is what a user gets.", "",
        f"Measured tau (all steps) {tau.estimate:.2f} [{tau.low:.2f}, {tau.high:.2f}] over {len(mine)} prompts; "
        f"measured / predicted {gap.estimate:.3f} [{gap.low:.3f}, {gap.high:.3f}] (both prompt sets resampled).", "",
        "The model before the horizon (the whole 96-token walk, uncut steps): predicted "
        f"{sum(whole[0]) / sum(whole[1]):.2f} against {sum(uncut[0]) / sum(uncut[1]):.2f} measured over uncut "
        f"steps, measured / predicted {gap_old.estimate:.3f} [{gap_old.low:.3f}, {gap_old.high:.3f}].", "",
        f"treespec's seconds are predicted from this machine's cached profile (forwards timed when it was made), the "
        f"target alone's decoding from HF generate timed just before the runs ({prediction.plain_seconds:.3f} s per "
        f"token; the profile's: {tuned.prediction.plain_seconds:.3f} s), as the demo does; the target alone ran "
        f"{plain:.3f} s per token here, its prefill included.", ""]
    text = "\n".join(lines)
    (args.out / "README.md").write_text(text)
    (args.out / "summary.json").write_text(json.dumps({
        "prompts": [start, stop], "max_new_tokens": args.max_new_tokens, "target_precision": precision_of(target),
        "configuration": resolved.why,
        "predicted": prediction.as_dict(), "draft_prefill_seconds": draft_prefill, "side_by_side": side,
        "measured_tau": asdict(tau), "measured_over_predicted": asdict(gap),
        "whole_walk_uncut_predicted": sum(whole[0]) / sum(whole[1]), "whole_walk_measured_over_predicted":
        asdict(gap_old)}, indent=1))
    print("\n" + text)


if __name__ == "__main__":
    main()
