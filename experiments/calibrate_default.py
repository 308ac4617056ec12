"""Measure the acceptance shipped for the built-in Qwen2.5-Coder pair.

Calibration prompts are drawn at random (``--seed``) from HumanEval 0-99, the set's calibration range:
the demo, the benchmarks and the CPU sweep's configs evaluate on prompts from 100 on, so the shipped
rows never saw an evaluation prompt. The draw matters: HumanEval's first prompts accept less than its
later ones, and the files shipped before were prompts 0-19, which underrated the sweep's measured tau
by up to 13% (``experiments/results/acceptance-fit``, ``more-walk``), where 40 prompts drawn at random
from outside the evaluation prompts come within a few percent (``random-walk``;
``experiments/results/predictions-cpu``).

The continuation is walked (``treespec.calibrate.acceptance``, ``context="walk"``: written by the
acceptance rule one token at a time, both models running one incremental forward per token, as a step
runs them), with the target in bfloat16 and the draft in int8 as the CPU sweep ran them, 8 proposals
per position in the mode a Sequoia tree drafts with at each temperature (top-k at T=0, without
replacement at T=1). Writes ``treespec/data/acceptance-qwen2.5-coder-t{0,1}.json``: the positional
vector, the per-depth matrix (what the CLI and the demo size Sequoia trees with when the user gives no
acceptance of their own) and every position's accepted rank (for replays). Each file is written as soon
as its temperature is measured (about 20 minutes each on the project's 2-core CPU). Each prompt's part is kept as it
is measured (``<file>.parts.jsonl`` beside the file, with the settings it was measured under): a stopped run, run
again with the same options, measures only what is missing, a finished temperature from its parts; the parts go
once every temperature of the run is written.

Each continuation ends at the target's end of text, where a run stops (``<|im_end|>`` or ``<|endoftext|>``; the
files are walked so since 2026-11-29: those shipped before went on through 96 tokens past it, into text no run
reaches, 365 of code's 3,840 positions at T=0 with the int4 draft and 1,249 of chat's, which underrated code's
acceptance: the T=0 depth-8 chain replayed 5.51 tokens per step over the first 64 positions, 5.70 now, where
24 held-out prompts measured 5.86).

``--dataset sharegpt`` measures what chat runs (``treespec generate --chat``) are sized with instead: 40 ShareGPT
first turns drawn the same way from turns 1000-1099 (the benchmarks evaluate on turns below 400), each as the user's
turn in the target's chat template, written to ``acceptance-qwen2.5-coder-chat-t{T}[-dtype].json``. A chat reply
accepts less than code (prose is less predictable than code that goes on as it began), so a tree sized from
code's rows speculates where chat does not pay.

    python experiments/calibrate_default.py
    python experiments/calibrate_default.py --draft-dtype int4 --temperatures 0   # the int4 draft's walk, T=0
    python experiments/calibrate_default.py --dataset sharegpt --draft-dtype int4  # chat's, in the chat template
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from treespec.bench.datasets import dataset_prompts
from treespec.calibrate.acceptance import MeasuredAcceptance, encode_prompts, measure_each
from treespec.common.jsonl import append_record, read_records, repair_tail
from treespec.common.prompts import user_turn
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.models.pair import eos_ids
from treespec.models.precision import precision_of, to_precision
from treespec.recipes import draft_mode

DATA = Path(__file__).resolve().parents[1] / "treespec" / "data"
CALIBRATION_RANGE = 100  # each set's calibration range: 100 prompts from its first (below)
#: the calibration sets: whether prompts go in the chat template, the infix of the files, and the first prompt of
#: the range (HumanEval 0-99: evaluations use 100 on; ShareGPT 1000-1099: the benchmarks use turns below 400)
SETS = {"humaneval": (False, "", 0), "sharegpt": (True, "chat-", 1000)}


def calibration_prompts(count: int, seed: int, first: int = 0) -> list[int]:
    """``count`` prompt indices drawn at random without replacement from ``first`` .. ``first + 99``, sorted."""
    draw = np.random.default_rng(seed).choice(CALIBRATION_RANGE, size=count, replace=False)
    return sorted(first + int(i) for i in draw)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", choices=sorted(SETS), default="humaneval",
                    help="the prompts: HumanEval (code, the default files) or ShareGPT first turns in the chat "
                         "template (the chat files)")
    ap.add_argument("--prompts", type=int, default=40, help="calibration prompts drawn from the set's range")
    ap.add_argument("--seed", type=int, default=0, help="the draw's seed")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    ap.add_argument("--draft-dtype", default="int8",
                    help="the draft's precision: int8 writes the default files, another (int4: what --compile and the "
                         "demo draft with here) writes acceptance-qwen2.5-coder-t{T}-{dtype}.json beside them, which "
                         "runs drafting in that precision are predicted with")
    args = ap.parse_args(argv)
    if not 1 <= args.prompts <= CALIBRATION_RANGE:
        ap.error(f"--prompts must be 1-{CALIBRATION_RANGE}: calibration prompts stay inside the set's range")
    target, tok = load(DEFAULT_TARGET, dtype="bfloat16")
    # converted from float32 as ``dtype="auto"`` converts what it keeps (``load(dtype="int4")`` would keep the GGUF
    # file's own 4-bit blocks instead: another draft than the one the CLI's automatic choice runs)
    draft = to_precision(load(DEFAULT_DRAFT, dtype="float32", role="draft")[0], args.draft_dtype)
    chat, infix, first = SETS[args.dataset]
    ids = calibration_prompts(args.prompts, args.seed, first)
    texts = [dataset_prompts(args.dataset)[i] for i in ids]
    prompts = [user_turn(tok, t) for t in texts] if chat else encode_prompts(tok, texts)
    label = (f"{args.dataset}{ids} (random, seed {args.seed}, from {first}-{first + CALIBRATION_RANGE - 1})"
             + (" in the chat template" if chat else ""))
    written = []
    for t in args.temperatures:
        path = DATA / (f"acceptance-qwen2.5-coder-{infix}t{t:g}"
                       f"{'' if args.draft_dtype == 'int8' else '-' + args.draft_dtype}.json")
        settings = {"prompts": ids, "dataset": args.dataset, "max_new_tokens": args.max_new_tokens,
                    "width": args.width, "temperature": t, "draft_dtype": args.draft_dtype, "ends_at_eos": True}
        parts_file = path.with_name(path.name + ".parts.jsonl")
        saved = kept_parts(parts_file, settings)

        def keep(j: int, part: MeasuredAcceptance | None) -> None:
            saved[j] = part
            append_record(parts_file, {"index": j, "part": part and part.to_dict(), "settings": settings})

        if len(saved) < len(prompts):
            if saved:
                print(f"{parts_file}: {len(saved)} of {len(prompts)} prompts measured before; measuring the others")
            measure_each(target, draft, prompts, width=args.width, mode=draft_mode("sequoia", t), temperature=t,
                         max_new_tokens=args.max_new_tokens, prompts_label=label, done=saved, on_prompt=keep,
                         eos_token_id=eos_ids(target, tok) or None)
        acc = MeasuredAcceptance.merge([saved[j] for j in sorted(saved) if saved[j] is not None])
        acc.meta.update(prompts=len(prompts), target_precision=precision_of(target),
                        draft_precision=precision_of(draft))
        acc.save(path)
        written.append(parts_file)
        print(path, acc)
    for parts_file in written:  # every temperature of the run is written: its parts are in the files
        parts_file.unlink(missing_ok=True)


def kept_parts(parts_file: Path, settings: dict) -> dict[int, MeasuredAcceptance | None]:
    """The prompts' parts ``parts_file`` keeps, by prompt index; refused where they were measured under other
    settings (the options of another run)."""
    repair_tail(parts_file)  # a torn last line from a stop while writing
    saved = {}
    for rec in read_records(parts_file):
        if rec.get("settings") != settings:
            raise SystemExit(f"{parts_file} holds parts measured under other settings ({rec.get('settings')}); "
                             "run with those options, or move it aside to measure afresh")
        saved[rec["index"]] = rec["part"] and MeasuredAcceptance.from_dict(rec["part"])
    return saved


if __name__ == "__main__":
    main()
