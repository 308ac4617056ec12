"""A draft with another tokenizer against the matching draft, in treespec and in HF assisted generation.

Target: Qwen2.5-Coder-1.5B-Instruct in bfloat16. Drafts: Qwen2.5-Coder-0.5B-Instruct (same
tokenizer) and SmolLM2-135M-Instruct (Llama family, its own 49,152-token vocabulary), each in the
precision ``treespec.models.load(dtype="auto", role="draft")`` measures fastest here. Greedy, on
HumanEval (code, raw completion prompts) and ShareGPT human first turns (chat, wrapped in the
target's chat template). Per prompt, in turn (interleaved, so a drift in the machine's speed hits
every method alike; ``treespec.bench.compare``):

* ``hf-bfloat16``: HF ``generate``, the target alone, eager;
* ``hf-bfloat16-static-compiled``: the same with a static cache and ``torch.compile`` (inductor's weight freezing
  on a CPU): HF's fastest plain decoding, compiled in the warm-up call every method gets (``compare.run``);
* ``hf-assisted-qwen0.5b``: HF assisted generation with the Qwen 0.5B draft;
* ``hf-assisted-smollm2``: HF "universal assisted generation" with SmolLM2 (``tokenizer=`` and
  ``assistant_tokenizer=``: HF re-tokenises the draft's chain);
  each HF assisted method in its setting fastest on one prompt of each set outside the measured ones
  (``compare.fastest_assisted_method``: HF's default or a constant number of drafted tokens; cached in ``--out``);
* ``treespec-qwen0.5b``: treespec with the Qwen draft tuned as ``treespec generate`` tunes it (the Sequoia tree
  sized by the shipped acceptance of the draft's precision and a pilot, ``treespec.calibrate.tuning``), eager steps;
* ``treespec-smollm2``: treespec with SmolLM2 as a cross-tokenizer draft (``CrossDraft`` from
  ``treespec.recipes.load_pair``; a greedy text chain of ``--cross-depth`` draft tokens per step,
  proposed as target-token point masses).

Per prompt and method a record is appended to ``<out>/results.jsonl`` (tokens, seconds, tok/s; for
treespec tau, per-drafter acceptance, draft forwards and draft seconds); a re-run resumes. The
summary gives tok/s with bootstrap 95% intervals over prompts, paired speed ratios, greedy
agreement with the target alone, acceptance and the draft's cost per forward (one forward drafts
one level: a tree level for the Qwen draft, one chain token for SmolLM2). Writes summary.json,
README.md and tokens_per_second.png.

    python experiments/bench_cross.py --out experiments/results/cross-tokenizer --prompts 8 --max-new-tokens 64

``--smoke`` runs the same loop on tiny in-process models with two different byte-level BPE
vocabularies (seconds; used by tests/test_bench_cross.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import torch

from treespec.bench import compare

from treespec.bench import intervals
from treespec.bench.datasets import DATASETS, dataset_prompts, encode_prompt, humaneval_prompts
from treespec.drafters.model import ModelDrafter
from treespec.common.machine import cpu_model
from treespec.models.precision import precision_of
import treespec
from treespec.calibrate.vectors import default_acceptance
from treespec.models.pair import CrossDraft
from treespec.recipes import Recipe, build_drafters
from treespec.calibrate.choices import resolve_run

SAME, CROSS = "same", "cross"  # the two draft roles


@dataclass
class Setup:
    """What one run compares: the target, its tokenizer, the six methods (HF assisted's in HF's default setting
    until :func:`fastest_assisted` times them) and the two drafts by role."""

    target: torch.nn.Module
    tokenizer: Any
    methods: list[compare.Method]
    settings: dict[str, Any]
    drafts: dict[str, torch.nn.Module | CrossDraft]
    labels: dict[str, str]


# -- methods ---------------------------------------------------------------------------------------


def tokenizers_of(draft: torch.nn.Module | CrossDraft) -> tuple[torch.nn.Module, tuple[Any, Any] | None]:
    """The model HF assisted generation drafts with, and the (target's, draft's) tokenizers where the draft has a
    vocabulary of its own (HF's universal assisted generation re-tokenises its chain)."""
    if isinstance(draft, CrossDraft):
        return draft.model, (draft.target_tokenizer, draft.tokenizer)
    return draft, None


def draft_forwards(drafter: Any, proposals: int) -> int:
    """Draft model forwards of a drafter after ``proposals`` calls of ``propose``.

    A ``ModelDrafter`` feeds the new context once per call and forwards each tree level it expands
    (``levels_forwarded``); a ``CrossTokenizerDrafter`` feeds the re-tokenised context once per call
    and forwards its chains ``depth - 1`` more times."""
    if isinstance(drafter, ModelDrafter):
        return proposals + drafter.levels_forwarded
    return proposals * drafter.depth


def treespec_counted(target: torch.nn.Module, recipe: Recipe, draft: torch.nn.Module | CrossDraft,
                     name: str) -> compare.Method:
    """``compare.treespec_method`` for ``recipe`` and one draft, its records adding ``draft_forwards``."""
    built: list[tuple[Any, list[int]]] = []  # this prompt's drafters and their propose() call counts

    def make(n: int) -> list:
        built.clear()
        drafters = build_drafters(recipe, [draft], max_new_tokens=n)
        for d in drafters:
            calls = [0]
            inner = d.propose

            def propose(context, inner=inner, calls=calls):
                calls[0] += 1
                return inner(context)

            d.propose = propose  # counts calls; the drafter itself is unchanged
            built.append((d, calls))
        return drafters

    def generate_one(ids: list[int], n: int):  # the recipe's drafters, wrapped to count, under its budget
        return treespec.generate(target, ids, make(n), max_new_tokens=n, budget=recipe.budget)

    method = compare.treespec_method(generate_one, precision_of(target), name=name)

    def run(ids: list[int], n: int):
        tokens, seconds, extra = method.run(ids, n)
        extra["draft_forwards"] = sum(draft_forwards(d, calls[0]) for d, calls in built)
        return tokens, seconds, extra

    return replace(method, run=run)


def methods_for(target: torch.nn.Module, drafts: dict[str, torch.nn.Module | CrossDraft],
                recipes: dict[str, Recipe], labels: dict[str, str], backend: str = "inductor") -> list[compare.Method]:
    """The six methods, in the order they run on each prompt (``backend``: HF static + compile's, inductor but in
    the smoke run)."""
    same, cross = drafts[SAME], drafts[CROSS]
    if not isinstance(cross, CrossDraft) or isinstance(same, CrossDraft):
        raise ValueError("bench_cross needs one draft sharing the target's tokenizer and one that does not")
    assisted = [compare.hf_assisted_method(target, model, f"hf-assisted-{labels[role]}", tokenizers=tokenizers)
                for role in (SAME, CROSS) for model, tokenizers in [tokenizers_of(drafts[role])]]
    return [compare.hf_method(target), compare.hf_compiled_method(target, backend=backend), *assisted,
            treespec_counted(target, recipes[SAME], same, f"treespec-{labels[SAME]}"),
            treespec_counted(target, recipes[CROSS], cross, f"treespec-{labels[CROSS]}")]


def cross_recipe(depth: int, target: torch.nn.Module, draft: CrossDraft) -> Recipe:
    """A chain of ``depth`` draft tokens (the cross-tokenizer drafter drafts one greedy text chain)."""
    return Recipe(tree="chain", budget=depth + 1, target_dtype=precision_of(target),
                  draft_dtype=precision_of(draft.model))


# -- the real models and the tiny ones -------------------------------------------------------------


def measured_prompts(tok: Any, args: argparse.Namespace) -> list[tuple[str, int, list[int]]]:
    """The prompts measured: ``--prompts`` of each of ``--datasets`` from ``--start``, encoded as they are sent."""
    return [(d, i, encode_prompt(tok, d, dataset_prompts(d)[i])) for d in args.datasets
            for i in range(args.start, min(args.start + args.prompts, len(dataset_prompts(d))))]


def real_setup(args: argparse.Namespace) -> Setup:
    from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, SMOLLM2
    from treespec.models.pair import load_pair

    target, tok, (same, cross) = load_pair(DEFAULT_TARGET, [DEFAULT_DRAFT, SMOLLM2], target_dtype="bfloat16",
                                           draft_dtype="auto")
    # tuned as `treespec generate --no-compile` tunes it (choices.resolve_run): the shipped code acceptance of this
    # draft's precision, the profile corrected by a pilot of the tree's real steps, the prediction replayed over the
    # calibration walk the rows came from (their bare expectation overstates tau), the draft's prefill of these
    # prompts charged
    prompts = measured_prompts(tok, args)
    resolved = resolve_run(Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0)), target, [same], tok,
                           prompts=[ids for *_, ids in prompts], max_new_tokens=args.max_new_tokens, compile=False)
    recipes = {SAME: resolved.recipe, CROSS: cross_recipe(args.cross_depth, target, cross)}
    labels = {SAME: "qwen0.5b", CROSS: "smollm2"}
    settings = {"target": f"{DEFAULT_TARGET} ({precision_of(target)})",
                SAME: f"{DEFAULT_DRAFT} ({precision_of(same)}), same tokenizer",
                CROSS: f"{SMOLLM2} ({precision_of(cross.model)}), its own tokenizer",
                "precision_choice": {"qwen0.5b": getattr(same, "treespec_precision", None),
                                     "smollm2": getattr(cross.model, "treespec_precision", None)},
                "treespec-qwen0.5b": f"tuned: {resolved.why}",
                "treespec-smollm2": f"cross-tokenizer greedy chain of {args.cross_depth} draft tokens "
                                    f"(budget {recipes[CROSS].budget})",
                "hf-assisted": "each in its setting fastest on a prompt of each set outside the measured ones "
                               "(HF's default, up to 20 drafted tokens a step stopped under the draft's confidence "
                               "0.4, or a constant 1, 2, 3, 4 or 6)"}
    drafts = {SAME: same, CROSS: cross}
    return Setup(target, tok, methods_for(target, drafts, recipes, labels), settings, drafts, labels)


def tiny_bpe(texts: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained in-process on ``texts`` (any text encodes and decodes back)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(texts), trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<|eos|>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>", pad_token="<|eos|>")


def smoke_setup(args: argparse.Namespace) -> Setup:
    from treespec.models.tiny import perturbed_copy, tiny_model

    corpus = humaneval_prompts(0, 40)
    tok, draft_tok = tiny_bpe(corpus[:20], 384), tiny_bpe(corpus[20:], 320)  # two different vocabularies
    target = tiny_model("llama", vocab=len(tok), hidden=64, scale=4.0, seed=0, max_positions=4096)
    target.config._name_or_path = "tiny-target"
    same = perturbed_copy(target, 0.2)
    cross_model = tiny_model("qwen2", vocab=len(draft_tok), hidden=32, seed=3, max_positions=4096)
    cross_model.config._name_or_path = "tiny-cross"
    cross = CrossDraft(cross_model, draft_tok, tok)
    recipes = {SAME: Recipe(tree="sequoia", budget=8, depth=4, acceptance=default_acceptance(None, 0.0)),
               CROSS: cross_recipe(args.cross_depth, target, cross)}
    labels = {SAME: "tiny-same", CROSS: "tiny-cross"}
    settings = {"target": "tiny random Llama (float32), byte-level BPE of 384 tokens",
                SAME: "its perturbed copy (same tokenizer)",
                CROSS: "tiny random Qwen2 with another byte-level BPE (320 tokens)"}
    drafts = {SAME: same, CROSS: cross}
    # HF static + compile with dynamo's aot_eager backend: the smoke checks its plumbing in seconds (inductor's
    # compile of it under freezing: tests/test_freezing.py)
    return Setup(target, tok, methods_for(target, drafts, recipes, labels, backend="aot_eager"), settings, drafts,
                 labels)


# -- summary ---------------------------------------------------------------------------------------


def paired_speed(by_method: dict[str, dict[int, dict]], a: str, b: str, prompts: Sequence[int]) -> dict:
    """Speed of ``a`` over ``b`` (seconds of b / seconds of a, same prompts and tokens), with its interval."""
    return intervals.ratio_of_sums([by_method[b][p]["seconds"] for p in prompts],
                                   [by_method[a][p]["seconds"] for p in prompts]).as_dict()


def summarize(records: Sequence[dict], dataset: str, reference: str, pairs: Sequence[tuple[str, str]],
              warmup: dict[str, float] | None = None) -> dict:
    """``compare.summarize`` (with each method's warm-up seconds: HF static + compile's compile) plus, per method:
    greedy agreement with ``reference`` (the target alone), per-drafter acceptance, draft forwards per step and draft
    seconds per forward; and the speed ratios of ``pairs`` (paired per prompt)."""
    s = compare.summarize(records, dataset, warmup)
    by_method: dict[str, dict[int, dict]] = {}
    for r in records:
        if r["dataset"] == dataset:
            by_method.setdefault(r["method"], {})[r["prompt"]] = r
    prompts = s["prompts"]
    if not prompts:
        return s
    ref = [by_method[reference][p] for p in prompts]
    s["agreement"] = {}
    for name, entry in s["methods"].items():
        sel = [by_method[name][p] for p in prompts]
        if name != reference:
            same = [r["output"] == q["output"] for r, q in zip(sel, ref)]
            s["agreement"][name] = {"against": reference, "identical": sum(same), "of": len(same),
                                    "mismatched_prompts": [p for p, ok in zip(prompts, same) if not ok]}
        if "draft_forwards" in sel[0]:
            proposed = sum(d["proposed"] for r in sel for d in r["drafters"])
            accepted = sum(d["accepted"] for r in sel for d in r["drafters"])
            entry["acceptance"] = accepted / proposed if proposed else 0.0  # drafted tokens kept / verified
            entry["proposed_per_step"] = proposed / sum(r["steps"] for r in sel)
            entry["draft_forwards_per_step"] = sum(r["draft_forwards"] for r in sel) / sum(r["steps"] for r in sel)
            entry["draft_seconds_per_forward"] = intervals.ratio_of_sums(
                [r["drafting_seconds"] for r in sel], [r["draft_forwards"] for r in sel]).as_dict()
            entry["verify_seconds_per_step"] = sum(r["verifying_seconds"] for r in sel) / sum(r["steps"] for r in sel)
            entry["draft_share"] = sum(r["drafting_seconds"] for r in sel) / sum(r["seconds"] for r in sel)
    s["target_seconds_per_token"] = sum(r["seconds"] for r in ref) / sum(r["tokens"] for r in ref)
    for a, b in pairs:
        if a in by_method and b in by_method:
            s["speedups"][f"{a} vs {b}"] = paired_speed(by_method, a, b, prompts)
    return s


def draft_table(summary: dict) -> str:
    """Per treespec method: acceptance, tau, tokens proposed and draft forwards per step, draft cost."""
    lines = ["| method | acceptance (kept / verified drafted tokens) | tau | proposed / step | draft forwards / step "
             "| draft s / forward | = target tokens' time | drafting share of time | verify s / step |",
             "|---|---|---|---|---|---|---|---|---|"]
    t = summary.get("target_seconds_per_token")
    for name, e in summary["methods"].items():
        if "acceptance" not in e:
            continue
        per = e["draft_seconds_per_forward"]["estimate"]
        lines.append(f"| {name} | {e['acceptance']:.2f} | {compare.fmt(e.get('tau'))} | {e['proposed_per_step']:.1f} | "
                     f"{e['draft_forwards_per_step']:.1f} | {compare.fmt(e['draft_seconds_per_forward'], 3)} | "
                     f"{per / t:.2f} | {e['draft_share']:.0%} | {e['verify_seconds_per_step']:.3f} |")
    return "\n".join(lines)


def agreement_lines(summary: dict) -> str:
    out = []
    for name, a in summary.get("agreement", {}).items():
        line = f"- {name}: greedy output identical to {a['against']} on {a['identical']}/{a['of']} prompts"
        divs = [f"{summary['dataset']}/{d['prompt']} from token {d.get('position')} (target top-2 logit gap "
                f"{d.get('top2_gap', float('nan')):.3f})" for d in a.get("divergences", [])]
        out.append(line + (f"; first differences: {', '.join(divs)}" if divs else ""))
    return "\n".join(out)


# -- main ------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="results directory (resumed if it holds results.jsonl)")
    ap.add_argument("--datasets", nargs="+", default=["humaneval", "sharegpt"], choices=DATASETS)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per dataset (from --start)")
    ap.add_argument("--start", type=int, default=0, help="index of the first prompt of each dataset")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--cross-depth", type=int, default=6,
                    help="draft tokens per step of the cross-tokenizer drafter (its greedy chain)")
    ap.add_argument("--smoke", action="store_true", help="tiny in-process models (seconds), for tests")
    args = ap.parse_args(argv)
    for name in ("prompts", "max_new_tokens", "cross_depth"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.start < 0:
        ap.error("--start must be >= 0")
    return args


def fastest_assisted(setup: Setup, args: argparse.Namespace, prompt_ids: Any) -> list[compare.Method]:
    """``setup``'s methods with each HF assisted method in its setting fastest on one prompt of each set outside the
    measured ones (``compare.fastest_assisted_method``, cached in ``--out``); the choice goes into the settings."""
    outside = args.start - 1 if args.start else args.start + args.prompts  # just before the range, or just after
    search = [prompt_ids(d, outside) for d in args.datasets]
    chosen = {}
    for role, draft in setup.drafts.items():
        name = f"hf-assisted-{setup.labels[role]}"
        model, tokenizers = tokenizers_of(draft)
        chosen[name], speeds = compare.fastest_assisted_method(
            setup.target, model, search, args.max_new_tokens, name=name, cache=args.out / f"{name}.search.json",
            tokenizers=tokenizers)
        setup.settings[name] = compare.assisted_choice(speeds, f"prompt {outside} of each set", who=name,
                                                       tokens=args.max_new_tokens)
        print(setup.settings[name], flush=True)
    return [chosen.get(m.name, m) for m in setup.methods]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python experiments/bench_cross.py " + " ".join(shlex.quote(a) for a in
                                                              (sys.argv[1:] if argv is None else argv))
    args.out.mkdir(parents=True, exist_ok=True)
    setup = (smoke_setup if args.smoke else real_setup)(args)
    tok = setup.tokenizer
    prompt_ids = lambda d, i: encode_prompt(tok, d, dataset_prompts(d)[i])  # noqa: E731
    prompts = measured_prompts(tok, args)

    def show(r: dict) -> None:
        print(f"  {r['dataset']}/{r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s"
              + (f", tau {r['tau']:.2f}" if "tau" in r else ""), flush=True)

    methods = fastest_assisted(setup, args, prompt_ids)
    results = args.out / "results.jsonl"
    records = compare.run(methods, prompts, args.max_new_tokens, results, on_record=show,
                          settings={"cross_depth": args.cross_depth})
    warmup = compare.warmup_seconds(results)
    names = [m.name for m in methods]
    reference, _, as_same, as_cross, ts_same, ts_cross = names  # the second: HF static + compile
    pairs = [(as_same, reference), (as_cross, reference), (ts_cross, ts_same), (as_cross, as_same)]
    summaries = []
    for d in dict.fromkeys(p[0] for p in prompts):
        s = summarize(records, d, reference, pairs, warmup)
        compare.locate_divergences(setup.target, records, s, prompt_ids)
        summaries.append(s)
    meta = {"machine": f"{cpu_model()}, {torch.get_num_threads()} torch threads", "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": command,
            "max_new_tokens": args.max_new_tokens, "greedy": True,
            "prompts": f"{args.start}..{args.start + args.prompts - 1}"
            " of each dataset", "settings": setup.settings}
    result = {**meta, "summaries": summaries}
    (args.out / "summary.json").write_text(json.dumps(result, indent=1, default=str))
    tables = "\n\n".join(f"{compare.markdown({**s, 'agreement': {}})}\n\nDrafts:\n\n{draft_table(s)}\n\n"
                         f"Greedy agreement with the target alone (HF, same precision):\n\n{agreement_lines(s)}"
                         for s in summaries if s["prompts"])
    settings = "\n".join(f"- {k}: {v}" for k, v in setup.settings.items() if k != "precision_choice")
    (args.out / "README.md").write_text(
        f"# A cross-tokenizer draft (SmolLM2-135M) vs the matching draft (Qwen 0.5B), CPU\n\n"
        f"Machine: {meta['machine']}, torch {meta['torch']}; {meta['date']}.\n"
        f"Command: `{command}`.\n\n{settings}\n\n{args.max_new_tokens} greedy tokens per prompt (no early stop), "
        f"prompts {meta['prompts']}; the methods run interleaved per prompt. HumanEval prompts are raw "
        f"completions; ShareGPT first turns go through the target's chat template. Intervals: bootstrap 95% "
        f"over prompts (`treespec.bench.intervals`), ratios paired per prompt.\n\n{tables}\n")
    compare.plot([s for s in summaries if s["prompts"]], args.out / "tokens_per_second.png")
    print(tables)
    return result


if __name__ == "__main__":
    main()
