"""``treespec demo``: the main job on the default pair, treespec beside the target alone.

Loads the built-in Qwen2.5-Coder pair (1.5B target, 0.5B draft) in the precisions measured fastest
here, measures this machine's forward latencies (``treespec.calibrate.tuning``; cached), sizes a Sequoia tree
for them from the shipped acceptance vector, then decodes a few HumanEval evaluation prompts (100
onwards: disjoint from the calibration prompts) greedily with the target alone (HF ``generate`` in
float32 and in the target's precision) and with treespec, interleaved per prompt
(``treespec.bench.compare``), and reports the speedup over the fastest with its interval.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from . import compare
from ..core.checks import check_writable
from .datasets import humaneval_prompts
from ..models.precision import precision_of
from ..models.loading import cache_root
from ..recipes import build_drafters, default_acceptance, load_pair
from ..calibrate.tuning import tune


def load_models(args: argparse.Namespace):
    """The target, its tokenizer and the default draft (``--target``/``--draft``/``--device``/``--dtype``)."""
    from ..models.loading import DEFAULT_DRAFT

    return load_pair(args.target, (args.draft or [DEFAULT_DRAFT])[:1], device=args.device, target_dtype=args.dtype,
                     draft_dtype=args.draft_dtype)


def run_demo(args: argparse.Namespace) -> int:
    out_dir: Path = check_writable(args.out, directory=True)  # fail now, not after minutes of profiling
    print(f"treespec demo on {platform.machine()} with {torch.get_num_threads()} threads, device {args.device}")
    print("loading the target and the draft (the first run builds the model cache: a few minutes) ...", flush=True)
    target, tok, drafts = load_models(args)
    draft = drafts[0]

    print("measuring forward latencies on this machine (cached after the first run) ...", flush=True)
    vector = default_acceptance(None, 0.0)
    tuned = tune(target, draft, vector, cache_file=cache_root() / "profiles.json")
    prof, choice, recipe = tuned.profile, tuned.choice, tuned.recipe
    t1 = prof.target_latency[1]
    print(f"  target forward: {t1:.3f} s for 1 token, {prof.target_latency[16]:.3f} s for 16; "
          f"draft level: {prof.draft_level_seconds:.3f} s (c = {choice.c:.2f})")
    print(f"  chosen: {tuned.why}")
    png = out_dir / "tree.png"
    choice.shape.draw(str(png), acceptance=vector, title=f"treespec demo tree (budget {choice.shape.size})")
    print(f"  tree drawn to {png}\n{choice.shape}")

    methods = [compare.hf_method(target)]
    if precision_of(target) != "float32":  # the sceptic's baseline: the target alone in float32 too
        from ..models.loading import load

        methods.insert(0, compare.hf_method(load(args.target, device=args.device, dtype="float32")[0]))
    methods.append(compare.treespec_method(target, lambda n: build_drafters(recipe, [draft], max_new_tokens=n),
                                           recipe.budget))
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
    print("\n" + report)
    print(f"\nspeedup over the fastest HF generate ({summary['fastest_baseline']}): {compare.fmt(headline)}x")
    (out_dir / "report.md").write_text(
        f"# treespec demo\n\nMachine: {platform.platform()}, {torch.get_num_threads()} threads, {args.device}.\n"
        f"Configuration, chosen from measured latencies: {tuned.why}.\n{args.max_new_tokens} greedy tokens per "
        f"prompt.\n\n{report}\n\nspeedup over the fastest HF generate: {compare.fmt(headline)}x\n")
    (out_dir / "report.json").write_text(json.dumps({"summary": summary, "choice": choice.as_dict(),
                                                     "profile": prof.to_dict()}, indent=1))
    print(f"\nreport written to {out_dir / 'report.md'}; tree picture {png}")
    return 0 if all_same else 1
