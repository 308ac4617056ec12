"""Tree shapes compared each at its own best size, beside every HF method a user would pick at its fastest.

A shape comparison at one fixed budget favours whichever shape that budget suits; here each builder is sized by the
same tuner, the way ``treespec generate --tree NAME`` sizes it without ``--budget``
(``treespec.calibrate.choices.resolve``: this machine's cost profile calibrated on real steps of that builder's
tree, the shipped acceptance rows, the run's tokens and prompt length): the Sequoia tree (the default), a chain and
SpecInfer's k-ary trees of widths 2 and 3. They run on the built-in pair (the GGUF target in the rendering
``--target-dtype`` names, int4 by default, the one the demo keeps on the Zen 4 host; the draft in its measured
precision), greedy, interleaved per prompt with HF ``generate`` eager, with a static cache + ``torch.compile``
(inductor freezing on a CPU) and HF assisted generation with the same draft, on the same loaded model, after the
same warm-up call. Records are appended as they finish and a re-run resumes.

Printed and written to ``OUT/README.md`` (with ``summary.json``, ``shapes.json`` and ``tok_s.png``): each shape's
tuned tree and the tuner's prediction beside what it measured, the methods' tok/s, each shape over each HF
method and over the Sequoia tree (paired per prompt), and greedy agreement with HF eager (a difference located: at
a tie of the target's top two logits in its precision, or not).

    python experiments/bench_tuned_shapes.py --out experiments/results/tuned-shapes-cpu --humaneval 100:110
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from treespec.bench import arms, compare
from treespec.bench.datasets import dataset_prompts, prompt_range
from treespec.bench.demo import baseline_methods, divergence_lines
from treespec.calibrate.choices import resolve
from treespec.calibrate.vectors import acceptance_for_draft
from treespec.common.machine import machine
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.models.precision import precision_of
from treespec.recipes import Recipe, run

#: shape name -> (builder, k-ary width)
SHAPES = {"sequoia": ("sequoia", 2), "chain": ("chain", 2), "kary2": ("kary", 2), "kary3": ("kary", 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/tuned-shapes-cpu"))
    ap.add_argument("--humaneval", default="100:110", metavar="A:B", help="HumanEval problems A..B-1 (default 100:110)")
    ap.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--target-dtype", default="int4", help="the target's rendering (default int4: the file's blocks)")
    ap.add_argument("--quick", action="store_true", help="HF eager only (not static + compile, nor assisted)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    target, tok = load(DEFAULT_TARGET, dtype=args.target_dtype, role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft")
    texts = dataset_prompts("humaneval")
    a, b = prompt_range(args.humaneval, len(texts), "humaneval")
    prompts = [("humaneval", i, tok(texts[i])["input_ids"]) for i in range(a, b)]
    rows, walk = acceptance_for_draft(None, 0.0, draft)
    mean_prompt = statistics.mean(len(ids) for _, _, ids in prompts)

    methods, shapes = baseline_methods(target, draft, args.quick), {}
    for name in args.shapes:
        tree, width = SHAPES[name]
        resolved = resolve(Recipe(tree=tree, kary_width=width, acceptance=rows), target, [draft], tokenizer=tok,
                           walk=walk, max_new_tokens=args.max_new_tokens, prompt_tokens=mean_prompt)
        print(f"{name}: {resolved.why}", flush=True)
        p, shape = resolved.tuned.prediction, resolved.tuned.choice.shape
        plain = resolved.recipe.budget == 1
        shapes[name] = {"recipe": {"tree": tree, "kary_width": width, "budget": resolved.recipe.budget,
                                   "depth": resolved.recipe.depth, "max_width": resolved.recipe.max_width},
                        "paths": [] if plain else [list(q) for q in shape.paths], "why": resolved.why,
                        "predicted": {"tau": 1.0 if plain else p.tau, "step_seconds": p.plain_seconds if plain
                                      else p.step_seconds, "run_speedup": resolved.tuned.run_speedup}}
        methods.append(compare.treespec_method(
            lambda ids, n, recipe=resolved.recipe: run(recipe, target, [draft], ids, max_new_tokens=n),
            precision_of(target), name=f"treespec-{name}"))
    (args.out / "shapes.json").write_text(json.dumps(shapes, indent=1))

    results = args.out / "results.jsonl"
    records = compare.run(methods, prompts, args.max_new_tokens, results,
                          on_record=lambda r: print(f"  {r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} "
                                                    "tok/s", flush=True))
    summary = compare.summarize(records, "humaneval", compare.warmup_seconds(results))
    ids = {i: p for _, i, p in prompts}
    compare.locate_divergences(target, records, summary, lambda dataset, i: ids[i])  # at a tie, or a broken rule
    for name in args.shapes:  # each shape over the Sequoia tree, paired per prompt, into the summary's speedups
        if name != "sequoia":
            arms.paired(records, summary, f"treespec-{name}", "treespec-sequoia")
    lines = [f"# Tree shapes, each tuned, on this CPU ({machine('cpu')}, torch {torch.__version__})", "",
             f"Command: `python experiments/bench_tuned_shapes.py --out {args.out} --humaneval {args.humaneval} "
             f"--max-new-tokens {args.max_new_tokens}{' --quick' if args.quick else ''}` (target "
             f"{precision_of(target)}, draft {precision_of(draft)}; greedy; eager treespec steps, what `treespec "
             "generate` runs for a run this size).", "",
             "| shape | tuned tree (budget, depth, nodes per level) | predicted tau | measured tau | predicted "
             "s/step | measured s/step | predicted speedup over the target alone (the draft's prefill charged) |",
             "|---|---|---|---|---|---|---|"]
    for name, s in shapes.items():
        mine = [r for r in records if r["method"] == f"treespec-{name}" and r["prompt"] in summary["prompts"]]
        steps = sum(r["steps"] for r in mine)
        decode = sum(r["drafting_seconds"] + r["verifying_seconds"] + r["engine_seconds"] for r in mine)
        levels = [sum(1 for q in s["paths"] if len(q) == d) for d in range(1, 1 + max(map(len, s["paths"]), default=0))]
        lines.append(f"| {name} | {s['recipe']['budget']}, {len(levels)}, {levels or '-'} | "
                     f"{s['predicted']['tau']:.2f} | {sum(r['tokens'] for r in mine) / max(steps, 1):.2f} | "
                     f"{s['predicted']['step_seconds']:.3f} | {decode / max(steps, 1):.3f} | "
                     f"{s['predicted']['run_speedup']:.2f}x |")
    lines += ["", compare.markdown(summary)]
    for name, agreement in summary.get("agreement", {}).items():
        if agreement.get("divergences"):
            lines += ["", f"{name}: " + divergence_lines(agreement["divergences"], precision_of(target))]
    lines += ["", "Why each tree (the tuner's line):", "", *[f"- {n}: {s['why']}" for n, s in shapes.items()]]
    compare.plot([summary], args.out / "tok_s.png")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
