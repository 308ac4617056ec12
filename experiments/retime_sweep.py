"""The CPU sweep's static trees timed again on a quiet machine, and the step-cost model checked on them.

The committed sweep (``experiments/results/cpu-qwen-coder``, 48 static-tree points) ran for hours
at load averages of 1.9-3.2, on two hosts; points of identical shape differ there by up to 18% in
seconds per step, so no cost model can be checked against it within 10%. Its tau needs its 20
prompts x 96 tokens; a step's *cost* does not. This script runs every static point again (same
recipe: its builder, budget, drafting mode, temperature, the sweep's acceptance files and models:
bfloat16 target, int8 draft, eager steps) on a few of the sweep's own evaluation prompts, the points
interleaved prompt by prompt (the second prompt visits them in reverse order, so drift falls evenly),
and compares each point's measured seconds per step (drafting + verifying + engine) with the
prediction ``treespec generate`` would make: this machine's profile of isolated forwards
(``treespec.calibrate.costs.profile``, saved as ``profile.json``; measured after 128 and after 512
cached tokens, so each point is costed at its own mean context: ``Profile.at_context``), calibrated
per temperature on the pooled real steps of the points that run the budget-4 chain (the chain and
the Sequoia tree of budget 4 on both prompt sets: code and prose, as the tuner's pilot; the report's
rule, ``treespec.bench.sweep.figures.step_cost_rows``), every other point predicted from its own tree.

Each (point, prompt) is appended to ``steps.jsonl`` as it finishes; a re-run resumes. Writes
``README.md`` (per panel: predicted and measured seconds per step, gap; largest gap per panel).

    python experiments/retime_sweep.py --out experiments/results/cpu-qwen-coder-retimed
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tqdm.auto import tqdm  # noqa: E402

from treespec.bench.sweep.figures import mean_context, panel, step_cost_rows  # noqa: E402
from treespec.bench.sweep.points import point_key  # noqa: E402
from treespec.bench.sweep.records import append_record, read_records  # noqa: E402
from treespec.bench.sweep.runner import Sweep  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core.sampling import spread_seed  # noqa: E402
from treespec.recipes import run  # noqa: E402

SWEEP = Path(__file__).resolve().parent / "results" / "cpu-qwen-coder"
PARTS = ("drafting_seconds", "verifying_seconds", "overhead_seconds")
#: the profile is measured after 128 and after this many cached tokens (``Profile.context_slope``)
SECOND_CONTEXT = 512


def static_points() -> list[dict]:
    """The sweep's static-tree treespec records (a tree and steps), in a fixed order."""
    records = [r for r in read_records(SWEEP / "results.jsonl")
               if r["kind"] == "treespec" and r["result"].get("tree") and r["result"]["steps"]]
    return sorted(records, key=lambda r: (str(panel(r["params"])), r["params"]["builder"], r["params"]["budget"]))


def measure(points: list[dict], out: Path, prompts: int, tokens: int, progress: bool) -> None:
    """Run each point on each of ``prompts`` evaluation prompts (``tokens`` new tokens), appending one
    line per (point, prompt) to ``out / steps.jsonl``; lines already there are kept and skipped."""
    steps = out / "steps.jsonl"
    done = ({(d["key"], d["prompt"]) for d in map(json.loads, steps.read_text().splitlines())} if steps.exists()
            else set())
    cfg = json.loads((SWEEP / "config.json").read_text())["config"]
    sweep = Sweep(cfg, SWEEP, progress=False, measure=None)  # reads the sweep's acceptance files, writes nothing
    todo = [(i, r) for i in range(prompts) for r in (points if i % 2 == 0 else points[::-1])
            if (point_key(r["params"]), i) not in done]
    if not todo:
        return
    target, _ = sweep.models.get(cfg["models"]["target"])
    recipes = {}
    for r in points:
        recipe, drafts, info = sweep.recipe_of(r["params"])
        if info["tree"]["paths"] != r["result"]["tree"]["paths"]:
            raise SystemExit(f"the recipe of {point_key(r['params'])} builds another tree than the sweep recorded; "
                             "the sweep's acceptance files or the builders changed")
        recipes[point_key(r["params"])] = (recipe, drafts)
    # untimed warm-up on a real prompt: the first timed run of a process paid for its allocations and
    # cold caches (one run here measured its point 12% slower than the identical tree timed later)
    recipe, drafts = next(iter(recipes.values()))
    warm_ids = sweep.token_prompts(cfg["models"]["target"], points[0]["params"]["dataset"], "eval")[0]
    run(recipe, target, drafts, warm_ids, max_new_tokens=tokens, seed=0)
    for i, r in tqdm(todo, desc="re-timing the sweep's static points", disable=not progress):
        key = point_key(r["params"])
        recipe, drafts = recipes[key]
        ids = sweep.token_prompts(cfg["models"]["target"], r["params"]["dataset"], "eval")[i]
        started = time.perf_counter()
        s = run(recipe, target, drafts, ids, max_new_tokens=tokens, seed=spread_seed("sweep", 0, i)).stats
        append_record(steps, {"key": key, "prompt": i, "steps": s.steps, "new_tokens": s.new_tokens,
                             "tree_tokens": s.mean_tree_size * s.steps, "wall_seconds": time.perf_counter() - started,
                             **{k: getattr(s, k) for k in PARTS}, "load_average": os.getloadavg()[0],
                             "machine": machine("cpu")})


def retimed_records(points: list[dict], out: Path) -> list[dict]:
    """The sweep's records with their timings (and steps, verified size, machine) from ``steps.jsonl``."""
    lines = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    records = []
    for r in points:
        mine = [d for d in lines if d["key"] == point_key(r["params"])]
        if not mine:
            continue
        steps = sum(d["steps"] for d in mine)
        records.append({**r, "meta": {"machine": mine[0]["machine"]},
                        "result": {**r["result"], "steps": steps,
                                   "mean_tree_size": sum(d["tree_tokens"] for d in mine) / steps,
                                   "prompt_tokens": [r["result"]["prompt_tokens"][d["prompt"]] for d in mine],
                                   "tokens_per_prompt": [d["new_tokens"] for d in mine]},
                        "timing": {k: sum(d[k] for d in mine) for k in PARTS}, "retimed": mine})
    return records


def report(points: list[dict], out: Path, profile, command: str) -> str:
    records = retimed_records(points, out)
    rows = step_cost_rows(records, profile)
    lines_in = [d for r in records for d in r["retimed"]]
    loads = [d["load_average"] for d in lines_in if d.get("load_average") is not None]
    worst: dict[tuple, float] = {}
    for v in rows:
        if not v["calibration"]:
            key = panel(v["record"]["params"])
            worst[key] = max(worst.get(key, 0.0), abs(v["gap"]))
    by_key = {point_key(r["params"]): r for r in points}
    lines = ["# The sweep's static trees re-timed: predicted vs measured seconds per step "
             f"({records[0]['meta']['machine']})",
             "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             f"{len(records)} points, {len(lines_in)} runs of {lines_in[0]['new_tokens'] if lines_in else 0} "
             "new tokens "
             f"(evaluation prompts {sorted({d['prompt'] for d in lines_in})} of the sweep's 100-119); load average "
             f"{min(loads):.2f}-{max(loads):.2f} over the runs. Profile: `profile.json` "
             f"({profile.meta.get('date', '?')[:10]}).", "",
             "Largest gap per panel (held-out points): " + "; ".join(
                 f"{d} T={t:g}: {g:.1%}" for (_, d, t, _), g in sorted(worst.items(), key=str)) + ".", "",
             "| dataset | T | builder | B | steps | mean context | predicted s/step (draft + verify) | "
             "measured (draft + verify) | gap | committed sweep's measured s/step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for v in rows:
        p, parts = v["record"]["params"], v["parts"]
        old = by_key[point_key(p)]
        old_step = sum(old["timing"][k] for k in PARTS) / old["result"]["steps"]
        lines.append(f"| {p['dataset']} | {p['temperature']:g} | {p['builder']} | {p['budget']} | "
                     f"{v['record']['result']['steps']} | {mean_context(v['record']):.0f} | "
                     f"{v['predicted']:.3f} ({parts['drafting'][0]:.3f} + {parts['verifying'][0]:.3f}) | "
                     f"{v['measured']:.3f} ({parts['drafting'][1]:.3f} + {parts['verifying'][1]:.3f}) | "
                     + ("*calibration*" if v["calibration"] else f"{v['gap']:+.1%}") + f" | {old_step:.3f} |")
    lines += ["", f"Command: `{command}`.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for steps.jsonl, profile.json and README.md")
    ap.add_argument("--prompts", type=int, default=4, help="evaluation prompts per point (the sweep's first ones)")
    ap.add_argument("--new-tokens", type=int, default=48, help="new tokens per prompt")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.new_tokens < 1:
        ap.error("--prompts and --new-tokens must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    points = static_points()
    measure(points, args.out, args.prompts, args.new_tokens, not args.no_progress)
    profile_file = args.out / "profile.json"
    if profile_file.exists():
        from treespec.calibrate.costs import Profile

        profile = Profile.load(profile_file)
    else:  # this machine's isolated forwards of the sweep's pair, as the tuner measures them, at two contexts
        from treespec.calibrate.costs import profile as measure_profile
        from treespec.calibrate.tuning import PROFILE_SIZES, PROFILE_WIDTHS

        cfg = json.loads((SWEEP / "config.json").read_text())["config"]
        sweep = Sweep(cfg, SWEEP, progress=False, measure=None)
        target, _ = sweep.models.get(cfg["models"]["target"])
        draft = sweep.draft_model(cfg["models"]["target"], cfg["models"]["draft"])
        profile = measure_profile(target, draft, sizes=PROFILE_SIZES, draft_widths=PROFILE_WIDTHS,
                                  second_context=SECOND_CONTEXT)
        profile.save(profile_file)
    command = f"python experiments/retime_sweep.py --out {args.out}" + (
        f" --prompts {args.prompts}" if args.prompts != 4 else "") + (
        f" --new-tokens {args.new_tokens}" if args.new_tokens != 48 else "")
    text = report(points, args.out, profile, command)
    (args.out / "README.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
