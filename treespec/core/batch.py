"""Several prompts at once: one target forward per step verifies every row's tree.

Each row is one request (its prompt, its own copies of the drafters, its own seed and random numbers,
its own acceptance: ``padded.HostAcceptance``, the eager step's), so a row's output is what
``treespec.generate`` gives for that prompt alone with the row's seed (:func:`row_seed`) through the same route
(the eager step: ``compile=False``), whichever prompts share its batch. What the rows share are the forwards
and the rule's call (``padded.accept_rows``: every row's tree padded to the widest, each with its own random
numbers): the target's over every row's tree, and a model drafter's over every row's level (its drafting is a
coroutine of forwards, ``Drafter.drafting``, ``Drafter.drafts_in_forwards``; other drafters propose row by row),
each through one ``kv.RowsCache`` (batch row ``b`` holds row ``b``'s committed tokens; a row's new tokens follow
its own, padding attends to itself only). The prompts are not shared: each row's goes through its own forward
(``kv.RowsCache.prompts``). A finished row (EOS or ``max_new_tokens``) leaves the batch: it costs nothing after.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from . import checks
from .drafting import DraftProposals, Drafter, Drafting, Forward, checked
from .buffers import Envelope
from .kv import RowCache, RowsCache, causal_allowed, kept_rows, tree_inputs
from .padded import HostAcceptance, accept_rows
from .request import Request
from .sampling import spread_seed
from .stats import SECTIONS, GenerateOutput, Progress, Stats
from .step import Clock, draft_tree, wants_drafts
from .tree import FlatTree, TokenTree, flatten

@dataclass
class BatchOutput:
    """A batch's outputs: ``rows[r]`` is prompt ``r``'s (its ``stats`` seconds: the batch's, while it was in it)."""

    rows: list[GenerateOutput]
    stats: Stats  # the rows' counts pooled; seconds: the batch's sections, once
    forwards: int  # batch steps: trees verified, each for every row still in the batch (plain decoding's first
    # by the prefill's forward)
    row_seconds: list[float]  # per row: seconds from the start until it finished

    @property
    def tokens_per_second(self) -> float:
        """Every row's tokens over the batch's seconds."""
        return self.stats.tokens_per_second


def row_seed(seed: int, row: int) -> int:
    """The seed of a batch's row ``row``: the call's seed for row 0, a hash of both for the others (so a
    row's output is ``generate``'s for its prompt with this seed, and never depends on its batch mates)."""
    return seed if row == 0 else spread_seed("batch-row", seed, row)


def row_seeds(seed: int | Sequence[int] | None, rows: int) -> tuple[list[int], int | None]:
    """Each row's seed: ``seed`` itself when it is a list of one seed per prompt, else :func:`row_seed` of the
    call's seed (drawn at random when None); and that call's seed (None for a list): ``seed=`` it repeats the
    batch."""
    if isinstance(seed, (np.ndarray, torch.Tensor)) and seed.ndim == 1:  # one seed per prompt, as an array
        seed = seed.tolist()
    if isinstance(seed, (list, tuple)):
        if len(seed) != rows:
            raise ValueError(f"seed: a list gives one seed per prompt; got {len(seed)} seeds for {rows} prompts")
        if any(s is None for s in seed):
            raise ValueError("seed: a list of seeds holds whole numbers in [0, 2**64), not None")
        return [checks.check_seed(s) for s in seed], None
    seed = checks.check_seed(seed)
    if seed is None:
        seed = int.from_bytes(os.urandom(7), "little")
    return [row_seed(seed, r) for r in range(rows)], seed


class BatchEagerStep:
    """The eager step over a batch of rows (module docstring). Each step: every row's proposals, a drafter that
    drafts in forwards (``Drafter.drafts_in_forwards``: the model drafter) running all rows' forwards at once over one
    ``RowsCache`` of its model (its rows' caches are views of it); one target forward for every row; every row's
    acceptance in one call of the rule (each row's own random numbers)."""

    name = "eager, batched"

    def __init__(self, reqs: Sequence[Request], gens: Sequence[torch.Generator]) -> None:
        self.target, self.device, self.vocab = reqs[0].target, reqs[0].device, reqs[0].vocab
        self.acceptance = [HostAcceptance(req, gen) for req, gen in zip(reqs, gens)]  # by row
        self.cache = RowsCache(len(reqs))
        #: each row's root logits ``[1, V]`` from the prefill, until the first step
        self.root_logits: dict[int, torch.Tensor] | None = None
        #: drafter index -> the rows' shared draft cache, for drafters that draft in forwards
        self.draft_caches: dict[int, RowsCache] = {}
        for i, d in enumerate(reqs[0].drafters):
            if d.drafts_in_forwards():
                self.draft_caches[i] = shared = RowsCache(len(reqs))
                for row, req in enumerate(reqs):
                    req.drafters[i].cache = RowCache(shared, row)

    def prefill(self, prompts: Sequence[list[int]], clock: Clock) -> None:
        """Cache each prompt, its last token's logits kept for the row's first step (as ``EagerStep.prefill``), in
        the target, and each prompt but its last token in each drafter that drafts in forwards (``Drafter.prefilling``;
        the drafters that propose row by row, such as a draft of another tokenizer, by ``Drafter.prefill``);
        each row's prompt in a forward of its own (``kv.RowsCache.prompts``)."""
        asks = {row: Forward(torch.tensor(p, device=self.device), torch.arange(len(p), device=self.device),
                             causal_allowed(0, len(p)), last=True, prompt=True) for row, p in enumerate(prompts)}
        self.root_logits = self.cache.forward(self.target, asks)
        reqs = [a.req for a in self.acceptance]
        for i, shared in self.draft_caches.items():
            coroutines = {row: c for row, (req, p) in enumerate(zip(reqs, prompts))
                          if req.speculating and (c := req.drafters[i].prefilling(p)) is not None}
            if coroutines:
                model = reqs[0].drafters[i].model
                together(coroutines, lambda asks, shared=shared, model=model: shared.forward(model, asks))
        for req, p in zip(reqs, prompts):  # the drafters that propose row by row: each row's own pass
            for i, d in enumerate(req.drafters if req.speculating else []):
                if i not in self.draft_caches:
                    d.prefill(p)

    def advance(self, runs: dict[int, Progress], clock: Clock) -> dict[int, tuple[TokenTree, list[int], int, bool]]:
        """One step of every row still in the batch (``runs``: its generation by row)."""
        drafts = self.propose(runs)
        drafted = {}
        for row, run in runs.items():  # the proposals' seconds are drafting (the first row's charge), each merge the
            drafted[row] = draft_tree(run.req, run.committed, run.remaining, run.req.budget, clock, drafts[row])
            clock.charge("overhead")  # engine's (the next row's charge would have counted it as drafting)
        flats = {row: flatten(tree) for row, (tree, _) in drafted.items()}
        committed = {row: self.cache.length_of(row) for row in flats}  # the tree's slots follow them
        held, self.root_logits = self.root_logits, None  # the first step: each root cached, its logits held
        logits = self.forward_trees(flats, committed, held is not None, clock)
        if held is not None:
            logits = {row: torch.cat([held[row], logits[row]]) if row in logits else held[row] for row in flats}
        accepted = accept_rows([(self.acceptance[row], tree, flats[row], logits[row])
                                for row, (tree, _) in drafted.items()])
        out = {row: (tree, path, extra, capped)
               for (row, (tree, capped)), (path, extra) in zip(drafted.items(), accepted)}
        self.cache.keep_each({row: (committed[row], kept_rows(flats[row], path, committed[row], held is not None))
                              for row, (_, path, _, _) in out.items()})
        return out

    def forward_trees(self, flats: dict[int, FlatTree], committed: dict[int, int], root_cached: bool, clock: Clock
                      ) -> dict[int, torch.Tensor]:
        """One target forward over every row's flattened tree after its ``committed`` rows (``root_cached``: the
        nodes below each root, ``kv.tree_inputs``): logits by row; none when no row has a node to forward."""
        asks = {}
        for row, flat in flats.items():
            if len(flat) > root_cached:
                ids, pos, allowed = tree_inputs(flat, committed[row], root_cached)
                asks[row] = Forward(ids.to(self.device), pos.to(self.device), allowed)
        clock.charge("overhead")
        if not asks:
            return {}
        logits = self.cache.forward(self.target, asks)
        clock.charge("verifying")
        return logits

    def propose(self, runs: dict[int, Progress]) -> dict[int, list[DraftProposals]]:
        """Every row's proposals, in its drafters' order; a row that wants none gets none."""
        wanting = {row: run for row, run in runs.items() if wants_drafts(run.req, run.committed, run.remaining)}
        out: dict[int, list[DraftProposals]] = {row: [] for row in runs}
        for i in range(len(self.acceptance[0].req.drafters)):  # every row has copies of the same drafters
            coroutines = {}
            for row, run in wanting.items():
                d = run.req.drafters[i]
                if i in self.draft_caches:
                    coroutines[row] = d.drafting(run.committed)
                else:
                    out[row].append(checked(i, d, d.propose(run.committed), self.vocab))
            if coroutines:
                model = wanting[next(iter(coroutines))].req.drafters[i].model
                done = together(coroutines, lambda asks, i=i, model=model: self.draft_caches[i].forward(model, asks))
                for row, props in done.items():
                    out[row].append(checked(i, wanting[row].req.drafters[i], props, self.vocab))
        return out

    def drop(self, rows: Sequence[int]) -> None:
        """These rows finished: they leave the batch (and every cache)."""
        self.cache.drop(rows)
        for shared in self.draft_caches.values():
            shared.drop(rows)


def together(coroutines: dict[int, Drafting], forward: Callable[[dict[int, Forward]], dict[int, torch.Tensor]]
             ) -> dict[int, DraftProposals]:
    """Run several rows' drafting coroutines to their proposals, each round's forwards in one ``forward`` call
    (a row whose drafting ends early drops out of the later rounds)."""
    done, asks = {}, {}
    for row, co in coroutines.items():
        try:
            asks[row] = next(co)
        except StopIteration as end:
            done[row] = end.value
    while asks:
        answers, asks = forward(asks), {}
        for row, logits in answers.items():
            try:
                asks[row] = coroutines[row].send(logits)
            except StopIteration as end:
                done[row] = end.value
    return done


def decode_batch(reqs: Sequence[Request], step: BatchEagerStep) -> BatchOutput:
    """The speculative loop over a batch: each step drafts and accepts per row and verifies all rows at once."""
    runs = [Progress(req, step.name) for req in reqs]
    timing = Stats(step=step.name, verifier=reqs[0].verifier)
    clock = Clock(timing, reqs[0].device)
    start, row_seconds, forwards = time.perf_counter(), [0.0] * len(runs), 0
    active = list(range(len(runs)))
    with torch.inference_mode():
        step.prefill([req.prompt for req in reqs], clock)
        clock.charge("prefill")
        while active:
            emitted = {r: runs[r].take(*result)
                       for r, result in step.advance({r: runs[r] for r in active}, clock).items()}
            forwards += 1
            for r, tokens in emitted.items():
                runs[r].stream(tokens)
            clock.charge("overhead")  # the commits' bookkeeping and the caller's on_tokens
            finished = [r for r in active if runs[r].done]
            if finished:
                clock.settle()
            for r in finished:
                row_seconds[r] = time.perf_counter() - start
                for name in SECTIONS:  # the row's seconds: the batch's while it was in it
                    setattr(runs[r].stats, name, getattr(timing, name))
            if finished:
                active = [r for r in active if r not in finished]
                if active:
                    step.drop(finished)
    outputs = [run.output() for run in runs]
    stats = Stats.combined([o.stats for o in outputs])
    for name in SECTIONS:
        setattr(stats, name, getattr(timing, name))
    stats.step = step.name
    return BatchOutput(outputs, stats, forwards, row_seconds)


def generate_batch(
    target: torch.nn.Module,
    prompts: Sequence[Sequence[int] | torch.Tensor],
    drafters: Sequence[Drafter] = (),
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | torch.Tensor | None = None,
    seed: int | Sequence[int] | None = None,
    budget: int | None = None,
    on_tokens: Callable[[int, list[int]], None] | None = None,
    verifier: str = "rrs",
    compile: bool | str = False,
    envelope: Envelope | None = None,
) -> BatchOutput:
    """``treespec.generate`` over several prompts at once (``generate`` calls this for a list of prompts).

    Each prompt (a list of token ids or a ``[1, L]`` tensor; lengths may differ) decodes as it would alone
    with seed ``row_seed(seed, r)`` (``seed[r]`` when ``seed`` is a list of one seed per prompt): greedy output
    equal to the target's, sampled output distributed as the target's, per row. Each row gets its own copy of
    each drafter (``Drafter.for_row``). ``on_tokens`` is called as ``on_tokens(row, tokens)``. The other
    arguments are ``generate``'s. With ``compile`` the batch runs the captured step
    (``treespec.core.captured.BatchCapturedStep``: one model drafter of a static shape) where its drafters
    allow, and a row equals its prompt alone with ``compile``; else the eager batched step (``stats.step`` says
    why), and a row equals its prompt alone with ``compile=False``: alone, such drafters run the compiled step
    drafted on the host, which has no batched form and draws its random numbers otherwise (the same law, other
    samples).
    """
    if isinstance(prompts, (str, bytes, torch.Tensor)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("a batch is a non-empty list of prompts, each a list of token ids (or a [1, L] tensor); "
                         f"got {type(prompts).__name__ if prompts is not None else None}"
                         f"{' of length 0' if isinstance(prompts, Sequence) and not prompts else ''}")
    if on_tokens is not None:
        checks.check_callback(on_tokens, "on_tokens of a batch", "each row's index and its tokens", 2)
    seeds, call_seed = row_seeds(seed, len(prompts))
    drafters = checks.check_drafters(drafters, Drafter)
    reqs: list[Request] = []
    for r, prompt in enumerate(prompts):  # the settings checked once, with the first prompt; each row's prompt
        stream = None if on_tokens is None else functools.partial(on_tokens, r)
        row = {"drafters": [d.for_row() for d in drafters], "seed": seeds[r], "on_tokens": stream}
        try:
            reqs.append(reqs[0].for_prompt(prompt, **row) if reqs else
                        Request.checked(target, prompt, row["drafters"], max_new_tokens, temperature, top_k, top_p,
                                        eos_token_id, seeds[r], budget, stream, verifier, compile, envelope))
        except ValueError as e:
            raise ValueError(f"prompt {r} of the batch: {e}") from None
    out = decode_batch(reqs, batch_step_for(reqs, [req.start() for req in reqs]))
    out.stats.seed = None if reqs[0].params.greedy else call_seed  # as one prompt's: seed=stats.seed repeats it
    return out


def batch_step_for(reqs: Sequence[Request], gens: Sequence[torch.Generator]) -> BatchEagerStep:
    """The batch's step: eager; or, compiled, the captured step where its drafters allow (else the eager step,
    named with why: the host-drafted compiled step verifies one prompt at a time)."""
    if reqs[0].compile is False:
        return BatchEagerStep(reqs, gens)
    from .captured import BatchCapturedStep, capturable  # torch.compile machinery only when asked for

    spec = capturable(reqs[0])
    if isinstance(spec, str):
        step = BatchEagerStep(reqs, gens)
        step.name = f"eager, batched: compile=... captures one model drafter's static tree, not this one ({spec})"
        return step
    return BatchCapturedStep(reqs, gens, spec)
