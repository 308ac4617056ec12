"""A tree run over a calibration walk (``MeasuredAcceptance.replayed_steps``): the steps a real run of the tree
would take over the walk's positions, with the model drafter's confidence stop where the walk kept each
proposal's draft probability.

The walk (``treespec.calibrate.ranks.walk_ranks``) wrote every position with the exact acceptance rule over
``width`` fresh proposals, so its ranks decode like a real run (``MeasuredAcceptance.replayed_tau``). The
confidence stop (``ModelDrafter(min_confidence=...)``) stops drafting deeper levels once the best frontier node's
path probability under the draft (the product of ``q`` of its tokens) is below the threshold; a step whose tree
was stopped at depth ``s`` accepts at most ``s`` tokens, and its next position is the bonus token, which the walk
wrote as the target's own (the rule is exact). Which nodes' probabilities the walk knows: along the accepted path
every node's and its siblings' (the proposals at each position, ``confidence``); nodes below a sibling the walk
did not take, it does not know. So the stop is modelled from the known frontier (a lower bound of the best
frontier path: it may stop a branching tree earlier than a real run would); for a chain every frontier node lies
on the accepted path and the tau is exact. The levels a step drafts *after* its path was rejected (they cost
drafting time, not tokens) continue along the walk's next positions' rank-0 probabilities, a stand-in for the
draft's continuation of the rejected token, which the walk did not draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tree_builders import TreeShape


@dataclass(frozen=True)
class ReplayedStep:
    """One uncut step of a tree replayed over a walk: which continuation, the tokens it commits (accepted + 1)
    and the depth it drafted (the tree's own, or where the confidence stop ended it)."""

    continuation: int
    tokens: int
    drafted_depth: int


def replay_steps(ranks: Sequence[Sequence[int]], shape: TreeShape,
                 confidence: Sequence[Sequence[Sequence[float]]] | None = None,
                 min_confidence: float | None = None, horizon: int | None = None,
                 ended: Sequence[bool] = ()) -> list[ReplayedStep]:
    """Every uncut step of ``shape`` run over ``ranks`` (per continuation, each position's accepted rank, -1:
    none), with the confidence stop at ``min_confidence`` over ``confidence`` (per continuation and position,
    the draft probability of each rank's proposal; module doc). Steps the end of a continuation would cut are
    left out: those whose drafted tree (the shape, or where the confidence stop ended it) does not fit before
    it, whatever they accept (a run's rule for a cut step;
    leaving out only the steps that then accepted past the end kept the short ones and biased tau down 2-3% for
    deep chains). ``horizon``: the steps of a run of that many new tokens over each continuation's first positions,
    the depth of the last ones capped as the engine caps it, so none is cut (module doc); a continuation shorter
    than the horizon is replayed whole. ``ended[c]``: continuation ``c`` ended at the target's end of text (its
    last position wrote it), where a run stops too: its last steps are a run's whole trees (``step.end_capped``
    cannot see an end of text coming), so they are kept (leaving them out kept the steps before them and biased
    tau up); one whose path accepted the end of text as a drafted token commits the tokens up to it and is a cut
    step (``Stats.step_cut``: it emitted fewer tokens than its path), kept over a horizon only."""
    if min_confidence is not None and confidence is None:
        raise ValueError("modelling the confidence stop needs the walk's proposal probabilities; this measurement "
                         "has none (written before they were kept): measure it again with `treespec accept`")
    n_children: dict[tuple[int, ...], int] = {(): 0}
    for path in shape.paths:
        n_children[tuple(path)] = n_children.get(tuple(path), 0)
        n_children[tuple(path[:-1])] = n_children.get(tuple(path[:-1]), 0) + 1
    steps: list[ReplayedStep] = []
    for c, walk in enumerate(ranks):
        probs = None if min_confidence is None else confidence[c]  # type: ignore[index]
        capped = horizon is not None and len(walk) >= horizon  # a run ends within this continuation
        walk = walk[:horizon] if capped else walk
        at_eos = c < len(ended) and ended[c] and not capped  # the walk ends where a run stops
        pos = 0
        while pos < len(walk):
            # a step r tokens from the run's end drafts at most r - 1 levels (the engine's cap)
            depth = min(shape.depth, len(walk) - pos - 1) if capped else shape.depth
            accepted, drafted, past_end = _one_step(walk, probs, pos, n_children, depth, min_confidence)
            if not capped and not at_eos and pos + drafted >= len(walk):
                break  # the tree it drafted (the shape's, or where the confidence stop ended it) reaches past the
                # end: a run capped there marks the step cut whatever it accepts (decided before the outcome, as
                # ``step.end_capped`` decides it, so leaving it out biases nothing)
            if past_end and not (at_eos and horizon is not None):
                break  # cut by the end of the walk, or by the end of text inside the path (a run marks it cut)
            steps.append(ReplayedStep(c, accepted + 1, drafted))  # past the end of text: the tokens up to it
            pos += accepted + 1
    return steps


def _one_step(walk: Sequence[int], probs: Sequence[Sequence[float]] | None, pos: int,
              n_children: dict[tuple[int, ...], int], depth: int, threshold: float | None) -> tuple[int, int, bool]:
    """(accepted tokens, drafted depth, whether the path ran past the walk's end) of the step rooted at ``pos``;
    past the end, the accepted tokens are those before the walk's last position (which ends the step)."""
    node: tuple[int, ...] = ()
    path_prob, stopped = 1.0, None
    while True:
        d = len(node)
        if pos + d >= len(walk):  # the walk's last position was accepted as a drafted token
            return d - 1, stopped or depth, True
        b = n_children[node] if d < depth else 0  # below a capped depth: a leaf
        if b == 0 or (stopped is not None and d >= stopped):
            return d, stopped or depth, False  # a leaf: the next position is the bonus token
        if probs is not None and stopped is None:  # the stop after drawing level d + 1 (the known frontier)
            frontier = [path_prob * probs[pos + d][k] for k in range(b) if n_children[node + (k,)] > 0]
            if frontier and max(frontier) < threshold:
                stopped = d + 1
        rank = walk[pos + d]
        if not 0 <= rank < b:  # rejected: the next position is the correction token
            return d, stopped or _drafted_after_rejection(walk, probs, pos, d, path_prob, node, n_children,
                                                            depth, threshold), False
        node += (rank,)
        path_prob *= probs[pos + d][rank] if probs is not None else 1.0


def _drafted_after_rejection(walk: Sequence[int], probs: Sequence[Sequence[float]] | None, pos: int, d: int,
                             path_prob: float, node: tuple[int, ...], n_children: dict[tuple[int, ...], int],
                             depth: int, threshold: float | None) -> int:
    """The depth a step drafted when its path was rejected below depth ``d + 1`` without a stop so far: the
    tree's depth without a stop; with one, the frontier's best child continues along the walk's next positions'
    rank-0 probabilities until the stop (module doc)."""
    if probs is None:
        return depth
    best = max(((path_prob * probs[pos + d][k], node + (k,)) for k in range(n_children[node])
                if n_children[node + (k,)] > 0), default=None)
    level = d + 1
    if best is None:
        return level
    prob, at = best
    while level < depth and n_children.get(at, 0) > 0:
        i = pos + level
        if i >= len(walk):
            break
        prob *= probs[i][0]
        at += (0,)
        level += 1
        if prob < threshold or n_children.get(at, 0) == 0:  # type: ignore[operator]
            break
    return level


def per_continuation(steps: Sequence[ReplayedStep], continuations: int) -> tuple[list[int], list[int]]:
    """The committed tokens and the number of ``steps`` on each of ``continuations`` walked continuations."""
    tokens, counts = [0] * continuations, [0] * continuations
    for step in steps:
        tokens[step.continuation] += step.tokens
        counts[step.continuation] += 1
    return tokens, counts


def truncated(shape: TreeShape, depth: int) -> TreeShape:
    """``shape`` without its nodes deeper than ``depth`` (what a step stopped there drafted)."""
    return shape if depth >= shape.depth else TreeShape([p for p in shape.paths if len(p) <= depth])

