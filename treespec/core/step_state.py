"""What the captured step's compiled calls take and give (``treespec.core.captured``): named containers of device
tensors, built and read here, so that no caller packs or unpacks them by position.

A step hands the next a :class:`StepState`; a draft level takes the tree drafted so far (:class:`Drafted`) and
gives it one depth further; the tree's buffers go in as data (:class:`TreeTensors`, one :class:`LevelTensors` per
level); the verify call's one packed tensor is the host's :class:`Outcome`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .buffers import LevelBuffers, TreeBuffers


class StepState(NamedTuple):
    """What one step hands the next (the verify call's output; the prefill's for the first step)."""

    tokens: torch.Tensor  # [N] long: the next tree's tokens so far (its root at 0)
    exists: torch.Tensor  # [N] bool: which nodes exist so far (the root)
    conf: torch.Tensor  # [N] float: each node's path probability under the draft (the root 1)
    pending: torch.Tensor  # [1] long: the token before the root, forwarded at level 0 when the draft lacks it
    length: torch.Tensor  # [] long: the target's committed length (the root's position)
    draft_length: torch.Tensor  # [] long: the draft's committed length (one short when the pending token is used)


class Drafted(NamedTuple):
    """The tree as drafted so far (a level's output): tokens, existence and path confidence per node."""

    tokens: torch.Tensor
    exists: torch.Tensor
    conf: torch.Tensor


class TreeTensors(NamedTuple):
    """A tree's :class:`TreeBuffers` as device tensors: the node arrays the compiled calls read as data."""

    depth: torch.Tensor
    flat_parent: torch.Tensor
    ancestors: torch.Tensor
    chosen_at: torch.Tensor
    row: torch.Tensor
    rank: torch.Tensor
    q_row: torch.Tensor
    post_order: torch.Tensor
    earlier_siblings: torch.Tensor
    slot_node: torch.Tensor
    slot_level: torch.Tensor
    given: torch.Tensor

    @classmethod
    def of(cls, buf: TreeBuffers, device: torch.device) -> "TreeTensors":
        return cls(*(torch.as_tensor(getattr(buf, name), device=device) for name in cls._fields))


class LevelTensors(NamedTuple):
    """One level's :class:`LevelBuffers` as device tensors, with its index and first slot as 0-d tensors (data,
    so that levels of equal rows share a graph)."""

    nodes: torch.Tensor
    slot_depth: torch.Tensor
    block: torch.Tensor
    start: torch.Tensor
    index: torch.Tensor

    @classmethod
    def of(cls, level: LevelBuffers, index: int, device: torch.device) -> "LevelTensors":
        t = lambda a: torch.as_tensor(a, device=device)  # noqa: E731
        return cls(t(level.nodes), t(level.slot_depth), t(level.block), t(level.start), t(index))


class Outcome(NamedTuple):
    """A step's result on the host, unpacked from the verify call's one packed tensor
    ``[path rows N, m, extra, tokens N, exists N]`` (its layout is written here and in ``_verify`` only)."""

    path: list[int]  # shape nodes of the accepted path, root first
    extra: int
    tokens: list[int]
    exists: list[int]

    @classmethod
    def unpack(cls, packed: list[int], n: int) -> "Outcome":
        m = packed[n]
        return cls(packed[:m], packed[n + 1], packed[n + 2 : 2 * n + 2], packed[2 * n + 2 : 3 * n + 2])
