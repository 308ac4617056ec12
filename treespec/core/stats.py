"""What one ``generate`` call reports: per-step records and the figures derived from them.

Filled by the decoding loop (``treespec.core.engine.decode``) whichever step runs it. ``Stats.record``
is the one flattening of these figures into a JSON record (``treespec generate --json``, comparisons,
sweeps); ``Stats.combined`` pools several calls (a sweep point's prompts).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import torch

from .tree import TokenTree

if TYPE_CHECKING:
    from .request import Request


#: the seconds of a call, by section (``Stats``): they add up to ``Stats.seconds``
SECTIONS = ("prefill_seconds", "drafting_seconds", "verifying_seconds", "overhead_seconds")


@dataclass
class DrafterStats:
    name: str
    proposed: int = 0  # proposals that made it into the verified tree
    accepted: int = 0  # emitted drafted tokens this drafter had proposed


@dataclass
class Stats:
    """Figures of one ``generate`` call. Seconds are wall clock (synchronised on CUDA).

    Only emitted tokens count: when EOS or ``max_new_tokens`` cuts a step's accepted path, the
    tokens after the cut are in neither ``accepted_hist`` nor the drafters' ``accepted``.

    A step is *cut* (``step_cut``) when the end of the generation shortened it: its committed tokens
    were cut at EOS or ``max_new_tokens``, or its tree was capped in depth by the tokens still wanted
    (or the context left), drafting skipped included (``treespec.core.step.end_capped``, decided before the
    acceptance: every step's rule, the captured step's too, whose fixed tree is drafted whole). Two means of
    tokens per step, both with the bonus/correction token included: ``tau`` over all steps (what the user
    got) and ``tau_uncut`` over the steps that were not cut (what the tree shape and drafters deliver per
    full step; the per-step expected tokens of ``docs/design.md``, "Definitions", estimate this one).
    The ``*_seconds`` sections are wall-clock; on CUDA they are read off events on the device's timeline
    (``treespec.core.step.Clock``: no wait for the device per section) and add up to the same wall time.
    """

    steps: int = 0  # trees verified (the prefill is not counted; plain decoding's first by the prefill's forward)
    new_tokens: int = 0
    accepted_hist: list[int] = field(default_factory=list)  # [k] = steps that emitted k drafted tokens
    tree_sizes: list[int] = field(default_factory=list)  # tokens verified per step, root included
    step_tokens: list[int] = field(default_factory=list)  # tokens committed per step (bonus included)
    step_cut: list[bool] = field(default_factory=list)  # per step: shortened by the end of the generation
    prefill_seconds: float = 0.0
    drafting_seconds: float = 0.0  # drafters' propose(), draft model forwards included
    verifying_seconds: float = 0.0  # target forwards over the trees
    overhead_seconds: float = 0.0  # trie, flattening, mask, acceptance walk, cache commit
    drafters: list[DrafterStats] = field(default_factory=list)
    depth_tried: list[int] = field(default_factory=list)  # [d-1]: uncut steps whose walk reached a node at depth
                                                          # d-1 with children
    depth_accepted: list[int] = field(default_factory=list)  # [d-1]: of those, steps that accepted a child at depth d
    verifier: str = "rrs"  # the verification rule (treespec.core.verifiers)
    step: str = "eager"  # where the steps ran: eager, compiled (host drafting, and why) or captured
    seed: int | None = None  # a sampled run's seed, the one given or drawn (generate(seed=...) repeats the run)

    @property
    def tau(self) -> float:
        """Mean tokens committed per step over all steps (bonus/correction token included)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def cut_steps(self) -> int:
        """Number of steps shortened by the end of the generation (see the class docstring)."""
        return sum(self.step_cut)

    @property
    def tau_uncut(self) -> float:
        """Mean tokens committed per step over the steps that were not cut (0.0 if there are none)."""
        full = [n for n, cut in zip(self.step_tokens, self.step_cut) if not cut]
        return sum(full) / len(full) if full else 0.0

    @property
    def depth_acceptance(self) -> list[float]:
        """Per depth d (index d-1): the rate at which a walk that reached depth d-1, with children
        to try, accepted one of them; measured over uncut steps. Compare with the acceptance vector
        the tree was sized for to locate where a predicted tau is lost."""
        return [a / t if t else 0.0 for a, t in zip(self.depth_accepted, self.depth_tried)]

    @property
    def seconds(self) -> float:
        return self.prefill_seconds + self.drafting_seconds + self.verifying_seconds + self.overhead_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_tree_size(self) -> float:
        """Tokens verified per step, root included, averaged over steps."""
        return sum(self.tree_sizes) / len(self.tree_sizes) if self.tree_sizes else 0.0

    def as_dict(self) -> dict:
        """Every field and derived figure (per-step lists included)."""
        d = asdict(self)
        d.update(tau=self.tau, tau_uncut=self.tau_uncut, cut_steps=self.cut_steps,
                 depth_acceptance=self.depth_acceptance, seconds=self.seconds,
                 tokens_per_second=self.tokens_per_second)
        return d

    def record(self) -> dict[str, Any]:
        """The figures a result record keeps: counts, tau both ways, per-depth and per-drafter
        acceptance, and the seconds per section (``engine_seconds`` is :attr:`overhead_seconds`)."""
        return {"steps": self.steps, "new_tokens": self.new_tokens, "tau": self.tau, "tau_uncut": self.tau_uncut,
                "cut_steps": self.cut_steps, "step_tokens": self.step_tokens, "step_cut": self.step_cut,
                "accepted_hist": self.accepted_hist, "mean_tree_size": self.mean_tree_size,
                "depth_tried": self.depth_tried, "depth_accepted": self.depth_accepted,
                "prefill_seconds": self.prefill_seconds, "drafting_seconds": self.drafting_seconds,
                "verifying_seconds": self.verifying_seconds, "engine_seconds": self.overhead_seconds,
                "seconds": self.seconds, "tokens_per_second": self.tokens_per_second, "verifier": self.verifier,
                "step": self.step, "seed": self.seed,
                "drafters": [asdict(d) for d in self.drafters]}

    @classmethod
    def combined(cls, parts: Sequence["Stats"]) -> "Stats":
        """Several calls' figures as one: counts, seconds and histograms added, per-step lists joined."""
        out = cls(verifier=parts[0].verifier if parts else "rrs", step=parts[0].step if parts else "eager")
        for s in parts:
            for name in ("steps", "new_tokens", *SECTIONS):
                setattr(out, name, getattr(out, name) + getattr(s, name))
            for name in ("tree_sizes", "step_tokens", "step_cut"):
                getattr(out, name).extend(getattr(s, name))
            for name in ("accepted_hist", "depth_tried", "depth_accepted"):
                setattr(out, name, _add(getattr(out, name), getattr(s, name)))
            if not out.drafters:
                out.drafters = [DrafterStats(d.name) for d in s.drafters]
            for total, d in zip(out.drafters, s.drafters):
                total.proposed += d.proposed
                total.accepted += d.accepted
        return out


def _add(a: list[int], b: list[int]) -> list[int]:
    """Elementwise sum of two count lists of different lengths."""
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(max(len(a), len(b)))]


@dataclass
class GenerateOutput:
    """What ``treespec.generate`` returns for one prompt: the prompt and its new tokens as one ``[1, L + n]`` tensor
    (as HF's ``generate`` returns them), the new tokens alone (none after an EOS), and the run's :class:`Stats`
    (``stats.record()`` / ``stats.as_dict()`` for JSON)."""

    sequences: torch.Tensor  # [1, L + n]: prompt then the generated tokens
    new_tokens: list[int]
    stats: Stats


def emitted_tokens(step_tokens: list[int], remaining: int, eos: set[int]) -> list[int]:
    """A step's committed tokens as emitted: at most ``remaining``, and none after an EOS token."""
    step_tokens = step_tokens[:remaining]
    for i, t in enumerate(step_tokens):
        if t in eos:
            return step_tokens[: i + 1]
    return step_tokens


def record_step(stats: Stats, tree: TokenTree, path: list[int], emitted: int, cut: bool) -> None:
    """Count one step; of its accepted path only the ``emitted`` tokens count (EOS or the length cut it)."""
    stats.steps += 1
    accepted = min(len(path) - 1, emitted)  # drafted tokens actually emitted
    if len(stats.accepted_hist) <= accepted:
        stats.accepted_hist.extend([0] * (accepted + 1 - len(stats.accepted_hist)))
    stats.accepted_hist[accepted] += 1
    stats.tree_sizes.append(tree.size)
    stats.step_tokens.append(emitted)
    stats.step_cut.append(cut)
    if not cut:  # per-depth acceptance: the walk reached depth d - 1 with children to try there
        for d, v in enumerate(path, start=1):
            if not tree.proposals[v]:
                break
            if len(stats.depth_tried) < d:
                stats.depth_tried.append(0)
                stats.depth_accepted.append(0)
            stats.depth_tried[d - 1] += 1
            stats.depth_accepted[d - 1] += d < len(path)
    for props in tree.proposals:
        for p in props:
            stats.drafters[p.drafter].proposed += 1
    for v in path[1 : 1 + accepted]:
        mask = tree.proposed_by[v]
        for i, ds in enumerate(stats.drafters):
            if mask >> i & 1:
                ds.accepted += 1


class Progress:
    """One prompt's generation so far (``treespec.core.engine.decode``; each row of a batch,
    ``treespec.core.batch``): each step's accepted path and extra token emitted (cut at EOS or
    ``max_new_tokens``), counted in :attr:`stats`, streamed to the request's ``on_tokens``."""

    def __init__(self, req: "Request", step: str) -> None:
        self.req = req
        self.stats = Stats(drafters=[DrafterStats(d.describe()) for d in req.drafters], verifier=req.verifier,
                           step=step, seed=None if req.params.greedy else req.seed)
        self.committed, self.new = list(req.prompt), []
        self.done = False

    @property
    def remaining(self) -> int:
        """Tokens still wanted."""
        return self.req.max_new_tokens - len(self.new)

    def take(self, tree: TokenTree, path: list[int], extra: int, capped: bool) -> list[int]:
        """Emit one step's result (a step's ``advance``); returns the tokens emitted."""
        tokens = emitted_tokens([tree.tokens[v] for v in path[1:]] + [extra], self.remaining, self.req.eos)
        self.committed += tokens
        self.new += tokens
        record_step(self.stats, tree, path, len(tokens), capped or len(tokens) < len(path))
        self.done = self.remaining <= 0 or tokens[-1] in self.req.eos
        return tokens

    def stream(self, tokens: list[int]) -> None:
        """Hand ``tokens`` to the request's ``on_tokens`` (its own list)."""
        if self.req.on_tokens is not None:
            self.req.on_tokens(list(tokens))

    def output(self) -> GenerateOutput:
        self.stats.new_tokens = len(self.new)
        return GenerateOutput(torch.tensor([self.committed], dtype=torch.long, device=self.req.out_device), self.new,
                              self.stats)
