"""Several prompts at once: one target forward per step verifies every row's tree.

Each row is one request (its prompt, its own copies of the drafters, its own seed and random numbers,
its own acceptance: ``padded.HostAcceptance``, the eager step's), so a row's output is what
``treespec.generate`` gives for that prompt alone with the row's seed (:func:`row_seed`), whichever
prompts share its batch. What the rows share is the target's forward: their trees, each padded to the
widest (``padded.PaddedTree``: a padding node attends to itself only), go through the model as one
``[B, n]`` batch over one ``TreeCache`` whose batch row ``b`` holds row ``b``'s committed tokens in slots
``[0, lengths[b])``. A step's tokens are written at one offset for every row (the cache's length, the
longest row's), so a shorter row's slots between its own length and that offset are stale, and its mask
never allows them. A finished row (EOS or ``max_new_tokens``) leaves the batch: it costs nothing after.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from . import checks
from .drafting import Drafter
from .kv import TreeCache, forward_masked
from .padded import HostAcceptance, PaddedTree
from .request import Request
from .sampling import spread_seed
from .stats import GenerateOutput, Progress, Stats
from .step import Clock, draft_tree
from .tree import TokenTree, flatten

SECTIONS = ("prefill_seconds", "drafting_seconds", "verifying_seconds", "overhead_seconds")


@dataclass
class BatchOutput:
    """A batch's outputs: ``rows[r]`` is prompt ``r``'s (its ``stats`` seconds: the batch's, while it was in it)."""

    rows: list[GenerateOutput]
    stats: Stats  # the rows' counts pooled; seconds: the batch's sections, once
    forwards: int  # target forwards over trees (each verified every row still in the batch)
    row_seconds: list[float]  # per row: seconds from the start until it finished

    @property
    def tokens_per_second(self) -> float:
        """Every row's tokens over the batch's seconds."""
        return self.stats.tokens_per_second


def row_seed(seed: int, row: int) -> int:
    """The seed of a batch's row ``row``: the call's seed for row 0, a hash of both for the others (so a
    row's output is ``generate``'s for its prompt with this seed, and never depends on its batch mates)."""
    return seed if row == 0 else spread_seed("batch-row", seed, row)


class BatchEagerStep:
    """The eager step over a batch of rows (module docstring): drafting per row on the host, one target
    forward for every row, acceptance per row."""

    name = "eager, batched"

    def __init__(self, reqs: Sequence[Request], gens: Sequence[torch.Generator]) -> None:
        self.target, self.device = reqs[0].target, reqs[0].device
        self.rows = [HostAcceptance(req, gen) for req, gen in zip(reqs, gens)]  # the rows still in the batch
        self.cache = TreeCache()
        self.lengths: list[int] = []  # committed cache rows per batch row

    def prefill(self, prompts: Sequence[list[int]], clock: Clock) -> None:
        """Cache each prompt but its last token (rows padded to the longest; padding attends to itself)."""
        self.lengths = [len(p) - 1 for p in prompts]
        n = max(self.lengths)
        if n == 0:
            return
        ids = torch.zeros(len(prompts), n, dtype=torch.long)
        allowed = torch.eye(n, dtype=torch.bool).repeat(len(prompts), 1, 1)
        for b, (p, k) in enumerate(zip(prompts, self.lengths)):
            ids[b, :k] = torch.tensor(p[:-1])
            allowed[b, :k, :k] = torch.ones(k, k, dtype=torch.bool).tril()
        pos = torch.arange(n).expand(len(prompts), n)
        forward_masked(self.target, self.cache, ids.to(self.device), pos.to(self.device), allowed, logits_to_keep=1)

    def advance(self, runs: Sequence[Progress], clock: Clock) -> list[tuple[TokenTree, list[int], int, bool]]:
        """One step of every row in the batch (``runs[b]`` is batch row ``b``'s generation)."""
        drafted = [draft_tree(run.req, run.committed, run.remaining, run.req.budget, clock) for run in runs]
        flats = [flatten(tree) for tree, _ in drafted]
        n, past = max(len(f) for f in flats), self.cache.length
        padded = [PaddedTree.of(f, n, self.device) for f in flats]
        lengths = torch.tensor(self.lengths, device=self.device)
        allowed = torch.cat([(torch.arange(past, device=self.device) < lengths[:, None]).unsqueeze(1).expand(-1, n, -1),
                             torch.stack([t.anc for t in padded])], dim=-1)
        ids, pos = torch.stack([t.tokens for t in padded]), lengths[:, None] + torch.stack([t.depth for t in padded])
        clock.charge("overhead")
        logits = forward_masked(self.target, self.cache, ids, pos, allowed)
        clock.charge("verifying")
        out, kept = [], []
        for row, (tree, capped), flat, b_logits in zip(self.rows, drafted, flats, logits):
            path, extra = row.accept(tree, flat, b_logits[: len(flat)])
            kept.append(past + flat.index[path])
            out.append((tree, path, extra, capped))
        self.cache.keep_rows(self.lengths, [torch.as_tensor(k) for k in kept])
        self.lengths = [length + len(k) for length, k in zip(self.lengths, kept)]
        return out

    def drop(self, batch_rows: Sequence[int]) -> None:
        """These batch rows finished: they leave the batch (and the cache)."""
        stay = [b for b in range(len(self.rows)) if b not in set(batch_rows)]
        self.cache.select(stay)
        self.rows = [self.rows[b] for b in stay]
        self.lengths = [self.lengths[b] for b in stay]


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
            emitted = [runs[r].take(*result) for r, result in zip(active, step.advance([runs[r] for r in active], clock))]
            forwards += 1
            clock.charge("overhead")
            for r, tokens in zip(active, emitted):
                runs[r].stream(tokens)
            finished = [b for b, r in enumerate(active) if runs[r].done]
            for b in finished:
                row_seconds[active[b]] = time.perf_counter() - start
                for name in SECTIONS:  # the row's seconds: the batch's while it was in it
                    setattr(runs[active[b]].stats, name, getattr(timing, name))
            if finished:
                active = [r for b, r in enumerate(active) if b not in finished]
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
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    budget: int | None = None,
    on_tokens: Callable[[int, list[int]], None] | None = None,
    verifier: str = "rrs",
    compile: bool | str = False,
) -> BatchOutput:
    """``treespec.generate`` over several prompts at once (``generate`` calls this for a list of prompts).

    Each prompt (a list of token ids or a ``[1, L]`` tensor; lengths may differ) decodes as it would alone
    with seed ``row_seed(seed, r)``: greedy output equal to the target's, sampled output distributed as the
    target's, per row. Each row gets its own copy of each drafter (``Drafter.for_row``). ``on_tokens`` is
    called as ``on_tokens(row, tokens)``. The other arguments are ``generate``'s; ``compile`` must be False
    (the batch runs the eager step).
    """
    if isinstance(prompts, (str, bytes, torch.Tensor)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("a batch is a non-empty list of prompts, each a list of token ids (or a [1, L] tensor); "
                         f"got {type(prompts).__name__ if prompts is not None else None}"
                         f"{' of length 0' if isinstance(prompts, Sequence) and not prompts else ''}")
    if compile is not False:
        raise ValueError("compile=... runs one prompt at a time; a batch of prompts runs the eager step: pass "
                         "compile=False, or call generate once per prompt to compile")
    if on_tokens is not None and not callable(on_tokens):
        raise ValueError(f"on_tokens must be callable (it gets each row's index and tokens), got "
                         f"{type(on_tokens).__name__}")
    seed = checks.check_seed(seed)
    if seed is None:
        seed = int.from_bytes(os.urandom(7), "little")
    drafters = checks.check_drafters(drafters, Drafter)
    reqs = []
    for r, prompt in enumerate(prompts):
        stream = None if on_tokens is None else functools.partial(on_tokens, r)
        try:
            reqs.append(Request.checked(target, prompt, [d.for_row() for d in drafters], max_new_tokens, temperature,
                                        top_k, top_p, eos_token_id, row_seed(seed, r), budget, stream, verifier, False))
        except ValueError as e:
            raise ValueError(f"prompt {r} of the batch: {e}") from None
    return decode_batch(reqs, BatchEagerStep(reqs, [req.start() for req in reqs]))
