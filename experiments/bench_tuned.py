"""Is the tuned default tree as fast as the fastest tree of the CPU sweep's grid? One panel at a time.

Per panel of the committed CPU sweep (``experiments/results/cpu-qwen-coder``: HumanEval and Lee news,
T=0 and T=1; bfloat16 target, int8 draft), three methods run side by side, interleaved per prompt, on
the sweep's own evaluation prompts with its seeds and token count:

* ``tuned``: what ``treespec generate`` runs by default at that temperature, resolved the way the CLI
  resolves it (``treespec.calibrate.choices.resolve`` with the tokenizer: the measured-fastest Sequoia tree under
  the shipped acceptance's per-depth rows, costs calibrated by real steps);
* ``tuned-panel``: the same tuner given the panel's own acceptance, measured on prompts disjoint from
  the evaluation's (the ``random-walk`` calibration of ``experiments/results/acceptance-fit``: 40
  prompts drawn at random from the rest of the set, walked, 96 tokens), as ``treespec accept
  --prompts-jsonl`` gives a user; its per-depth rows, as the CLI passes them;
* ``grid-best``: the sweep's fastest measured point of the panel, rebuilt from its parameters (its
  Sequoia tree from the sweep's own acceptance file, which must give the recorded tree).

The paired ratio x / grid-best (bootstrap 95% interval over prompts) says whether the tuned tree
is within 5% of the grid's best when they run now, on this machine, in one process (the sweep's tok/s
were measured in other sessions, under load, so they only pick which point to re-run). Records are
appended as they finish and a re-run resumes (a method added later runs after the finished ones).

    python experiments/bench_tuned.py --out experiments/results/tuned-vs-grid --prompts 10
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from treespec.bench import compare
from treespec.bench.datasets import dataset_prompts
from treespec.bench.sweep.models import encode
from treespec.bench.sweep.points import point_recipe
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.calibrate.vectors import default_acceptance
from treespec.common.machine import machine
from treespec.core.sampling import spread_seed
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.recipes import Recipe, plan, run
from treespec.calibrate.choices import resolve

SWEEP = Path("experiments/results/cpu-qwen-coder")
CALIBRATION = Path("experiments/results/acceptance-fit")  # bench_acceptance_fit.py's files
PANELS = (("humaneval", 0.0), ("humaneval", 1.0), ("lee-news", 0.0), ("lee-news", 1.0))


def grid_best(records: list[dict], dataset: str, temperature: float) -> dict:
    """The panel's treespec point with the most tokens per second in the sweep."""
    points = [r for r in records if r["params"].get("kind") == "treespec" and r["params"]["dataset"] == dataset
              and r["params"]["temperature"] == temperature and r.get("timing")]
    if not points:
        raise SystemExit(f"{SWEEP / 'results.jsonl'} has no treespec point for {dataset} T={temperature:g}")
    return max(points, key=lambda r: r["timing"]["tokens_per_second"])


def grid_recipe(point: dict) -> Recipe:
    """The point's recipe, its Sequoia tree rebuilt from the sweep's acceptance file (checked against the record)."""
    p, res = point["params"], point["result"]
    acc = None
    if p["builder"] == "sequoia":
        accepted = MeasuredAcceptance.load(SWEEP / res["acceptance"]["file"])
        acc = accepted.matrix if res["acceptance"]["use"] == "matrix" else accepted.vector
    recipe = point_recipe(p, acc)
    if res.get("tree"):
        shape = plan(recipe, with_model=True, max_new_tokens=p["max_new_tokens"]).shape
        if [list(x) for x in shape.paths] != res["tree"]["paths"]:
            raise SystemExit(f"the rebuilt {p['builder']} B={p['budget']} tree differs from the sweep's record")
    return recipe


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/tuned-vs-grid"))
    ap.add_argument("--prompts", type=int, default=10, help="the first N of the sweep's evaluation prompts")
    ap.add_argument("--panels", default=",".join(f"{d}:{t:g}" for d, t in PANELS), metavar="DATASET:T,...")
    args = ap.parse_args(argv)
    records = [json.loads(line) for line in (SWEEP / "results.jsonl").read_text().splitlines() if line.strip()]
    cfg = json.loads((SWEEP / "config.json").read_text())["config"]
    target, tok = load(DEFAULT_TARGET, dtype=cfg["run"]["dtype"], role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype=cfg["run"]["draft_dtype"], role="draft")
    n_tokens = int(cfg["data"]["max_new_tokens"])
    first = int(str(cfg["data"]["eval"]).split(":")[0])
    summaries = []
    for spec in args.panels.split(","):
        dataset, temperature = spec.split(":")[0], float(spec.split(":")[1])
        best = grid_best(records, dataset, temperature)
        own = panel_acceptance(records, dataset, temperature)
        tuned = {name: resolve(Recipe(tree="sequoia", temperature=temperature, acceptance=rows), target, [draft],
                               tokenizer=tok, max_new_tokens=n_tokens)
                 for name, rows in (("tuned", default_acceptance(None, temperature)),
                                    ("tuned-panel", own.matrix.tolist()))}
        recipes = {**{name: r.recipe for name, r in tuned.items()}, "grid-best": grid_recipe(best)}
        print(f"{dataset} T={temperature:g}: grid best: {best['params']['builder']} B={best['params']['budget']} "
              f"({best['timing']['tokens_per_second']:.2f} tok/s in the sweep)", flush=True)
        texts = dataset_prompts(dataset)
        prompts = [(dataset, i, encode(tok, texts[i])) for i in range(first, first + args.prompts)]
        # the sweep's seed of each evaluation prompt (by position); the warm-up call gets the first one's
        seed_of = {tuple(x): spread_seed("sweep", int(best["params"]["seed"]), k)
                   for k, (_, _, x) in enumerate(prompts)}

        def method(name: str, recipe: Recipe) -> compare.Method:
            def one(ids: list[int], n: int):
                return run(recipe, target, [draft], ids, max_new_tokens=n, seed=seed_of.get(tuple(ids), 0),
                           eos_token_id=None)
            return compare.treespec_method(one, cfg["run"]["dtype"], name=name)

        recs = compare.run([method(name, r) for name, r in recipes.items()], prompts, n_tokens,
                           args.out / f"{dataset}-T{temperature:g}.jsonl",
                           on_record=lambda r: print(f"  {r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} "
                                                     f"tok/s, tau {r.get('tau', 0):.2f}", flush=True))
        summaries.append(summarize(recs, dataset, temperature, tuned, best))
        for name in tuned:
            print(f"  {name} / grid-best: {compare.fmt(summaries[-1]['methods'][name]['ratio'])}", flush=True)
    write(args, summaries)
    return {"summaries": summaries}


def panel_acceptance(records: list[dict], dataset: str, temperature: float) -> MeasuredAcceptance:
    """The panel's own acceptance for its Sequoia points' drafting mode: the ``random-walk`` calibration
    (40 prompts disjoint from the evaluation's, walked), as ``treespec accept`` would measure it on a
    user's own prompts."""
    point = next(r for r in records if r["params"].get("kind") == "treespec" and r["params"]["builder"] == "sequoia"
                 and r["params"]["dataset"] == dataset and r["params"]["temperature"] == temperature)
    path = CALIBRATION / (f"acceptance-{dataset}-T{temperature:g}-{point['result']['acceptance']['mode']}"
                          "-random-walk.json")
    if not path.exists():
        raise SystemExit(f"{path} is missing: measure it with python experiments/bench_acceptance_fit.py")
    return MeasuredAcceptance.load(path)


def summarize(recs: list[dict], dataset: str, temperature: float, tuned: dict, best: dict) -> dict:
    """``compare.summarize`` with grid-best as the baseline (tok/s, tau, paired ratios), and per tuned
    method what the tuner said and its prediction against what its steps cost here."""
    recs = [{**r, "baseline": r["method"] == "grid-best"} for r in recs]  # what the tuned methods are compared with
    base = compare.summarize(recs, dataset)
    methods = {}
    for m in [*tuned, "grid-best"]:
        entry = base["methods"][m]
        out = {"tokens_per_second": entry["tokens_per_second"]["estimate"], "tau": entry["tau"]["estimate"]}
        if m in tuned:
            sel = [r for r in recs if r["method"] == m and r["prompt"] in base["prompts"]]
            split = entry["seconds_split"]
            out.update(ratio=base["speedups"][f"{m} vs grid-best"], why=tuned[m].why, budget=tuned[m].recipe.budget,
                       depth=tuned[m].recipe.depth)
            if tuned[m].tuned is not None:
                choice = tuned[m].tuned.choice
                out["prediction"] = {
                    "tau": choice.tau, "measured_tau_uncut": entry["tau_uncut"]["estimate"],
                    "step_seconds": choice.step_seconds,
                    "measured_step_seconds": (split["drafting_seconds"] + split["verifying_seconds"]
                                              + split["engine_seconds"]) / sum(r["steps"] for r in sel)}
        methods[m] = out
    return {"dataset": dataset, "temperature": temperature, "prompts": len(base["prompts"]), "methods": methods,
            "grid_best": {k: best["params"][k] for k in ("builder", "budget", "max_depth")},
            "grid_best_sweep_tokens_per_second": best["timing"]["tokens_per_second"]}


def verdict(r: dict) -> str:
    return ("yes" if r["low"] >= 0.95 else "no" if r["high"] < 0.95 else
            "yes by the estimate, the interval reaches below 0.95" if r["estimate"] >= 0.95 else
            "no by the estimate, the interval reaches 0.95")


def write(args: argparse.Namespace, summaries: list[dict]) -> None:
    (args.out / "summary.json").write_text(json.dumps({"machine": machine("cpu"), "torch": torch.__version__,
                                                       "summaries": summaries}, indent=1))
    lines = [f"# The tuned default against the CPU sweep's fastest point, side by side ({machine('cpu')}, "
             f"torch {torch.__version__})", "",
             f"Command: `python experiments/bench_tuned.py --out {args.out} --prompts {args.prompts}`. Per panel: the "
             "sweep's first evaluation prompts, its seeds and 96 new tokens, bfloat16 target and int8 draft. Methods: "
             "*tuned*, what `treespec generate` runs by default (the tree sized from the per-depth rows of the "
             "shipped acceptance, measured on HumanEval calibration prompts, costs calibrated by real steps); "
             "*tuned-panel*, the same tuner given the panel's own acceptance rows, measured on 40 prompts drawn at "
             "random from outside the evaluation prompts (as `treespec accept --prompts-jsonl` on a user's prompts, "
             "then `--acceptance FILE`); *grid-best*, the sweep's fastest point. *x / grid-best*: paired "
             "speed ratio (grid-best seconds over x's; > 1: x is faster), bootstrap 95% interval over prompts.", "",
             "| dataset | T | grid best (sweep tok/s) | method | tree | tok/s now | tau | x / grid-best | within 5%? |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        g = s["grid_best"]
        for name, m in s["methods"].items():
            tree = f"budget {m['budget']}, depth {m['depth']}" if "budget" in m else f"{g['builder']} B={g['budget']}"
            lines.append(f"| {s['dataset']} | {s['temperature']:g} | {g['builder']} B={g['budget']} "
                         f"({s['grid_best_sweep_tokens_per_second']:.2f}) | {name} | {tree} | "
                         f"{m['tokens_per_second']:.2f} | {m['tau']:.2f} | "
                         + (f"{compare.fmt(m['ratio'])} | {verdict(m['ratio'])} |" if name != "grid-best"
                            else "- | - |"))
    lines += ["", "Each tuner's prediction for its own tree against its steps here (tau over uncut steps; seconds per "
              "step = drafting + verifying + engine). The tuned recipes' confidence stop (0.3 greedy, 0.1 sampled) "
              "drafts fewer levels than the tree the prediction costs, and the shipped acceptance is HumanEval's: on "
              "prose the *tuned* prediction misses, as expected; *tuned-panel* is the tuner's prediction with the "
              "workload's acceptance. `without-sampled-stop/` keeps the T=1 records from before the sampled stop "
              "existed (tuned / grid-best on lee-news T=1: 0.75 [0.70, 0.80]).", "",
              "| dataset | T | method | predicted tau | measured tau (uncut) | gap | predicted s/step | "
              "measured s/step | gap |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        for name, m in s["methods"].items():
            p = m.get("prediction")
            if p:
                lines.append(f"| {s['dataset']} | {s['temperature']:g} | {name} | {p['tau']:.2f} | "
                             f"{p['measured_tau_uncut']:.2f} | {p['tau'] / p['measured_tau_uncut'] - 1:+.0%} | "
                             f"{p['step_seconds']:.3f} | {p['measured_step_seconds']:.3f} | "
                             f"{p['step_seconds'] / p['measured_step_seconds'] - 1:+.0%} |")
    lines += ["", "What the tuner said, per panel and method:", ""] + [
        f"- {s['dataset']} T={s['temperature']:g}, {name}: {m['why']}"
        for s in summaries for name, m in s["methods"].items() if "why" in m]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
