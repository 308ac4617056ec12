"""Timing one tree-shaped forward of a model: the measurement behind precision and tree sizing."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence

import numpy as np
import torch
from transformers import StoppingCriteria

from ..common.device import execution_device, sync
from ..core.attention import own_kernels
from ..core.checks import context_of, vocab_size
from ..core.compiling import compile_options
from ..core.kv import TreeCache, causal_allowed, forward_masked, forward_prompt
from ..core.static_cache import StaticTreeCache
from ..core.tree import layout

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
    return layout(parent)


@torch.inference_mode()
def measure_latency(
    model: torch.nn.Module,
    sizes: Sequence[int] = DEFAULT_SIZES,
    context: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    seed: int = 0,
    compiled: bool | str = False,
) -> dict[int, float]:
    """Seconds of one tree forward of ``n`` tokens after ``context`` cached tokens, for each ``n``.

    ``compiled``: the forward the compiled steps run (a static cache, ``torch.compile`` with
    ``compiling.compile_options``: CUDA graphs on CUDA; a string names the backend), compiled once with
    a dynamic token count for every size (under CUDA graphs one graph is recorded per size, no new
    compile); False: the eager forward on a growable cache (the eager step's).

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
    context = min(context, max(1, _positions(model) - max(sizes)))  # a short context: a model of fewer positions
    device = execution_device(model)
    gen = torch.Generator().manual_seed(seed)
    vocab = vocab_size(model)
    ctx = torch.randint(vocab, (context,), generator=gen).tolist()
    trees = {}
    for n in sorted({int(s) for s in sizes}):
        depth, anc = random_tree(n, gen)
        trees[n] = (torch.randint(vocab, (n,), generator=gen).to(device), depth, anc)
    forward = (_eager_forward if compiled is False else _compiled_forward)(model, ctx, trees, compiled)
    return _medians_of_rounds(forward, list(trees), device, warmup, repeats)


def _medians_of_rounds(run: Callable[[int], object], keys: list[int], device: torch.device, warmup: int,
                       repeats: int) -> dict[int, float]:
    """Seconds of ``run(k)`` for each of ``keys``: ``warmup`` untimed runs of each, then ``repeats`` rounds each
    timing every key once (alternate rounds in reverse order), the median of each key's rounds (the device
    synchronised around each run)."""
    def timed(k: int) -> float:
        sync(device)
        t0 = time.perf_counter()
        run(k)
        sync(device)
        return time.perf_counter() - t0

    for _ in range(warmup):
        for k in keys:
            timed(k)
    times: dict[int, list[float]] = {k: [] for k in keys}
    for r in range(repeats):
        for k in (keys if r % 2 == 0 else keys[::-1]):
            times[k].append(timed(k))
    return {k: statistics.median(t) for k, t in times.items()}


def _eager_forward(model: torch.nn.Module, ctx: list[int], trees: dict, compiled: bool | str):
    """``n -> `` the eager tree forward of tree ``n`` after ``ctx`` on a growable cache (cropped back after)."""
    device, context = execution_device(model), len(ctx)
    cache = TreeCache()
    forward_masked(model, cache, torch.tensor(ctx, device=device), torch.arange(context, device=device),
                   causal_allowed(0, context, device), logits_to_keep=1)
    inputs = {}
    for n, (ids, depth, anc) in trees.items():
        allowed = torch.ones(n, context + n, dtype=torch.bool)
        allowed[:, context:] = torch.from_numpy(anc)
        inputs[n] = (ids, torch.as_tensor(context + depth, device=device), allowed.to(device))

    def run(n: int) -> None:
        forward_masked(model, cache, *inputs[n])
        cache.keep(context, [])

    return run


def _compiled_forward(model: torch.nn.Module, ctx: list[int], trees: dict, compiled: bool | str):
    """``n -> `` the compiled steps' tree forward of tree ``n`` after ``ctx`` on a static cache: one graph with a
    dynamic token count (the rows it writes stay uncommitted)."""
    device = execution_device(model)
    backend, mode = compile_options(compiled, device)
    cache = StaticTreeCache(model, -(-(len(ctx) + max(trees) + 1) // 256) * 256)
    cache.prefill(model, ctx + [0])
    committed = cache.length.clone()

    def forward(ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor,
                committed: torch.Tensor) -> torch.Tensor:
        return cache.forward(model, ids, positions, block, committed)

    fn = torch.compile(forward, dynamic=True, fullgraph=True, backend=backend, mode=mode)
    inputs = {n: (ids, committed + torch.as_tensor(depth, device=device), torch.as_tensor(anc, device=device),
                  committed)
              for n, (ids, depth, anc) in trees.items()}

    def run(n: int) -> torch.Tensor:
        with own_kernels(model):  # switched outside the graph, as the steps' graphs are (compile_graph)
            return fn(*inputs[n])

    return run


class TokenClock(StoppingCriteria):
    """A stopping criterion of HF ``generate`` that never stops: it stamps ``time.perf_counter()`` into
    :attr:`stamps` after each new token (``device`` synchronised first), or after the first only (``every=False``:
    no wait for the device at the later tokens, which would keep a GPU's host from running ahead). The first stamp
    ends the prompt's prefill (its forward gives the first token); the gaps between stamps are decoding steps."""

    def __init__(self, device: torch.device, every: bool = True) -> None:
        self.device, self.every, self.stamps = device, every, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor | None, **kwargs) -> torch.Tensor:
        if self.every or not self.stamps:
            sync(self.device)
            self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@torch.inference_mode()
def measure_plain_decode(model: torch.nn.Module, context: int = 128, tokens: int = 12, seed: int = 0) -> float:
    """Seconds per token of the model's own plain decoding: HF ``generate`` (greedy, its growable cache, the
    model's stock layers and attention, as the "target alone" baselines run it) after a ``context``-token prompt.

    One ``generate`` call of ``tokens`` new tokens; a stopping criterion stamps the time after each token
    (:class:`TokenClock`), and the figure is the median of the gaps between stamps (one decoding step each: the
    prefill and the first token are not in any gap; the median keeps a stall of the machine out). This is the cost
    plain decoding has, which a tree forward of one token (``measure_latency(model, [1])``: a 4D mask, treespec's
    own kernels) only approximates: HF's loop runs the stock layers and attention, and its cost differs.
    """
    from transformers import GenerationConfig

    if context < 1 or tokens < 3:
        raise ValueError(f"context must be >= 1 and tokens >= 3, got {context} and {tokens}")
    if _positions(model) < tokens + 1:
        raise ValueError(f"a model of {_positions(model)} positions cannot time {tokens} new tokens after a prompt")
    context = min(context, _positions(model) - tokens)  # a short context: a model of fewer positions
    device = execution_device(model)
    clock = TokenClock(device)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab_size(model), (1, context), generator=gen).to(device)
    config = GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=[], pad_token_id=0,
                              do_sample=False)  # neutral: nothing inherited from the checkpoint
    model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, stopping_criteria=[clock])
    return statistics.median(b - a for a, b in zip(clock.stamps, clock.stamps[1:]))


#: the prompt lengths a prefill cost curve is timed at (``measure_prefill``; ``Profile.draft_prefill_seconds``
#: extrapolates past the longest)
PREFILL_LENGTHS = (32, 128, 512)


def _positions(model: torch.nn.Module) -> int:
    """The positions ``model`` can hold (a model with a table of position embeddings fails past it)."""
    return context_of(model) or 2**31


@torch.inference_mode()
def measure_prefill(model: torch.nn.Module, lengths: Sequence[int] = PREFILL_LENGTHS, repeats: int = 3,
                    seed: int = 0) -> dict[int, float]:
    """Seconds of the eager prefill of a prompt of ``n`` tokens, for each ``n`` in ``lengths``: one forward over
    the prompt into an empty growable cache, the last token's logits kept (``kv.forward_prompt``: what the eager step
    and a model drafter run before the first step; a model with wide-input twins runs them, as a prompt does). After
    an untimed warm-up of each length, ``repeats`` rounds each time every length once (alternate rounds reversed);
    a length's figure is the median of its rounds."""
    if not lengths or any(int(n) != n or n < 1 for n in lengths) or repeats < 1:
        raise ValueError(f"lengths must be ints >= 1 and repeats >= 1, got {tuple(lengths)!r} and {repeats}")
    lengths = sorted({min(int(n), _positions(model)) for n in lengths})  # no prompt is longer than the context
    device = execution_device(model)
    gen = torch.Generator().manual_seed(seed)
    vocab = vocab_size(model)
    prompts = {int(n): torch.randint(vocab, (int(n),), generator=gen).to(device) for n in sorted(set(lengths))}
    return _medians_of_rounds(lambda n: forward_prompt(model, TreeCache(), prompts[n]), list(prompts), device,
                              warmup=1, repeats=repeats)
