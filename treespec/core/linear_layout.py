"""The GEMM layout of a model's ``nn.Linear`` layers in treespec's own forwards.

``nn.Linear`` computes ``x @ W.T``: for a tree forward, a product with few rows (the tree's tokens) against the
transposed weight. On some CPUs the BLAS behind PyTorch's CPU wheels (MKL) runs that shape far slower than the
same product as ``(W @ x.T).T``, with the weight's many rows as the long side: on a Zen 3 host (AVX2), a 4-token
forward of the 1.5B float32 target took 2.32 s stock and 0.86 s in this form, one token 0.68 and 0.65 s
(``experiments/results/linear-layout-cpu``). The two sum in another order, so the logits differ in the last bits
(5e-4 on that model), as a tree forward's differ from a one-token forward's already.

A model carries its layout in the attribute ``treespec_linear_layout`` (:data:`STOCK` when absent), chosen by
measurement where it is loaded (``treespec.models.layout``). :func:`linear_layout` switches the float
``nn.Linear`` layers of the models that chose :data:`WEIGHT_FIRST` to :class:`WeightFirstLinear` for a block (the
module's class, one pointer each; the weights are the same tensors), and back on leaving, so a model is stock
outside treespec's forwards: HF's ``generate`` run on the same model as a baseline runs HF's own layers.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

#: ``nn.Linear``'s own ``x @ W.T``
STOCK = "stock"
#: the same product as ``(W @ x.T).T``
WEIGHT_FIRST = "weight-first"
LAYOUTS = (STOCK, WEIGHT_FIRST)
#: the model attribute holding its layout
ATTRIBUTE = "treespec_linear_layout"


class WeightFirstLinear(torch.nn.Linear):
    """``nn.Linear`` computing ``(W @ x.T).T``: the same weights and product, the weight as the GEMM's first
    operand. The result is a transposed view, which the layers after it read as any strided tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        out = torch.mm(self.weight, flat.t()).t()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])


def layout_of(model: torch.nn.Module) -> str:
    """The model's layout (:data:`STOCK` unless one was set with :func:`set_layout`)."""
    return getattr(model, ATTRIBUTE, STOCK)


def layout_tags(*models: torch.nn.Module) -> list[str]:
    """What a cached timing of these models depends on besides their precision: ``"linear[i]=weight-first"`` for
    the ``i``-th model in that layout (its place: a target in one layout and its draft in the other are not the
    reverse), nothing for stock ones (so timings cached before layouts existed stay valid)."""
    return [f"linear[{i}]={layout_of(m)}" for i, m in enumerate(models) if layout_of(m) != STOCK]


def set_layout(model: torch.nn.Module, layout: str) -> torch.nn.Module:
    """Mark ``model`` to run its float ``nn.Linear`` layers in ``layout`` inside :func:`linear_layout`."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown Linear layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    setattr(model, ATTRIBUTE, layout)
    return model


def switchable(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The layers :func:`linear_layout` switches: plain ``nn.Linear`` with a floating weight (quantised layers are
    other modules, and keep their own kernels)."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.is_floating_point()]


@contextlib.contextmanager
def linear_layout(*models: torch.nn.Module) -> Iterator[None]:
    """Each model's float ``nn.Linear`` layers in the model's layout for the block, stock again after.

    A compiled graph is switched around its calls (``compiling.compile_graph``), never inside: a graph traces the
    classes it finds, and guards on them."""
    layers = [] if torch.compiler.is_compiling() else \
        [m for model in models if layout_of(model) == WEIGHT_FIRST for m in switchable(model)]
    for m in layers:
        m.__class__ = WeightFirstLinear
    try:
        yield
    finally:
        for m in layers:
            m.__class__ = torch.nn.Linear
