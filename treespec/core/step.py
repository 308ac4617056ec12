"""What a decoding step is to the loop (``treespec.core.engine.decode``), and how its time is charged.

A *step* owns the target's cache and runs one step's verification: the target forward over the
flattened tree, the acceptance walk and the commit of the accepted path. ``EagerStep``
(``treespec.core.engine``) and ``CompiledStep`` (``treespec.core.compiled``) are the two kinds.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from ..common.device import sync
from .stats import Stats
from .tree import FlatTree, TokenTree


class Clock:
    """Charges wall-clock sections to ``stats`` (``<section>_seconds``); waits for the device first."""

    def __init__(self, stats: Stats, device: torch.device) -> None:
        self.stats, self.device, self.t = stats, device, time.perf_counter()

    def charge(self, section: str) -> None:
        """Add the time since the last charge to ``stats.<section>_seconds``."""
        sync(self.device)
        now = time.perf_counter()
        name = f"{section}_seconds"
        setattr(self.stats, name, getattr(self.stats, name) + now - self.t)
        self.t = now


class Step(Protocol):
    """Where a step's target forward and acceptance run (``EagerStep``, ``CompiledStep``)."""

    #: the most nodes a tree may have (None: the request's budget, or no cap)
    width: int | None

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        """Cache ``prompt[:-1]`` (a step may defer it to its first :meth:`verify`)."""

    def verify(self, tree: TokenTree, flat: FlatTree, clock: Clock) -> tuple[list[int], int]:
        """Verify ``tree`` and commit its accepted path in the cache: ``(path of tree nodes, extra token)``."""
