"""``treespec demo``: the main job on the default pair, treespec beside the target alone.

Loads the built-in Qwen2.5-Coder pair (1.5B target, 0.5B draft), measures this machine's forward
latencies, sizes a Sequoia tree for them from the shipped acceptance vector, then decodes a few
HumanEval evaluation prompts (100 onwards: disjoint from the calibration prompts) greedily with the
target alone (HF ``generate``) and with treespec, and reports side by side.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from .baselines import hf_generate
from .datasets import humaneval_prompts
from .engine import generate
from .models import cache_root
from .recipes import build_drafters, default_acceptance, load_pair
from .tuning import tune


def load_models(args: argparse.Namespace):
    """The target, its tokenizer and the default draft (``--target``/``--draft``/``--device``/``--dtype``)."""
    from .models import DEFAULT_DRAFT

    return load_pair(args.target, (args.draft or [DEFAULT_DRAFT])[:1], device=args.device, target_dtype=args.dtype,
                     draft_dtype=args.draft_dtype)


def run_demo(args: argparse.Namespace) -> int:
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
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

    drafters = build_drafters(recipe, [draft], max_new_tokens=args.max_new_tokens)
    budget = recipe.budget
    prompts = humaneval_prompts(100, 100 + args.prompts)
    rows, totals = [], {"base_s": 0.0, "spec_s": 0.0, "tokens": 0, "steps": 0}
    for i, text in enumerate(prompts):
        ids = tok(text)["input_ids"]
        ref, base_s = hf_generate(target, ids, args.max_new_tokens)
        out = generate(target, ids, drafters=drafters, max_new_tokens=args.max_new_tokens, budget=budget)
        s = out.stats
        same = out.new_tokens == ref
        rows.append({"prompt": 100 + i, "identical": same, "tau": s.tau, "base_tok_s": len(ref) / base_s,
                     "treespec_tok_s": s.tokens_per_second, "speedup": base_s / s.seconds})
        totals["base_s"] += base_s
        totals["spec_s"] += s.seconds
        totals["tokens"] += s.new_tokens
        totals["steps"] += s.steps
        print(f"  HumanEval/{100 + i}: identical={same} tau={s.tau:.2f} target alone {len(ref) / base_s:.2f} tok/s, "
              f"treespec {s.tokens_per_second:.2f} tok/s ({base_s / s.seconds:.2f}x)", flush=True)

    all_same = all(r["identical"] for r in rows)
    lines = [
        "| prompt | identical greedy output | tau | target alone tok/s | treespec tok/s | speedup |",
        "|---|---|---:|---:|---:|---:|",
        *(f"| HumanEval/{r['prompt']} | {'yes' if r['identical'] else 'NO'} | {r['tau']:.2f} | "
          f"{r['base_tok_s']:.2f} | {r['treespec_tok_s']:.2f} | {r['speedup']:.2f}x |" for r in rows),
        f"| all | {'yes' if all_same else 'NO'} | {totals['tokens'] / totals['steps']:.2f} | "
        f"{totals['tokens'] / totals['base_s']:.2f} | {totals['tokens'] / totals['spec_s']:.2f} | "
        f"{totals['base_s'] / totals['spec_s']:.2f}x |",
    ]
    report = "\n".join(lines)
    print("\n" + report)
    (out_dir / "report.md").write_text(
        f"# treespec demo\n\nMachine: {platform.platform()}, {torch.get_num_threads()} threads, {args.device}.\n"
        f"Configuration, chosen from measured latencies: {tuned.why}.\n{args.max_new_tokens} greedy tokens per prompt.\n\n"
        f"{report}\n")
    (out_dir / "report.json").write_text(json.dumps({"rows": rows, "choice": choice.as_dict(),
                                                     "profile": prof.to_dict()}, indent=1))
    print(f"\nreport written to {out_dir / 'report.md'}; tree picture {png}")
    return 0 if all_same else 1
