"""What one ``generate`` call reports: per-step records and the figures derived from them.

Shared by the eager loop (``treespec.core.engine``) and the static-shape loop (``treespec.core.compiled``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .tree import TokenTree


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
    (or the context left), drafting skipped included. Two means of tokens per step, both with the
    bonus/correction token included: ``tau`` over all steps (what the user got) and ``tau_uncut``
    over the steps that were not cut (what the tree shape and drafters deliver per full step; the
    per-step expected tokens of ``docs/design.md``, "Definitions", estimate this one).
    """

    steps: int = 0  # target forwards over a token tree (the prefill is not counted)
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
    depth_tried: list[int] = field(default_factory=list)  # [d-1]: uncut steps whose walk reached a node at depth d-1 with children
    depth_accepted: list[int] = field(default_factory=list)  # [d-1]: of those, steps that accepted a child at depth d
    verifier: str = "rrs"  # the verification rule (treespec.core.verifiers)

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

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(tau=self.tau, tau_uncut=self.tau_uncut, cut_steps=self.cut_steps,
                 depth_acceptance=self.depth_acceptance, seconds=self.seconds,
                 tokens_per_second=self.tokens_per_second)
        return d


@dataclass
class GenerateOutput:
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
