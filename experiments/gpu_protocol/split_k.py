"""A product of few rows as a sum of products over slices of its input width (split-K), for the draft level.

A draft level multiplies 16 rows by each weight. On an H200 such a product has few output blocks to spread over
the card's 132 SMs, so one block walks the whole input width (K) alone: the down projection (K 4864, N 896) took
12.8 us as a Triton template, and cuBLAS splits K itself, 5.5 us, then sums the pieces in a reduction kernel of
its own, 1.9 us and a launch gap of about 0.9 us before it (``experiments/results/gpu-h200-autotune``). Written as
``splits`` products of K / splits columns each (one batched product: ``splits`` times the blocks) whose results are
summed, the sum is part of the graph: inductor lowers a sum of fewer than ``unroll_reductions_threshold`` terms
(8 by default; :func:`split_k` raises it past the splits while graphs compile) as pointwise additions, which join the
kernel that reads them, here the residual add and the next RMS norm, so the separate reduction kernel and its gap
go. The products are the same dot products in another order (float32 partial sums on CUDA): the draft's
logits move by rounding, and a draft's proposals need no more for exactness (its ``q`` is whatever it computes).

:func:`split_k` swaps a model's linears of the given names for :class:`SplitKLinear` for a block (the
``default+matmul+split-k`` levers of ``levers.py``); the same swapped modules every time for one linear, so a graph
compiled inside the block replays when the block is entered again.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

import torch

#: each linear's split-K twins made so far, by splits (the same objects on every entry: a compiled graph's guards)
_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class SplitKLinear(torch.nn.Module):
    """``linear`` (``y = x W^T + b``) as ``splits`` products over consecutive slices of the input width, summed;
    its weight held as ``[splits, K / splits, N]`` (each slice's rows of ``W^T``)."""

    def __init__(self, linear: torch.nn.Linear, splits: int) -> None:
        super().__init__()
        k, n = linear.in_features, linear.out_features
        if splits < 2 or k % splits:
            raise ValueError(f"split-K needs at least 2 splits that divide the input width {k}, got {splits}")
        self.in_features, self.out_features, self.splits = k, n, splits
        weight = linear.weight.detach().t().reshape(splits, k // splits, n).contiguous()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.splits, self.in_features // self.splits).transpose(0, 1)  # [splits, rows, K/s]
        if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16):  # the partial sums in float32 (CUDA's kernel)
            out = torch.bmm(rows, self.weight, out_dtype=torch.float32).sum(0).to(x.dtype)
        else:
            out = torch.bmm(rows, self.weight).sum(0)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def twin(linear: torch.nn.Linear, splits: int) -> SplitKLinear:
    """``linear``'s :class:`SplitKLinear` of ``splits``, made once."""
    made = _TWINS.setdefault(linear, {})
    if splits not in made:
        made[splits] = SplitKLinear(linear, splits)
    return made[splits]


@contextlib.contextmanager
def split_k(model: torch.nn.Module, splits: dict[str, int]) -> Iterator[int]:
    """``model``'s ``nn.Linear`` modules whose names end in a key of ``splits`` (``"mlp.down_proj"``) run as
    :class:`SplitKLinear` of that many splits inside the block; yields how many were swapped (a name matching none
    is an error: a lever that changed nothing would be timed as if it had)."""
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Linear, int]] = []  # (parent, attribute, linear, splits)
    found = dict.fromkeys(splits, 0)
    for name, module in list(model.named_modules()):
        suffix = next((s for s in splits if name == s or name.endswith("." + s)), None)
        if suffix is None or not isinstance(module, torch.nn.Linear):
            continue
        parent = model.get_submodule(name.rpartition(".")[0])
        swapped.append((parent, name.rpartition(".")[2], module, splits[suffix]))
        found[suffix] += 1
    missing = [s for s, n in found.items() if not n]
    if missing:
        raise ValueError(f"split-K: no nn.Linear named *{', *'.join(missing)} in {type(model).__name__}")
    for parent, attr, linear, n in swapped:
        setattr(parent, attr, twin(linear, n))
    # a sum of fewer terms than the threshold lowers as pointwise additions (``ir.Reduction.create``)
    unroll = max(torch._inductor.config.unroll_reductions_threshold, max(splits.values()) + 1)
    try:
        with torch._inductor.config.patch(unroll_reductions_threshold=unroll):
            yield len(swapped)
    finally:
        for parent, attr, linear, _ in swapped:
            setattr(parent, attr, linear)
