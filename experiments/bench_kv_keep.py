"""The KV commit of rows already in place (``TreeCache.keep`` of a chain's accepted path, or plain decoding's one
token): the commit as it runs now, which moves the cache's prefix past them, against the per-layer gather it ran
before (each layer's own ``keep`` with the index: a copy of the rows onto themselves). The built-in target's cache
shape: 28 layers of 2 KV heads x 128, bfloat16, 200 cached rows, one row committed; rounds alternate.

    python experiments/bench_kv_keep.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from treespec.core.kv import TreeCache


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=500, help="commits per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    cache = TreeCache()
    for layer in range(28):
        cache.update(*(torch.randn(1, 2, 201, 128, dtype=torch.bfloat16) for _ in range(2)), layer)
    rows, index = np.array([200]), torch.tensor([200])

    def gathered() -> None:
        for layer in cache.layers:
            layer.keep(200, index)

    times: dict[str, list[float]] = {"in place (now)": [], "gathered (before)": []}
    for _ in range(args.rounds):
        for name, commit in (("in place (now)", lambda: cache.keep(200, rows)), ("gathered (before)", gathered)):
            t = time.perf_counter()
            for _ in range(args.calls):
                commit()
            times[name].append((time.perf_counter() - t) / args.calls)
    for name, seconds in times.items():
        print(f"{name}: {min(seconds) * 1e3:.3f} ms per commit (best of {args.rounds} rounds)")
    print(f"ratio: {min(times['gathered (before)']) / min(times['in place (now)']):.2f}x")


if __name__ == "__main__":
    main()
