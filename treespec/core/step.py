"""What a decoding step is to the loop (``treespec.core.engine.decode``), and how its time is charged.

A *step* owns the target's cache and advances the generation by one tree: draft it, verify it in
one target forward, commit the accepted path. Two kinds draft on the host (:class:`HostDrafted`:
drafters' proposals merged into a trie, flattened, then ``verify``): ``EagerStep``
(``treespec.core.engine``) and ``CompiledStep`` (``treespec.core.compiled``). ``CapturedStep``
(``treespec.core.captured``) drafts a static tree on the device as well.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

import torch

from ..common.device import sync
from . import verifiers
from .drafting import DraftProposals, propose_all
from .stats import Stats
from .tree import FlatTree, TokenTree, flatten

if TYPE_CHECKING:
    from .request import Request


class Clock:
    """Charges wall-clock sections to ``stats`` (``<section>_seconds``).

    On a CPU a charge reads the host's clock. On CUDA (``device_events``) it records an event on the current
    stream instead of waiting for the device: a section's seconds are the device's timeline between two events
    (a section whose work the device ran: its run; one with no device work while the device idled: the host's
    time), read once both have happened (``Event.query``, no wait). Waiting at every charge would idle the
    device while the host launches the next section's work (three waits per step where the step's own
    device->host copy is one). :meth:`settle` waits once and adds what is left; read the sections after it."""

    #: CUDA sections timed by events (False: wait for the device at every charge, as on a CPU)
    device_events = True

    def __init__(self, stats: Stats, device: torch.device) -> None:
        self.stats, self.device, self.t = stats, device, time.perf_counter()
        self.events = self.device_events and torch.device(device).type == "cuda"
        self.last = self._event(device) if self.events else None
        self.pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @staticmethod
    def _event(device: torch.device) -> "torch.cuda.Event":
        """An event recorded now on ``device``'s current stream (where the step's work is queued)."""
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(device))
        return e

    def charge(self, section: str) -> None:
        """Add the time since the last charge to ``stats.<section>_seconds`` (on CUDA: once it has happened)."""
        if self.events:
            end = self._event(self.device)
            self.pending.append((section, self.last, end))
            self.last = end
            self._add(wait=False)
            return
        sync(self.device)
        now = time.perf_counter()
        self._credit(section, now - self.t)
        self.t = now

    def settle(self) -> None:
        """Wait for the device and add every section still pending (no-op off CUDA)."""
        self._add(wait=True)

    def _add(self, wait: bool) -> None:
        while self.pending and (wait or self.pending[0][2].query()):
            section, start, end = self.pending.pop(0)
            end.synchronize()
            self._credit(section, start.elapsed_time(end) * 1e-3)  # milliseconds

    def _credit(self, section: str, seconds: float) -> None:
        name = f"{section}_seconds"
        setattr(self.stats, name, getattr(self.stats, name) + seconds)


class Step(Protocol):
    """One kind of step (``EagerStep``, ``CompiledStep``, ``CapturedStep``)."""

    #: the most nodes a tree may have (None: the request's budget, or no cap)
    width: int | None

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        """Cache the prompt for the first :meth:`advance` (a step may defer it to then): the eager steps cache all of
        it and keep its last token's logits for the first tree's root; the compiled steps cache ``prompt[:-1]`` and
        forward the root with the first tree."""

    def advance(self, committed: list[int], remaining: int, clock: Clock) -> tuple[TokenTree, list[int], int, bool]:
        """Draft, verify and commit one tree after ``committed`` (``remaining`` tokens still wanted):
        ``(tree, accepted path of tree nodes, extra token, whether the end of the generation capped the tree)``."""


class HostDrafted:
    """A step whose tree the drafters propose on the host; subclasses verify it (``verify``)."""

    req: "Request"
    width: int | None

    def prefill_drafters(self, prompt: list[int]) -> None:
        """Each drafter's pass over ``prompt`` (``Drafter.prefill``), in the prefill's time."""
        if self.req.speculating:
            for d in self.req.drafters:
                d.prefill(prompt)

    def advance(self, committed: list[int], remaining: int, clock: Clock) -> tuple[TokenTree, list[int], int, bool]:
        tree, capped = draft_tree(self.req, committed, remaining, self.width, clock)
        path, extra = self.verify(tree, flatten(tree), clock)
        return tree, path, extra, capped

    def verify(self, tree: TokenTree, flat: FlatTree, clock: Clock) -> tuple[list[int], int]:
        """Verify ``tree`` and commit its accepted path in the cache: ``(path of tree nodes, extra token)``."""
        raise NotImplementedError


def tree_depth(req: "Request", committed: list[int], remaining: int) -> int:
    """The deepest a drafted token of this step can sit and still be emitted."""
    # A path of depth d commits d + 1 tokens (the bonus on top) and its last node sits at position
    # len(committed) - 1 + d: deeper proposals can never be emitted. Dropping them looks at depth
    # only, never at a token, so the output stays exact (TokenTree.merge).
    return min(remaining - 1, req.max_positions - len(committed))


def wants_drafts(req: "Request", committed: list[int], remaining: int) -> bool:
    """Whether this step asks the drafters at all: with no drafted token wanted they are not called (they see
    the tokens at their next ``propose``)."""
    return req.speculating and tree_depth(req, committed, remaining) >= 1


def end_capped(req: "Request", max_depth: int, too_deep: int) -> bool:
    """Whether the end of the generation capped a step's tree (:func:`tree_depth` ``max_depth``), so that the step is
    *cut* (``Stats.step_cut``) whatever it then accepts: ``too_deep`` drafted proposals sat deeper than the tokens
    still wanted (or the context left) let a token be emitted, or drafting was skipped (no drafted token wanted).
    Decided before the acceptance, so that leaving cut steps out of ``tau_uncut`` leaves no bias by outcome. The one
    rule of every step: the host-drafted ones drop those proposals (:func:`draft_tree`), the captured step drafts its
    fixed shape whole and counts its nodes past the cap (``treespec.core.captured``)."""
    return too_deep > 0 or (req.speculating and max_depth < 1)


def draft_tree(req: "Request", committed: list[int], remaining: int, width: int | None,
               clock: Clock, drafts: list[DraftProposals] | None = None) -> tuple[TokenTree, bool]:
    """This step's tree: every drafter's proposals (``drafts``, or asked here) merged under ``width`` nodes and
    the depth that can still be emitted; and whether the end of the generation capped it (:func:`end_capped`: the
    step is then *cut*)."""
    max_depth = tree_depth(req, committed, remaining)
    if drafts is None:
        drafts = propose_all(req.drafters, committed, req.vocab) if wants_drafts(req, committed, remaining) else []
    clock.charge("drafting")
    tree = TokenTree.rooted_at(committed[-1])
    too_deep = tree.merge(drafts, width, max_depth)
    if not req.params.greedy and tree.size > 1:  # refuse, before the forward, a tree the verifier is not exact for
        # only the budget's cut counts as truncation: the depth cap drops whole levels, never siblings
        kept = sum(len(props) for props in tree.proposals)
        verifiers.check_tree(req.verifier, tree, truncated=kept + too_deep < sum(len(d) for d in drafts))
    return tree, end_capped(req, max_depth, too_deep)
