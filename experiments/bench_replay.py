"""Verifiers compared on the same trees (``treespec.bench.replay``), on the real pair.

One live sampled run per prompt records every step; for every verification rule that is exact for a
step's construction, the expected accepted length on that same tree and the same target distributions
is computed exactly (every branch of its accept/reject decisions, weighed by its probability: no coin
noise). Reported: expected accepted drafted tokens per step for each rule, and its expected tokens per
step over ``rrs`` with a paired bootstrap 95% interval over steps. Constructions: the Sequoia tree drawn
without replacement (``rrs``, ``traversal``) and a chain of i.i.d. draws (``rrs``, ``block``,
``traversal``, ``spectr``), at each temperature.

    python experiments/bench_replay.py --out experiments/results/replay --prompts 10 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout

import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from treespec.bench import replay  # noqa: E402
from treespec.bench.datasets import humaneval_prompts  # noqa: E402
from treespec.calibrate.vectors import default_acceptance  # noqa: E402
from treespec.common.files import write_json  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load  # noqa: E402
from treespec.recipes import Recipe, build_drafters  # noqa: E402

CONSTRUCTIONS = {  # name -> recipe settings (temperature added per run)
    "sequoia-without-replacement": dict(tree="sequoia", budget=12, depth=6, max_width=2),
    "chain-iid": dict(tree="chain", budget=6, draft_mode="sample"),
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=10, help="HumanEval prompts from 100 on")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.6])
    args = ap.parse_args(argv)
    target, tok = load(DEFAULT_TARGET, dtype="bfloat16")
    draft, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft")
    prompts = [tok(p)["input_ids"] for p in humaneval_prompts(100, 100 + args.prompts)]
    results = {"machine": machine("cpu"), "torch": torch.__version__, "prompts": f"humaneval[100:{100 + args.prompts}]",
               "max_new_tokens": args.max_new_tokens, "runs": {}}
    for name, settings in CONSTRUCTIONS.items():
        for temperature in args.temperatures:
            recipe = Recipe(**settings, temperature=temperature,
                            acceptance=default_acceptance(None, temperature) if settings["tree"] == "sequoia" else None)
            recordings = [replay.record(target, ids,
                                        build_drafters(recipe, [draft], max_new_tokens=args.max_new_tokens),
                                        max_new_tokens=args.max_new_tokens, temperature=temperature, seed=i,
                                        budget=recipe.budget)
                          for i, ids in enumerate(tqdm(prompts, desc=f"{name} T={temperature}"))]
            results["runs"][f"{name} T={temperature:g}"] = replay.compare(recordings)
            write_json(args.out / "results.json", results)  # after every run: nothing finished is lost
    lines = [f"# Verifiers on the same trees ({results['machine']}, torch {results['torch']})", "",
             f"Real pair (Qwen2.5-Coder 1.5B bfloat16 target, 0.5B draft), {results['prompts']}, "
             f"{args.max_new_tokens} sampled tokens per prompt; every rule exact for a step replays that step's tree, "
             "target distributions, and its expected accepted length there is computed exactly over all its "
             "accept/reject "
             "branches (`treespec.bench.replay.expected_accepted`): the intervals hold only the spread over steps. "
             f"Command: `python experiments/bench_replay.py --out {args.out} --prompts {args.prompts} --max-new-tokens "
             f"{args.max_new_tokens}`.", "",
             "| construction | verifier | steps | expected accepted per step | tokens per step over rrs (95% CI) |",
             "|---|---|---|---|---|"]
    for run, out in results["runs"].items():
        for name, v in out["verifiers"].items():
            r = v.get("tau_ratio")
            ci = "-" if r is None else f"x{r['estimate']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"
            lines.append(f"| {run} | {name} | {v['steps']} | {v['mean_accepted']:.2f} | {ci} |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return results


if __name__ == "__main__":
    main()
