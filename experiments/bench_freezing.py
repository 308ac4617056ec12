"""Does inductor's weight freezing pay for treespec's captured step on this CPU?

``treespec generate --compile``'s route (the tuned recipe with ``compile=True``, the draft loaded for
compiled steps) with weight freezing, the default since commit f89c7a7, against the same without freezing,
which is what that route ran before the commit (freezing passed in ``torch.compile``'s options froze
nothing: ``treespec/core/compiling.py``). The real Qwen2.5-Coder pair, HumanEval prompts, greedy.

A third arm, ``frozen-concat``, adds the concatenation of the linears that share an input (q, k, v; gate, up),
which freezing does on CUDA and on a CPU only when asked (``cpp.enable_concat_linear``).

Each arm runs in a process of its own (a frozen runner holds the weights as constants of its graphs; two
compiled pairs do not share a process well in 24 GiB), the unfrozen first, each making a warm-up call (its
compiles, kept apart) before its timed prompts. Records are appended to ``results-<arm>.jsonl`` (a re-run
resumes); the summary pairs the arms per prompt (bootstrap 95% interval).

    python experiments/bench_freezing.py --out experiments/results/freezing-cpu
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout without installing treespec

import torch  # noqa: E402

from treespec.bench import compare, intervals  # noqa: E402
from treespec.bench.datasets import dataset_prompts, prompt_range  # noqa: E402
from treespec.calibrate.choices import resolve  # noqa: E402
from treespec.calibrate.vectors import default_acceptance  # noqa: E402
from treespec.common.machine import machine  # noqa: E402
from treespec.core import captured_runner, compiled, compiling, prefill  # noqa: E402
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, cache_root, load  # noqa: E402
from treespec.models.precision import precision_of  # noqa: E402
from treespec.recipes import Recipe, run  # noqa: E402

ARMS = ("unfrozen", "frozen", "frozen-concat")


def unfrozen_compile_graph(fn, backend: str, mode: str | None):
    """What ``compiling.compile_graph`` did before commit f89c7a7: ``freezing`` in ``torch.compile``'s options."""
    options = {"freezing": True} if backend == "inductor" and mode is None else None
    return torch.compile(fn, fullgraph=True, backend=backend, mode=mode, options=options)


def concat_compile_graph(fn, backend: str, mode: str | None):
    """``compiling.compile_graph`` with the linears that share an input concatenated under freezing (q, k, v;
    gate, up: what freezing does by default on CUDA, on a CPU only with ``cpp.enable_concat_linear``)."""
    frozen = compiling.compile_graph(fn, backend, mode)

    def call(*args, **kwargs):
        with torch._inductor.config.patch({"cpp.enable_concat_linear": True}):
            return frozen(*args, **kwargs)

    return call


def run_arm(arm: str, args: argparse.Namespace) -> None:
    """One arm in this process: the warm-up call, then every prompt not yet recorded."""
    patched = {"unfrozen": unfrozen_compile_graph, "frozen-concat": concat_compile_graph}.get(arm)
    if patched is not None:
        for module in (captured_runner, compiled, prefill):
            module.compile_graph = patched
    target, tok = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    draft, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft", traceable=True)
    resolved = resolve(Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0), compile=True), target,
                       [draft], cache_file=cache_root() / "profiles.json")
    print(f"{arm}: {resolved.why}", flush=True)
    method = compare.treespec_method(lambda ids, n: run(resolved.recipe, target, [draft], ids, max_new_tokens=n),
                                     precision_of(target), name=f"treespec-captured-{arm}")
    method.baseline = arm == "unfrozen"  # the summary's speedups: each frozen arm over the unfrozen one
    texts = dataset_prompts("humaneval")
    a, b = prompt_range(args.humaneval, len(texts), "humaneval")
    prompts = [("humaneval", i, tok(texts[i])["input_ids"]) for i in range(a, b)]
    compare.run([method], prompts, args.max_new_tokens, args.out / f"results-{arm}.jsonl",
                on_record=lambda r: print(f"  {r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s",
                                          flush=True))


def report(args: argparse.Namespace) -> dict:
    files = [args.out / f"results-{arm}.jsonl" for arm in ARMS]
    records = [r for f in files for r in compare.read_records(f)]
    summary = compare.summarize(records, "humaneval", {k: v for f in files for k, v in compare.warmup_seconds(f).items()})
    lines = [f"# Weight freezing in the captured step on this CPU ({machine('cpu')}, torch {torch.__version__})", "",
             f"Command: `python experiments/bench_freezing.py --out {args.out}` (HumanEval {args.humaneval}, "
             f"{args.max_new_tokens} greedy tokens, `treespec generate --compile`'s recipe; each arm in its own "
             "process, the unfrozen first).", "", "| arm | tok/s [95% CI] | tau | warm-up call s (compiles) |",
             "|---|---|---|---|"]
    for name, m in summary["methods"].items():
        lines.append(f"| {name} | {compare.fmt(m['tokens_per_second'])} | {compare.fmt(m.get('tau'))} | "
                     f"{m.get('warmup_seconds', float('nan')):.0f} |")
    lines += ["", "| paired per prompt | ratio [95% CI] |", "|---|---|"]
    lines += [f"| {k} | {compare.fmt(v)}x |" for k, v in summary["speedups"].items()]
    by = {(r["method"], r["prompt"]): r for r in records}
    a, b = "treespec-captured-frozen-concat", "treespec-captured-frozen"  # both speculative: not in summarize's pairs
    both = [p for p in summary["prompts"] if (a, p) in by and (b, p) in by]
    if both:
        ratio = intervals.ratio_of_sums([by[b, p]["seconds"] for p in both], [by[a, p]["seconds"] for p in both])
        summary["speedups"][f"{a} vs {b}"] = ratio.as_dict()
        lines.append(f"| {a} vs {b} | {compare.fmt(ratio.as_dict())}x |")
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n".join(lines))
    return summary


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/freezing-cpu"))
    ap.add_argument("--humaneval", default="100:106", metavar="A:B", help="HumanEval problems A..B-1")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--arm", choices=ARMS, default=None, help="run one arm in this process (the driver's call)")
    ap.add_argument("--arms", choices=ARMS, nargs="+", default=list(ARMS),
                    help="the arms the driver runs, in order (each resumes from its own results file)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.arm:
        run_arm(args.arm, args)
        return None
    for arm in args.arms:
        subprocess.run([sys.executable, __file__, "--arm", arm, "--out", str(args.out), "--humaneval", args.humaneval,
                        "--max-new-tokens", str(args.max_new_tokens)], check=True)
    return report(args)


if __name__ == "__main__":
    main()
