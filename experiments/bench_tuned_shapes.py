"""Tree shapes compared each at its own best size, beside every HF method a user would pick at its fastest.

A shape comparison at one fixed budget favours whichever shape that budget suits; here each builder is sized by the
same tuner, the way ``treespec generate --tree NAME --no-compile`` sizes it without ``--budget``
(``treespec.calibrate.choices.resolve_run``: this machine's cost profile calibrated on real steps of that builder's
tree, the acceptance rows and walk of the draft's precision, the run's tokens and prompt length): the Sequoia tree
(the default), a chain and SpecInfer's k-ary trees of widths 2 and 3. They run on the built-in pair or any other
(``--target``, ``--draft``: an HF id, a local directory or ``.gguf`` file; a GGUF target on a CPU in ``int4`` on its
file's blocks by default, the rendering the demo keeps on the Zen 4 host, else ``auto``; ``--target-dtype`` names
another), greedy, interleaved per prompt with HF ``generate`` eager, with a static cache + ``torch.compile``
(inductor freezing on a CPU) and HF assisted generation with the same draft, on the same loaded model, after the
same warm-up call. Prompts: HumanEval's ``--prompts A:B`` (ShareGPT first turns in the chat template with
``--chat``, sized from chat's rows), or your own (``--prompts-jsonl``, a ``prompt`` per line); rows: the shipped
ones for the built-in draft, or ``--acceptance`` (from ``treespec accept`` on prompts like yours). Records are
appended as they finish and a re-run resumes.

Printed and written to ``OUT/README.md`` (with ``summary.json``, ``shapes.json`` and ``tok_s.png``): each shape's
tuned tree and the tuner's prediction beside what it measured, the methods' tok/s, each shape over each HF
method and over the Sequoia tree (paired per prompt), and greedy agreement with HF eager (a difference located: at
a tie of the target's top two logits in its precision, or not).

    python experiments/bench_tuned_shapes.py --out experiments/results/tuned-shapes-cpu --prompts 100:110
    python experiments/bench_tuned_shapes.py --target my/target --draft my/draft --acceptance acc.json \
        --prompts-jsonl mine.jsonl --out shapes-mine
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from treespec.bench import arms, compare
from treespec.bench.datasets import dataset_prompts, prompt_range
from treespec.bench.demo import (ASSISTED_SEARCH_PROMPTS, FIRST_PROMPT, LABELS, baseline_methods, demo_prompts,
                                 method_divergences)
from treespec.calibrate.choices import resolve_run
from treespec.calibrate.vectors import default_acceptance
from treespec.cli_input import encode_all, read_prompts
from treespec.common.machine import machine
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.models.loading import has_file_blocks
from treespec.models.precision import precision_of
from treespec.recipes import Recipe, run

#: shape name -> (builder, k-ary width)
SHAPES = {"sequoia": ("sequoia", 2), "chain": ("chain", 2), "kary2": ("kary", 2), "kary3": ("kary", 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/tuned-shapes-cpu"))
    ap.add_argument("--target", default=DEFAULT_TARGET, metavar="M", help=f"target model (default {DEFAULT_TARGET})")
    ap.add_argument("--draft", default=DEFAULT_DRAFT, metavar="M", help=f"draft model (default {DEFAULT_DRAFT})")
    ap.add_argument("--target-dtype", default=None,
                    help="the target's precision (default: int4 for a GGUF target on a CPU: its file's blocks; else "
                         "auto)")
    ap.add_argument("--prompts", "--humaneval", dest="prompts", default="100:110", metavar="A:B",
                    help="HumanEval problems A..B-1, or ShareGPT first turns with --chat (default 100:110)")
    ap.add_argument("--prompts-jsonl", type=Path, default=None, metavar="F",
                    help="your own prompts instead: a JSONL file, one object with a 'prompt' per line")
    ap.add_argument("--chat", action="store_true",
                    help="prompts as user turns in the chat template (ShareGPT's by default), trees sized from chat's "
                         "shipped rows (unless --acceptance)")
    ap.add_argument("--acceptance", type=Path, default=None, metavar="JSON",
                    help="the rows and walk trees are sized from (`treespec accept`; default: the shipped ones)")
    ap.add_argument("--max-new-tokens", type=int, default=64, metavar="N")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--quick", action="store_true", help="HF eager only (not static + compile, nor assisted)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    dtype = args.target_dtype or ("int4" if has_file_blocks(args.target) and not torch.cuda.is_available() else "auto")
    target, tok = load(args.target, dtype=dtype, role="target")
    draft, _ = load(args.draft, dtype="auto", role="draft")
    if args.prompts_jsonl is not None:
        texts = read_prompts(argparse.Namespace(prompt=None, prompt_file=None, prompts_jsonl=args.prompts_jsonl))
        prompts = [("prompts", i, ids) for i, ids in enumerate(encode_all(tok, texts, args.chat))]
    else:
        dataset = "sharegpt" if args.chat else "humaneval"
        texts = dataset_prompts(dataset)
        a, b = prompt_range(args.prompts, len(texts), dataset)
        prompts = [(dataset, i, ids) for i, ids in zip(range(a, b), encode_all(tok, texts[a:b], args.chat))]

    # HF assisted generation's settings timed on prompts apart from the measured ones: those just before the range
    # (after it where the range starts at the set's first; HumanEval's or ShareGPT's before 100 for --prompts-jsonl)
    k = ASSISTED_SEARCH_PROMPTS
    first = FIRST_PROMPT - k if args.prompts_jsonl is not None else a - k if a >= k else b
    search = demo_prompts(tok, k, args.chat, first=first)
    methods, assisted_note = baseline_methods(target, draft, args.quick, search, args.max_new_tokens,
                                              cache=args.out / "assisted.json")
    shapes = {}
    for name in args.shapes:
        tree, width = SHAPES[name]
        # as `treespec generate --tree T --no-compile` sizes it: the rows and walk of --acceptance, else the shipped
        # ones of the draft's precision (chat's with --chat)
        resolved = resolve_run(Recipe(tree=tree, kary_width=width, acceptance=default_acceptance(None, 0.0)), target,
                               [draft], tok, prompts=[ids for *_, ids in prompts],
                               max_new_tokens=args.max_new_tokens, acceptance_file=args.acceptance, chat=args.chat,
                               compile=False)
        print(f"{name}: {resolved.why}", flush=True)
        p, shape = resolved.tuned.prediction, resolved.tuned.choice.shape
        plain = resolved.recipe.budget == 1
        shapes[name] = {"recipe": {"tree": tree, "kary_width": width, "budget": resolved.recipe.budget,
                                   "depth": resolved.recipe.depth, "max_width": resolved.recipe.max_width},
                        "paths": [] if plain else [list(q) for q in shape.paths],
                        "widths": [] if plain else list(shape.widths), "why": resolved.why,
                        "predicted": {"tau": 1.0 if plain else p.tau, "step_seconds": p.plain_seconds if plain
                                      else p.step_seconds, "run_speedup": resolved.tuned.run_speedup}}
        methods.append(compare.treespec_method(
            lambda ids, n, recipe=resolved.recipe: run(recipe, target, [draft], ids, max_new_tokens=n),
            precision_of(target), name=f"treespec-{name}"))
    (args.out / "shapes.json").write_text(json.dumps(shapes, indent=1))

    results = args.out / "results.jsonl"
    records = compare.run(methods, prompts, args.max_new_tokens, results,
                          settings={"target": args.target, "draft": args.draft, "chat": args.chat,
                                    "acceptance": None if args.acceptance is None else str(args.acceptance)},
                          on_record=lambda r: print(f"  {r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} "
                                                    "tok/s", flush=True))
    summary = compare.summarize(records, prompts[0][0], compare.warmup_seconds(results))
    ids = {i: p for _, i, p in prompts}
    compare.locate_divergences(target, records, summary, lambda dataset, i: ids[i])  # at a tie, or a broken rule
    for name in args.shapes:  # each shape over the Sequoia tree, paired per prompt, into the summary's speedups
        if name != "sequoia":
            arms.paired(records, summary, f"treespec-{name}", "treespec-sequoia")
    command = " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"# Tree shapes, each tuned, on this CPU ({machine('cpu')}, torch {torch.__version__})", "",
             f"Command: `python experiments/bench_tuned_shapes.py {command}` (target "
             f"{precision_of(target)}, draft {precision_of(draft)}; greedy; eager treespec steps, what `treespec "
             "generate` runs for a run this size).", "",
             "| shape | tuned tree (budget, depth, nodes per level) | predicted tau | measured tau | predicted "
             "s/step | measured s/step | predicted speedup over the target alone (the draft's prefill charged) |",
             "|---|---|---|---|---|---|---|"]
    for name, s in shapes.items():
        mine = [r for r in records if r["method"] == f"treespec-{name}" and r["prompt"] in summary["prompts"]]
        steps = sum(r["steps"] for r in mine)
        decode = sum(r["drafting_seconds"] + r["verifying_seconds"] + r["engine_seconds"] for r in mine)
        lines.append(f"| {name} | {s['recipe']['budget']}, {len(s['widths'])}, {s['widths'] or '-'} | "
                     f"{s['predicted']['tau']:.2f} | {sum(r['tokens'] for r in mine) / max(steps, 1):.2f} | "
                     f"{s['predicted']['step_seconds']:.3f} | {decode / max(steps, 1):.3f} | "
                     f"{s['predicted']['run_speedup']:.2f}x |")
    lines += ["", compare.markdown(summary)] + (["", assisted_note] if assisted_note else [])
    for text in method_divergences(summary, precision_of(target), LABELS.get(prompts[0][0], "prompt")):
        lines += ["", text]
    lines += ["", "Why each tree (the tuner's line):", "", *[f"- {n}: {s['why']}" for n, s in shapes.items()]]
    compare.plot([summary], args.out / "tok_s.png")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
