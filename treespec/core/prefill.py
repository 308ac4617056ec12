"""The prompt's prefill through one compiled graph, for the static caches of the compiled steps.

A prompt's length varies, so an eager forward caches it (``StaticTreeCache.prefill``): on a CPU that
eager forward is the slowest part of a short run (a third of a 64-token HumanEval run with the 1.5B
target in bfloat16; measured while that eager forward still ran its LM head over a slice, about 1.4 s of a
slow kernel per prompt that ``attention.last_rows`` since removed). Measured again with the eager prefill on the
model's own causal route (``EagerPrefill``, ``kv.forward_prompt``): the compiled exact pieces still take 11% less
time on HumanEval 100-109 and 22% less on Lee news leads 0-9, about 0.13 s a prompt, for a compile of 86 s
(``experiments/results/prefill-eager-cpu.md``): the graph pays back over some 600 prompts of a process, which the
compile choice (``treespec.calibrate.compile_choice``) weighs with the steps' graphs. One compiled graph serves every
prompt, cut into pieces: token ``j`` of a
piece sits at position ``length + j`` and attends to the committed rows and to the piece's tokens up
to itself (a causal block). No logits are kept (the first step forwards the prompt's last token itself).

How a prompt is cut depends on the backend:

* **exact pieces** (a CPU, and every backend without CUDA graphs): the graph's token dimension is
  dynamic, so a prompt is cut into as few near-equal pieces as :data:`PIECE` allows and nothing is
  padded. On this project's CPU a compiled call of the 1.5B target in bfloat16 costs ~70 ms (its
  weights stream through once) plus ~7 ms per token, so one exact call beats fixed 64-token chunks by
  the padding (up to 63 tokens) and by the calls it saves: 21% less prefill time on HumanEval 100-109,
  36% on Lee news leads 0-9 (``experiments/results/prefill-cpu.md``).
* **fixed chunks** (CUDA graphs, ``mode="reduce-overhead"``: a graph is recorded per shape): every
  chunk has :data:`CHUNK` tokens, the last one padded; the padding rows land beyond the committed
  length, where the cache never reads them.

A short prompt prefills eagerly: its eager forward costs a fraction of a second, a compile tens of
seconds on a CPU (the graph is compiled at the first prompt of at least ``CHUNKED_MIN`` tokens).
So does every prompt of a model whose fastest prompt forward cannot be traced (:func:`prefill_for`:
an int4 model, whose prompt runs on its layers' twins for wide inputs outside ``torch.compile``: a draft's int8
weights, a target's own weights in bfloat16, ``treespec.models.quantized``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .compiling import compile_graph
from .static_cache import StaticTreeCache, cached_parts

#: tokens per fixed chunk under CUDA graphs (a longer chunk costs less per token but pads more of the
#: prompt's last chunk)
CHUNK = 64
#: most tokens per exact piece (bounds the ``[n, capacity]`` attention mask of one call)
PIECE = 512
#: prompts with fewer tokens to cache prefill eagerly
CHUNKED_MIN = 16


def padded_length(n: int, chunk: int = CHUNK) -> int:
    """The cache rows a fixed-chunk prefill of ``n`` tokens writes (the last chunk's padding included)."""
    return -(-n // chunk) * chunk


def pieces(n: int, longest: int = PIECE) -> list[int]:
    """``n`` tokens cut into the fewest pieces of at most ``longest``, of near-equal sizes (so that no
    piece is much shorter than the others: a graph dynamic in the token count still specialises 1)."""
    k = -(-n // longest)
    return [n // k + (i < n % k) for i in range(k)]


class ChunkedPrefill:
    """Fills ``cache`` with a prompt through one compiled graph (``__call__``): exact pieces of a dynamic
    token count, or fixed chunks of ``chunk`` tokens under CUDA graphs (module doc)."""

    def __init__(self, model: torch.nn.Module, cache: StaticTreeCache, backend: str, mode: str | None,
                 chunk: int | None = None, fixed: bool | None = None) -> None:
        self.model, self.cache = model, cache
        # CUDA graphs record one graph per shape, so one shape there (``fixed``: force either way, to compare)
        self.fixed = mode == "reduce-overhead" if fixed is None else fixed
        self.chunk = chunk or (CHUNK if self.fixed else PIECE)
        # a graph input, not an attribute: under weight freezing a graph folds what it only reads into constants
        self.no_logits = torch.zeros(0, dtype=torch.long, device=cache.length.device)
        self.step = compile_graph(self._piece, backend, mode, (model,))

    def _piece(self, ids: torch.Tensor, m: torch.Tensor, no_logits: torch.Tensor) -> None:
        """Write ``ids`` (the first ``m`` real) at ``[length, length + n)``, commit ``m`` (per row of a batched
        cache: ``ids`` ``[B, n]``, ``m`` ``[B]``)."""
        length = self.cache.length
        n = ids.shape[-1]
        offsets = torch.arange(n, device=ids.device)
        causal = torch.ones(n, n, dtype=torch.bool, device=ids.device).tril()
        self.cache.forward(self.model, ids, length[..., None] + offsets, causal, length, logits_to_keep=no_logits)
        length.add_(m)

    def __call__(self, prompt: Sequence[int]) -> None:
        """Empty the cache and commit ``prompt[:-1]`` (eagerly when it is shorter than ``CHUNKED_MIN``)."""
        self.rows([prompt])

    def rows(self, prompts: Sequence[Sequence[int]]) -> None:
        """:meth:`__call__` for each row of a batched cache (one prompt per row; one for an unbatched cache):
        the rows right-padded to the longest, each committing its own tokens only."""
        tokens, lengths = cached_parts(prompts)
        n = tokens.shape[1]
        if n < CHUNKED_MIN:
            self.cache.prefill_rows(self.model, prompts)
            return
        if (padded_length(n, self.chunk) if self.fixed else n) > self.cache.capacity:
            raise ValueError(f"a prompt of {n + 1} tokens does not fit a cache of {self.cache.capacity} rows")
        self.cache.reset()
        device = self.cache.length.device
        sizes = [min(self.chunk, n - s) for s in range(0, n, self.chunk)] if self.fixed else pieces(n, self.chunk)
        start = 0
        for size in sizes:
            # a contiguous copy: a piece of a longer prompt kept its row stride, and a graph guards on strides
            ids = tokens[:, start : start + size].clone(memory_format=torch.contiguous_format)
            m = torch.tensor([min(max(k - start, 0), size) for k in lengths])
            if self.cache.rows is None:
                ids, m = ids[0], m[0]
            if self.fixed:  # the last chunk padded to the graph's one width
                ids = torch.nn.functional.pad(ids, (0, self.chunk - size))
            else:  # one graph for every token count (never 1: pieces are near-equal, n >= CHUNKED_MIN)
                torch._dynamo.mark_dynamic(ids, ids.dim() - 1, min=2, max=self.chunk)
            self.step(ids.to(device), m.to(device), self.no_logits)
            start += size


class EagerPrefill:
    """Fills ``cache`` with each row's prompt in one eager forward (``StaticTreeCache.prefill_rows``); called as
    :class:`ChunkedPrefill` is (``__call__`` for one prompt, ``rows`` for a batched cache's)."""

    def __init__(self, model: torch.nn.Module, cache: StaticTreeCache) -> None:
        self.model, self.cache = model, cache

    def __call__(self, prompt: Sequence[int]) -> None:
        """Empty the cache and commit ``prompt[:-1]``."""
        self.rows([prompt])

    def rows(self, prompts: Sequence[Sequence[int]]) -> None:
        self.cache.prefill_rows(self.model, prompts)


def prefill_for(model: torch.nn.Module, cache: StaticTreeCache, backend: str,
                mode: str | None) -> ChunkedPrefill | EagerPrefill:
    """How ``model``'s prompt is cached: compiled pieces, or eagerly for a model whose Linear layers keep
    twins for wide inputs that only run outside ``torch.compile`` (an int4 draft's or target's)."""
    if any(getattr(m, "wide", None) is not None for m in model.modules()):
        return EagerPrefill(model, cache)
    return ChunkedPrefill(model, cache, backend, mode)
