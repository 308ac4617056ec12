"""A product of few rows as a sum of products over slices of its input width (split-K), for the draft level.

A draft level multiplies 16 rows by each weight. On an H200 such a product has few output blocks to spread over
the card's 132 SMs, so one block walks the whole input width (K) alone: the down projection (K 4864, N 896) took
12.8 us as a Triton template, and cuBLAS splits K itself, 5.5 us, then sums the pieces in a reduction kernel of
its own, 1.9 us and a launch gap of about 0.9 us before it (``experiments/results/gpu-h200-autotune``); q/k/v
(896 -> 1152, one product under freezing) took 4.2 us and o (896 -> 896) 3.3-5.4 us, for weights that stream in
under half a microsecond at the card's bandwidth. Written as ``splits`` products of K / splits columns each (one
batched product: ``splits`` times the blocks) whose results are summed, the sum is part of the graph: inductor
lowers a sum of fewer than ``unroll_reductions_threshold`` terms (8 by default; :func:`settings` raises it past
the splits) as pointwise additions, which join the kernels that read them (the residual add and the next RMS
norm; the rotary embedding and the cache writes), so no reduction kernel of its own and no gap before it. The
products are the same dot products in another order (float32 partial sums on CUDA): the draft's logits move by
rounding, and a draft's proposals need no more for exactness (its ``q`` is whatever it computes).

The rewrite is a pass over the graph as inductor holds it after freezing (:class:`SplitK`, inductor's
``post_grad_custom_pre_pass``): it takes the products whose weight is a frozen constant of a listed shape
``(K, N)``, so it sees q, k and v after freezing made them one product, which no module of the model holds. The
``default+matmul+split-k`` levers of ``levers.py`` apply it to the draft level's graph alone, naming the draft's
products by role (:func:`shapes_of`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.pattern_matcher import (CallFunction, KeywordArg, Match, PatternMatcherPass,
                                             register_graph_pattern)

aten = torch.ops.aten

#: the products a lever can name, by role in a Qwen2 / Llama decoder layer
ROLES = ("qkv", "o", "down")


def split_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, splits: int) -> torch.Tensor:
    """``x @ weight + bias`` (``x`` [M, K], ``weight`` [K, N]) as the sum over ``splits`` consecutive slices of K
    of each slice's product: one batched product ``[splits, M, K/splits] x [splits, K/splits, N]`` (both views
    where the strides allow), then the sum over the batch."""
    m, k = x.shape
    n = weight.shape[1]
    pieces = x.reshape(m, splits, k // splits).transpose(0, 1)
    weights = weight.reshape(splits, k // splits, n)
    if not (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)):
        out = torch.bmm(pieces, weights).sum(0)
    elif "dtype" in aten.bmm.overloads():  # float32 partial sums, as cuBLAS's split-K keeps them
        out = torch.bmm(pieces, weights, out_dtype=torch.float32).sum(0).to(x.dtype)
    else:  # a torch without bmm's out_dtype: partial sums rounded to x's precision, summed in float32
        out = torch.bmm(pieces, weights).float().sum(0).to(x.dtype)
    return out if bias is None else out + bias


def shapes_of(config: Any, splits: dict[str, int]) -> dict[tuple[int, int], int]:
    """The ``(K, N)`` of each product named in ``splits`` (a role of :data:`ROLES` -> splits) in a decoder of
    ``config`` (a Qwen2 or Llama config): ``qkv`` is q, k and v as the one product freezing makes of them."""
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    hidden = config.hidden_size
    by_role = {"qkv": (hidden, (heads + 2 * kv) * head_dim), "o": (heads * head_dim, hidden),
               "down": (config.intermediate_size, hidden)}
    out: dict[tuple[int, int], int] = {}
    for role, n in splits.items():
        if role not in by_role:
            raise ValueError(f"split-K: no product named {role!r}; name one of {', '.join(ROLES)}")
        shape = by_role[role]
        if n < 2 or shape[0] % n:
            raise ValueError(f"split-K: {role}'s input width {shape[0]} is not split in {n} equal pieces; give a "
                             "divisor of it, at least 2")
        if out.setdefault(shape, n) != n:
            raise ValueError(f"split-K: {role} has the shape {shape} of another product named, with other splits")
    return out


class SplitK(CustomGraphPass):
    """Inductor's ``post_grad_custom_pre_pass`` that rewrites each product ``x @ W (+ b)`` whose ``W`` is a frozen
    constant of a shape ``(K, N)`` in ``splits`` as :func:`split_product` of that many pieces; ``taken`` counts
    the products rewritten (a lever whose pass took nothing would be timed as if it had)."""

    def __init__(self, splits: dict[tuple[int, int], int]) -> None:
        self.splits, self.taken = dict(splits), 0
        self.patterns = PatternMatcherPass()
        product = (CallFunction(aten.addmm.default, KeywordArg("bias"), KeywordArg("x"), KeywordArg("weight")),
                   CallFunction(aten.mm.default, KeywordArg("x"), KeywordArg("weight")))
        for pattern in product:
            register_graph_pattern(pattern, extra_check=self._listed, pass_dict=self.patterns)(self._rewrite)

    def _listed(self, match: Match) -> bool:
        weight, scales = match.kwargs["weight"], match.output_node().kwargs  # addmm's beta * b + alpha * x @ W
        return (weight.op == "get_attr" and tuple(weight.meta["val"].shape) in self.splits
                and scales.get("alpha", 1) == 1 and scales.get("beta", 1) == 1)

    def _rewrite(self, match: Match, x, weight, bias=None) -> None:
        splits = self.splits[tuple(weight.meta["val"].shape)]
        if bias is None:  # (a traced function takes no defaults)
            match.replace_by_example(lambda x, w: split_product(x, w, None, splits), [x, weight])
        else:
            match.replace_by_example(lambda x, w, b: split_product(x, w, b, splits), [x, weight, bias])
        self.taken += 1

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.patterns.apply(graph)

    def uuid(self) -> bytes:  # inductor's graph cache keys a graph by it
        return hashlib.sha256(repr(sorted(self.splits.items())).encode()).digest()


def settings(split: SplitK) -> dict[str, Any]:
    """The inductor settings under which a graph compiles with ``split``'s rewrite: the pass, and a sum of that
    many terms lowered as additions (``ir.Reduction.create`` unrolls a sum of fewer terms than the threshold).

    On a CPU, freezing packs float32 weights (and bfloat16 ones where oneDNN computes in it) for its BLAS before
    any pass of this kind sees them, whatever ``cpp.weight_prepack`` says once the packing patterns are registered:
    the pass then takes nothing there (``SplitK.taken``); a float64 graph keeps its products (the tests')."""
    unroll = max(torch._inductor.config.unroll_reductions_threshold, max(split.splits.values()) + 1)
    return {"post_grad_custom_pre_pass": split, "unroll_reductions_threshold": unroll}
