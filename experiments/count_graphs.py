"""How many graphs the captured step compiles for a tree shape (each one a compile: tens of seconds on a
GPU for the real pair), counted on CPU with tiny models (``aot_eager``; the count does not depend on the
models' size): dynamo's ``unique_graphs`` over one ``treespec.generate(compile=...)`` call, whose prompt
is long enough for the compiled prefill (one graph for every length on a CPU).

    python experiments/count_graphs.py --budget 16     # the Sequoia tree the GPU protocol times
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from torch._dynamo.utils import counters  # noqa: E402

import treespec  # noqa: E402
from tree_builders.budgeted import for_budget  # noqa: E402
from treespec.calibrate.acceptance import MeasuredAcceptance  # noqa: E402
from treespec.models.tiny import perturbed_copy, tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--max-depth", type=int, default=8)
    args = ap.parse_args(argv)
    acc = MeasuredAcceptance.load(ROOT / "treespec" / "data" / "acceptance-qwen2.5-coder-t0.json")
    shape = for_budget("sequoia", args.budget, acc.matrix, max_depth=args.max_depth)
    target = tiny_model(seed=0)
    draft = perturbed_copy(target, 0.05, seed=1)
    counters.clear()
    out = treespec.generate(target, [i % 40 + 1 for i in range(128)], [treespec.ModelDrafter(draft, shape)],
                            max_new_tokens=32, budget=shape.size, compile="aot_eager")
    graphs = counters["stats"]["unique_graphs"]
    print(f"Sequoia tree of budget {args.budget}, depth {shape.depth}, widths {shape.widths}: step "
          f"{out.stats.step!r}, {graphs} graphs compiled")
    return graphs


if __name__ == "__main__":
    main()
