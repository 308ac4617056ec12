"""Benchmark arms that each run in a process of their own (``experiments/bench_freezing.py``,
``experiments/bench_ngram_chain.py``): a compiled pair holds its weights as constants of its frozen graphs, and
two of them do not share a process well in 24 GiB. The driver runs the script once per arm (``--arm``), each arm
resuming from its own results file, then writes the report."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..calibrate.choices import resolve
from ..common.machine import machine
from ..models import DEFAULT_DRAFT, DEFAULT_TARGET, cache_root, load
from ..models.precision import precision_of
from ..recipes import Recipe, run
from . import compare, intervals
from .datasets import dataset_prompts, prompt_range


def main(script: str, doc: str, arms: Sequence[str], default_out: str, default_prompts: str,
         run_arm: Callable[[str, argparse.Namespace], None], report: Callable[[argparse.Namespace], dict],
         argv: list[str] | None = None) -> dict | None:
    """The command line of such a script: ``--arm`` runs one arm in this process; otherwise every arm of
    ``--arms`` in its own process, in order, then ``report``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(default_out))
    ap.add_argument("--humaneval", default=default_prompts, metavar="A:B", help="HumanEval problems A..B-1")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--arm", choices=arms, default=None, help="run one arm in this process (the driver's call)")
    ap.add_argument("--arms", choices=arms, nargs="+", default=list(arms),
                    help="the arms the driver runs, in order (each resumes from its own results file)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.arm:
        run_arm(args.arm, args)
        return None
    for arm in args.arms:
        subprocess.run([sys.executable, script, "--arm", arm, "--out", str(args.out), "--humaneval", args.humaneval,
                        "--max-new-tokens", str(args.max_new_tokens)], check=True)
    return report(args)


def summarized(out: Path, arms: Sequence[str]) -> tuple[list[dict], dict]:
    """Every arm's records (``results-<arm>.jsonl`` under ``out``) and their ``compare.summarize`` (HumanEval)."""
    files = [out / f"results-{arm}.jsonl" for arm in arms]
    records = [r for f in files for r in compare.read_records(f)]
    return records, compare.summarize(records, "humaneval", {k: v for f in files
                                                             for k, v in compare.warmup_seconds(f).items()})


def table(records: list[dict], summary: dict, step: bool = False) -> list[str]:
    """The arms' table (tok/s, tau, warm-up seconds; ``step``: the step each ran) and the paired speedups."""
    steps = {r["method"]: r.get("step") for r in records}
    head = "| arm | step |" if step else "| arm |"
    lines = [f"{head} tok/s [95% CI] | tau | warm-up call s (compiles) |", "|---" * (4 + step) + "|"]
    for name, m in summary["methods"].items():
        lines.append(f"| {name} |{f' {steps.get(name)} |' if step else ''} {compare.fmt(m['tokens_per_second'])} | "
                     f"{compare.fmt(m.get('tau'))} | {m.get('warmup_seconds', float('nan')):.0f} |")
    lines += ["", "| paired per prompt | ratio [95% CI] |", "|---|---|"]
    return lines + [f"| {k} | {compare.fmt(v)}x |" for k, v in summary["speedups"].items()]


def paired(records: list[dict], summary: dict, a: str, b: str) -> list[str]:
    """Arm ``a`` over arm ``b`` paired per prompt (two speculative arms: not among ``summarize``'s pairs), added to
    ``summary``; the table's row, or none when no prompt has both."""
    by = {(r["method"], r["prompt"]): r for r in records}
    both = [p for p in summary["prompts"] if (a, p) in by and (b, p) in by]
    if not both:
        return []
    ratio = intervals.ratio_of_sums([by[b, p]["seconds"] for p in both], [by[a, p]["seconds"] for p in both])
    summary["speedups"][f"{a} vs {b}"] = ratio.as_dict()
    return [f"| {a} vs {b} | {compare.fmt(ratio.as_dict())}x |"]


def report(args: argparse.Namespace, arms: Sequence[str], script: str, title: str, setting: str,
           pair: tuple[str, str], step: bool = False) -> dict:
    """The arms' report (``README.md``) and ``summary.json`` under ``args.out``, printed: ``title`` on this CPU, the
    command (``script``) and its ``setting``, the arms' :func:`table` and the two speculative arms ``pair`` paired."""
    records, summary = summarized(args.out, arms)
    lines = [f"# {title} on this CPU ({machine('cpu')}, torch {torch.__version__})", "",
             f"Command: `python {script} --out {args.out}` (HumanEval {args.humaneval}, {args.max_new_tokens} greedy "
             f"tokens, {setting}).", ""]
    lines += table(records, summary, step) + paired(records, summary, *pair)
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n".join(lines))
    return summary


def run_recipe(args: argparse.Namespace, arm: str, recipe: Recipe, name: str, baseline: bool,
               target_dtype: str = "auto") -> None:
    """One arm: the default pair (the draft loaded for compiled steps), ``recipe`` resolved on this machine, its
    warm-up call, then every HumanEval prompt of ``args.humaneval`` not yet in ``results-<arm>.jsonl``."""
    target, tok = load(DEFAULT_TARGET, dtype=target_dtype, role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft", traceable=True)
    resolved = resolve(recipe, target, [draft], cache_file=cache_root() / "profiles.json")
    print(f"{arm}: {resolved.why}", flush=True)
    method = compare.treespec_method(lambda ids, n: run(resolved.recipe, target, [draft], ids, max_new_tokens=n),
                                     precision_of(target), name=name)
    method.baseline = baseline  # the summary's speedups are over the baseline arm
    texts = dataset_prompts("humaneval")
    a, b = prompt_range(args.humaneval, len(texts), "humaneval")
    prompts = [("humaneval", i, tok(texts[i])["input_ids"]) for i in range(a, b)]
    compare.run([method], prompts, args.max_new_tokens, args.out / f"results-{arm}.jsonl",
                on_record=lambda r: print(f"  {r['prompt']} {r['method']} ({r.get('step')}): "
                                          f"{r['tokens_per_second']:.2f} tok/s", flush=True))
