"""Measure the acceptance shipped for the built-in Qwen2.5-Coder pair.

Calibration prompts are HumanEval 0..N-1 (inside the 0-99 calibration range; evaluation uses
100-163). The continuation is walked (``treespec.calibrate.acceptance``, ``context="walk"``: written by
the acceptance rule one token at a time, both models running one incremental forward per token, as a
step runs them), with the target in bfloat16 and the draft in int8 as the CPU sweep ran them, 8
proposals per position in the mode a Sequoia tree drafts with at each temperature (top-k at T=0,
without replacement at T=1). Writes ``treespec/data/acceptance-qwen2.5-coder-t{0,1}.json``: the
positional vector, the per-depth matrix (what the CLI and the demo size Sequoia trees with when the
user gives no acceptance of their own) and every position's accepted rank (for replays).

The shipped files were measured with the defaults below (HumanEval 0-19, 96 tokens): they are the
``more-walk`` calibrations of ``experiments/results/acceptance-fit`` (``bench_acceptance_fit.py``), whose
predictions of the CPU sweep's measured tau that directory reports.

    python experiments/calibrate_default.py --prompts 20 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
from pathlib import Path

from treespec.calibrate.acceptance import encode_prompts, measure
from treespec.bench.datasets import humaneval_prompts
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load
from treespec.recipes import draft_mode

DATA = Path(__file__).resolve().parents[1] / "treespec" / "data"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    args = ap.parse_args(argv)
    if args.prompts > 100:
        ap.error("calibration prompts must stay inside HumanEval 0-99 (--prompts 100 or fewer)")
    target, tok = load(DEFAULT_TARGET, dtype="bfloat16")
    draft, _ = load(DEFAULT_DRAFT, dtype="int8", role="draft")
    prompts = encode_prompts(tok, humaneval_prompts(0, args.prompts))
    for t in args.temperatures:
        acc = measure(target, draft, prompts, width=args.width, mode=draft_mode("sequoia", t), temperature=t,
                      max_new_tokens=args.max_new_tokens, prompts_label=f"humaneval[0:{args.prompts}]")
        path = DATA / f"acceptance-qwen2.5-coder-t{t:g}.json"
        acc.save(path)
        print(path, acc)


if __name__ == "__main__":
    main()
