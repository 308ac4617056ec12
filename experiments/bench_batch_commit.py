"""A batch's commit in the eager batched step: every row's kept slots moved in its caches, row by row against all
rows at once (``kv.Moves``: one gather and one write per layer's key and value tensor, what ``TreeCache.keep_rows``
runs).

The caches have the real target's geometry (Qwen2.5-Coder-1.5B: 28 layers, 2 key/value heads of 128; ``--layers``,
``--heads``, ``--head-dim`` for another), ``--context`` committed slots and a tree's slots after them; each row keeps
an accepted path of 3 slots that are not in place (the copy a tree's commit makes). Both ways run on the same
cache, the order alternating every round, median (and fastest) of ``--rounds``; the row-by-row way is
``keep_rows`` as it was before (two copies per row per layer), written out here, and both must leave every row's
slots equal.

    python experiments/bench_batch_commit.py --out experiments/results/batch-commit-cpu
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from treespec.common.machine import machine  # noqa: E402
from treespec.core.kv import RowsCache, _in_place  # noqa: E402


def row_by_row(cache: RowsCache, prefixes: list[int], rows: list[torch.Tensor]) -> None:
    """``RowsCache.keep_rows`` as it was: each row's kept slots moved by copies of their own, in every layer."""
    prefixes, rows = zip(*(_in_place(p, r) for p, r in zip(prefixes, rows)))
    device = cache.layers[0].device
    empty = torch.empty(0, dtype=torch.long, device=device)
    index = [torch.as_tensor(r, dtype=torch.long, device=device) if len(r) else empty for r in rows]
    for layer in cache.layers:
        for b, (prefix, kept) in enumerate(zip(prefixes, index)):
            if kept.numel():
                layer._k[b, :, prefix : prefix + kept.numel()] = layer._k[b, :, kept]
                layer._v[b, :, prefix : prefix + kept.numel()] = layer._v[b, :, kept]
        layer.length = max(p + r.numel() for p, r in zip(prefixes, index))
        layer.keys, layer.values = layer._k[..., : layer.length, :], layer._v[..., : layer.length, :]
    cache.lengths = [p + len(r) for p, r in zip(prefixes, rows)]


def filled(batch: int, args: argparse.Namespace) -> RowsCache:
    cache = RowsCache(batch)
    g = torch.Generator().manual_seed(0)
    for i in range(args.layers):
        k, v = (torch.randn(batch, args.heads, args.context + 16, args.head_dim, generator=g).to(args.device)
                for _ in range(2))
        cache.update(k, v, i)
    return cache


def seconds(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 50], help="rows per batch")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--heads", type=int, default=2, help="key/value heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--context", type=int, default=200, help="committed slots before the tree's")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="folder for results.json (default: print only)")
    args = ap.parse_args(argv)
    args.device = torch.device(args.device)
    results = {"setup": {**{k: v for k, v in vars(args).items() if k not in ("out", "device")},
                         "device": str(args.device), "machine": machine(args.device),
                         "date": datetime.date.today().isoformat()}, "batches": {}}
    for batch in args.batches:
        prefixes = [args.context] * batch
        rows = [args.context + torch.tensor([1, 3, 6]) + b % 3 for b in range(batch)]  # 3 slots, not in place
        caches = {way: filled(batch, args) for way in ("rows", "moves")}
        runs = {"rows": lambda: row_by_row(caches["rows"], prefixes, rows),
                "moves": lambda: caches["moves"].keep_rows(prefixes, rows)}
        times: dict[str, list[float]] = {"rows": [], "moves": []}
        for r in range(args.rounds + 2):
            for way in (("rows", "moves") if r % 2 else ("moves", "rows")):
                caches[way].lengths = [args.context + 10] * batch
                for layer in caches[way].layers:
                    layer.length = args.context + 10
                t = seconds(runs[way], args.device)
                if r >= 2:  # two rounds of warm-up
                    times[way].append(t)
        same = all(torch.equal(a._k[:, :, : args.context + 3], b._k[:, :, : args.context + 3])
                   for a, b in zip(caches["rows"].layers, caches["moves"].layers))
        ms = {way: 1e3 * statistics.median(t) for way, t in times.items()}
        fastest = {way: 1e3 * min(t) for way, t in times.items()}
        results["batches"][batch] = {"row_by_row_ms": ms["rows"], "moves_ms": ms["moves"],
                                     "ratio": ms["rows"] / ms["moves"], "row_by_row_fastest_ms": fastest["rows"],
                                     "moves_fastest_ms": fastest["moves"], "same_slots": same}
        print(f"{batch:3d} rows: row by row {ms['rows']:.3f} ms, all rows at once {ms['moves']:.3f} ms "
              f"({ms['rows'] / ms['moves']:.2f}x; fastest {fastest['rows']:.3f} and {fastest['moves']:.3f} ms), "
              f"same slots: {same}", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
