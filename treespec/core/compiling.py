"""How treespec compiles a step's functions: backend, mode and options, in one place.

``compile=True`` is inductor with weight freezing (``freezing``: the graph's weights become constants; on a
CPU prepacked for oneDNN's bfloat16 matmuls, what HF's fastest CPU decoding uses and what
``experiments/results/cpu-fastest-zen4`` measured the captured step with), and on CUDA with CUDA graphs
(``reduce-overhead``), q, k and v as one product (:data:`CUDA_GRAPHS_ONE_QKV`). Freezing folds every tensor a
graph only reads into a constant, which is why the compiled steps pass what they do not mutate as inputs
(``treespec.core.static_cache.StaticTreeCache``). A string names another backend, compiled without options;
``"uncompiled"`` runs the same step functions as plain PyTorch, without dynamo (the way gpt-fast's decoding
runs without ``--compile``): no speed, but the captured step's code to step through in a debugger, and its
sampled law checked without minutes of tracing (the tests tie it to the compiled graphs token for token).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch

from . import fused_qkv
from .attention import own_kernels
from .checks import check_compile


#: the ``compile`` value that runs the compiled steps' functions without compiling them
UNCOMPILED = "uncompiled"

#: CUDA graphs (``reduce-overhead``) of frozen weights, as a CPU's graphs always are: inductor concatenates the
#: products that share an input (gate and up); with ``CUDA_GRAPHS_ONE_QKV`` q, k and v too, whatever their widths
#: (``fused_qkv``). On an H200 the two took a 0.5B draft level to 1.53 ms (``experiments/results/gpu-h200-qkv``:
#: 2.23 ms last measured without them, with the memory-efficient attention kernel). Frozen graphs hold the
#: concatenated weights beside the model's own (by our count about 2 GB for the 1.5B + 0.5B pair; not measured).
CUDA_GRAPHS_FREEZE = True
CUDA_GRAPHS_ONE_QKV = True


def compile_options(compile: bool | str, device: torch.device) -> tuple[str, str | None]:
    """``(backend, mode)``: ``compile=True`` is inductor, with CUDA graphs (``reduce-overhead``) on
    CUDA; a string names the backend."""
    if check_compile(compile) is True:
        return "inductor", "reduce-overhead" if device.type == "cuda" else None
    if compile is False:
        raise ValueError("compile=False runs the eager step (treespec.core.engine.EagerStep), not this one")
    return compile, None


def graph_settings(backend: str, mode: str | None) -> tuple[bool, bool]:
    """``(freezing, q/k/v as one product)`` of a step's graphs: inductor freezes on a CPU (no mode) and with CUDA
    graphs (:data:`CUDA_GRAPHS_FREEZE`), and rewrites q, k, v into one product with CUDA graphs
    (:data:`CUDA_GRAPHS_ONE_QKV`; a CPU's graphs were measured without it)."""
    freezing = backend == "inductor" and (mode is None or (mode == "reduce-overhead" and CUDA_GRAPHS_FREEZE))
    return freezing, freezing and mode is not None and CUDA_GRAPHS_ONE_QKV


def compile_graph(fn: Callable, backend: str, mode: str | None, models: tuple[torch.nn.Module, ...] = ()) -> Callable:
    """``fn`` compiled as one graph (``fullgraph=True``) of static shapes: inductor freezes weights
    (:func:`graph_settings`). ``models``: those ``fn`` runs, switched to treespec's kernels (grouped-query
    attention, each model's ``nn.Linear`` layout: ``attention.own_kernels``) around every call, outside the graph;
    a frozen graph keeps stock layers: freezing packs (or concatenates) their weights, which a weight-first product
    (a plain matmul) does not get (on the Zen 4 host the 1.5B bfloat16 target's compiled 9-token forward took
    136-148 ms stock against 207-217 weight-first, the layout its eager forwards measured as a tie:
    ``experiments/compiled_layout.py``).

    ``dynamic=False``: every runner compiles the same code objects for its own shapes (a batch's rows, an
    envelope's widths), and dynamo's default would trace every runner after the first with those sizes symbolic
    (automatic dynamic shapes), slower to compile and to run. A dimension marked dynamic (the prefill's token
    count) stays dynamic.

    Freezing is switched on around every call rather than passed in ``torch.compile``'s ``options``: dynamo
    marks a module's weights static (so inductor may fold them) only when ``torch._inductor.config.freezing``
    is on while it traces; ``options`` reach inductor alone, after the weights became ordinary graph inputs,
    and froze nothing (tests/test_freezing.py checks the generated code)."""
    if backend == UNCOMPILED:
        return fn
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend, mode=mode)
    freezing, one_qkv = graph_settings(backend, mode)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        freeze = torch._inductor.config.patch(freezing=True) if freezing else contextlib.nullcontext()
        joined = fused_qkv.applied() if one_qkv else contextlib.nullcontext()
        with own_kernels(*models, layouts=not freezing), freeze, joined:
            return compiled(*args, **kwargs)

    return call


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far (what a sweep records per point, and a benchmark per
    tree shape)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def allow_recompiles() -> None:
    """Every runner compiles its own graphs of the same code objects (its caches are guarded by identity,
    see ``StaticTreeCache``): let dynamo keep many of them rather than fall back to eager."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 512)
