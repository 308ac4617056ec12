"""Measure the acceptance vectors shipped for the built-in Qwen2.5-Coder pair.

Calibration prompts are HumanEval 0..N-1 (inside the 0-99 calibration range; evaluation uses
100-163). Writes ``treespec/data/acceptance-qwen2.5-coder-t{0,1}.json``; the CLI and the demo use
them to build Sequoia trees when the user gives no vector of their own.

    python experiments/calibrate_default.py --prompts 12 --max-new-tokens 48
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
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--width", type=int, default=8)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    args = ap.parse_args(argv)
    assert args.prompts <= 100, "calibration prompts must stay inside HumanEval 0-99"
    target, tok = load(DEFAULT_TARGET)
    draft, _ = load(DEFAULT_DRAFT)
    prompts = encode_prompts(tok, humaneval_prompts(0, args.prompts))
    for t in args.temperatures:
        acc = measure(target, draft, prompts, width=args.width,
                      mode=draft_mode("sequoia", t), temperature=t,
                      max_new_tokens=args.max_new_tokens, prompts_label=f"humaneval[0:{args.prompts}]")
        path = DATA / f"acceptance-qwen2.5-coder-t{t:g}.json"
        acc.save(path)
        print(path, acc)


if __name__ == "__main__":
    main()
