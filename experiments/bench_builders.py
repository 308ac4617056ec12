"""Tree builders benchmarked: build time of the Sequoia DP, and a measured-versus-predicted tau table.

Build time (default):

    python experiments/bench_builders.py --budgets 16 32 64 128 256 512 768 \
        --max-depth 20 --max-width 32 --out experiments/results/builders_build_time.md

Times ``tree_builders.sequoia`` (an exact DP, ``O(depth * width * budget^2)``) under a fixed,
synthetic but measured-looking positional acceptance vector, and under a per-depth matrix, and
writes a Markdown table (budget, seconds, expected tokens, depth, size). ``time_builds`` returns
the rows, for other benchmarks to reuse.

Measured versus predicted tau, from a finished sweep (``treespec sweep``; its trees come from
``treespec.recipes``, like every other run's):

    python experiments/bench_builders.py --from-sweep experiments/results/NAME/results.jsonl \
        --out experiments/results/NAME/builders_tau.md
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from tree_builders import Acceptance, greedy_best_first, sequoia
from treespec.bench.sweep import read_records


def synthetic_acceptance(width: int = 32) -> np.ndarray:
    """A decreasing positional acceptance vector shaped like measured ones (top-1 ~0.6, long tail).

    Synthetic: the first entries are typical of a small draft model against a 1-7B target; the
    tail decays geometrically. Sums to < 1 (the rest is the probability that no child matches).
    """
    head = [0.6, 0.15, 0.07, 0.04, 0.025, 0.015, 0.01, 0.008, 0.006, 0.005]
    tail = [0.004 * 0.8**i for i in range(max(0, width - len(head)))]
    return np.asarray((head + tail)[:width], dtype=np.float64)


def synthetic_matrix(width: int = 32, rows: int = 8) -> np.ndarray:
    """A per-depth matrix: the top-1 acceptance drifts from 0.55 (depth 1) up to ~0.7 deeper,
    the remaining ranks scaled from :func:`synthetic_acceptance` (synthetic, for timing)."""
    base = synthetic_acceptance(width)
    out = np.empty((rows, width))
    for d in range(rows):
        top = min(0.55 + 0.02 * d, 0.7)
        out[d, 0] = top
        out[d, 1:] = base[1:] * (1.0 - top) / (1.0 - base[0])  # keep the same rejection share
    return out


@dataclass
class BuildRow:
    """One timed build."""

    kind: str
    budget: int
    seconds: float
    expected_tokens: float
    depth: int
    size: int
    greedy_expected_tokens: float


def time_builds(
    acceptance: Acceptance,
    budgets: Sequence[int],
    max_depth: int | None = 20,
    max_width: int | None = 32,
    kind: str = "vector",
    repeats: int = 1,
) -> list[BuildRow]:
    """Time ``sequoia(acceptance, budget, max_depth, max_width)`` for each budget (best of
    ``repeats``) and record the optimum's expected tokens, depth and size (plus greedy's value)."""
    rows: list[BuildRow] = []
    for budget in budgets:
        best = float("inf")
        shape = None
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            shape = sequoia(acceptance, budget, max_depth=max_depth, max_width=max_width)
            best = min(best, time.perf_counter() - t0)
        assert shape is not None
        greedy = greedy_best_first(acceptance, budget, max_depth=max_depth, max_width=max_width)
        rows.append(
            BuildRow(
                kind=kind,
                budget=int(budget),
                seconds=best,
                expected_tokens=shape.expected_tokens(acceptance),
                depth=shape.depth,
                size=shape.size,
                greedy_expected_tokens=greedy.expected_tokens(acceptance),
            )
        )
    return rows


def machine_info() -> str:
    """One line describing the machine the timings come from."""
    proc = platform.processor() or platform.machine()
    return (
        f"{platform.system()} {platform.machine()}, processor '{proc}', {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, numpy {np.__version__}"
    )


def markdown_table(rows: Sequence[BuildRow]) -> str:
    """A Markdown table of build rows."""
    lines = [
        "| acceptance | budget | seconds | expected tokens | depth | size | greedy best-first tokens |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.kind} | {r.budget} | {r.seconds:.3f} | {r.expected_tokens:.4f} | {r.depth} | {r.size} "
            f"| {r.greedy_expected_tokens:.4f} |"
        )
    return "\n".join(lines)


def sweep_tau_table(results: Path) -> str:
    """Measured vs predicted tau per (temperature, budget, builder) from a ``treespec sweep`` JSONL.

    Predictions use the acceptance vector the sweep measured on its calibration prompts; the
    measurements come from its evaluation prompts (disjoint). Speedup is over the target alone
    (HF generate) measured in the same run.
    """
    recs = [r for r in read_records(results) if r.get("status") == "ok" and r["params"]["kind"] == "treespec"
            and r["params"]["drafters"] == "model" and r["result"].get("predicted_tau") is not None]
    if not recs:
        raise SystemExit(f"no treespec records with a predicted tau in {results}")
    p0 = recs[0]["params"]
    calib = next(r["params"]["acceptance"]["calib"] for r in recs if r["params"].get("acceptance"))
    lines = [f"# Measured vs predicted tau at equal budgets (from `{results}`)", "",
             f"Target {p0['target']}, draft {p0['draft']}; calibration prompts {p0['dataset']}"
             f"[{calib[0]}:{calib[1]}] (acceptance vectors), evaluation prompts "
             f"[{p0['eval'][0]}:{p0['eval'][1]}], {p0['max_new_tokens']} tokens each.", "",
             "| T | budget | builder | tree size | depth | predicted tau | measured tau | measured / predicted |"
             " tok/s | vs target alone |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(recs, key=lambda r: (r["params"]["temperature"], r["params"]["budget"], r["params"]["builder"])):
        p, res = r["params"], r["result"]
        lines.append(f"| {p['temperature']:g} | {p['budget']} | {p['builder']} | {res['tree']['size']} | "
                     f"{res['tree']['depth']} | {res['predicted_tau']:.2f} | {res['tau']:.2f} | "
                     f"{res['tau'] / res['predicted_tau']:.2f} | {r['timing']['tokens_per_second']:.2f} | "
                     f"{(r.get('speedup') or {}).get('target', float('nan')):.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 768])
    ap.add_argument("--max-depth", type=int, default=20, help="depth limit (-1: none)")
    ap.add_argument("--max-width", type=int, default=32, help="children per node limit (-1: none)")
    ap.add_argument("--kinds", nargs="+", choices=["vector", "matrix"], default=["vector", "matrix"])
    ap.add_argument("--repeats", type=int, default=3, help="best of this many builds per budget")
    ap.add_argument("--out", type=Path, default=None, help="write the Markdown report here")
    ap.add_argument("--from-sweep", type=Path, default=None, metavar="JSONL",
                    help="tabulate measured vs predicted tau of the static builders from a sweep's results")
    args = ap.parse_args(argv)
    if args.from_sweep is not None:
        report = sweep_tau_table(args.from_sweep)
        print(report)
        if args.out is not None:
            args.out.write_text(report)
        return 0
    max_depth = None if args.max_depth < 0 else args.max_depth
    max_width = None if args.max_width < 0 else args.max_width
    width = max_width or 32

    rows: list[BuildRow] = []
    accs: dict[str, np.ndarray] = {"vector": synthetic_acceptance(width), "matrix": synthetic_matrix(width)}
    for kind in args.kinds:
        rows += time_builds(accs[kind], args.budgets, max_depth, max_width, kind=kind, repeats=args.repeats)

    vec = accs["vector"]
    report = "\n".join(
        [
            "# Sequoia DP build time",
            "",
            f"`tree_builders.sequoia(acceptance, budget, max_depth={max_depth}, max_width={max_width})`, "
            f"best of {args.repeats} build(s) per budget.",
            "",
            f"Machine: {machine_info()}",
            "",
            "Acceptance (synthetic, measured-looking): vector a[:10] = "
            + ", ".join(f"{x:g}" for x in vec[:10])
            + f", ... ({len(vec)} ranks, sum {vec.sum():.3f}); matrix: per-depth rows, top-1 from "
            "0.55 (depth 1) to 0.69 (depth 8 and deeper), other ranks scaled from the vector.",
            "Expected tokens include the bonus token (tau). 'greedy best-first tokens' is "
            "`greedy_best_first` at the same budget and limits, for comparison.",
            "",
            markdown_table(rows),
            "",
        ]
    )
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
