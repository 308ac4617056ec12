"""Drafters side by side on the real pair (greedy, HumanEval): n-gram, model, both, HF baselines.

A thin front over the sweep harness, so every method runs in one process on the same prompts with
the same number of tokens, and finished points survive an interruption (re-run to resume).

    flock /tmp/treespec-real.lock python experiments/bench_drafters.py \\
        [--config experiments/configs/drafters-qwen-coder.toml] [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from treespec.bench.sweep import sweep

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "experiments/configs/drafters-qwen-coder.toml")
    ap.add_argument("--out", type=Path, default=None, help="results folder (default: experiments/results/<name>)")
    args = ap.parse_args(argv)
    results = sweep(args.config, out_dir=args.out)
    print((results.parent / "README.md").read_text())


if __name__ == "__main__":
    main()
