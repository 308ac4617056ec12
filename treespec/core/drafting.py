"""What every drafter hands the engine: its proposals for one step, in its own proposal order.

A drafter never sees the verifier. Each step the engine calls ``propose(context)`` with the whole
committed sequence (prompt plus every committed token; its last token is the root of this step's
token tree) and merges the returned proposals into one prefix trie.

The exactness rule (``docs/design.md``, "Exactness rule") needs, for every proposal, the distribution
its token was drawn from:

* ``dist_rows[j] == -1``: a deterministic candidate (top-k child, n-gram guess): a point mass;
* otherwise the token was drawn from ``dists[dist_rows[j]]`` with the tokens ``exclude[j]`` removed
  and the rest renormalised (``exclude[j] == ()`` for i.i.d. draws; the earlier draws of the same
  sibling group for sampling without replacement).
"""

from __future__ import annotations

import abc
import copy
from dataclasses import dataclass, field
from typing import Callable, Generator, NamedTuple, Sequence

import numpy as np
import torch

from .sampling import SamplingParams

POINT_MASS = -1
ROOT = -1
#: how far a sampled proposal's distribution may sum from 1 (float32 sums over a large vocabulary round by about 1e-5)
ROW_MASS_TOLERANCE = 1e-3


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

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ``ValueError`` unless these proposals are well formed and exact to verify.

        Checks: ``tokens``, ``parents``, ``dist_rows`` and ``exclude`` have one entry per proposal;
        parents precede children; token ids lie in ``[0, vocab_size)``; ``dists`` is a ``[rows, V]``
        float tensor with ``V == vocab_size``; every ``dist_rows`` entry is
        ``POINT_MASS`` or a row of ``dists``; and every sampled proposal had ``q(x) > 0`` (its token
        has mass in its row and is not among its ``exclude`` tokens). A proposal claiming to be drawn
        from a ``q`` with ``q(x) = 0`` would otherwise always be accepted: the output would be inexact.
        Vectorised over proposals (one small device-to-host copy when there are sampled proposals).
        """
        n = len(self.tokens)
        for name, seq in (("parents", self.parents), ("dist_rows", self.dist_rows), ("exclude", self.exclude)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"DraftProposals: {n} tokens but {len(seq)} {name}; give one entry per proposal")
        if n == 0:
            return
        tokens = _int_array("tokens", self.tokens)
        parents = _int_array("parents", self.parents)
        j = np.flatnonzero((parents != ROOT) & ((parents < 0) | (parents >= np.arange(n))))
        if j.size:
            j = int(j[0])
            raise ValueError(f"DraftProposals: proposal {j} has parent {int(parents[j])}; a parent must be "
                             f"ROOT (-1) or an earlier proposal (0..{j - 1})")
        _check_range("token id", tokens, vocab_size)
        if self.exclude is not None:
            for j, ex in enumerate(self.exclude):
                if ex:
                    _check_range("excluded token id", _int_array("exclude", ex), vocab_size, j)
        if self.dist_rows is not None:
            self._check_draws(tokens, vocab_size)

    def _check_draws(self, tokens: np.ndarray, vocab_size: int | None) -> None:
        """The sampled proposals: rows of a ``[rows, V]`` float ``dists``, and ``q(x) > 0`` for each."""
        rows = _int_array("dist_rows", self.dist_rows)
        sampled = np.flatnonzero(rows != POINT_MASS)
        if sampled.size == 0:
            return
        dists = self.dists
        if not isinstance(dists, torch.Tensor) or dists.dim() != 2 or not dists.dtype.is_floating_point:
            raise ValueError(f"DraftProposals: proposal {int(sampled[0])} has dist row {int(rows[sampled[0]])} but "
                             f"dists is {_describe(dists)}; give a float tensor [rows, vocab] of probabilities")
        if vocab_size is not None and dists.shape[1] != vocab_size:
            raise ValueError(f"DraftProposals: dists has {dists.shape[1]} columns but the vocabulary has "
                             f"{vocab_size} tokens; give one probability per token id")
        bad = np.flatnonzero((rows < POINT_MASS) | (rows >= dists.shape[0]))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"DraftProposals: proposal {j} has dist row {int(rows[j])} but dists has "
                             f"{dists.shape[0]} rows; use POINT_MASS (-1) or a row index 0..{dists.shape[0] - 1}")
        r = torch.as_tensor(rows[sampled], device=dists.device)
        x = torch.as_tensor(tokens[sampled], device=dists.device)
        # the rows sampled proposals were drawn from must be distributions: verification divides by them, and by
        # anything else than the q a token was drawn from the output's law is not the target's. One device-to-host
        # copy: q(x) of each sampled proposal, then every row's mass and least entry (reduced over the whole tensor,
        # the rows drawn from picked after: no gather of whole rows on the step's path)
        drawn_from = np.unique(rows[sampled])
        whole = dists.float()
        copied = torch.cat([dists[r, x].float(), whole.sum(1), whole.amin(1)]).cpu().numpy()
        q_x, mass, least = np.split(copied, [len(sampled), len(sampled) + dists.shape[0]])
        mass, least = mass[drawn_from], least[drawn_from]
        off = np.flatnonzero(~(np.abs(mass - 1) <= ROW_MASS_TOLERANCE) | ~(least >= 0))
        if off.size:
            row = int(drawn_from[off[0]])
            raise ValueError(f"DraftProposals: proposal {int(sampled[rows[sampled] == row][0])} is drawn from dist row "
                             f"{row}, which is no distribution (its entries sum to {mass[off[0]]:.6g}, the least is "
                             f"{least[off[0]]:.6g}); give each row's probabilities, non-negative and summing to 1: "
                             "the verifier divides by them")
        bad = [int(s) for s in sampled[~(np.isfinite(q_x) & (q_x > 0))]]
        if self.exclude is not None:
            bad += [int(s) for s in sampled if int(tokens[s]) in self.exclude[s]]
        if bad:
            j = min(bad)
            qj = float(q_x[np.searchsorted(sampled, j)])
            why = "it is one of its exclude tokens" if self.exclude is not None and int(tokens[j]) in self.exclude[j] \
                else f"q(x) = {qj:g}"
            raise ValueError(
                f"DraftProposals: proposal {j} (token {int(tokens[j])}) claims to be drawn from dist row "
                f"{int(rows[j])} where it has no probability ({why}); a sampled token must have q(x) > 0, "
                "otherwise verification is inexact. Propose it as a point mass (dist row POINT_MASS) or give "
                "the distribution it was really drawn from."
            )


def _int_array(name: str, values: Sequence[int]) -> np.ndarray:
    a = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise ValueError(f"DraftProposals: {name} must be a list of ints, got {_describe(values)}")
    return a.astype(np.int64, copy=False)


def _check_range(what: str, ids: np.ndarray, vocab_size: int | None, proposal: int | None = None) -> None:
    bad = np.flatnonzero((ids < 0) | (ids >= vocab_size if vocab_size is not None else False))
    if bad.size:
        j = int(bad[0]) if proposal is None else proposal
        span = f"the vocabulary [0, {vocab_size})" if vocab_size is not None else "the token ids (>= 0)"
        raise ValueError(f"DraftProposals: proposal {j} has {what} {int(ids[bad[0]])}, outside {span}; "
                         "propose the target's token ids")


def _describe(x: object) -> str:
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return f"a {type(x).__name__} of dtype {x.dtype} and shape {tuple(x.shape)}"
    return f"{x!r}" if not isinstance(x, (list, tuple)) or len(x) < 8 else f"a {type(x).__name__} of {len(x)} items"


@dataclass(frozen=True)
class Capture:
    """What a drafter hands the captured step (``treespec.core.captured``) to draft on the device.

    ``model`` proposes a fixed tree shape: ``parent[i]`` is node ``i``'s parent (node 0 = the root,
    ``parent[0] == -1``, nodes in BFS order) and ``rank[i]`` its child rank; ``mode`` is how the
    children of a node are chosen: ``"topk"`` (its most likely tokens, point-mass proposals) or
    ``"sample_without_replacement"`` (Gumbel-top-k draws from the draft distribution);
    ``min_confidence``: the drafter's confidence stop (None: every depth is drafted).

    With a second drafter whose proposals are a chain of point masses (:meth:`Drafter.given_chain`: an n-gram
    drafter), the captured step hangs that chain under the root: ``given[i]`` is node ``i``'s place in the
    chain (-1: drafted by ``model``; ``treespec.core.buffers.with_chain``), and ``given_by`` the chain drafter's
    index in the request's drafters, asked for the chain's tokens on the host before each step.
    """

    model: torch.nn.Module
    parent: np.ndarray
    rank: np.ndarray
    mode: str
    min_confidence: float | None = None
    given: np.ndarray | None = None
    given_by: int = -1

    @property
    def size(self) -> int:
        """Nodes of the shape, root included."""
        return len(self.parent)


class Drafter(abc.ABC):
    """Base class of everything that proposes continuation tokens."""

    #: vocabulary size of the drafter's token space, or None when it uses the target's ids as-is
    vocab_size: int | None = None

    def reset(self, prompt: Sequence[int], *, sampling: SamplingParams, seed: int) -> None:
        """Start a new generation from ``prompt``. Called once per ``generate`` call."""

    def prefill(self, prompt: Sequence[int]) -> None:
        """Cache what the drafter can of ``prompt`` before the first step, in the prompt's prefill (after
        :meth:`reset`; the host-drafted steps call it, so a draft model's pass over the prompt is charged to the
        prefill, not to the first step's drafting). Default: nothing (the first :meth:`propose` catches up)."""

    def prefilling(self, prompt: Sequence[int]) -> Drafting | None:
        """:meth:`prefill` as a coroutine of forwards over :attr:`cache`, for a drafter that drafts in forwards
        (:meth:`drafting`): a batch runs every row's at once. None (the default): nothing to prefill."""
        return None

    @abc.abstractmethod
    def propose(self, context: Sequence[int]) -> DraftProposals:
        """Proposals for the step whose root is ``context[-1]``."""

    def describe(self) -> str:
        return type(self).__name__

    def for_row(self) -> "Drafter":
        """A drafter of the same settings for one prompt of a batch (``treespec.core.batch``): a shallow copy,
        sharing models and settings, whose per-prompt state :meth:`reset` makes anew. A drafter holding state
        that ``reset`` does not replace overrides this."""
        return copy.copy(self)

    def capture(self) -> Capture | str:
        """How to draft this drafter's tree on the device (a :class:`Capture`), or why it cannot be."""
        return f"{self.describe()} drafts on the host"

    def given_chain(self) -> int | str:
        """The most tokens of this drafter's proposals when they are one chain of point masses that cost no
        forward (the captured step takes them as data under the root of a model drafter's tree), or why not."""
        return f"{self.describe()} is no chain of point masses"

    def drafting(self, context: Sequence[int]) -> Drafting | None:
        """This step's proposals as a coroutine of model forwards over the drafter's :attr:`cache` (so that a
        batch of prompts runs the rows' forwards together, ``treespec.core.batch``); None (the default): the
        drafter proposes in one call, :meth:`propose`."""
        return None

    def drafts_in_forwards(self) -> bool:
        """Whether a batch runs this drafter's rows through :meth:`prefilling` and :meth:`drafting`, every row's
        forwards of its ``model`` at once over a shared cache (each row's drafter gets its row as ``cache``), in
        place of :meth:`prefill` and :meth:`propose` row by row. Only where that gives :meth:`propose`'s own
        proposals (the model drafter); default False: a batch calls ``propose`` per row, as one prompt does (a
        drafter wrapping another proposes as it does alone)."""
        return False


def propose_all(drafters: Sequence[Drafter], committed: list[int], vocab: int) -> list[DraftProposals]:
    """Every drafter's proposals for this step, validated; a bad drafter is named in the error."""
    return [checked(i, d, d.propose(committed), vocab) for i, d in enumerate(drafters)]


def checked(i: int, drafter: Drafter, draft: object, vocab: int) -> DraftProposals:
    """``drafters[i]``'s proposals, validated; a bad drafter is named in the error."""
    try:
        if not isinstance(draft, DraftProposals):
            raise ValueError(f"propose() must return a DraftProposals, got {type(draft).__name__}")
        draft.validate(vocab)
    except ValueError as e:
        raise ValueError(f"drafters[{i}] ({drafter.describe()}) returned invalid proposals: {e}") from None
    return draft


class Forward(NamedTuple):
    """One model forward a drafter asks for (:meth:`Drafter.drafting`), over ``ids`` [n] at ``positions`` [n]
    appended to its cache; ``allowed`` [n, cache.length + n] (``treespec.core.kv.forward_masked``); ``last``: only
    the last token's logits are needed; ``prompt``: the prompt into an empty cache, ``allowed`` ordinary causal
    attention (answered by ``kv.forward_prompt``, the model's own causal route: a batch's rows one by one,
    ``kv.RowsCache.prompts``). The answer is the logits ``[n, V]`` (``[1, V]`` with ``last``)."""

    ids: torch.Tensor
    positions: torch.Tensor
    allowed: torch.Tensor
    last: bool = False
    prompt: bool = False


#: a step's drafting as a coroutine: it yields the forwards it needs, is sent their logits, returns its proposals
Drafting = Generator[Forward, torch.Tensor, DraftProposals]


def drive(drafting: Drafting, forward: Callable[[Forward], torch.Tensor]) -> DraftProposals:
    """Run ``drafting`` to its proposals, answering each forward it asks for with ``forward``."""
    try:
        ask = next(drafting)
        while True:
            ask = drafting.send(forward(ask))
    except StopIteration as done:
        return done.value
