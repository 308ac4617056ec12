"""Acceptance walks of several prompts at once against one at a time, on the real pair: ``measure(batch_size=B)``.

``treespec accept`` (and every calibration: the sweep's, the pilot's) writes each prompt's continuation one token at
a time with both models (``treespec.calibrate.ranks.walk_ranks``). Walked together, ``B`` prompts are the rows of
one forward per model and position, each drawing from its own generator as it would alone. This times both ways on
the same prompts in one process (the built-in pair, the target at the precision ``treespec accept`` loads here and
the draft in int4 by default, greedy top-k as the CLI's default), and compares what they measured: each prompt's
ranks, position by position (a batched forward may round differently from a single-row one, so a near tie may
break the other way and the walks then go apart; on the tiny float32 models of ``tests/test_acceptance_walk.py``
they agree exactly). A dynamic int8 model is walked one prompt at a time whatever the batch size (its activations
share one scale per forward).

    python experiments/bench_accept_batch.py --out experiments/results/accept-batch-cpu

Each batch size's record is appended to ``results.jsonl`` when it finishes; a re-run skips what is recorded.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from treespec.bench.datasets import humaneval_prompts
from treespec.calibrate.acceptance import encode_prompts, measure_each
from treespec.common.machine import machine
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from treespec.models.pair import load_pair
from treespec.models.precision import precision_of


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="directory for results.jsonl and README.md (resumed)")
    ap.add_argument("--prompts", default="0:8", metavar="A:B", help="HumanEval prompts A..B-1 (the CLI's default "
                                                                   "calibration prompts are 0:20)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--target-dtype", default=None, help="as `treespec accept --dtype` (default: auto)")
    ap.add_argument("--draft-dtype", default="int4",
                    help="default int4 (weight-only: a row's logits do not depend on its batch mates); a dynamic int8 "
                         "draft (what auto picks on some CPUs) is always walked one prompt at a time")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "results.jsonl"
    done = {r["batch_size"]: r for r in map(json.loads, log.read_text().splitlines())} if log.exists() else {}
    a, b = map(int, args.prompts.split(":"))
    target, tok, drafts = load_pair(DEFAULT_TARGET, [DEFAULT_DRAFT], target_dtype=args.target_dtype,
                                    draft_dtype=args.draft_dtype)
    prompts = encode_prompts(tok, humaneval_prompts(a, b))
    precision = {"target": precision_of(target), "draft": precision_of(drafts[0])}
    measure_each(target, drafts[0], prompts[:1], max_new_tokens=2, progress=False)  # warm-up (first-call costs)
    for size in args.batch_sizes:
        if size in done:
            print(f"batch size {size}: recorded ({done[size]['seconds']:.1f} s)")
            continue
        t = time.perf_counter()
        parts = measure_each(target, drafts[0], prompts, max_new_tokens=args.max_new_tokens, batch_size=size)
        seconds = time.perf_counter() - t
        record = {"batch_size": size, "seconds": seconds, "prompts": f"humaneval[{a}:{b}]",
                  "max_new_tokens": args.max_new_tokens, "positions": sum(len(p.ranks[0]) for p in parts),
                  "ranks": [p.ranks[0] for p in parts], "precision": precision,
                  "machine": machine("cpu"), "python": platform.python_version(), "torch": torch.__version__,
                  "threads": torch.get_num_threads()}
        with log.open("a") as f:
            f.write(json.dumps(record) + "\n")
        done[size] = record
        print(f"batch size {size}: {seconds:.1f} s", flush=True)
    write_readme(args.out, done)


def write_readme(out: Path, done: dict[int, dict]) -> None:
    """The side-by-side table: seconds, positions per second, ratio against one prompt at a time, and how many
    positions each batched walk shares with the one-at-a-time walk (up to the first difference, per prompt)."""
    sizes = sorted(done)
    base = done[sizes[0]]
    lines = [f"# Acceptance walks, {base['prompts']}, {base['max_new_tokens']} tokens each, greedy top-k (width 8)",
             "", f"Machine: {base['machine']}; torch {base['torch']}, {base['threads']} threads; target "
             f"{base['precision']['target']}, draft {base['precision']['draft']}.", "",
             "| batch size | seconds | positions/s | speedup vs batch size "
             f"{sizes[0]} | positions equal to batch size {sizes[0]}'s walk, before the first difference |",
             "|---|---|---|---|---|"]
    for size in sizes:
        r = done[size]
        same = sum(_common_prefix(x, y) for x, y in zip(r["ranks"], base["ranks"]))
        lines.append(f"| {size} | {r['seconds']:.1f} | {r['positions'] / r['seconds']:.1f} | "
                     f"{base['seconds'] / r['seconds']:.2f}x | {same} of {base['positions']} |")
    lines += ["", "Command: `python experiments/bench_accept_batch.py --out " + str(out) + "` (one process, batch "
              "sizes in order after one warm-up walk)."]
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _common_prefix(x: list[int], y: list[int]) -> int:
    n = 0
    for a, b in zip(x, y):
        if a != b:
            break
        n += 1
    return n


if __name__ == "__main__":
    main()
