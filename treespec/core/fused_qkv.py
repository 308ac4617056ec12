"""Attention's q, k and v as one matrix product in a frozen graph, whatever their output widths.

A Qwen2 (or Llama) attention layer computes three products of the same input: q, and under grouped-query
attention narrower k and v (896 against 128 columns in Qwen2.5's 0.5B). Inductor's freezing has a pass that
rewrites such a triple into one product of the concatenated weights, but it left these three products apart on
torch 2.11 (an H200: its check wants three weights of one shape) and on torch 2.13 (a CPU:
``experiments/concat_linears.py``). :func:`applied` adds the same rewrite with an input-width check, as a freezing
pass of its own, around the captured step's calls on CUDA
(``compiling.compile_graph``): on an H200 it took a draft level of the 0.5B model from 1.82 to 1.53 ms and a
1.5B verification from 3.09 to 2.68 ms (``experiments/results/gpu-h200-qkv``). The graph's q, k and v are the
three column slices of the one product: the same dot products, computed by another kernel (its rounding may
differ in the last bit).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch

aten = torch.ops.aten

#: whether the rewrite applies (a registered pattern stays for the process; this switches ours)
ENABLED = [False]
#: triples the rewrite has taken in this process (a count to check it fired)
TAKEN = [0]


def _three_products(inp, w1, w2, w3, b1, b2, b3):
    return aten.addmm(b1, inp, w1), aten.addmm(b2, inp, w2), aten.addmm(b3, inp, w3)


def _one_product(inp, w1, w2, w3, b1, b2, b3):
    widths = [w1.size(1), w2.size(1), w3.size(1)]
    return aten.addmm(torch.cat((b1, b2, b3)), inp, torch.cat((w1, w2, w3), dim=1)).split(widths, dim=1)


def _frozen_weights_of_one_input_width(match) -> bool:
    """The weights and biases are frozen constants, the weights take inputs of one width, the biases are vectors."""
    weights = [match.kwargs[k] for k in ("w1", "w2", "w3")]
    biases = [match.kwargs[k] for k in ("b1", "b2", "b3")]
    take = (ENABLED[0] and all(n.op == "get_attr" for n in weights + biases)
            and len({w.meta["val"].shape[0] for w in weights}) == 1 and all(b.meta["val"].dim() == 1 for b in biases))
    TAKEN[0] += take
    return take


@functools.cache
def register() -> None:
    """Add the rewrite to inductor's freezing passes (once per process), as a pass of its own after inductor's
    (a pattern matcher refuses a pattern its pass already holds, and inductor's holds this one with the stricter
    check)."""
    from torch._inductor.fx_passes import freezing_patterns
    from torch._inductor.pattern_matcher import PatternMatcherPass, fwd_only, register_replacement

    freezing_patterns.lazy_init()
    own = PatternMatcherPass()
    example = [torch.empty(8, 8) for _ in range(7)]  # inductor traces its own patterns from 2-D examples alike
    register_replacement(_three_products, _one_product, example, fwd_only, own,
                         extra_check=_frozen_weights_of_one_input_width,
                         exclusive_arg_names=("w1", "w2", "w3", "b1", "b2", "b3"))
    freezing_patterns.pass_patterns.append(own)


@contextlib.contextmanager
def applied() -> Iterator[None]:
    """The rewrite on for the graphs compiled inside (registered at first use). Inductor's graph cache does not
    key a graph by it: a graph compiled without the rewrite may be served inside, and one compiled with it
    outside, the same products either way (:func:`uncached` where that matters: a measurement of the rewrite)."""
    register()
    saved, ENABLED[0] = ENABLED[0], True
    try:
        yield
    finally:
        ENABLED[0] = saved


@contextlib.contextmanager
def uncached() -> Iterator[None]:
    """Inductor's and AOT's compile caches off: each graph compiled inside is compiled, not loaded."""
    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield
