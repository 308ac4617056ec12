"""What every drafter hands the engine: its proposals for one step, in its own proposal order.

A drafter never sees the verifier. Each step the engine calls ``propose(context)`` with the whole
committed sequence (prompt plus every committed token; its last token is the root of this step's
token tree) and merges the returned proposals into one prefix trie.

The exactness rule (see ``../shared/design/NOTES.md``) needs, for every proposal, the distribution
its token was drawn from:

* ``dist_rows[j] == -1``: a deterministic candidate (top-k child, n-gram guess): a point mass;
* otherwise the token was drawn from ``dists[dist_rows[j]]`` with the tokens ``exclude[j]`` removed
  and the rest renormalised (``exclude[j] == ()`` for i.i.d. draws; the earlier draws of the same
  sibling group for sampling without replacement).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .sampling import SamplingParams

POINT_MASS = -1
ROOT = -1


@dataclass
class DraftProposals:
    """One drafter's proposals for one step.

    Proposal ``j`` proposes ``tokens[j]`` as a child of ``parents[j]``: ``ROOT`` (-1) is the last
    committed token, ``i >= 0`` is the node created by proposal ``i`` (always ``i < j``).
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    dists: torch.Tensor | None = None  # [rows, V] float probabilities, or None if all point masses
    dist_rows: list[int] | None = None  # per proposal: row of ``dists`` or POINT_MASS; None = all point masses
    exclude: list[tuple[int, ...]] | None = None  # per proposal: tokens removed before drawing; None = none

    def __len__(self) -> int:
        return len(self.tokens)

    def dist_row(self, j: int) -> int:
        return POINT_MASS if self.dist_rows is None else self.dist_rows[j]

    def excluded(self, j: int) -> tuple[int, ...]:
        return () if self.exclude is None else self.exclude[j]

    def validate(self) -> None:
        if len(self.parents) != len(self.tokens):
            raise ValueError("DraftProposals: tokens and parents differ in length")
        for j, p in enumerate(self.parents):
            if not (p == ROOT or 0 <= p < j):
                raise ValueError(f"DraftProposals: proposal {j} has parent {p}; parents must precede children")


class Drafter(abc.ABC):
    """Base class of everything that proposes continuation tokens."""

    #: vocabulary size of the drafter's token space, or None when it uses the target's ids as-is
    vocab_size: int | None = None

    def reset(self, prompt: Sequence[int], *, sampling: SamplingParams, seed: int) -> None:
        """Start a new generation from ``prompt``. Called once per ``generate`` call."""

    @abc.abstractmethod
    def propose(self, context: Sequence[int]) -> DraftProposals:
        """Proposals for the step whose root is ``context[-1]``."""

    def describe(self) -> str:
        return type(self).__name__
