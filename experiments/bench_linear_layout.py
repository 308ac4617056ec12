"""Does a tree forward pay for the GEMM layout PyTorch picks for ``nn.Linear`` on this CPU?

``nn.Linear`` computes ``x @ W.T`` (an NT product with few rows: a tree's tokens). On some CPUs the BLAS behind
it (MKL in the CPU wheels) runs that shape far slower than the same product as ``(W @ x.T).T`` (an NN product
with the weight's many rows). This script times the target's tree forward (``models.timing.measure_latency``: n
tree tokens after ``--context`` cached ones) in both layouts (``treespec.core.linear_layout``: stock and
weight-first), alternating twice, and reports the logits' largest difference and argmax agreement on a prompt (the
two sum in another order). treespec's forwards use the layout ``load(linear_layout="auto")`` measures faster on
the machine (``treespec.models.layout``); this script shows the whole curve.

    python experiments/bench_linear_layout.py --out experiments/results/linear-layout-cpu
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from treespec.common.machine import machine
from treespec.core.attention import tree_forward
from treespec.core.linear_layout import STOCK, WEIGHT_FIRST, set_layout
from treespec.models.loading import DEFAULT_TARGET, load
from treespec.models.timing import measure_latency


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_TARGET)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = load(args.model, dtype=args.dtype, role="target", linear_layout=STOCK)
    ids = torch.randint(1000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = tree_forward(model, input_ids=ids).logits
        alt = tree_forward(set_layout(model, WEIGHT_FIRST), input_ids=ids).logits
    runs: dict[str, list[dict[int, float]]] = {STOCK: [], WEIGHT_FIRST: []}
    for name in [STOCK, WEIGHT_FIRST] * 2:  # alternating: a slower minute of the host falls on both
        runs[name].append(measure_latency(set_layout(model, name), args.sizes, context=args.context, repeats=3))
        print(name, {n: round(s, 3) for n, s in runs[name][-1].items()}, flush=True)
    best = {name: {n: min(r[n] for r in rs) for n in args.sizes} for name, rs in runs.items()}
    result = {"machine": machine("cpu"), "platform": platform.platform(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "model": str(args.model), "dtype": args.dtype,
              "context": args.context, "threads": args.threads, "runs": runs, "best": best,
              "speedup": {n: best[STOCK][n] / best[WEIGHT_FIRST][n] for n in args.sizes},
              "max_abs_logit_difference": float((ref - alt).abs().max()),
              "argmax_agreement": float((ref.argmax(-1) == alt.argmax(-1)).float().mean())}
    print("| tree tokens | stock s | (W @ x.T).T s | stock / weight-first |\n|---|---|---|---|")
    for n in args.sizes:
        print(f"| {n} | {best[STOCK][n]:.3f} | {best[WEIGHT_FIRST][n]:.3f} | {result['speedup'][n]:.2f}x |")
    print(f"logits: max |difference| {result['max_abs_logit_difference']:.2e}, "
          f"argmax agreement {result['argmax_agreement']:.3f} over 40 positions")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
