"""Timing one tree-shaped forward of a model: the measurement behind precision and tree sizing."""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import numpy as np
import torch

from ..common.device import execution_device, sync
from ..core.checks import vocab_size
from ..core.kv import TreeCache, causal_allowed, forward_masked

DEFAULT_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def random_tree(n: int, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random ``n``-node tree (node 0 the root, parents precede children): ``(depth [n], ancestors [n, n])``.

    Each node's parent is uniform over the earlier nodes, so trees are bushy near the root and a
    few levels deep, like the shapes the builders return.
    """
    parent = np.full(n, -1)
    if n > 1:
        u = torch.rand(n - 1, generator=generator).numpy()
        parent[1:] = np.floor(u * np.arange(1, n)).astype(np.int64)
    depth = np.zeros(n, dtype=np.int64)
    ancestors = np.eye(n, dtype=bool)
    for i in range(1, n):
        depth[i] = depth[parent[i]] + 1
        ancestors[i] |= ancestors[parent[i]]
    return depth, ancestors


@torch.inference_mode()
def measure_latency(
    model: torch.nn.Module,
    sizes: Sequence[int] = DEFAULT_SIZES,
    context: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
) -> dict[int, float]:
    """Seconds of one tree forward of ``n`` tokens after ``context`` cached tokens, for each ``n``.

    The new tokens carry a random tree-shaped ancestor mask and tree position ids (as in a
    verification pass, logits for every node included). Every size runs ``warmup`` untimed times,
    then ``repeats`` rounds each time every size once (alternate rounds in reverse order), and a
    size's figure is the median of its rounds: a slowdown of the machine while measuring falls on
    all sizes alike instead of on a few neighbouring ones, which would bend the curve the tree
    sizing reads ratios from. CUDA is synchronised around each run; the cache is cropped back to
    the context after every run.
    """
    if not sizes or any(int(n) != n or n < 1 for n in sizes):
        raise ValueError(f"sizes must be ints >= 1, got {tuple(sizes)!r}")
    if context < 1 or repeats < 1 or warmup < 0:
        raise ValueError("context and repeats must be >= 1 and warmup >= 0")
    device = execution_device(model)
    gen = torch.Generator().manual_seed(seed)
    vocab = vocab_size(model)
    cache = TreeCache()
    ctx = torch.randint(vocab, (context,), generator=gen).to(device)
    forward_masked(model, cache, ctx, torch.arange(context, device=device), causal_allowed(0, context, device),
                   logits_to_keep=1)
    inputs = {}
    for n in sorted({int(s) for s in sizes}):
        depth, anc = random_tree(n, gen)
        allowed = torch.ones(n, context + n, dtype=torch.bool)
        allowed[:, context:] = torch.from_numpy(anc)
        inputs[n] = (torch.randint(vocab, (n,), generator=gen).to(device), torch.as_tensor(context + depth, device=device),
                     allowed.to(device))

    def timed(n: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        forward_masked(model, cache, *inputs[n])
        sync(device)
        cache.keep(context, [])
        return time.perf_counter() - t0

    for _ in range(warmup):
        for n in inputs:
            timed(n)
    times: dict[int, list[float]] = {n: [] for n in inputs}
    for r in range(repeats):
        for n in (list(inputs) if r % 2 == 0 else list(inputs)[::-1]):
            times[n].append(timed(n))
    return {n: statistics.median(t) for n, t in times.items()}
