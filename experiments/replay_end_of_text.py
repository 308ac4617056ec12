"""The shipped walks replayed with a continuation's last steps at the target's end of text left out (as before
2026-11-29, later) and kept (as a run takes them): per file, the chain a temperature's tuner runs with its
confidence stop over all positions (the runs' tau of uncut steps) and over the first 64 and 96 (a run of that many
tokens), and the depth-3 chain the int4 target runs. Prints the table of docs/defaults.md, "A run's last steps at
its end of text" (no model runs; seconds):

    python experiments/replay_end_of_text.py
"""

from __future__ import annotations

import argparse

from tree_builders import chain
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.calibrate.walk_replay import replay_steps

from compare_walks import NAMES, walk


def tau(w: MeasuredAcceptance, depth: int, stop: float, horizon: int | None, keep_end: bool) -> float:
    """Tokens per step of a ``depth`` chain replayed over ``w`` (the ended continuations' last steps kept or not)."""
    steps = replay_steps(w.ranks, chain(depth), w.confidence or None, stop, horizon, w.ended if keep_end else ())
    return sum(s.tokens for s in steps) / len(steps)


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    print("| walk | ended early | chain | all positions (uncut) | first 64 | first 96 | depth 3, stop 0.3, first 64 |")
    print("|---|---|---|---|---|---|---|")
    for name in NAMES:
        w = walk(name, None)
        depth, stop = (7, 0.1) if "t1" in name else (8, 0.3)
        cells = [" -> ".join(f"{tau(w, d, stop, h, keep):.2f}" for keep in (False, True))
                 for d, h in ((depth, None), (depth, 64), (depth, 96), (3, 64))]
        print(f"| `{name}` | {sum(w.ended)} of {len(w.ranks)} | depth {depth}, stop {stop} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
