"""treespec on a batch of prompts against HF ``generate`` on the same batch, on this machine.

The real Qwen2.5-Coder pair (1.5B target, 0.5B draft, the precisions ``treespec generate`` picks), greedy,
HumanEval 100+ (code) and lee-news leads (prose), ``--max-new-tokens`` each. For each batch size B the prompts
go in groups of B (a group: B prompts of one dataset); per group, in turn (interleaved, so a drift in the
machine's speed hits every method alike):

* ``hf``: HF ``generate`` on the batch, eager (left-padded, masked: HF's way);
* ``hf-static-compiled``: the same with a static cache and ``torch.compile`` (inductor's weight freezing on a
  CPU): HF's fastest plain decoding. Its compile runs in a warm-up call per batch size, apart;
* ``hf-assisted``: HF assisted generation with the same draft, at B = 1 only (HF's assisted generation
  takes one prompt), in its setting fastest on one prompt of each set outside the measured ones
  (``compare.fastest_assisted_method``: HF's default or a constant number of drafted tokens; cached in ``--out``);
* ``treespec``: ``treespec.run`` on the batch (the eager batched step, ``treespec.core.batch``; the tree the
  default recipe tunes here for that batch size, as ``treespec generate --batch-size B`` does:
  ``choices.resolve_run``, ``Profile.for_batch``);
* ``treespec-compiled`` (``--compile``): the same tree through the captured batched step
  (``treespec.core.captured.BatchCapturedStep``); its compiles run in a warm-up on the first group's prompts,
  apart (``warmups.jsonl`` keeps every method's warm-up seconds).

Tokens per second: every row's tokens over the group's seconds; speedups paired per group (ratio of sums,
bootstrap 95% intervals over groups). Each method's greedy rows are compared with treespec's (same
precision: bf16 near-ties may differ). Records are appended as they finish; a re-run resumes (a batch size
whose treespec records ran another tree, or whose HF assisted records another setting, runs again, every method,
so that its methods stay interleaved: ``current_records``).

    python experiments/bench_batch.py --out experiments/results/batch-cpu
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from treespec.bench import compare, intervals
from treespec.bench.baselines import fastest_compile_settings, hf_generate
from treespec.bench.datasets import dataset_prompts
from treespec.common.jsonl import append_record, read_records, repair_tail
from treespec.calibrate.choices import resolve_run
from treespec.calibrate.vectors import default_acceptance
from treespec.common.machine import cpu_model
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.recipes import Recipe, run

Batch = list[list[int]]
#: where HF assisted's settings are timed (the prompt just before each set's measured ones, or just after)
OUTSIDE = "one prompt of each set outside the measured ones"
#: method name -> run(batch, new tokens) -> (new tokens per row, seconds)
Methods = dict[str, Callable[[Batch, int], tuple[Batch, float]]]


def methods_for(target: torch.nn.Module, draft: torch.nn.Module, recipe: Recipe, batch_size: int,
                compiled: bool = False, assisted_method: compare.Method | None = None) -> Methods:
    """The methods timed at ``batch_size``; ``assisted_method``: HF assisted generation in its fastest setting
    (:func:`treespec.bench.compare.fastest_assisted_method`), run at B = 1 (HF's default setting where not given)."""
    one = assisted_method or compare.hf_assisted_method(target, draft)

    def hf(batch: Batch, n: int) -> tuple[Batch, float]:
        return hf_generate(target, batch, n)  # type: ignore[return-value]

    def hf_compiled(batch: Batch, n: int) -> tuple[Batch, float]:
        with fastest_compile_settings():
            return hf_generate(target, batch, n, static_compiled=True)  # type: ignore[return-value]

    def assisted(batch: Batch, n: int) -> tuple[Batch, float]:
        tokens, seconds, _ = one.run(batch[0], n)
        return [tokens], seconds

    def treespec_run(recipe: Recipe, batch: Batch, n: int) -> tuple[Batch, float]:
        t = time.perf_counter()
        out = run(recipe, target, [draft], batch, max_new_tokens=n)
        return [row.new_tokens for row in out.rows], time.perf_counter() - t

    methods: Methods = {"hf": hf, "hf-static-compiled": hf_compiled}
    if batch_size == 1:
        methods["hf-assisted"] = assisted
    methods["treespec"] = lambda batch, n: treespec_run(recipe, batch, n)
    if compiled:
        methods["treespec-compiled"] = lambda batch, n: treespec_run(replace(recipe, compile=True), batch, n)
    return methods


def tree_of(recipe: Recipe) -> str:
    """The tree a treespec record ran (its recipe's budget and depth)."""
    return f"budget {recipe.budget}, depth {recipe.depth}"


def made_as(trees: dict[int, str], setting: str | None, batch_size: int) -> dict[str, Any]:
    """What decides a record of ``batch_size`` besides its method: the tree treespec runs there (:func:`tree_of`) and
    HF assisted's ``setting`` (B = 1 only); every record keeps it."""
    return {"tree": trees[batch_size], "assisted_setting": setting if batch_size == 1 else None}


def current_records(records: list[dict[str, Any]], trees: dict[int, str], setting: str | None) -> list[dict[str, Any]]:
    """The records made as this run makes them (:func:`made_as`) at its batch sizes (``trees``), and those of other
    batch sizes. A batch size made otherwise runs again, every method, so that its methods stay interleaved.
    Records kept before ``made_as`` was: their batch size is current when its treespec records ran this tree and
    its HF assisted records this setting (one not recorded is not)."""
    def legacy_stale(r: dict[str, Any]) -> bool:
        if r["method"].startswith("treespec"):
            return r.get("tree") != trees[r["batch_size"]]
        return r["method"] == "hf-assisted" and r.get("assisted_setting") != setting

    stale = {r["batch_size"] for r in records if "made_as" not in r and r["batch_size"] in trees and legacy_stale(r)}
    return [r for r in records if r["batch_size"] not in trees
            or (r["made_as"] == made_as(trees, setting, r["batch_size"]) if "made_as" in r
                else r["batch_size"] not in stale)]


def _tree(record: dict[str, Any]) -> str | None:
    """The tree a treespec record ran (kept in ``made_as``; in ``tree`` by records made before it was)."""
    return record["made_as"]["tree"] if "made_as" in record else record.get("tree")


def summarize(records: list[dict[str, Any]], batch_size: int, dataset: str | None = None) -> dict[str, Any]:
    """Tok/s per method at ``batch_size`` (on ``dataset``, or all) and each treespec method's paired speedup over
    each HF method and the fastest."""
    mine = [r for r in records if r["batch_size"] == batch_size and dataset in (None, r["dataset"])]
    groups = sorted({(r["dataset"], r["group"]) for r in mine})
    by = {(r["dataset"], r["group"], r["method"]): r for r in mine}
    names = list(dict.fromkeys(r["method"] for r in mine))
    complete = [g for g in groups if all((*g, m) in by for m in names)]
    if not complete:
        return {"batch_size": batch_size, "dataset": dataset or "all", "groups": 0}
    tokens = {m: [sum(map(len, by[(*g, m)]["tokens"])) for g in complete] for m in names}
    seconds = {m: [by[(*g, m)]["seconds"] for g in complete] for m in names}
    tps = {m: sum(tokens[m]) / sum(seconds[m]) for m in names}
    ours = [m for m in names if m.startswith("treespec")]
    hf = [m for m in names if m not in ours]
    fastest = max(hf, key=tps.get)
    out: dict[str, Any] = {"batch_size": batch_size, "dataset": dataset or "all", "groups": len(complete),
                           "tokens_per_second": tps, "tree": _tree(by[(*complete[0], "treespec")]),
                           "fastest_hf": fastest, "speedup": {}, "greedy_rows_equal": {}}
    for t in ours:
        # same tokens per group (greedy, exactly n each): the ratio of seconds is the ratio of tok/s
        out["speedup"][t] = {m: intervals.ratio_of_sums(seconds[m], seconds[t]).as_dict() for m in names if m != t}
        out["greedy_rows_equal"][t] = {}
        for m in names:
            if m != t:
                rows = [(a, b) for g in complete for a, b in zip(by[(*g, m)]["tokens"], by[(*g, t)]["tokens"])]
                out["greedy_rows_equal"][t][m] = f"{sum(a == b for a, b in rows)}/{len(rows)}"
    out["speedup_over_fastest_hf"] = {t: out["speedup"][t][fastest] for t in ours}
    return out


def markdown(summaries: list[dict[str, Any]]) -> str:
    ours = list(dict.fromkeys(t for s in summaries if s.get("groups") for t in s["speedup"]))
    header = ("| batch | prompts | groups | HF eager tok/s | HF static+compile tok/s | HF assisted tok/s | "
              "treespec tree | "
              + " | ".join(f"{t} tok/s | {t} / fastest HF [95% CI]" for t in ours) + " |")
    lines = [header, "|" + "---|" * (7 + 2 * len(ours))]
    for s in summaries:
        if not s.get("groups"):
            continue
        t = s["tokens_per_second"]
        cells = [f"{t[m]:.2f}" if m in t else "n/a (one prompt only)"
                 for m in ("hf", "hf-static-compiled", "hf-assisted")]
        for m in ours:
            sp = s["speedup_over_fastest_hf"][m]
            cells += [f"{t[m]:.2f}", f"{sp['estimate']:.2f}x [{sp['low']:.2f}, {sp['high']:.2f}] vs {s['fastest_hf']}"]
        lines.append(f"| {s['batch_size']} | {s['dataset']} | {s['groups']} | {' | '.join(cells[:3])} | {s['tree']} | "
                     f"{' | '.join(cells[3:])} |")
    lines.append("\nGreedy rows equal to each treespec method's, per method: " + "; ".join(
        f"B={s['batch_size']} {s['dataset']} {t}: " + ", ".join(f"{m} {v}" for m, v in eq.items())
        for s in summaries if s.get("groups") for t, eq in s["greedy_rows_equal"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/batch-cpu"))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--prompts", type=int, default=4, help="prompts per dataset (a multiple of each batch size)")
    ap.add_argument("--datasets", nargs="+", default=["humaneval", "lee-news"])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--compile", action="store_true", help="add treespec's captured batched step (treespec-compiled)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    target, tok = load(DEFAULT_TARGET, dtype="auto", role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft")
    first = {"humaneval": 100, "lee-news": 0}
    prompts = {d: [tok(dataset_prompts(d)[first.get(d, 0) + i])["input_ids"] for i in range(args.prompts)]
               for d in args.datasets}
    every = [p for d in args.datasets for p in prompts[d]]
    # what `treespec generate --batch-size B --no-compile` runs on these prompts: the tree sized for B rows from the
    # shipped acceptance of the draft's precision, its tau predicted by the calibration walk replayed through it
    resolved = {b: resolve_run(Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0)), target, [draft], tok,
                               prompts=every,
                               max_new_tokens=args.max_new_tokens, batch_size=b, compile=False)
                for b in args.batch_sizes}
    for b, r in resolved.items():
        print(f"treespec configuration at B={b}:", r.why, flush=True)
    warm = [prompts[args.datasets[0]][0][:32]]
    assisted, choice = None, ""
    if 1 in args.batch_sizes:  # HF assisted in its fastest setting, timed on prompts apart from the measured ones
        search = [tok(dataset_prompts(d)[first[d] - 1 if first.get(d) else args.prompts])["input_ids"]
                  for d in args.datasets]
        assisted, speeds = compare.fastest_assisted_method(target, draft, search, args.max_new_tokens,
                                                           name="hf-assisted", cache=args.out / "assisted.search.json")
        choice = compare.assisted_choice(speeds, OUTSIDE, who="HF assisted (B = 1)", tokens=args.max_new_tokens)
        print(choice, flush=True)
    trees = {b: tree_of(r.recipe) for b, r in resolved.items()}
    setting = assisted.setting if assisted is not None else None
    done = set()
    if results.exists():
        repair_tail(results)
        done = {(r["batch_size"], r["dataset"], r["group"], r["method"])
                for r in current_records(read_records(results), trees, setting)}
    for b in args.batch_sizes:
        methods = methods_for(target, draft, resolved[b].recipe, b, compiled=args.compile, assisted_method=assisted)
        todo = {(b, d, g, m) for d in args.datasets for g in range(len(prompts[d]) // b) for m in methods} - done
        if not todo:
            continue  # resumed: this batch size is done
        for name, method in methods.items():  # warm-up (HF static+compile compiles here), not timed with the rest
            t = time.perf_counter()
            if name == "treespec-compiled":  # the captured step compiles every graph of the run's shapes here
                method(prompts[args.datasets[0]][:b], args.max_new_tokens)
            else:
                method(warm * b, 4)
            append_record(args.out / "warmups.jsonl", {"batch_size": b, "method": name,
                                                        "seconds": time.perf_counter() - t})
            print(f"B={b} {name}: warm-up {time.perf_counter() - t:.1f} s", flush=True)
        for d in args.datasets:
            for g in range(len(prompts[d]) // b):
                batch = prompts[d][g * b : (g + 1) * b]
                for name, method in methods.items():
                    if (b, d, g, name) in done:
                        continue
                    tokens, seconds = method(batch, args.max_new_tokens)
                    append_record(results, {"batch_size": b, "dataset": d, "group": g, "method": name,
                                            "tokens": tokens, "seconds": seconds,
                                            "made_as": made_as(trees, setting, b)})
                    print(f"B={b} {d}/{g} {name}: {sum(map(len, tokens)) / seconds:.2f} tok/s", flush=True)
    records = current_records(read_records(results), trees, setting)
    summaries = [summarize(records, b, d) for b in args.batch_sizes for d in [*args.datasets, None]]
    machine = (f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
               f"torch {torch.__version__}")
    result = {"machine": machine, "configuration": {b: r.why for b, r in resolved.items()}, "hf_assisted": choice,
              "max_new_tokens": args.max_new_tokens,
              "warmup_seconds": (read_records(args.out / "warmups.jsonl") if (args.out / "warmups.jsonl").exists()
                                 else []),
              "summaries": summaries}
    (args.out / "summary.json").write_text(json.dumps(result, indent=1))
    table = markdown(summaries)
    (args.out / "README.md").write_text(
        f"# treespec on a batch of prompts vs HF generate on the same batch, CPU\n\nMachine: {machine}.\n"
        "Configuration chosen by treespec here for each batch size (`resolve_run(batch_size=B)`):\n\n"
        + "".join(f"- B={b}: {r.why}\n" for b, r in resolved.items())
        + f"\n{args.max_new_tokens} greedy "
        f"tokens per prompt, {args.prompts} prompts per dataset ({', '.join(args.datasets)}), methods interleaved "
        f"per group of B prompts.{' ' + choice if choice else ''}\n"
        f"Command: `python experiments/bench_batch.py --out {args.out} --batch-sizes "
        f"{' '.join(map(str, args.batch_sizes))} --prompts {args.prompts} --max-new-tokens {args.max_new_tokens}"
        f"{' --compile' if args.compile else ''}`."
        f"\n\n{table}\n\nThe target runs in bfloat16 for every method: a greedy row that differs from HF's is a "
        f"bfloat16 rounding of a batched forward (padded rows, another token count) where the top two logits nearly "
        f"tie; this script does not locate them (float32 rows equal HF's and the prompt alone: tests/test_batch.py). "
        f"The tree is the one tuned for each batch size (on eager costs); `treespec` runs the eager batched step, "
        f"`treespec-compiled` the same tree through the captured batched step, its compiles in a warm-up apart "
        f"(`warmups.jsonl`: every method's warm-up seconds).\n")
    print(table)
    return result


if __name__ == "__main__":
    main()
