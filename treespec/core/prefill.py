"""The prompt's prefill in fixed-width compiled chunks, for the static caches of the compiled steps.

A prompt's length varies, so an eager forward caches it (``StaticTreeCache.prefill``): on a CPU that
eager forward is the slowest part of a short run (a third of a 64-token HumanEval run with the 1.5B
target in bfloat16). Cut into chunks of a fixed width ``C``, every chunk is one call of the *same*
compiled graph: token ``j`` of a chunk sits at position ``length + j`` and attends to the committed
rows and to the chunk's tokens up to itself (a causal block); the last chunk is padded, and its
padding rows land beyond the committed length, where the cache never reads them. No logits are kept
(the first step forwards the prompt's last token itself).
Measured on this project's CPU (``experiments/results/cpu-fastest``, weight freezing on): 0.75 s per
HumanEval prompt against 1.52 s in the eager step (0.48 s against 1.21 s per lee-news lead).

A short prompt prefills eagerly: its eager forward costs a fraction of a second, a compile tens of
seconds on a CPU (the chunk graph is compiled at the first prompt of at least ``CHUNKED_MIN`` tokens).
So does every prompt of a model whose fastest prompt forward cannot be traced (:func:`prefill_for`:
an int4 draft, which takes its int8 weights for wide inputs, ``treespec.models.quantized``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .compiling import compile_graph
from .kv import StaticTreeCache

#: tokens per compiled prefill chunk (a longer chunk costs less per token but pads more of the prompt's
#: last chunk)
CHUNK = 64
#: prompts with fewer tokens to cache prefill eagerly
CHUNKED_MIN = 16


def padded_length(n: int, chunk: int = CHUNK) -> int:
    """The cache rows a chunked prefill of ``n`` tokens writes (the last chunk's padding included)."""
    return -(-n // chunk) * chunk


class ChunkedPrefill:
    """Fills ``cache`` with a prompt through one compiled graph of ``chunk`` tokens (``__call__``)."""

    def __init__(self, model: torch.nn.Module, cache: StaticTreeCache, backend: str, mode: str | None,
                 chunk: int = CHUNK) -> None:
        self.model, self.cache, self.chunk = model, cache, chunk
        device = cache.length.device
        # graph inputs, not attributes: under weight freezing a graph folds what it only reads into
        # constants, which is right for these two (they never change) and for nothing it mutates
        self.offsets = torch.arange(chunk, device=device)
        self.causal = torch.ones(chunk, chunk, dtype=torch.bool, device=device).tril()
        self.no_logits = torch.zeros(0, dtype=torch.long, device=device)
        self.step = compile_graph(self._chunk, backend, mode)

    def _chunk(self, ids: torch.Tensor, m: torch.Tensor, offsets: torch.Tensor, causal: torch.Tensor,
               no_logits: torch.Tensor) -> None:
        """Write ``ids`` (``chunk`` tokens, the first ``m`` real) at ``[length, length + chunk)``, commit ``m``."""
        length = self.cache.length
        self.cache.forward(self.model, ids, length + offsets, causal, length, logits_to_keep=no_logits)
        length.add_(m)

    def __call__(self, prompt: Sequence[int]) -> None:
        """Empty the cache and commit ``prompt[:-1]`` (eagerly when it is shorter than ``CHUNKED_MIN``)."""
        n = len(prompt) - 1
        if n < CHUNKED_MIN:
            self.cache.prefill(self.model, prompt)
            return
        if padded_length(n, self.chunk) > self.cache.capacity:
            raise ValueError(f"a prompt of {n + 1} tokens does not fit a cache of {self.cache.capacity} rows "
                             f"in chunks of {self.chunk}")
        self.cache.reset()
        device = self.cache.length.device
        ids = torch.zeros(padded_length(n, self.chunk), dtype=torch.long)
        ids[:n] = torch.as_tensor(list(prompt[:-1]), dtype=torch.long)
        ids = ids.to(device)
        for start in range(0, n, self.chunk):
            m = torch.tensor(min(self.chunk, n - start), device=device)
            self.step(ids[start : start + self.chunk], m, self.offsets, self.causal, self.no_logits)


class EagerPrefill:
    """Fills ``cache`` with a prompt in one eager forward (``StaticTreeCache.prefill``)."""

    def __init__(self, model: torch.nn.Module, cache: StaticTreeCache) -> None:
        self.model, self.cache = model, cache

    def __call__(self, prompt: Sequence[int]) -> None:
        self.cache.prefill(self.model, prompt)


def prefill_for(model: torch.nn.Module, cache: StaticTreeCache, backend: str,
                mode: str | None) -> ChunkedPrefill | EagerPrefill:
    """How ``model``'s prompt is cached: compiled chunks, or eagerly for a model whose Linear layers keep
    int8 weights for wide inputs that only run outside ``torch.compile`` (an int4 draft)."""
    if any(getattr(m, "wide", None) is not None for m in model.modules()):
        return EagerPrefill(model, cache)
    return ChunkedPrefill(model, cache, backend, mode)
