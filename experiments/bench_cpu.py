"""treespec's default configuration against every way a user could run the target alone, on this machine.

The real Qwen2.5-Coder pair (1.5B target, 0.5B draft), greedy, on HumanEval 100-109 (code) and the
first lee-news leads (natural language, from the gensim wheel), 64 tokens each. Per prompt, in
turn: HF ``generate`` in float32 and in bfloat16, HF assisted generation (bfloat16 target, the
draft in the precision treespec chose for it, in its setting fastest on one prompt of each set outside the measured
ones: ``compare.fastest_assisted_method``), then treespec with what ``treespec generate``
picks by default (measured precisions, tuned tree; ``treespec.calibrate.tuning``). The headline is the
speedup over the fastest HF configuration, paired per prompt, with a bootstrap 95% interval.
Records are appended as they finish; a re-run resumes.

    python experiments/bench_cpu.py --out experiments/results/cpu-speed
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from treespec.bench import compare
from treespec.bench.datasets import dataset_prompts
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.models.precision import to_precision
from treespec.calibrate.vectors import default_acceptance
from treespec.models.precision import precision_of
from treespec.recipes import Recipe, run
from treespec.calibrate.choices import resolve_run


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/cpu-speed"))
    ap.add_argument("--humaneval", default="100:110", metavar="A:B")
    ap.add_argument("--lee-news", default="0:10", metavar="A:B", help="lee-news leads A..B-1 ('' to skip)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--no-fp32-baseline", action="store_true", help="skip HF generate in float32 (slow)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    target32, tok = load(DEFAULT_TARGET, dtype="float32")
    target, _ = load(DEFAULT_TARGET, dtype="auto", role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft")
    prompts, search = [], []  # search: HF assisted's settings are timed on one prompt of each set apart from these
    for name, spec in (("humaneval", args.humaneval), ("lee-news", args.lee_news)):
        if spec:
            a, b = (int(x) for x in spec.split(":"))
            prompts += [(name, i, tok(dataset_prompts(name)[i])["input_ids"]) for i in range(a, b)]
            search.append(tok(dataset_prompts(name)[a - 1 if a else b])["input_ids"])  # just outside the range
    # what `treespec generate` runs on these prompts by default (choices.resolve_run: the tree, then the compile
    # choice, measured)
    resolved = resolve_run(Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0)), target, [draft], tok,
                           prompts=[ids for *_, ids in prompts], max_new_tokens=args.max_new_tokens)
    recipe = resolved.recipe
    print("treespec configuration:", resolved.why, flush=True)
    target16 = target if str(target.dtype) == "torch.bfloat16" else to_precision(load(DEFAULT_TARGET)[0], "bfloat16")
    assisted, speeds = compare.fastest_assisted_method(target16, draft, search, args.max_new_tokens,
                                                       cache=args.out / "assisted.search.json")
    print(compare.assisted_choice(speeds, "one prompt of each set outside the measured ones"), flush=True)
    methods = [] if args.no_fp32_baseline else [compare.hf_method(target32)]
    methods += [compare.hf_method(target16), assisted,
                compare.treespec_method(lambda ids, n: run(recipe, target, [draft], ids, max_new_tokens=n),
                                        precision_of(target))]

    def show(r: dict) -> None:
        print(f"  {r['dataset']}/{r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s"
              + (f", tau {r['tau']:.2f}" if "tau" in r else ""), flush=True)

    records = compare.run(methods, prompts, args.max_new_tokens, args.out / "results.jsonl", on_record=show)
    summaries = [compare.summarize(records, d) for d in dict.fromkeys(p[0] for p in prompts)]
    for s in summaries:  # locate each greedy mismatch and print the target's top-2 gap there
        compare.locate_divergences(target, records, s, lambda d, p: tok(dataset_prompts(d)[p])["input_ids"])
    machine = (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
               f"torch {torch.__version__}")
    result = {"machine": machine, "configuration": resolved.why, "recipe": {
        "budget": recipe.budget, "depth": recipe.depth, "max_width": recipe.max_width,
        "min_confidence": recipe.min_confidence, "target_dtype": recipe.target_dtype,
        "draft_dtype": recipe.draft_dtype}, "profile": resolved.tuned.profile.to_dict(),
        "max_new_tokens": args.max_new_tokens, "summaries": summaries}
    (args.out / "summary.json").write_text(json.dumps(result, indent=1))
    text = "\n\n".join(compare.markdown(s) for s in summaries)
    for s in summaries:
        for spec, a in s.get("agreement", {}).items():
            for d in a.get("divergences", []):
                text += (f"\n\n{s['dataset']}/{d['prompt']}: first difference at token {d.get('position')}, "
                         f"target top-2 logit gap there {d.get('top2_gap', float('nan')):.3f}")
    (args.out / "README.md").write_text(
        f"# treespec vs the target alone, CPU\n\nMachine: {machine}.\nConfiguration (chosen by treespec on this "
        f"machine): {resolved.why}.\n{args.max_new_tokens} greedy tokens per prompt, methods interleaved per prompt.\n"
        f"Command: `python experiments/bench_cpu.py --out {args.out}`.\n\n{text}\n")
    compare.plot(summaries, args.out / "tokens_per_second.png")
    print(text)
    return result


if __name__ == "__main__":
    main()
