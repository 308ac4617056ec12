"""How treespec compiles a step's functions: backend, mode and options, in one place.

``compile=True`` is inductor: on CUDA with CUDA graphs (``reduce-overhead``), on a CPU with inductor's
weight freezing (``freezing``: the graph's weights become constants, prepacked for oneDNN's bfloat16
matmuls; what HF's fastest CPU decoding uses, and what ``experiments/results/cpu-fastest-zen4`` measured
the captured step with). Freezing folds every tensor a graph only
reads into a constant, which is why the compiled steps pass what they do not mutate as inputs
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

from .attention import own_kernels
from .checks import check_compile


#: the ``compile`` value that runs the compiled steps' functions without compiling them
UNCOMPILED = "uncompiled"


def compile_options(compile: bool | str, device: torch.device) -> tuple[str, str | None]:
    """``(backend, mode)``: ``compile=True`` is inductor, with CUDA graphs (``reduce-overhead``) on
    CUDA; a string names the backend."""
    if check_compile(compile) is True:
        return "inductor", "reduce-overhead" if device.type == "cuda" else None
    if compile is False:
        raise ValueError("compile=False runs the eager step (treespec.core.engine.EagerStep), not this one")
    return compile, None


def compile_graph(fn: Callable, backend: str, mode: str | None, models: tuple[torch.nn.Module, ...] = ()) -> Callable:
    """``fn`` compiled as one graph (``fullgraph=True``) of static shapes: inductor without a mode (the CPU's)
    freezes weights. ``models``: those ``fn`` runs, switched to treespec's kernels (grouped-query attention, each
    model's ``nn.Linear`` layout: ``attention.own_kernels``) around every call, outside the graph; a frozen graph
    keeps stock layers: freezing packs their weights for oneDNN, which a weight-first product (a plain matmul) does
    not get (on the Zen 4 host the 1.5B bfloat16 target's compiled 9-token forward took 136-148 ms stock against
    207-217 weight-first, the layout its eager forwards measured as a tie: ``experiments/compiled_layout.py``).

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
    freezing = backend == "inductor" and mode is None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        freeze = torch._inductor.config.patch(freezing=True) if freezing else contextlib.nullcontext()
        with own_kernels(*models, layouts=not freezing), freeze:
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
