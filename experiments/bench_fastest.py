"""treespec's captured step against each alternative a user would pick, each at its fastest, on this CPU.

The real Qwen2.5-Coder pair (1.5B target, 0.5B draft), greedy, 64 tokens per prompt, on HumanEval
(code) and the lee-news leads (prose, from the gensim wheel). Per prompt, methods in turn:

* ``hf-bfloat16``: HF ``generate``, eager, bfloat16 (faster than float32 here);
* ``hf-bfloat16-static-compiled``: HF ``generate`` with a static cache and ``torch.compile``, inductor
  weight freezing on (HF's fastest plain decoding on a CPU);
* ``hf-assisted-bfloat16``: HF assisted generation with the draft in the precision treespec's eager
  default picks for it (int8 here: the same draft as treespec-eager and treespec-compiled);
* ``hf-assisted-<p>-draft``: HF assisted generation with the captured step's draft (``auto`` among the
  precisions ``torch.compile`` can trace), so each treespec method meets HF assisted with its own draft
  (left out when both drafts have one precision). Each assisted method runs in its setting fastest on one
  prompt of each set just outside the measured ranges (``compare.fastest_assisted_method``: HF's default or a
  constant number of drafted tokens; cached in ``--out``);
* ``treespec-eager``: what ``treespec generate --no-compile`` runs (measured precisions, the tree tuned as
  ``treespec generate`` tunes it, ``choices.resolve_run``, its confidence stop);
* ``treespec-captured``: what ``treespec generate --compile`` runs: the same tuned recipe with
  ``compile=True``, its draft loaded for compiled steps (``load(..., traceable=True)``); one draft model
  of a static shape, so the whole step runs in compiled calls (``treespec.core.captured``: start,
  per-depth and verify graphs, the confidence stop read between depths, weight freezing);
* ``treespec-compiled`` (only with ``--only``): the eager default's recipe and int8 draft with
  ``compile=True``: torch.ao's int8 cannot be traced, so it drafts on the host and only the target's
  step is compiled.

Compiles are paid once, before the timed prompts, and reported (both static caches hold 1024 rows,
so one set of graphs serves every prompt; see ``treespec.bench.baselines.hf_generate`` for why HF's
cache is kept across calls). The headline is the paired speedup over each baseline with bootstrap 95%
intervals, and the per-step split (drafting / verifying / engine). Records are appended as they
finish; a re-run resumes (compiles are paid again).

    python experiments/bench_fastest.py --out experiments/results/cpu-fastest-zen4

On a host without bfloat16 arithmetic (AVX2 only: Zen 3) the bfloat16 target's forward costs in proportion to its
tokens and no tree pays: both treespec methods then run plain decoding, and the script says so
(``experiments/results/cpu-fastest-zen3``); the defaults there run the int4 target (``treespec demo``).

In 24 GiB three frozen compiles of the pair do not fit in one process: ``--only`` adds a method to a
finished run (its prompts then run after, not interleaved with, the others; on an empty ``--out``,
``--only`` just runs fewer methods).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from treespec.bench import compare
from treespec.bench.datasets import dataset_prompts, prompt_range
from treespec.bench.demo import LABELS, method_divergences
from treespec.calibrate.vectors import default_acceptance
from treespec.common.machine import machine
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.models.precision import precision_of
from treespec.recipes import Recipe, run
from treespec.calibrate.choices import Resolved, resolve_run


#: the compiles' warm-up prompt: long enough for the compiled steps' chunked prefill (``treespec.core.prefill``)
WARMUP = 'def add(a: int, b: int) -> int:\n    """Return the sum of a and b.\n\n    >>> add(2, 3)\n    5\n    """\n'


#: where HF assisted's settings are timed (``compare.fastest_assisted_method``)
OUTSIDE = "one prompt of each set outside the measured ranges"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/cpu-fastest"))
    ap.add_argument("--humaneval", default="100:110", metavar="A:B", help="HumanEval problems A..B-1 ('' to skip)")
    ap.add_argument("--lee-news", default="0:10", metavar="A:B", help="lee-news leads A..B-1 ('' to skip)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--only", default=None, metavar="M1,M2",
                    help="run only these methods (their compiles only: three frozen compiles of the pair do not fit "
                         "in 24 GiB together); the summary covers every method recorded in --out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch._inductor.config.freezing = True  # HF's fastest CPU decoding, and the captured step's

    target, tok = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    draft_auto, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft")
    draft_traced, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft", traceable=True)
    traced = precision_of(draft_traced)
    prompts, search = [], []  # search: HF assisted's settings are timed on one prompt of each set apart from these
    for name, spec in (("humaneval", args.humaneval), ("lee-news", args.lee_news)):
        if spec:
            texts = dataset_prompts(name)
            a, b = prompt_range(spec, len(texts), name)
            prompts += [(name, i, tok(texts[i])["input_ids"]) for i in range(a, b)]
            search.append(tok(texts[a - 1 if a else b])["input_ids"])  # just before the range, or just after

    # what `treespec generate --no-compile` and `treespec generate --compile` run on these prompts: each tree sized
    # from the shipped acceptance of its draft's precision, its tau predicted by the calibration walk replayed
    # through it, its costs corrected by a pilot of its real steps
    def resolved(draft: torch.nn.Module, compile: bool) -> Resolved:
        return resolve_run(Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0)), target, [draft], tok,
                           prompts=[ids for *_, ids in prompts], max_new_tokens=args.max_new_tokens, compile=compile)

    eager, captured = resolved(draft_auto, False), resolved(draft_traced, True)
    print("treespec eager:", eager.why, "\ntreespec captured:", captured.why, flush=True)
    if eager.recipe.budget == captured.recipe.budget == 1:
        print("note: both treespec methods run plain decoding on this host (no tree is predicted to pay with this "
              "bfloat16 target; on a host without bfloat16 arithmetic its forward costs in proportion to its tokens: "
              "experiments/results/cpu-fastest-zen3); what follows times plain decoding against HF's", flush=True)

    def assisted(draft: torch.nn.Module, name: str) -> compare.Method:
        """HF assisted with ``draft`` in its setting fastest on ``search`` (cached in --out: a resumed run keeps it)."""
        method, speeds = compare.fastest_assisted_method(target, draft, search, args.max_new_tokens, name=name,
                                                         cache=args.out / f"{name}.search.json")
        print(compare.assisted_choice(speeds, OUTSIDE, who=name), flush=True)
        return method

    host_compiled = replace(eager.recipe, compile=True)
    makers = {
        "hf-bfloat16": lambda: compare.hf_method(target),
        "hf-bfloat16-static-compiled": lambda: compare.hf_compiled_method(target),
        "hf-assisted-bfloat16": lambda: assisted(draft_auto, "hf-assisted-bfloat16"),
        f"hf-assisted-{traced}-draft": lambda: assisted(draft_traced, f"hf-assisted-{traced}-draft"),
        "treespec-eager": lambda: compare.treespec_method(
            lambda ids, n: run(eager.recipe, target, [draft_auto], ids, max_new_tokens=n), precision_of(target),
            name="treespec-eager"),
        "treespec-captured": lambda: compare.treespec_method(
            lambda ids, n: run(captured.recipe, target, [draft_traced], ids, max_new_tokens=n),
            precision_of(target), name="treespec-captured"),
        "treespec-compiled": lambda: compare.treespec_method(
            lambda ids, n: run(host_compiled, target, [draft_auto], ids, max_new_tokens=n), precision_of(target),
            name="treespec-compiled"),
    }
    # the captured step's own assisted baseline, unless its draft is the eager default's (then it is hf-assisted-*)
    same_draft = traced == precision_of(draft_auto)
    default = [m for m in makers if m != "treespec-compiled" and not (same_draft and m.endswith("-draft"))]
    chosen = default if args.only is None else [m for m in args.only.split(",") if m]  # '' = report only
    unknown = [m for m in chosen if m not in makers]
    if unknown:
        ap.error(f"--only: unknown method(s) {', '.join(unknown)}; choose among {', '.join(makers)}")
    methods = [makers[m]() for m in chosen]
    summary_file = args.out / "summary.json"
    before = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    compile_seconds = before.get("compile_seconds", {})
    added_later = before.get("added_later", []) + ([m for m in chosen if m not in before.get("added_later", [])]
                                                   if args.only is not None and before else [])
    for m in methods:  # compiles, paid once before the timed prompts
        if m.name in ("hf-bfloat16-static-compiled", "treespec-compiled", "treespec-captured"):
            t = time.perf_counter()
            m.run(tok(WARMUP)["input_ids"], 8)
            compile_seconds[m.name] = time.perf_counter() - t
    print(f"compiles: {compile_seconds}", flush=True)

    def show(r: dict) -> None:
        print(f"  {r['dataset']}/{r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s"
              + (f", tau {r['tau']:.2f}" if "tau" in r else ""), flush=True)

    records = compare.run(methods, prompts, args.max_new_tokens, args.out / "results.jsonl", on_record=show)
    summaries = [compare.summarize(records, d) for d in dict.fromkeys(p[0] for p in prompts)]
    ids = {(d, i): p for d, i, p in prompts}
    for s in summaries:  # each greedy difference from HF located: at a tie of the target's top two, or a broken rule
        compare.locate_divergences(target, records, s, lambda d, i: ids[d, i])
    result = {"machine": machine("cpu"), "torch": torch.__version__, "eager_configuration": eager.why,
              "captured_configuration": captured.why,
              "compile_seconds": compile_seconds, "added_later": added_later,
              "max_new_tokens": args.max_new_tokens, "summaries": summaries,
              "per_step": {s["dataset"]: per_step(records, s) for s in summaries}}
    (args.out / "summary.json").write_text(json.dumps(result, indent=1))

    def section(s: dict) -> str:  # a dataset's table, where its greedy outputs differ from HF's, its step breakdown
        differ = method_divergences(s, precision_of(target), LABELS.get(s["dataset"], s["dataset"]))
        return "\n\n".join([compare.markdown(s), *differ, breakdown(result["per_step"][s["dataset"]])])

    text = "\n\n".join(section(s) for s in summaries)
    searches = {f.name.removesuffix(".search.json"): json.loads(f.read_text())
                for f in sorted(args.out.glob("*.search.json"))}  # each HF assisted method's settings, timed
    settings = "".join(f"\n{compare.assisted_choice(speeds, OUTSIDE, who=name)}" for name, speeds in searches.items())
    (args.out / "README.md").write_text(
        f"# The captured step against HF at its fastest, CPU\n\nMachine: {result['machine']}, "
        f"torch {torch.__version__}."
        f"\n{args.max_new_tokens} greedy tokens per prompt, methods interleaved per prompt"
        + (f" (except {', '.join(added_later)}: added by a later run with `--only`, after the others)"
           if added_later else "") + ". treespec-eager: "
        f"{eager.why}. treespec-captured (`treespec generate --compile`): {captured.why}; `compile=True` with "
        f"inductor weight freezing, the whole step in compiled calls. treespec-compiled (if present): the eager "
        f"default with `compile=True` (its int8 draft drafts on the host).\nCompile seconds paid once before the "
        f"timed prompts: {', '.join(f'{k} {v:.0f} s' for k, v in compile_seconds.items())}.{settings}\n"
        f"Command: `python experiments/bench_fastest.py --out {args.out}`.\n\n{text}\n")
    compare.plot(summaries, args.out / "tokens_per_second.png")
    print(text)
    return result


def per_step(records: list[dict], summary: dict) -> dict:
    """Mean seconds per step of each treespec method: drafting, verifying, engine (and the engine's share)."""
    out = {}
    for name in (n for n, e in summary["methods"].items() if not e["baseline"]):
        sel = [r for r in records if r["method"] == name and r["dataset"] == summary["dataset"]
               and r["prompt"] in summary["prompts"]]
        steps = sum(r["steps"] for r in sel)
        split = {k: sum(r[f"{k}_seconds"] for r in sel) / steps for k in ("drafting", "verifying", "engine")}
        split["engine_share"] = split["engine"] / sum(split.values())
        split["prefill_share_of_time"] = sum(r["prefill_seconds"] for r in sel) / sum(r["seconds"] for r in sel)
        out[name] = split
    return out


def breakdown(split: dict) -> str:
    lines = ["| per step | drafting | verifying | engine | engine share | prefill share of all time |",
             "|---|---|---|---|---|---|"]
    for name, s in split.items():
        lines.append(f"| {name} | {s['drafting'] * 1e3:.0f} ms | {s['verifying'] * 1e3:.0f} ms | "
                     f"{s['engine'] * 1e3:.1f} ms | {s['engine_share']:.1%} | {s['prefill_share_of_time']:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
