"""``treespec demo``: the main job on the default pair, treespec beside the target alone.

Loads the built-in Qwen2.5-Coder pair (1.5B target, 0.5B draft) in the precisions measured fastest
here, measures this machine's forward latencies (``treespec.calibrate.tuning``; cached), sizes a Sequoia tree
for them from the shipped acceptance, then decodes a few HumanEval evaluation prompts (100
onwards: disjoint from the calibration prompts) greedily with the target alone (HF ``generate`` in
float32 and in the target's precision) and with treespec, interleaved per prompt
(``treespec.bench.compare``), and reports the speedup over the fastest with its interval.
"""

from __future__ import annotations

import argparse
import json
import platform
from typing import Any

import torch

from ..calibrate.vectors import default_acceptance
from ..common.files import check_writable
from ..models.precision import precision_of
from ..recipes import Recipe, run
from ..calibrate.choices import resolve, resolve_compile
from . import compare
from .datasets import humaneval_prompts


def predicted_and_measured(choice: Any, records: list[dict[str, Any]], target_alone: str) -> str:
    """A markdown table of the tuner's prediction beside the demo's measurement: tokens per step, seconds
    per step, and the speedup over the target alone with each prompt's prefill charged to both sides
    (the treespec runs' mean prefill; plain decoding costs ``choice.plain_seconds`` per token in the
    prediction and is ``target_alone``, HF ``generate`` in the target's precision, in the measurement)."""
    mine = [r for r in records if r["method"] == "treespec"]
    alone = [r for r in records if r["method"] == target_alone]
    if not mine or not alone:
        return ""
    steps = sum(r["steps"] for r in mine)
    step_seconds = sum(r["drafting_seconds"] + r["verifying_seconds"] + r["engine_seconds"] for r in mine) / steps
    tokens = sum(r["tokens"] for r in mine) / len(mine)  # per prompt
    prefill = sum(r["prefill_seconds"] for r in mine) / len(mine)
    predicted_run = (prefill + tokens * choice.plain_seconds) / (prefill + tokens / choice.tau * choice.step_seconds)
    measured_run = (sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)) / (
        sum(r["tokens"] for r in alone) / sum(r["seconds"] for r in alone))
    rows = [("tokens per step (tau)", f"{choice.tau:.2f}", f"{sum(r['tokens'] for r in mine) / steps:.2f}"),
            ("seconds per step", f"{choice.step_seconds:.3f}", f"{step_seconds:.3f}"),
            (f"speedup over the target alone, {prefill:.2f} s of prefill per prompt charged to both",
             f"{predicted_run:.2f}x", f"{measured_run:.2f}x")]
    return "\n".join(["| | predicted | measured |", "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)])


def run_demo(args: argparse.Namespace, target: torch.nn.Module, tok: Any, draft: torch.nn.Module) -> int:
    """The demo on a loaded pair (``args``: ``out``, ``prompts``, ``max_new_tokens``, ``device``,
    ``target`` for the float32 baseline); returns 0 when every greedy output equals HF's."""
    out_dir = check_writable(args.out, directory=True)
    print(f"treespec demo on {platform.machine()} with {torch.get_num_threads()} threads, device {args.device}")
    print("measuring forward latencies on this machine (cached after the first run) ...", flush=True)
    acceptance = default_acceptance(None, 0.0)
    resolved = resolve(Recipe(tree="sequoia", acceptance=acceptance), target, [draft], tokenizer=tok,
                       max_new_tokens=args.max_new_tokens)
    resolved = resolve_compile(resolved, target, [draft], tok, prompts=args.prompts, max_new_tokens=args.max_new_tokens)
    recipe, tuned = resolved.recipe, resolved.tuned
    prof, choice = tuned.profile, tuned.choice
    t1 = prof.target_latency[1]
    levels = ", ".join(f"{w} tokens {s:.3f} s" for w, s in sorted((prof.draft_level_latency or {}).items()))
    print(f"  target forward: {t1:.3f} s for 1 token, {prof.target_latency[16]:.3f} s for 16; "
          f"draft level: {levels} (c = {choice.c:.2f})")
    print(f"  chosen: {resolved.why}")
    png = out_dir / "tree.png"
    choice.shape.draw(str(png), acceptance=acceptance, title=f"treespec demo tree (budget {choice.shape.size})")
    print(f"  tree drawn to {png}\n{choice.shape}")

    methods = [compare.hf_method(target)]
    if precision_of(target) != "float32":  # the sceptic's baseline: the target alone in float32 too
        from ..models import load

        methods.insert(0, compare.hf_method(load(args.target, device=args.device, dtype="float32")[0]))
    methods.append(compare.treespec_method(lambda ids, n: run(recipe, target, [draft], ids, max_new_tokens=n),
                                           precision_of(target)))
    prompts = [("humaneval", 100 + i, tok(text)["input_ids"])
               for i, text in enumerate(humaneval_prompts(100, 100 + args.prompts))]
    results = out_dir / "results.jsonl"
    results.unlink(missing_ok=True)  # the demo measures afresh each run
    records = compare.run(methods, prompts, args.max_new_tokens, results, on_record=lambda r: print(
        f"  HumanEval/{r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s"
        + (f", tau {r['tau']:.2f}" if "tau" in r else ""), flush=True))
    summary = compare.summarize(records, "humaneval")
    agreement = summary.get("agreement", {}).get("treespec", {"identical": 0, "of": 0})
    all_same = agreement["identical"] == agreement["of"] == len(prompts)
    headline = summary["headline"]["treespec"]
    report = compare.markdown(summary)
    versus = predicted_and_measured(choice, records, compare.hf_method(target).name)
    if versus:
        stop = ("" if recipe.min_confidence is None else f" (the prediction drafts every level; the run stops drafting "
                f"below confidence {recipe.min_confidence}, which drafts fewer)")
        report += f"\n\nThe tuner's prediction beside this run{stop}:\n\n{versus}"
    print("\n" + report)
    print(f"\nspeedup over the fastest HF generate ({summary['fastest_baseline']}): {compare.fmt(headline)}x")
    (out_dir / "report.md").write_text(
        f"# treespec demo\n\nMachine: {platform.platform()}, {torch.get_num_threads()} threads, {args.device}.\n"
        f"Configuration, chosen from measured latencies: {resolved.why}.\n{args.max_new_tokens} greedy tokens per "
        f"prompt.\n\n{report}\n\nspeedup over the fastest HF generate: {compare.fmt(headline)}x\n")
    (out_dir / "report.json").write_text(json.dumps({"summary": summary, "choice": choice.as_dict(),
                                                     "profile": prof.to_dict()}, indent=1))
    print(f"\nreport written to {out_dir / 'report.md'}; tree picture {png}")
    return 0 if all_same else 1
