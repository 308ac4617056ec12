"""The compiled steps' runners, kept for reuse: one cache for both kinds (``compiled`` and ``captured``).

A runner owns compiled graphs and static KV caches of full capacity, so reusing it saves the compiles
(seconds to minutes) and a new runner costs memory: the cache keeps a few and evicts the oldest first.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, TypeVar

import torch

from .checks import context_of
from .compiling import allow_recompiles

R = TypeVar("R")


def model_key(model: torch.nn.Module) -> tuple[int, int]:
    """A model as a runner's graphs hold it: its identity, each parameter's and buffer's storage, version counter
    and dtype, and its context (a runner's cache clamps positions at it). Weights frozen into a graph (inductor's
    freezing) and a cache made in the model's dtype belong to the model as it was: an in-place ``load_state_dict``,
    a training step or ``.to(dtype)`` changes this key, so a new runner is made instead of running the old weights
    (or failing deep in a trace). A write through ``.data`` bumps no version counter and is not seen: clear
    ``treespec.core.captured.RUNNERS`` and ``treespec.core.compiled.RUNNERS`` after one."""
    tensors = (*model.parameters(), *model.buffers())
    return id(model), hash((context_of(model), *((t.data_ptr(), t._version, t.dtype) for t in tensors)))


class RunnerCache(Generic[R]):
    """Runners by key, at most ``limit`` of them (the oldest evicted first)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._runners: dict[Hashable, R] = {}

    def get(self, key: Hashable, make: Callable[[], R], fits: Callable[[Hashable, R], bool] | None = None) -> R:
        """The runner under ``key``, else the first one ``fits(its key, it)`` accepts, else a new ``make()``."""
        runner = self._runners.get(key)
        if runner is None and fits is not None:
            runner = next((r for k, r in self._runners.items() if fits(k, r)), None)
        if runner is None:
            while len(self._runners) >= self.limit:
                self._runners.pop(next(iter(self._runners)))
            allow_recompiles()
            runner = self._runners[key] = make()
        return runner

    def values(self) -> list[R]:
        return list(self._runners.values())

    def clear(self) -> None:
        self._runners.clear()

    def __len__(self) -> int:
        return len(self._runners)
