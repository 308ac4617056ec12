"""The exact verifiers side by side on the same trees and drafts: accepted length and tokens/s.

For each tree construction, every verifier that is exact for it (``docs/verifiers.md``) decodes the
same prompts with the same per-prompt seed, interleaved per prompt (prompt i: each verifier in turn,
the order rotated from prompt to prompt, so a drift in the machine's speed hits all alike). With the
same seed the drafters draw the same first tree; the verifiers then commit different tokens, so
later trees differ as the sampled continuations do.

Constructions (each built through ``treespec.recipes``):

* ``chain``: one sampled chain (``block``, ``traversal``, ``rrs``);
* ``sequoia``: the Sequoia tree, children drawn without replacement (``traversal``, ``rrs``);
* ``iid-kary``: a k-ary tree whose every node holds k i.i.d. draws, duplicates kept
  (``spectr``, ``traversal``, ``rrs``);
* ``iid-chains``: SpecInfer's independent i.i.d. chains (``spectr``, ``traversal``, ``rrs``).

Real pair: target Qwen2.5-Coder-1.5B-Instruct in bfloat16, draft Qwen2.5-Coder-0.5B-Instruct in
int8 (the fastest CPU configuration of ``experiments/results/cpu-speed``). Prompts: HumanEval from
100 on (0-99 is the calibration range of the shipped acceptance vectors) and lee-news leads.
A record per (construction, temperature, dataset, prompt, verifier) is appended to
``results.jsonl`` as it finishes; a re-run skips the finished ones. The summary gives, per
(construction, temperature, dataset, verifier), tau and tok/s with bootstrap intervals over prompts
and the paired ratios over ``rrs`` (``treespec.bench.intervals``); it is printed and written to
``summary.json``, ``README.md`` and ``gain_over_rrs.png``.

    python experiments/bench_verifiers.py --out experiments/results/verifiers --prompts 8 --max-new-tokens 48
    python experiments/bench_verifiers.py --smoke --out /tmp/verif-smoke      # tiny random models, seconds
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from treespec.bench import intervals
from treespec.calibrate.vectors import default_acceptance
from treespec.recipes import Recipe, plan
from treespec.recipes import run as run_recipe
from treespec.common.jsonl import append_record, read_records, repair_tail
from treespec.core.verifiers import NotExactError

RESULTS = "results.jsonl"
SEQUOIA = dict(tree="sequoia", budget=18, depth=8, max_width=2)  # the fastest CPU tree (cpu-speed README)


@dataclass(frozen=True)
class Setup:
    """A tree construction: the recipe's settings (temperature and acceptance added per run), the
    verifiers exact for it, ``rrs`` last (the reference of the paired ratios), and the draft's
    precision when it must differ from ``--draft-dtype``.

    The i.i.d. constructions draft in float32: K-SEQ needs every draw at a node to come from one
    ``q``, and when two i.i.d. siblings coincide the drafter computes the next level's ``q`` once per
    copy; with the int8 draft the copies' rows differ by up to 0.02 (measured), so ``spectr`` is
    refused (``NotExactError``), while in float32 they agree to about 1e-6.
    """

    recipe: dict[str, Any]
    verifiers: tuple[str, ...]
    about: str
    draft_dtype: str | None = None


CONSTRUCTIONS = {
    "chain": Setup(dict(tree="chain", budget=8), ("block", "traversal", "rrs"),
                   "one sampled chain of 7 drafted tokens"),
    "sequoia": Setup(SEQUOIA, ("traversal", "rrs"),
                     "Sequoia tree (budget 18, depth <= 8, <= 2 children per node), drawn without replacement"),
    "iid-kary": Setup(dict(tree="kary", budget=15, kary_width=2, draft_mode="sample"), ("spectr", "traversal", "rrs"),
                      "binary tree of depth 3 (budget 15), 2 i.i.d. draws at every node, duplicates kept; "
                      "float32 draft", "float32"),
    "iid-chains": Setup(dict(tree="chains", budget=9, chains=2), ("spectr", "traversal", "rrs"),
                        "SpecInfer's 2 independent i.i.d. chains of 4 tokens; float32 draft", "float32"),
}
DEFAULT_CONSTRUCTIONS = ("chain", "sequoia@1.0,0.6", "iid-kary")


def parse_constructions(items: Sequence[str], temperatures: Sequence[float]) -> list[tuple[str, float]]:
    """``NAME`` (every ``--temperatures``) or ``NAME@T1,T2`` -> ``[(name, temperature), ...]``."""
    jobs = []
    for item in items:
        name, _, temps = item.partition("@")
        if name not in CONSTRUCTIONS:
            raise SystemExit(f"unknown construction {name!r} in {item!r}; choose from {', '.join(CONSTRUCTIONS)}")
        try:
            ts = [float(t) for t in temps.split(",")] if temps else list(temperatures)
        except ValueError:
            raise SystemExit(f"bad temperatures in {item!r}: write NAME@T1,T2 (e.g. sequoia@1.0,0.6)") from None
        if any(t <= 0 for t in ts):
            raise SystemExit(f"{item!r}: the verifiers differ only when sampling; temperatures must be > 0")
        jobs += [(name, t) for t in ts if (name, t) not in jobs]
    return jobs


def prompt_seed(dataset: str, index: int) -> int:
    """The per-prompt seed shared by every verifier (hashed, not consecutive: docs/design.md)."""
    return int(hashlib.sha256(f"{dataset}/{index}".encode()).hexdigest()[:15], 16)


def recipe_for(name: str, temperature: float, acceptance: list[float]) -> Recipe:
    settings = dict(CONSTRUCTIONS[name].recipe, temperature=temperature)
    if settings["tree"] == "sequoia":
        settings["acceptance"] = acceptance
    return Recipe(**settings)


def run_one(target: torch.nn.Module, draft: torch.nn.Module, recipe: Recipe, ids: list[int], n: int,
            verifier: str, seed: int) -> dict[str, Any]:
    """One generation; a tree the verifier is not exact for ends the run as ``{"refused": why}``."""
    try:
        out = run_recipe(replace(recipe, verifier=verifier), target, [draft], ids, max_new_tokens=n, seed=seed)
    except NotExactError as error:
        return {"refused": str(error)}
    return {**out.stats.record(), "output": out.new_tokens}


def run(target: torch.nn.Module, drafts: Callable[[str], torch.nn.Module],
        prompts: Sequence[tuple[str, int, list[int]]], jobs: Sequence[tuple[str, float]], acceptance: list[float],
        max_new_tokens: int, results: Path, log=print) -> list[dict[str, Any]]:
    """Every (construction, temperature) job's verifiers on every prompt, interleaved per prompt;
    one record appended per run, finished runs (same key) skipped. ``drafts(construction)``: its draft."""
    results.parent.mkdir(parents=True, exist_ok=True)
    repair_tail(results)
    done = {(r["construction"], r["temperature"], r["dataset"], r["prompt"], r["verifier"])
            for r in read_records(results)}
    todo = [(d, i, ids, c, t, v) for d, i, ids in prompts for c, t in jobs
            for v in np.roll(CONSTRUCTIONS[c].verifiers, -i).tolist()  # rotate the order per prompt
            if (c, t, d, i, v) not in done]
    if todo:  # warm-up, not recorded: first calls pay one-off allocations and kernel setup
        for c, t in jobs:
            run_one(target, drafts(c), recipe_for(c, t, acceptance), prompts[0][2], 4, "rrs", 0)
    for dataset, index, ids, c, t, v in todo:
        recipe = recipe_for(c, t, acceptance)
        seed = prompt_seed(dataset, index)
        record = {"construction": c, "temperature": t, "dataset": dataset, "prompt": index, "verifier": v,
                  "seed": seed, "budget": recipe.budget, "max_new_tokens": max_new_tokens,
                  "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  **run_one(target, drafts(c), recipe, ids, max_new_tokens, v, seed)}
        append_record(results, record)
        log(f"  {c} T={t} {dataset}/{index} {v}: " + (f"REFUSED {record['refused']}" if "refused" in record else
            f"tau {record['tau']:.2f}, {record['tokens_per_second']:.2f} tok/s"))
    return read_records(results)


# ---------------------------------------------------------------------------------------------
# Summary


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (construction, temperature, dataset): per verifier tau and tok/s, and the ratios over
    ``rrs`` paired per prompt, over the prompts every verifier of the group finished (a run refused
    with ``NotExactError`` removes its prompt from the group; ``refused`` counts them).

    A prompt's cost is counted per generated token (steps / token, seconds / token), so the ratio
    ``sum_i cost_rrs(i) / sum_i cost_v(i)`` is the ratio of tau (of tok/s) when every run generates
    the same number of tokens, and stays a fair pairing if one stops early at an end-of-sequence."""
    groups: dict[tuple, dict[str, dict[int, dict]]] = {}
    refused: dict[tuple, int] = {}
    for r in records:
        if "refused" in r:
            key = (r["construction"], r["temperature"], r["dataset"])
            refused[key] = refused.get(key, 0) + 1
            continue
        groups.setdefault((r["construction"], r["temperature"], r["dataset"]), {}) \
            .setdefault(r["verifier"], {})[r["prompt"]] = r
    out = []
    for (c, t, d), by_v in sorted(groups.items(), key=lambda kv: (list(CONSTRUCTIONS).index(kv[0][0]),
                                                                  -kv[0][1], kv[0][2])):
        names = [v for v in CONSTRUCTIONS[c].verifiers if v in by_v]
        prompts = sorted(set.intersection(*(set(by_v[v]) for v in names)))
        if not prompts:
            continue
        rows = {v: [by_v[v][p] for p in prompts] for v in names}
        entry: dict[str, Any] = {"construction": c, "temperature": t, "dataset": d, "prompts": prompts,
                                 "refused_runs": refused.get((c, t, d), 0), "verifiers": {}}
        for v in names:
            tok = [r["new_tokens"] for r in rows[v]]
            e = {"tau": intervals.ratio_of_sums(tok, [r["steps"] for r in rows[v]]).as_dict(),
                 "tau_uncut_mean": float(np.mean([r["tau_uncut"] for r in rows[v]])),
                 "tokens_per_second": intervals.ratio_of_sums(tok, [r["seconds"] for r in rows[v]]).as_dict()}
            if v != "rrs" and "rrs" in rows:
                e["vs_rrs"] = {}
                for what, cost in (("tau_ratio", "steps"), ("speed_ratio", "seconds")):
                    ref = [r[cost] / r["new_tokens"] for r in rows["rrs"]]
                    mine = [r[cost] / r["new_tokens"] for r in rows[v]]
                    per_prompt = np.asarray(ref) / np.asarray(mine)
                    e["vs_rrs"][what] = {**intervals.ratio_of_sums(ref, mine).as_dict(),
                                         "per_prompt_min": float(per_prompt.min()),
                                         "per_prompt_median": float(np.median(per_prompt)),
                                         "per_prompt_max": float(per_prompt.max()),
                                         "prompts_better": int((per_prompt > 1).sum())}
            entry["verifiers"][v] = e
        out.append(entry)
    return out


def _iv(d: dict[str, float], digits: int = 2) -> str:
    return intervals.Interval(d["estimate"], d["low"], d["high"], d["confidence"], d["n"]).fmt(digits)


def markdown(summaries: Sequence[dict[str, Any]]) -> str:
    """One table: a row per (construction, T, dataset, verifier)."""
    lines = ["| construction | T | dataset | prompts (refused runs) | verifier | tau [95% CI] | tok/s [95% CI] "
             "| tau / rrs [95% CI] | per-prompt tau / rrs (min, median, max; better) | tok/s / rrs [95% CI] |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        for v, e in s["verifiers"].items():
            gain = e.get("vs_rrs")
            tr = gain["tau_ratio"] if gain else None
            spread = (f"{tr['per_prompt_min']:.2f}, {tr['per_prompt_median']:.2f}, {tr['per_prompt_max']:.2f}; "
                      f"{tr['prompts_better']}/{len(s['prompts'])}") if gain else "-"
            n = f"{len(s['prompts'])}" + (f" ({s['refused_runs']})" if s["refused_runs"] else "")
            lines.append(f"| {s['construction']} | {s['temperature']:g} | {s['dataset']} | {n} | {v} "
                         f"| {_iv(e['tau'])} | {_iv(e['tokens_per_second'])} "
                         f"| {_iv(tr, 3) + 'x' if gain else '-'} | {spread} "
                         f"| {_iv(gain['speed_ratio'], 3) + 'x' if gain else '-'} |")
    return "\n".join(lines)


def plot(summaries: Sequence[dict[str, Any]], path: Path) -> None:
    """Tau and tok/s ratios over rrs (95% CI) per construction / T / dataset, one bar per verifier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{s['construction']}\nT={s['temperature']:g}\n{s['dataset']}", v, e["vs_rrs"])
            for s in summaries for v, e in s["verifiers"].items() if "vs_rrs" in e]
    if not bars:
        return
    colors = {"block": "#2ca02c", "traversal": "#1f77b4", "spectr": "#ff7f0e"}
    fig, axes = plt.subplots(2, 1, figsize=(max(6.0, 0.55 * len(bars) + 2), 7), sharex=True)
    for ax, what, label in zip(axes, ("tau_ratio", "speed_ratio"), ("tau / tau(rrs)", "tok/s / tok/s(rrs)")):
        est = np.array([g[what]["estimate"] for _, _, g in bars])
        low = np.array([g[what]["low"] for _, _, g in bars])
        high = np.array([g[what]["high"] for _, _, g in bars])
        err = np.nan_to_num(np.vstack([est - low, high - est]), nan=0.0)
        ax.bar(range(len(bars)), est - 1, bottom=1, yerr=err, capsize=3,
               color=[colors.get(v, "#999") for _, v, _ in bars])
        ax.axhline(1, color="k", lw=0.8)
        ax.set_ylabel(f"{label}\n(paired, 95% CI over prompts)")
    handles = [matplotlib.patches.Patch(color=c, label=v) for v, c in colors.items() if any(b[1] == v for b in bars)]
    axes[0].legend(handles=handles, fontsize=8)
    axes[0].set_title("Each exact verifier over rrs (same prompts, seeds and first tree per prompt)")
    axes[1].set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Models and prompts


def real_models(target_dtype: str, draft_dtype: str, jobs: Sequence[tuple[str, float]]
                ) -> tuple[torch.nn.Module, Callable[[str], torch.nn.Module], Any]:
    """The target, each construction's draft (one load per precision) and the tokenizer."""
    from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load

    target, tok = load(DEFAULT_TARGET, dtype=target_dtype, role="target")
    dtypes = {c: CONSTRUCTIONS[c].draft_dtype or draft_dtype for c, _ in jobs}
    loaded = {dt: load(DEFAULT_DRAFT, dtype=dt, role="draft")[0] for dt in dict.fromkeys(dtypes.values())}
    return target, lambda c: loaded[dtypes[c]], tok


def smoke_models() -> tuple[torch.nn.Module, torch.nn.Module]:
    from treespec.models.tiny import perturbed_copy, tiny_model

    target = tiny_model("qwen2", vocab=64, seed=3, scale=2.0)
    return target, perturbed_copy(target, 0.5)


def real_prompts(tok: Any, datasets: Sequence[str], starts: dict[str, int], n: int) -> list[tuple[str, int, list[int]]]:
    from treespec.bench.datasets import dataset_prompts

    for d in datasets:
        if starts[d] + n > len(dataset_prompts(d)):
            raise SystemExit(f"{d} has {len(dataset_prompts(d))} prompts; --prompts {n} from {starts[d]} "
                             "runs past the end")
    # datasets alternate (a run stopped early keeps both datasets)
    return [(d, starts[d] + k, tok(dataset_prompts(d)[starts[d] + k])["input_ids"]) for k in range(n) for d in datasets]


def smoke_prompts(datasets: Sequence[str], starts: dict[str, int], n: int) -> list[tuple[str, int, list[int]]]:
    """Random 8-token prompts standing in for each dataset's (tiny models have no tokenizer)."""
    return [(d, starts[d] + k, torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(
        prompt_seed(d, starts[d] + k) % 2**31)).tolist()) for k in range(n) for d in datasets]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/verifiers"), help="results directory")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per dataset")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0],
                    help="temperatures for the constructions named without @T")
    ap.add_argument("--constructions", nargs="+", default=list(DEFAULT_CONSTRUCTIONS), metavar="NAME[@T1,T2]",
                    help=f"from {', '.join(CONSTRUCTIONS)}; NAME@T1,T2 runs it at those temperatures")
    ap.add_argument("--datasets", nargs="+", default=["humaneval", "lee-news"], choices=["humaneval", "lee-news"])
    ap.add_argument("--humaneval-start", type=int, default=100,
                    help="first HumanEval prompt (0-99 calibrated the shipped acceptance vectors)")
    ap.add_argument("--lee-news-start", type=int, default=0, help="first lee-news lead")
    ap.add_argument("--target-dtype", default="bfloat16")
    ap.add_argument("--draft-dtype", default="int8")
    ap.add_argument("--summarize-only", action="store_true",
                    help="no new runs: summarise the records already in --out (after a stopped run)")
    ap.add_argument("--smoke", action="store_true", help="tiny random models and prompts: checks the script runs")
    args = ap.parse_args(argv)
    if args.prompts < 1 or args.max_new_tokens < 1:
        raise SystemExit("--prompts and --max-new-tokens must be >= 1")
    jobs = parse_constructions(args.constructions, args.temperatures)
    starts = {"humaneval": args.humaneval_start, "lee-news": args.lee_news_start}
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    if args.summarize_only:
        pass
    elif args.smoke:
        target, draft = smoke_models()
        drafts = lambda c: draft  # noqa: E731
        prompts = smoke_prompts(args.datasets, starts, args.prompts)
    else:
        target, drafts, tok = real_models(args.target_dtype, args.draft_dtype, jobs)
        prompts = real_prompts(tok, args.datasets, starts, args.prompts)
    acceptance = default_acceptance(None, 1.0)
    records = read_records(args.out / RESULTS) if args.summarize_only else \
        run(target, drafts, prompts, jobs, acceptance, args.max_new_tokens, args.out / RESULTS,
            log=lambda s: print(s, flush=True))
    summaries = summarize(records)
    table = markdown(summaries)
    print(table)

    from treespec.common.machine import cpu_model

    settings = {
        "target": "tiny qwen2 (random)" if args.smoke else f"qwen2.5-coder-1.5b-instruct ({args.target_dtype})",
        "draft": "perturbed copy of the target" if args.smoke else f"qwen2.5-coder-0.5b-instruct ({args.draft_dtype}; "
                 "float32 for the i.i.d. constructions)",
        "max_new_tokens": args.max_new_tokens, "prompts_per_dataset": args.prompts,
        "prompts": {d: f"{starts[d]}..{starts[d] + args.prompts - 1}" for d in args.datasets},
        "jobs": [f"{c}@T={t:g}" for c, t in jobs], "top_k": 0, "top_p": 1.0, "eos": "none (every run generates "
        "max_new_tokens)", "sequoia_acceptance": "treespec/data/acceptance-qwen2.5-coder-t1.json (HumanEval 0-5)",
        "constructions": {c: {"about": CONSTRUCTIONS[c].about, "verifiers": list(CONSTRUCTIONS[c].verifiers),
                              "tree_paths": list(map(list, plan(recipe_for(c, 1.0, acceptance)).shape.paths))}
                          for c in dict.fromkeys(c for c, _ in jobs)},
    }
    machine = {"cpu": cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    command = shlex.join(["python", "experiments/bench_verifiers.py", *argv])
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    (args.out / "summary.json").write_text(json.dumps(
        {"machine": machine, "command": command, "date": date, "settings": settings, "smoke": args.smoke,
         "summaries": summaries}, indent=1))
    plot(summaries, args.out / "gain_over_rrs.png")
    about = "\n".join(f"* `{c}`: {CONSTRUCTIONS[c].about}; verifiers {', '.join(CONSTRUCTIONS[c].verifiers)}"
                      for c in settings["constructions"])
    (args.out / "README.md").write_text(
        "# Exact verifiers side by side (same prompts, seeds and first tree)"
        f"{' (SMOKE: tiny random models)' if args.smoke else ''}\n\n"
        f"Machine: {machine['cpu']}, {machine['threads']} torch threads, torch {machine['torch']}. Date: {date}.\n\n"
        f"Command: `{command}`\n\n"
        f"Target {settings['target']}, draft {settings['draft']}; {args.max_new_tokens} sampled tokens per run "
        f"(no end-of-sequence stop), top-k/top-p off. Prompts: "
        + ", ".join(f"{d} {r}" for d, r in settings["prompts"].items())
        + ". Every verifier of a construction runs on the same prompts with the same per-prompt seed "
        "(so the same first tree), interleaved per prompt in a rotating order.\n\n"
        f"Constructions:\n\n{about}\n\n"
        "tau = generated tokens / steps; tok/s = generated tokens / wall seconds (prefill included); "
        "intervals are 95% BCa bootstrap over prompts (`treespec.bench.intervals`), the ratios over rrs paired "
        "per prompt (each prompt's steps and seconds per token). Per-prompt column: the smallest, median "
        "and largest per-prompt tau ratio, and on how many prompts it exceeds 1.\n\n"
        f"{table}\n\n![gain over rrs](gain_over_rrs.png)\n")
    return summaries


if __name__ == "__main__":
    main()
