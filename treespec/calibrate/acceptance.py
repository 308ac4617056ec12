"""Positional acceptance vectors, measured along the verification walk on continuations distributed as
the target's own (docs/design.md, "Definitions").

For each calibration prompt a continuation distributed as the target's own is written (greedy,
or sampled at the requested temperature; two ways, below), which gives the draft distribution
``q`` and the target distribution ``r`` at every continuation position. At each position the draft
proposes ``width`` children the way a
``ModelDrafter`` would (``topk``: its ``width`` most likely tokens as point masses; ``sample``:
``width`` i.i.d. draws from ``q``; ``sample_without_replacement``: Gumbel-top-k), and the exact
acceptance rule (``verify_proposals`` with fresh uniforms; under greedy decoding: the child equal
to ``argmax r``) says which rank, if any, is accepted.

* ``vector[k]``: fraction of positions where the child of rank ``k`` (0-based) was accepted.
* ``matrix[d][k]``: the same, conditional on reaching depth ``d + 1`` of a step. Every position
  ``i`` is taken as a step root: depth 1 is position ``i``; if a child is accepted there, depth 2
  is position ``i + 1``, and so on. Row 0 equals ``vector``.
* ``beta``: mean over positions of ``sum_x min(r(x), q(x))`` (``1 - TV``) with both distributions
  standardised by the same ``SamplingParams``; under greedy decoding it is the fraction of
  positions where the draft's argmax equals the target's.

Two ways to write the continuation (``context``):

* ``"walk"`` (the default): the continuation is written by the acceptance rule itself, one
  position at a time: the draft proposes, the rule accepts a proposal (which becomes the next
  token) or draws the correction token from the residual. The rule is exact, so the continuation is
  still distributed as the target's own. Two things make it the measurement of a real step:
  (1) given that a proposal was accepted, the next position's context holds *that* proposal, as in
  a real step; when sampling, an accepted token leans towards the draft's likely tokens, so with
  ``"target"`` contexts the rows below the first mix in contexts a real walk would not have reached
  (``tests/test_acceptance_walk.py`` builds a pair where this moves row 1 from 2/3 to 3/4);
  (2) both models run one incremental forward per token, as a step runs them. A draft whose output
  depends on how many rows one forward holds is then measured as it drafts: the ``int8`` precision
  quantises activations with one scale per forward (torch's dynamic quantisation), and one
  teacher-forced forward over a whole prompt and continuation scores a coarser draft. Under greedy
  decoding, where both ways score the same continuation, the int8 draft's top-1 agreement with the
  target was 0.904 teacher-forced against 0.921 walked on HumanEval prompts 0-19, 0.733 against
  0.775 on Lee news (``experiments/results/acceptance-fit``; the teacher-forced files were measured
  on another host of this VM). Prompts are walked ``batch_size`` at a time, as the rows of one forward per model
  and position, each row attending to its own tokens and drawing from its own generator (its walk is the one it
  has alone, up to a batched forward's rounding), except where a model is in int8, whose activation scale
  would then span the rows: such a pair is walked one prompt at a time.
* ``"target"``: the target writes its continuation alone (greedy or sampled), and both models
  score it in one teacher-forced forward each: cheaper, and under greedy decoding with a draft in
  a floating-point precision the same ranks as the walk (an accepted child and a correction token
  are both the target's argmax). Kept for comparison with measurements made that way.

``ranks`` keeps every position's accepted rank per prompt: a tree can then be run over them
(:meth:`MeasuredAcceptance.replayed_tau`), which predicts its tau without the rows' assumptions.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from ..common.device import execution_device
from ..common.files import JSONFile
from ..common.machine import model_name, version
from ..common.options import CONTEXTS, STATIC_MODES
from ..core import checks
from ..core.engine import generate
from ..core.sampling import SamplingParams, spread_seed
from .ranks import accepted_ranks, continuation_logits, walk_ranks
from .walk_replay import ReplayedStep, per_continuation, replay_steps


@dataclass
class MeasuredAcceptance(JSONFile):
    """A measured positional acceptance vector, its per-depth matrix and how it was measured.

    ``counts[d, k]``: step roots that reached depth ``d + 1`` and accepted rank ``k`` there;
    ``totals[d]``: step roots that reached depth ``d + 1`` (the sample size of row ``d``).
    ``matrix[d] = counts[d] / totals[d]``; a row with no sample repeats the row above it.
    """

    vector: np.ndarray  # [width]
    matrix: np.ndarray  # [max_depth, width]
    counts: np.ndarray  # [max_depth, width] int
    totals: np.ndarray  # [max_depth] int
    beta: float
    positions: int
    meta: dict[str, Any] = field(default_factory=dict)
    ranks: list[list[int]] = field(default_factory=list)  # per prompt, every position's accepted rank (-1: none)
    #: per prompt and position, the draft probability of each rank's proposal (the confidence stop's input,
    #: ``treespec.calibrate.walk_replay``); empty in measurements written before it was kept
    confidence: list[list[list[float]]] = field(default_factory=list)

    @classmethod
    def from_counts(cls, counts: np.ndarray, totals: np.ndarray, beta: float,
                    meta: dict[str, Any] | None = None, ranks: Sequence[Sequence[int]] = (),
                    confidence: Sequence[Sequence[Sequence[float]]] = ()) -> "MeasuredAcceptance":
        """Build from raw counts (rows with ``totals == 0`` repeat the previous row)."""
        counts = np.asarray(counts, dtype=np.int64)
        totals = np.asarray(totals, dtype=np.int64)
        matrix = np.zeros(counts.shape, dtype=np.float64)
        for d in range(counts.shape[0]):
            if totals[d] > 0:
                matrix[d] = counts[d] / totals[d]
            elif d > 0:
                matrix[d] = matrix[d - 1]
        return cls(vector=matrix[0].copy(), matrix=matrix, counts=counts, totals=totals, beta=float(beta),
                   positions=int(totals[0]), meta=dict(meta or {}), ranks=[list(map(int, r)) for r in ranks],
                   confidence=_rounded(confidence))

    def replayed_tau(self, shape: Any, min_confidence: float | None = None, horizon: int | None = None) -> float:
        """Tokens per step (uncut) of ``shape`` (a ``tree_builders.TreeShape``) run over the kept ranks.

        The walk's ranks decode like a real run of that tree: a step starts at the first position;
        at a node with ``b`` children, rank ``k < b`` moves to child ``k`` (the walk wrote that child's
        token) and anything else ends the step there, as does a leaf; the position that ends it is
        the step's correction or bonus token, and the next step starts after it. This is exact for
        measurements with ``context="walk"`` (module doc), whatever the correlations along a path:
        the walk's token at a position where ranks ``0..b-1`` were not accepted is distributed as the
        correction token after those ``b`` rejections, and at a leaf as the target's own (the bonus),
        and the next position's proposals are fresh draws in that context. Unlike the rows, whose
        every position is a root, the replay starts steps only where a run of this tree starts them.
        Steps that the end of a continuation would cut are left out (as ``tau_uncut``); a continuation that ended at
        the target's end of text keeps its last steps, as a run does (:attr:`ended`). ``min_confidence``:
        with the model drafter's confidence stop (``treespec.calibrate.walk_replay``); ``horizon``: over every step
        of a run of that many new tokens (:meth:`replay`)."""
        tokens, steps = self.replayed_steps(shape, min_confidence, horizon)
        if sum(steps) == 0:
            raise ValueError("no complete step fits in the kept continuations; measure longer ones")
        return sum(tokens) / sum(steps)

    def replayed_steps(self, shape: Any, min_confidence: float | None = None,
                       horizon: int | None = None) -> tuple[list[int], list[int]]:
        """Per calibration prompt, the committed tokens and the steps of ``shape`` run over its ranks
        (:meth:`replayed_tau`; uncut steps only, or over a ``horizon``): what a bootstrap over the calibration
        prompts resamples (``treespec.bench.intervals.ratio_of_sums``) for the spread a prediction carries."""
        return per_continuation(self.replay(shape, min_confidence, horizon), len(self.ranks))

    def replay(self, shape: Any, min_confidence: float | None = None,
               horizon: int | None = None) -> list[ReplayedStep]:
        """Every uncut step of ``shape`` run over the kept ranks (``treespec.calibrate.walk_replay``), with the
        confidence stop at ``min_confidence`` (None: every level drafted); ``horizon``: every step of a run of
        that many new tokens over each continuation's first positions (the last ones' depth capped as the
        engine caps it)."""
        if not self.ranks:
            raise ValueError("this measurement keeps no per-position ranks (written before they were kept): "
                             "measure it again with `treespec accept` to replay a tree over it")
        if shape.max_width > self.width:
            raise ValueError(f"the tree has a node with {shape.max_width} children but the measurement drew "
                             f"{self.width} proposals per position; measure with --width {shape.max_width} or more")
        return replay_steps(self.ranks, shape, self.confidence or None, min_confidence, horizon, self.ended)

    @property
    def ended(self) -> list[bool]:
        """Per continuation, whether it ended at the target's end of text: shorter than the walk's
        ``max_new_tokens`` (``meta``; none known without it). One that wrote its end of text at exactly the last
        position counts as cut there, as a run of that length would."""
        limit = self.meta.get("max_new_tokens")
        return [len(r) < int(limit) for r in self.ranks] if limit else []

    @classmethod
    def merge(cls, parts: Sequence["MeasuredAcceptance"]) -> "MeasuredAcceptance":
        """Pool measurements of the same setting (e.g. one per prompt): counts add up, ``beta`` is
        weighted by positions and ``meta`` is the first part's with the prompt count summed."""
        if not parts:
            raise ValueError("merge needs at least one MeasuredAcceptance")
        shape = parts[0].counts.shape
        if any(p.counts.shape != shape for p in parts):
            raise ValueError(f"cannot merge acceptances of different width/depth: {[p.counts.shape for p in parts]}")
        counts = sum(p.counts for p in parts)
        totals = sum(p.totals for p in parts)
        positions = sum(p.positions for p in parts)
        beta = sum(p.beta * p.positions for p in parts) / max(positions, 1)
        meta = dict(parts[0].meta)
        if all("prompts" in p.meta for p in parts):
            meta["prompts"] = sum(int(p.meta["prompts"]) for p in parts)
        confidence = [c for p in parts for c in p.confidence] if all(p.confidence for p in parts) else []
        return cls.from_counts(counts, totals, beta, meta, [r for p in parts for r in p.ranks], confidence)

    @property
    def width(self) -> int:
        """Proposals per position (the vector's length)."""
        return int(self.vector.shape[0])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (lists, numbers), read back by :meth:`from_dict`."""
        return {
            "vector": self.vector.tolist(),
            "matrix": self.matrix.tolist(),
            "counts": self.counts.tolist(),
            "totals": self.totals.tolist(),
            "beta": self.beta,
            "positions": self.positions,
            "meta": self.meta,
            "ranks": self.ranks,
            **({"confidence": self.confidence} if self.confidence else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MeasuredAcceptance":
        """The inverse of :meth:`to_dict`."""
        return cls(vector=np.asarray(d["vector"], dtype=np.float64), matrix=np.asarray(d["matrix"], dtype=np.float64),
                   counts=np.asarray(d["counts"], dtype=np.int64), totals=np.asarray(d["totals"], dtype=np.int64),
                   beta=float(d["beta"]), positions=int(d["positions"]), meta=dict(d.get("meta", {})),
                   ranks=[list(map(int, r)) for r in d.get("ranks", [])], confidence=d.get("confidence", []))

    def __repr__(self) -> str:
        head = ", ".join(f"{x:.3f}" for x in self.vector[:4])
        return (f"MeasuredAcceptance(vector=[{head}{', ...' if self.width > 4 else ''}] "
                f"(sum {self.vector.sum():.3f}), "
                f"beta={self.beta:.3f}, positions={self.positions}, depth rows={self.matrix.shape[0]})")


def encode_prompts(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Token-id lists for ``measure`` from strings (plain tokenisation, no chat template)."""
    return [list(tokenizer(t).input_ids) for t in texts]


def _rounded(confidence: Sequence[Sequence[Sequence[float]]]) -> list[list[list[float]]]:
    """Probabilities to 4 significant digits (what the JSON keeps; the stop compares them with a threshold)."""
    return [[[float(f"{p:.4g}") for p in row] for row in walk] for walk in confidence]


def depth_counts(ranks: np.ndarray, width: int, max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-depth counts of one continuation's ranks (every position a step root; see module doc)."""
    n = len(ranks)
    counts = np.zeros((max_depth, width), dtype=np.int64)
    totals = np.zeros(max_depth, dtype=np.int64)
    alive = np.ones(n, dtype=bool)  # alive[i]: the step rooted at i reached depth d + 1
    for d in range(max_depth):
        m = n - d
        if m <= 0:
            break
        reached = alive[:m]
        here = ranks[d : d + m]
        totals[d] = int(reached.sum())
        got = here[reached]
        counts[d] = np.bincount(got[got >= 0], minlength=width)[:width]
        alive = reached & (here >= 0)
    return counts, totals


@torch.inference_mode()
def measure(target: torch.nn.Module, draft: torch.nn.Module, prompts: Sequence[Sequence[int]], width: int = 8,
            mode: str = "topk", temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, max_new_tokens: int = 64,
            max_depth: int = 8, seed: int = 0, progress: bool = True, *,
            eos_token_id: int | Sequence[int] | None = None, prompts_label: str | None = None, context: str = "walk",
            batch_size: int = 8) -> MeasuredAcceptance:
    """Measure the positional acceptance vector of ``draft`` against ``target`` (see module doc).

    Args:
        target, draft: HuggingFace causal LMs sharing one vocabulary.
        prompts: token-id lists (see :func:`encode_prompts` for strings); use prompts disjoint from
            the ones you evaluate on.
        width: proposals per position (the vector's length).
        mode: how the draft proposes, as in ``ModelDrafter``: ``topk``, ``sample`` or
            ``sample_without_replacement``.
        temperature, top_k, top_p: the target distribution (0 = greedy). Draft distributions use
            ``SamplingParams.for_draft()``, like the engine.
        max_new_tokens: length of each target continuation (shorter if ``eos_token_id`` appears).
        max_depth: rows of the per-depth matrix.
        seed: continuations, draws and uniforms are reproducible from it (prompt ``j`` draws from its own
            generator, so its walk does not depend on ``batch_size`` or on the other prompts).
        progress: show a tqdm bar over prompts.
        eos_token_id: stop continuations at this token (as ``generate``).
        prompts_label: free text recorded in ``meta`` (e.g. ``"humaneval[0:100]"``).
        context: how the continuation is written (module doc): ``"walk"`` or ``"target"``.
        batch_size: prompts walked together, as the rows of one forward per position (``"target"``: the
            target's continuations written as one batch, each row as its prompt alone); one at a time where a
            model is in dynamic int8, whose activations share one quantisation scale per forward: rows walked
            together would measure it as no single-prompt step runs it.
    """
    parts = measure_each(target, draft, prompts, width, mode, temperature, top_k, top_p, max_new_tokens, max_depth,
                         seed, progress, eos_token_id=eos_token_id, prompts_label=prompts_label, context=context,
                         batch_size=batch_size)
    if not parts:
        raise ValueError("no continuation tokens were generated: give at least one prompt (and max_new_tokens >= 1)")
    merged = MeasuredAcceptance.merge(parts)
    merged.meta["prompts"] = len(prompts)
    return merged


@torch.inference_mode()
def measure_each(target: torch.nn.Module, draft: torch.nn.Module, prompts: Sequence[Sequence[int]], width: int = 8,
                 mode: str = "topk", temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 max_new_tokens: int = 64, max_depth: int = 8, seed: int = 0, progress: bool = True, *,
                 eos_token_id: int | Sequence[int] | None = None, prompts_label: str | None = None,
                 context: str = "walk", batch_size: int = 8, done: Collection[int] = (),
                 on_prompt: Callable[[int, MeasuredAcceptance | None], None] | None = None
                 ) -> list[MeasuredAcceptance]:
    """:func:`measure` kept apart per prompt (a prompt with no continuation token gives none): what it pools, and
    what an error over prompts (a jackknife, a bootstrap) resamples. The same arguments, and for a measurement that
    resumes: ``done``, the indices of prompts not to measure (measured before), and ``on_prompt(j, part)``, called as
    each prompt ``j``'s part is ready (None: no continuation token). Prompt ``j`` draws from its own generator
    whatever else is measured, so a resumed measurement is the uninterrupted one (up to a batched forward's
    rounding)."""
    width, max_depth = _checked(prompts, width, mode, max_depth, context)
    batch_size = checks.check_int("batch_size", batch_size, 1, "prompts walked together.")
    if checks.has_dynamic_int8(target) or checks.has_dynamic_int8(draft):
        batch_size = 1  # its output depends on the rows of a forward (the batch_size argument's doc)
    params = SamplingParams(temperature, top_k, top_p)
    checks.check_vocab(checks.vocab_size(target), checks.vocab_size(draft), f"model({model_name(draft)})")
    meta = {"target": model_name(target), "draft": model_name(draft), "mode": mode, "width": int(width),
            "max_depth": int(max_depth), "temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p),
            "draft_temperature": float(params.for_draft().temperature), "prompts": 1,
            "prompts_label": prompts_label, "max_new_tokens": int(max_new_tokens), "seed": int(seed),
            "context": ("target's own continuation (teacher forced)" if context == "target" else
                        "written by the acceptance rule (walk)"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "treespec": version()}
    prompts = [[int(t) for t in p] for p in prompts]
    # a walk past a sliding window measures another model than a run may use
    checks.check_prompts_fit([len(p) for p in prompts], max_new_tokens, None,
                             [f"prompt {j} of {len(prompts)}" for j in range(len(prompts))],
                             reaching=[(target, "target"), (draft, "draft")])
    parts, todo = [], [j for j in range(len(prompts)) if j not in done]
    with tqdm(total=len(prompts), initial=len(prompts) - len(todo), desc="acceptance", unit="prompt",
              disable=not progress) as bar:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            for j, (ranks, overlap, proposal_q) in zip(chunk, _prompts_ranks(
                    target, draft, prompts, chunk, params, width, mode, max_new_tokens, seed, eos_token_id, context)):
                part = None
                if len(ranks):
                    counts, totals = depth_counts(ranks.cpu().numpy(), width, max_depth)
                    part = MeasuredAcceptance.from_counts(counts, totals, overlap / len(ranks), meta, [ranks.tolist()],
                                                          [proposal_q.tolist()] if proposal_q is not None else ())
                    parts.append(part)
                if on_prompt is not None:
                    on_prompt(j, part)
            bar.update(len(chunk))
    return parts


def _checked(prompts: Sequence[Sequence[int]], width: int, mode: str, max_depth: int, context: str) -> tuple[int, int]:
    """:func:`measure`'s arguments checked: ``(width, max_depth)`` as ints."""
    if mode not in STATIC_MODES:
        why = (" (a dynamic tree's children are point masses chosen by confidence, not draws from a proposal "
               "distribution: measure it as 'topk')" if mode == "dynamic" else "")
        raise ValueError(f"unknown mode {mode!r} for an acceptance measurement{why}; choose one of "
                         f"{', '.join(STATIC_MODES)}")
    if any(isinstance(p, str) for p in prompts):
        raise TypeError("prompts must be token-id lists; turn strings into ids with encode_prompts(tokenizer, texts)")
    if context not in CONTEXTS:
        raise ValueError(f"unknown context {context!r}; choose one of {', '.join(CONTEXTS)} (module doc of "
                         "treespec.calibrate.acceptance)")
    return (checks.check_int("width", width, 1, "proposals per position (the vector's length)."),
            checks.check_int("max_depth", max_depth, 1, "rows of the per-depth matrix."))


def _prompts_ranks(target: torch.nn.Module, draft: torch.nn.Module, prompts: list[list[int]], chunk: list[int],
                   params: SamplingParams, width: int, mode: str, max_new_tokens: int, seed: int,
                   eos_token_id: int | Sequence[int] | None, context: str
                   ) -> list[tuple[torch.Tensor, float, torch.Tensor | None]]:
    """The accepted ranks, summed overlap ``sum_x min(r, q)`` and (a walk only) each proposal's draft probability
    of prompts ``chunk`` (prompt ``j`` drawing from its own generator): empty ranks for no continuation token."""
    device = execution_device(target)
    gens = {j: torch.Generator(device).manual_seed(spread_seed(seed, "verify", j)) for j in chunk}
    none = (torch.zeros(0, dtype=torch.long), 0.0, None)  # a prompt with no continuation token
    if context == "walk":
        walked = [j for j in chunk if prompts[j]]
        walks = dict(zip(walked, walk_ranks(target, draft, [prompts[j] for j in walked], max(max_new_tokens, 0),
                                            params, width, mode, [gens[j] for j in walked],
                                            checks.eos_ids(eos_token_id))))
        return [(walks[j].ranks, walks[j].overlap, walks[j].proposal_q) if j in walks else none for j in chunk]
    out = []
    # the target's continuations in one batch, each row as its prompt alone with its own seed
    conts = [row.new_tokens for row in generate(
        target, [prompts[j] for j in chunk], max_new_tokens=max_new_tokens, temperature=params.temperature,
        top_k=params.top_k, top_p=params.top_p, eos_token_id=eos_token_id,
        seed=[spread_seed(seed, "continuation", j) for j in chunk]).rows]
    for j, cont in zip(chunk, conts):
        gen = gens[j]
        if not cont:
            out.append(none)
            continue
        ids = prompts[j] + cont
        r = params.probs(continuation_logits(target, ids, len(cont), device))
        d_logits = continuation_logits(draft, ids, len(cont), execution_device(draft)).to(device)
        overlap = float(torch.minimum(r, params.probs(d_logits)).sum(-1).sum())
        out.append((accepted_ranks(r, params.for_draft().probs(d_logits), width, mode, params.greedy, gen), overlap,
                    None))
    return out
