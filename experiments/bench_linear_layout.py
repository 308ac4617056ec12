"""Does a tree forward pay for the GEMM layout PyTorch picks for ``nn.Linear`` on this CPU?

``nn.Linear`` computes ``x @ W.T`` (an NT product with few rows: a tree's tokens). On some CPUs the BLAS behind
it (MKL in the CPU wheels) runs that shape far slower than the same product as ``(W @ x.T).T`` (an NN product
with the weight's many rows). This script times the target's tree forward (``models.timing.measure_latency``: n
tree tokens after ``--context`` cached ones) with the stock ``Linear.forward`` and with that reformulation,
alternating twice, and reports the logits' largest difference and argmax agreement on a prompt (the two sum in
another order). An experiment only: treespec's forwards use the stock layout.

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
from treespec.models.loading import DEFAULT_TARGET, load
from treespec.models.timing import measure_latency

STOCK = torch.nn.Linear.forward


def transposed(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``Linear`` as ``(W @ x.T).T``: the same product, the weight's rows as the GEMM's long side."""
    flat = x.reshape(-1, x.shape[-1])
    out = (self.weight @ flat.t()).t()
    if self.bias is not None:
        out = out + self.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


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
    model, _ = load(args.model, dtype=args.dtype, role="target")
    ids = torch.randint(1000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        ref = model(ids).logits
        torch.nn.Linear.forward = transposed
        alt = model(ids).logits
        torch.nn.Linear.forward = STOCK
    runs: dict[str, list[dict[int, float]]] = {"stock": [], "transposed": []}
    for name in ["stock", "transposed"] * 2:  # alternating: a slower minute of the host falls on both
        torch.nn.Linear.forward = STOCK if name == "stock" else transposed
        runs[name].append(measure_latency(model, args.sizes, context=args.context, repeats=3))
        torch.nn.Linear.forward = STOCK
        print(name, {n: round(s, 3) for n, s in runs[name][-1].items()}, flush=True)
    best = {name: {n: min(r[n] for r in rs) for n in args.sizes} for name, rs in runs.items()}
    result = {"machine": machine("cpu"), "platform": platform.platform(), "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d"), "model": str(args.model), "dtype": args.dtype,
              "context": args.context, "threads": args.threads, "runs": runs, "best": best,
              "speedup": {n: best["stock"][n] / best["transposed"][n] for n in args.sizes},
              "max_abs_logit_difference": float((ref - alt).abs().max()),
              "argmax_agreement": float((ref.argmax(-1) == alt.argmax(-1)).float().mean())}
    print("| tree tokens | stock s | (W @ x.T).T s | stock / transposed |\n|---|---|---|---|")
    for n in args.sizes:
        print(f"| {n} | {best['stock'][n]:.3f} | {best['transposed'][n]:.3f} | {result['speedup'][n]:.2f}x |")
    print(f"logits: max |difference| {result['max_abs_logit_difference']:.2e}, "
          f"argmax agreement {result['argmax_agreement']:.3f} over 40 positions")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    return result


if __name__ == "__main__":
    main()
