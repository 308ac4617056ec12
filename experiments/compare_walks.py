"""The shipped acceptance walks now beside those of an earlier commit: per file, the continuations that end early,
the positions, the draft's first choice accepted, and the chain a temperature's tuner runs replayed with its
confidence stop over all positions and over the first 64 (what a 64-token run is predicted with). Prints the
table of docs/defaults.md, "The shipped walks end where a run stops" (no model runs; a few seconds):

    python experiments/compare_walks.py --before 273a2d2
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from tree_builders import chain
from treespec.calibrate.acceptance import MeasuredAcceptance

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("t0-int4", "t1-int4", "t0", "t1", "chat-t0-int4", "chat-t1-int4", "chat-t0", "chat-t1")


def walk(name: str, rev: str | None) -> MeasuredAcceptance:
    """The shipped walk ``name`` as it is (``rev`` None) or at commit ``rev``."""
    path = f"treespec/data/acceptance-qwen2.5-coder-{name}.json"
    text = (ROOT / path).read_text() if rev is None else subprocess.check_output(
        ["git", "-C", str(ROOT), "show", f"{rev}:{path}"], text=True)
    return MeasuredAcceptance.from_dict(json.loads(text))


def first(w: MeasuredAcceptance, shape, stop: float, horizon: int = 64) -> float:
    tokens, steps = w.replayed_steps(shape, stop, horizon)[:2]
    return sum(tokens) / sum(steps)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit whose shipped walks are compared")
    args = ap.parse_args(argv)
    print("| walk | prompts ending early | positions | first choice accepted | chain replay, all positions "
          "| over the first 64 |")
    print("|---|---|---|---|---|---|")
    for name in NAMES:
        a, b = walk(name, args.before), walk(name, None)
        shape, stop, label = (chain(7), 0.1, "depth 7, stop 0.1") if "t1" in name else (chain(8), 0.3,
                                                                                          "depth 8, stop 0.3")
        early = sum(len(r) < b.meta["max_new_tokens"] for r in b.ranks)
        print(f"| `{name}` | {early} of {len(b.ranks)} | {a.positions:,} -> {b.positions:,} | {a.vector[0]:.3f} -> "
              f"{b.vector[0]:.3f} | {label}: {a.replayed_tau(shape, stop):.2f} -> {b.replayed_tau(shape, stop):.2f} "
              f"| {first(a, shape, stop):.2f} -> {first(b, shape, stop):.2f} |")


if __name__ == "__main__":
    main()
