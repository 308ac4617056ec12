"""``treespec demo``: the main job on the default pair, treespec beside each HF method a user would pick.

Loads the built-in Qwen2.5-Coder pair (1.5B target, 0.5B draft) in the precisions measured fastest
here, measures this machine's forward latencies (``treespec.calibrate.tuning``; cached), sizes a Sequoia tree
for them from the shipped acceptance, then decodes a few HumanEval evaluation prompts (100
onwards: disjoint from the calibration prompts; ``--chat``: ShareGPT first turns from 100 on as user turns in the chat
template, the tree sized from chat's shipped acceptance) greedily, interleaved per prompt (``treespec.bench.compare``):
HF ``generate`` eager (in float32 too, the sceptic's baseline, where the target's float32 copy fits in this machine's
memory: :func:`float32_baseline_refused`; and in the target's precision), HF with a static
cache + ``torch.compile`` (inductor weight freezing; CUDA graphs too on a GPU), HF assisted generation
with the same draft, and treespec. Every method makes the same warm-up call first (its compiles), shown apart
and counted in no tok/s. The report names the fastest of the HF methods that ran, the speedup over it with its
interval, the tuner's prediction beside the measurement, and the best branching tree of the chosen budget
beside the chosen one. ``--quick`` runs HF eager only, and the report says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
from pathlib import Path
from typing import Any, Sequence

import torch

from ..calibrate.vectors import default_acceptance
from ..common.files import check_writable
from ..common.machine import available_memory
from ..core.checks import check_prompts_fit, context_of
from ..models.precision import float32_bytes, precision_of
from ..models.timing import measure_plain_decode
from ..recipes import Recipe, run
from ..calibrate.choices import Resolved, resolve_run
from ..calibrate.step_cost import run_speedup
from ..calibrate.tuning import Prediction
from . import compare
from ..common.prompts import user_turn
from .datasets import dataset_prompts

#: the demo's prompts start at this index of their set: HumanEval problems 100 on (the calibration walked 0-39),
#: or with ``--chat`` ShareGPT first turns 100 on (chat's walked turns 1000-1099)
FIRST_PROMPT = 100
#: how many prompts of the demo's set, just before its measured ones, HF assisted generation's settings are timed on
#: (``compare.fastest_assisted_method``: the HF method is run at its fastest, as found on prompts it is not measured on)
ASSISTED_SEARCH_PROMPTS = 2
#: how a prompt of each set is named in the demo's lines
LABELS = {"humaneval": "HumanEval", "sharegpt": "ShareGPT"}


def demo_prompts(tok: Any, count: int, chat: bool = False, first: int = FIRST_PROMPT
                 ) -> list[tuple[str, int, list[int]]]:
    """``(dataset, index, token ids)`` of ``count`` prompts from ``first`` on (the demo's: :data:`FIRST_PROMPT`):
    HumanEval problems as written, or (``chat``) ShareGPT first turns as user turns in the target's chat template,
    what a chat user sends (refused for a tokenizer without a template)."""
    if not chat:
        return [("humaneval", first + i, tok(text)["input_ids"]) for i, text in
                enumerate(dataset_prompts("humaneval")[first:first + count])]
    return [("sharegpt", first + i, user_turn(tok, text)) for i, text in
            enumerate(dataset_prompts("sharegpt")[first:first + count])]


def prompt_set(prompts: list[tuple[str, int, list[int]]], chat: bool) -> str:
    """The demo's prompts in words: which set, which of its prompts, and how they were sent."""
    first, last = prompts[0][1], prompts[-1][1]
    what = "ShareGPT first turns" if chat else "HumanEval prompts"
    return f"{what} {first}-{last}" + (" as user turns in the chat template" if chat else "")


def predicted_and_measured(predicted: Prediction, records: list[dict[str, Any]], target_alone: str,
                           draft_prefill: float = 0.0) -> str:
    """A markdown table of the tuner's prediction (a ``tuning.Prediction``) beside the demo's measurement: tokens
    per step, seconds per step, and the speedup over the target alone with each prompt's prefill charged to both
    sides (the treespec runs' mean prefill; plain decoding costs ``predicted.plain_seconds`` per token after the
    first, which its prefill gives (:meth:`~treespec.calibrate.tuning.Prediction.run_speedup`), in the prediction and
    is ``target_alone``, HF ``generate`` in the target's precision, in the measurement: its decoding seconds, the
    run's less its own prefill, where its records carry one, else its whole run). A
    replayed prediction's tau carries the range a run over this many prompts lands in
    (:meth:`~treespec.calibrate.tuning.Prediction.tau_range`). ``draft_prefill``: the seconds of treespec's prefill
    that are the draft's (predicted: ``Tuned.draft_prefill``), which plain decoding does not run: charged to
    treespec's side alone, the rest (the target's) to both."""
    mine = [r for r in records if r["method"] == "treespec"]
    alone = [r for r in records if r["method"] == target_alone]
    if not mine or not alone:
        return ""
    steps = sum(r["steps"] for r in mine)
    step_seconds = sum(r["drafting_seconds"] + r["verifying_seconds"] + r["engine_seconds"] for r in mine) / steps
    tokens = sum(r["tokens"] for r in mine) / len(mine)  # per prompt
    prefill = sum(r["prefill_seconds"] for r in mine) / len(mine)
    predicted_run = predicted.run_speedup(tokens, prefill, draft_prefill)

    def decoding(rs: list[dict[str, Any]], first: int = 0) -> float:  # seconds per token decoded after the prefill
        return sum(r["seconds"] - r["prefill_seconds"] for r in rs) / sum(r["tokens"] - first for r in rs)

    # HF's prefill gives its first token (its records' prefill ends there): it decodes one token fewer after it
    own_prefill = all("prefill_seconds" in r for r in alone)
    if own_prefill:  # both sides decode after the same prefill
        # the measured run: a "step" of one token at its measured seconds per token (tau 1)
        measured_run = run_speedup(tokens, decoding(mine), 1.0, decoding(alone, 1), prefill, draft_prefill)
    else:
        measured_run = (sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)) / (
            sum(r["tokens"] for r in alone) / sum(r["seconds"] for r in alone))
    spread = predicted.tau_range(len(mine))
    tau = f"{predicted.tau:.2f}" + (f" (90% of {len(mine)}-prompt runs: {spread[0]:.2f}-{spread[1]:.2f})"
                                    if spread else "")
    rows = [("tokens per step (tau)", tau, f"{sum(r['tokens'] for r in mine) / steps:.2f}"),
            ("seconds per step", f"{predicted.step_seconds:.3f}", f"{step_seconds:.3f}"),
            *([("the target alone's decoding, seconds per token (HF generate, after its prefill and first token)",
                f"{predicted.plain_seconds:.3f}", f"{decoding(alone, 1):.3f}")] if own_prefill else []),
            ("speedup over the target alone, " + (
                f"{prefill:.2f} s of prefill per prompt charged to both" if not draft_prefill else
                f"{prefill - draft_prefill:.2f} s of the target's prefill per prompt charged to both and the draft's "
                f"{draft_prefill:.2f} s (predicted) to treespec"),
             f"{predicted_run:.2f}x", f"{measured_run:.2f}x")]
    note = ("", "The speedup row's measurement charges the same prefill to both sides, as the prediction does; the "
            "paired ratios above time each side's whole run, its own prefill included (treespec's holds the draft's "
            "pass over the prompt too), so the two measured speedups differ by the prefills' difference.")
    return "\n".join(["| | predicted | measured |", "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows),
                      *(note if own_prefill else ())])


def retimed(prediction: Prediction, target: torch.nn.Module, prompts: list[list[int]], tokens: int = 24
            ) -> Prediction:
    """``prediction`` with the target alone's decoding timed now (``measure_plain_decode``, HF ``generate`` after a
    context of the prompts' mean length, ``tokens`` tokens), not when the profile was measured: on a shared host
    that speed moves by a fifth within minutes while a prompt's prefill holds (memory bandwidth, not compute;
    ``experiments/hf_decode_timing.py --interleaved``), and a profile is cached for hours. Timed twice, the faster
    kept: a stall of the host only adds time (once, in ``treespec demo --quick --prompts 1`` on this project's 2-core
    CPU, a call read 0.105 s per token where the run then measured 0.078)."""
    context = round(statistics.mean(len(ids) for ids in prompts))
    seconds = min(measure_plain_decode(target, context, tokens) for _ in range(2))
    return dataclasses.replace(prediction, plain_seconds=seconds)


#: the share of this machine's available memory the sceptic's float32 copy of the target may take: the rest is the
#: run's (HF's compiled graphs, caches, the tokenizer) and the machine's
FLOAT32_SHARE = 0.8


def float32_baseline_refused(target: torch.nn.Module, available: int | None = None) -> str | None:
    """Why the sceptic's baseline (HF eager on the target loaded again in float32) is not run, or None where its
    copy fits: its float32 weights (``precision.float32_bytes``) within :data:`FLOAT32_SHARE` of the memory this
    machine has available (``available``, default ``machine.available_memory``; unknown: it runs). A copy that does
    not fit would end the demo minutes in, its finished work with it, or swap and time the swapping."""
    need = float32_bytes(target)
    available = available_memory() if available is None else available
    if available is None or need <= FLOAT32_SHARE * available:
        return None
    return (f"The float32 baseline (HF generate eager on the target loaded again in float32) was not run: its "
            f"weights need about {need / 2**30:.1f} GiB and this machine has {available / 2**30:.1f} GiB available; "
            f"the HF methods in the target's own precision ran as usual.")


def baseline_methods(target: torch.nn.Module, draft: torch.nn.Module, quick: bool,
                     search: Sequence[tuple[str, int, list[int]]] = (), max_new_tokens: int = 64,
                     cache: Path | None = None) -> tuple[list[compare.Method], str]:
    """The HF methods a user would pick, each at its fastest: ``generate`` eager, with a static cache +
    ``torch.compile``, and assisted by ``draft`` in the setting fastest on the ``search`` prompts (``(dataset,
    index, ids)``, apart from the measured ones; ``compare.fastest_assisted_method``); ``quick``: eager only.
    Returns the methods and a line saying which assisted setting was kept and why ("" with ``quick``); ``cache``:
    the search's figures, kept for a resumed run."""
    methods = [compare.hf_method(target)]
    if quick:
        return methods, ""
    if not search:
        raise ValueError("baseline_methods: HF assisted generation needs prompts to search its settings on")
    print("HF assisted generation: timing its settings on prompts apart from the measured ones ...", flush=True)
    assisted, speeds = compare.fastest_assisted_method(
        target, draft, [ids for _, _, ids in search], max_new_tokens,
        on_setting=lambda setting, speed: print(f"  {setting}: {speed:.2f} tok/s", flush=True), cache=cache)
    where = f"{LABELS.get(search[0][0], search[0][0])} {search[0][1]}-{search[-1][1]}"
    return methods + [compare.hf_compiled_method(target), assisted], compare.assisted_choice(
        speeds, where, tokens=max_new_tokens)


def headline_line(summary: dict[str, Any], quick: bool) -> str:
    """The demo's last line: treespec's speedup over the fastest of the HF methods that ran, named as such (and,
    when that is HF's own speculative decoding, over the fastest plain decoding too)."""
    line = (f"speedup over the {compare.FASTEST_ANY} ({summary['fastest_any']}): "
            f"{compare.fmt(summary['headline_any']['treespec'])}x")
    if summary["fastest_any"] != summary["fastest_baseline"]:
        line += (f"; over the {compare.FASTEST_PLAIN} ({summary['fastest_baseline']}): "
                 f"{compare.fmt(summary['headline']['treespec'])}x")
    if quick:
        line += ("\n(--quick: HF generate eager only; HF with a static cache + torch.compile and HF assisted "
                 "generation, usually faster, were not run)")
    return line


def why_this_shape(tuned: Any, acceptance: Any) -> str:
    """Why the chosen tree won here: it beside the best tree of the same budget that branches, both predicted
    on the tuner's costs (tau from the acceptance rows, seconds per step from the measured forwards)."""
    choice, prof = tuned.choice, tuned.profile
    step_seconds = prof.step_seconds(choice.shape)
    mine = f"tau {choice.tau:.2f} at {step_seconds:.3f} s per step"
    if choice.shape.depth == 0:
        return f"Plain decoding was chosen: no tree is predicted to pay on this machine ({mine})."
    other = prof.best_branching(acceptance, choice.shape.size, max(choice.shape.depth, 8))
    kind = "a chain" if choice.shape.max_width == 1 else f"a tree of widths {list(choice.shape.widths)}"
    if other is None:
        return (f"Chosen: {kind} of {choice.shape.size} nodes ({mine}); no tree of that budget branches usefully "
                "(fewer than 3 nodes, or acceptance rows under which a second child adds nothing).")
    shape, tau, seconds = other
    if shape.paths == choice.shape.paths:
        return f"Chosen: {kind} of {choice.shape.size} nodes ({mine}): the best branching tree of its budget."
    verdict = ("it accepts more per step, but its wider levels cost more here" if tau > choice.tau else
               "it accepts less per step")
    return (f"Chosen: {kind} of {choice.shape.size} nodes, depth {choice.shape.depth} ({mine}, "
            f"{choice.tau / step_seconds:.2f} tokens/s predicted). The best branching tree of the same "
            f"budget (depth {shape.depth}, widths {list(shape.widths)}): tau {tau:.2f} at {seconds:.3f} s per step, "
            f"{tau / seconds:.2f} tokens/s predicted: {verdict}. (Both by the tuner's expectation over the "
            "acceptance rows, every level drafted, the confidence stop aside: the figures the trees were compared by.)")


def run_demo(args: argparse.Namespace, target: torch.nn.Module, tok: Any, draft: torch.nn.Module) -> int:
    """The demo on a loaded pair (``args``: ``out``, ``prompts``, ``max_new_tokens``, ``device``,
    ``target`` for the float32 baseline, ``quick``: HF eager only); returns 0 when every greedy output equals HF's."""
    out_dir = check_writable(args.out, directory=True)
    chat = getattr(args, "chat", False)
    prompts = demo_prompts(tok, args.prompts, chat)  # a missing chat template or prompt set: refused before tuning
    context = context_of(target)  # a prompt too long for the model: refused before tuning too
    check_prompts_fit([len(ids) for _, _, ids in prompts], args.max_new_tokens, context,
                      [f"{LABELS[name]}/{index}" for name, index, _ in prompts])
    print(f"treespec demo on {platform.machine()} with {torch.get_num_threads()} threads, device {args.device}")
    resolved, png, shape_note = _configuration(args, target, tok, draft, out_dir, [ids for *_, ids in prompts])
    recipe, tuned = resolved.recipe, resolved.tuned
    prof, choice = tuned.profile, tuned.choice
    quick = getattr(args, "quick", False)
    search = demo_prompts(tok, ASSISTED_SEARCH_PROMPTS, chat, first=FIRST_PROMPT - ASSISTED_SEARCH_PROMPTS)
    methods, assisted_note = baseline_methods(target, draft, quick, search, args.max_new_tokens)
    no_float32 = None
    if precision_of(target) != "float32":  # the sceptic's baseline: the target alone in float32 too
        no_float32 = float32_baseline_refused(target)
        if no_float32 is None:
            from ..models import load

            methods.insert(0, compare.hf_method(load(args.target, device=args.device, dtype="float32")[0]))
        else:
            print(no_float32, flush=True)
    methods.append(compare.treespec_method(lambda ids, n: run(recipe, target, [draft], ids, max_new_tokens=n),
                                           precision_of(target)))
    dataset = prompts[0][0]
    prediction = retimed(tuned.prediction, target, [tokens for _, _, tokens in prompts])
    print(f"the target alone's decoding timed now: {prediction.plain_seconds:.3f} s per token (the profile's: "
          f"{tuned.prediction.plain_seconds:.3f})", flush=True)
    results = out_dir / "results.jsonl"
    results.unlink(missing_ok=True)  # the demo measures afresh each run
    compare.warmup_file(results).unlink(missing_ok=True)
    records = compare.run(methods, prompts, args.max_new_tokens, results, context=context, on_record=lambda r: print(
        f"  {LABELS[dataset]}/{r['prompt']} {r['method']}: {r['tokens_per_second']:.2f} tok/s"
        + (f", tau {r['tau']:.2f}" if "tau" in r else ""), flush=True))
    summary = compare.summarize(records, dataset, compare.warmup_seconds(results))
    ids = {index: tokens for _, index, tokens in prompts}
    compare.locate_divergences(target, records, summary, lambda dataset, p: ids[p])
    agreement = summary.get("agreement", {}).get("treespec", {"of": 0, "divergences": []})
    divergences = agreement["divergences"]
    exact = agreement["of"] == len(prompts) and all(d["near_tie"] for d in divergences)
    headline = headline_line(summary, quick)
    report = compare.markdown(summary) + f"\n\n{shape_note}" + (f"\n\n{assisted_note}" if assisted_note else "")
    versus = predicted_and_measured(prediction, records, compare.hf_method(target).name,
                                    tuned.draft_prefill if recipe.budget > 1 else 0.0)
    if versus:
        how = ("the tree replayed over the shipped calibration walk with the run's confidence stop"
               if prediction.model == "replay"
               else "the DP's expectation over the acceptance rows, every level drafted")
        report += f"\n\nThe tuner's prediction ({how}) beside this run:\n\n{versus}"
    if divergences:
        report += "\n\n" + divergence_lines(divergences, precision_of(target), LABELS[dataset])
    if no_float32:
        report += f"\n\n{no_float32}"
    print("\n" + report)
    print(f"\n{headline}")
    (out_dir / "report.md").write_text(
        f"# treespec demo\n\nMachine: {platform.platform()}, {torch.get_num_threads()} threads, {args.device}.\n"
        f"Configuration, chosen from measured latencies: {resolved.why}.\n{args.max_new_tokens} greedy tokens per "
        f"prompt; {prompt_set(prompts, chat)}.\n\n{report}\n\n{headline}\n")
    (out_dir / "report.json").write_text(json.dumps({"summary": summary, "choice": choice.as_dict(),
                                                     "profile": prof.to_dict()}, indent=1))
    print(f"\nreport written to {out_dir / 'report.md'}; tree picture {png}")
    return 0 if exact else 1


def _configuration(args: argparse.Namespace, target: torch.nn.Module, tok: Any, draft: torch.nn.Module,
                   out_dir: Path, prompts: Sequence[Sequence[int]]) -> tuple[Resolved, Path, str]:
    """The configuration the demo runs on ``prompts`` (token ids), tuned on this machine and
    printed with the costs it was chosen by; its tree drawn to ``out_dir/tree.png``. Returns (the resolved recipe,
    the picture, why this shape won here)."""
    print("measuring forward latencies on this machine (cached after the first run) ...", flush=True)
    # on CUDA treespec compiles as HF's static-cache baseline does (both compile in their warm-up call, kept out of
    # tok/s): an eager step there is launch-bound, the route no GPU user runs; on a CPU the run's own choice. The tree
    # is sized from the shipped acceptance of this draft's precision (chat's with --chat), as `treespec generate` does
    cuda = next(target.parameters()).device.type == "cuda"
    resolved = resolve_run(Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0)), target, [draft], tok,
                           prompts=prompts, max_new_tokens=args.max_new_tokens,
                           chat=getattr(args, "chat", False), compile=True if cuda else None,
                           reason="on CUDA the demo compiles treespec as it compiles HF's static-cache baseline, "
                                  "each in its warm-up call" if cuda else None)
    acceptance = resolved.recipe.acceptance
    prof, choice = resolved.tuned.profile, resolved.tuned.choice
    levels = ", ".join(f"{w} tokens {s:.3f} s" for w, s in sorted((prof.draft_level_latency or {}).items()))
    print(f"  target forward: {prof.target_latency[1]:.3f} s for 1 token, {prof.target_latency[16]:.3f} s for 16; "
          f"draft level: {levels} (c = {choice.c:.2f})")
    print(f"  chosen: {resolved.why}")
    png = out_dir / "tree.png"
    choice.shape.draw(str(png), acceptance=acceptance, title=f"treespec demo tree (budget {choice.shape.size})")
    print(f"  tree drawn to {png}\n{choice.shape}")
    shape_note = why_this_shape(resolved.tuned, acceptance)
    print(f"  {shape_note}")
    return resolved, png, shape_note


def method_divergences(summary: dict[str, Any], precision: str, label: str) -> list[str]:
    """Each method's greedy differences from HF in ``summary`` (located by ``compare.locate_divergences``) as
    :func:`divergence_lines`' text headed by the method's name; methods that differ nowhere are left out."""
    return [f"{name}: " + divergence_lines(a["divergences"], precision, label)
            for name, a in summary.get("agreement", {}).items() if a.get("divergences")]


def divergence_lines(divergences: list[dict[str, Any]], precision: str, label: str = "HumanEval") -> str:
    """The demo's verdict on outputs that differ from HF's (``compare.locate_divergences``): ties at the target's
    precision are rounding, not a rule broken (the demo exits 0); a difference where one token leads is a bug (it
    exits 1)."""
    lines = [f"- {label}/{d['prompt']} differs from token {d['position']}: the target's top-2 logits there are "
             f"{d['top2_gap']:.3g} apart ({'a tie' if d['near_tie'] else 'NOT a tie'} in {precision})"
             for d in divergences]
    verdict = ("every difference is at a tie: forwards over a tree and over one token round differently, and "
               "either token is the target's argmax" if all(d["near_tie"] for d in divergences) else
               "a difference where the target prefers one token: exactness is broken (exit status 1)")
    return "Greedy differences from HF in the same precision:\n" + "\n".join(lines) + f"\n\n{verdict}."
