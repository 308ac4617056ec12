"""The built-in bfloat16 target's compiled forward (inductor with weight freezing, as the captured step compiles
its graphs on a CPU) in each ``nn.Linear`` layout: stock ``x @ W.T`` against weight-first ``(W @ x.T).T``
(``treespec.core.linear_layout``), ``measure_latency(..., compiled="inductor")`` over 1 and 9 tokens after 128 cached
tokens, two rounds in alternating order, each layout compiled afresh (``torch._dynamo.reset``).

Run at df27b70 on the Zen 4 host (family 25 model 17), alone (as a one-off of this code; about 10 minutes, mostly
compiles), ms for 1 / 9 tokens: round 1 stock 127.9 / 136.2, weight-first 185.5 / 217.4; round 2 weight-first
177.9 / 206.9, stock 138.7 / 147.8. Freezing packs a stock Linear's weight for oneDNN, not a weight-first product's:
why a frozen graph keeps stock layers (``treespec.core.compiling.compile_graph``) whatever the eager forwards chose.

    python experiments/compiled_layout.py
"""

from __future__ import annotations

import argparse
import time

import torch

from treespec.core.linear_layout import STOCK, WEIGHT_FIRST, set_layout
from treespec.models.loading import DEFAULT_TARGET, load
from treespec.models.timing import measure_latency


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help says what it does
    torch.set_num_threads(2)
    torch._inductor.config.freezing = True
    target, _ = load(DEFAULT_TARGET, dtype="bfloat16", role="target")
    for rnd in range(2):
        for layout in (STOCK, WEIGHT_FIRST) if rnd == 0 else (WEIGHT_FIRST, STOCK):
            set_layout(target, layout)
            torch._dynamo.reset()
            start = time.perf_counter()
            lat = measure_latency(target, [1, 9], repeats=3, compiled="inductor")
            print(rnd, layout, {n: round(s * 1e3, 1) for n, s in lat.items()},
                  f"(with its compile {time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
