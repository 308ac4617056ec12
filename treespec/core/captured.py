"""The captured step: a static draft tree drafted, verified and committed on the device in compiled calls only.

For one model drafter with a fixed tree shape (``Drafter.capture``: top-k or sampling without
replacement), everything a step does is a function of the shape, laid out once in an envelope
(``treespec.core.buffers``), and of device tensors. The shape enters the compiled calls as *data*
(which nodes each level forwards, their slots and masks, each node's parent row and rank, the ancestor
matrix), so the graphs depend only on the envelope: every tree inside one envelope replays them. A
step is a fixed sequence of compiled calls:

1. **level**, once per depth of the tree: one draft forward over the level's rows (level 0: the
   *pending* token, the last accepted token of the previous step when the draft never forwarded it, and
   the root; level ``d``: the depth-``d`` nodes with children) on its block of the draft's
   ``StaticTreeCache``, then every node of the next depth takes its token from its parent row's choices
   (``topk`` of the draft logits, or Gumbel-top-k of ``q``: its key order is the order of sequential draws
   without replacement; a draw ``q``'s support cannot give is marked missing and drops its subtree). One
   compiled function serves every level: levels of equal rows replay one graph (a padded envelope gives
   every level the same rows). With the drafter's confidence stop (CPU only, where reading a number
   costs no device sync) each level also gives each node's path probability, and when the best one the
   next level would forward is below the threshold the host drafts no deeper: the missing depths are
   no proposals (``ModelDrafter``'s rule, at the same point).
2. **verify**: the target's forward over the whole tree, the acceptance (``treespec.core.rule``: the
   greedy path, the token-level rule walked proposal by proposal, or traversal verification's leaf tests;
   a without-replacement proposal's ``q`` has its older siblings removed), the commit of the target's
   cache and of the draft rows on the accepted path, and the :class:`StepState` the next step starts from.

Beside the model drafter, an n-gram drafter's chain (width 1) hangs under the root as given tokens
(``buffers.with_chain``): asked on the host before each step, its tokens enter the level call as data, level 0
forwards them in the draft beside the root, and the verify call tests each as a point-mass proposal.

On a CPU the envelope is the tree's own (width is not free there: padding would cost every step); on
CUDA the levels are padded to one row count (width is nearly free; one level graph), and a runner whose
envelope covers a new tree serves it. ``treespec.generate(envelope=...)`` pads to a given envelope
(a sweep passes the envelope of all its trees).

A batch of prompts of one tree shape runs the same calls over ``B`` rows (:class:`BatchCapturedStep`; the
single-prompt :class:`CapturedStep` is its batch of one; the compiled calls are ``treespec.core.captured_runner``'s):
the forwards take every row at once, the acceptance and the commits are each row's own.

No compiled output is read after another compiled call unless cloned first on CUDA (CUDA graphs
may reuse a graph's output memory at its next replay). Random numbers are drawn up front by one
seeded eager call per step. The step's only device->host copy is the packed :class:`Outcome`
(path rows, its length, the extra token, the tree's tokens and which nodes exist), from which the host
rebuilds the token tree for the statistics. The stock HF forward is driven with a 4D mask, position
ids and the cache.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np
import torch

from . import verifiers
from .buffers import Envelope, with_chain
from .captured_runner import CapturedRunner
from .checks import has_dynamic_int8
from .compiled import capacity_for
from .compiling import compile_options
from .constructions import Construction, of_static_shape
from .drafting import Capture
from .padded import Noise
from .request import Request
from .runners import RunnerCache, model_key
from .step import Clock, end_capped, tree_depth
from .stats import Progress
from .step_state import Outcome, StepState
from .tree import Proposal, TokenTree, layout

MODES = ("topk", "sample_without_replacement")


def capturable(req: Request) -> Capture | str:
    """The drafter's :class:`Capture` when ``req`` can run the captured step, else why it cannot: one model
    drafter, or one model drafter and one chain of point masses (an n-gram drafter of width 1), whose tokens
    hang under the root as given tokens (``buffers.with_chain``)."""
    specs = [d.capture() for d in req.drafters]
    on_device = [i for i, s in enumerate(specs) if not isinstance(s, str)]
    if len(specs) == 1:
        spec = specs[0]
        if isinstance(spec, str):
            return spec
    elif len(specs) == 2 and len(on_device) == 1:
        spec, other = specs[on_device[0]], 1 - on_device[0]
        length = req.drafters[other].given_chain()
        if isinstance(length, str):
            return f"2 drafters merge into a trie on the host (captured: a model drafter and a chain; {length})"
        parent, rank, given = with_chain(spec.parent, spec.rank, length)
        spec = replace(spec, parent=parent, rank=rank, given=given, given_by=other)
    else:
        return (f"{len(req.drafters)} drafters merge into a trie on the host (captured: one model drafter, with at "
                "most one chain of point masses beside it)")
    if spec.mode not in MODES:
        return f"draft mode {spec.mode!r} drafts on the host (captured: {', '.join(MODES)})"
    if req.budget is not None and spec.size > req.budget:
        return f"the drafter's shape has {spec.size} nodes, over the budget {req.budget} (the host cuts it)"
    if spec.min_confidence is not None and req.device.type != "cpu":
        return (f"the confidence stop reads the draft's confidence after every level, a device->host copy per "
                f"level on {req.device.type} (captured with min_confidence: CPU only)")
    if next(spec.model.parameters()).device != req.device:
        return "the draft model is on another device than the target"
    if has_dynamic_int8(spec.model):
        return ("the draft is int8 through torch.ao's dynamic quantisation, whose packed weights torch.compile "
                "cannot trace (load the draft in int4, bfloat16 or float32 to draft on the device)")
    return spec


def construction(spec: Capture) -> Construction:
    """The construction (``constructions.classify``) of the shape's drafted trees: one drafter, no merged
    duplicates, no budget cut; point masses (top-k), or draws without replacement (one per node on a chain).
    With a chain of given tokens: two drafters, whose proposals may repeat a token (point masses, or mixed)."""
    if spec.given is not None:
        return Construction("point_mass" if spec.mode == "topk" else "mixed", 2, False, True, False)
    return of_static_shape(spec.mode, bool(np.bincount(spec.parent[1:], minlength=spec.size).max() <= 1))


#: each holds two full KV caches
RUNNERS: RunnerCache[CapturedRunner] = RunnerCache(2)


def runner_for(req: Request, spec: Capture, envelope: Envelope, capacity: int, backend: str, mode: str | None,
               any_covering: bool, rows: int = 1) -> CapturedRunner:
    """The (cached) runner for ``rows`` rows: reusing it reuses its compiled graphs and caches. A cached runner of
    a larger capacity serves too (prompts of several lengths after the longest compile nothing), and with
    ``any_covering`` one of another envelope that covers ``envelope`` (padded trees)."""
    track = spec.min_confidence is not None
    base = (model_key(req.target), model_key(spec.model), spec.mode, backend, mode, track, rows)

    def fits(key: tuple, runner: CapturedRunner) -> bool:
        same_graphs = runner.envelope == envelope or (any_covering and runner.envelope.covers(envelope))
        return key[:-2] == base and runner.cache.capacity >= capacity and same_graphs

    return RUNNERS.get((*base, capacity, envelope), lambda: CapturedRunner(
        req.target, spec.model, spec.mode, envelope, capacity, backend, mode, track, rows), fits)


def envelope_for(req: Request, spec: Capture) -> tuple[Envelope, bool]:
    """The envelope a request's tree runs in, and whether any cached runner covering it may serve: the given
    one (``generate(envelope=...)``), else on CUDA the tree's own padded to one row count per level, else (a
    CPU, where padding costs every step) the tree's own."""
    own = Envelope.exact(spec.parent, spec.rank, spec.given)
    if req.envelope is not None:
        if not req.envelope.covers(own):
            raise ValueError(f"the drafter's tree ({own.describe()}) does not fit "
                             f"envelope=({req.envelope.describe()}); "
                             "give an envelope that covers every tree it should run (Envelope.padded)")
        return req.envelope, False
    if req.device.type == "cuda":
        return Envelope.padded([own]), True
    return own, False


class CapturedStep:
    """The engine's step (``treespec.core.step.Step``) with a static draft tree drafted on the device: a
    :class:`BatchCapturedStep` of one row.

    Cache capacity is bucketed (``compiled.capacity_for``) from prompt + ``max_new_tokens`` + the
    envelope, so prompts of similar length reuse the compiled calls. The tree is never capped by the end
    of the generation (its shape is fixed): tokens past ``max_new_tokens`` are dropped by the loop,
    which keeps the output exact (the emitted tokens are a prefix of an exact continuation). A step whose
    drafted nodes reach deeper than the host-drafted steps' cap is *cut* all the same (``step.end_capped``, the
    one rule of every step), so its statistics are theirs.
    Seconds: ``drafting`` the level calls, ``verifying`` the verify call up to the one device->host copy.
    """

    name = "captured"

    def __init__(self, req: Request, gen: torch.Generator, spec: Capture) -> None:
        self.batch = BatchCapturedStep([req], [gen], spec)

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        self.batch.prefill([prompt], clock)

    def advance(self, committed: list[int], remaining: int, clock: Clock) -> tuple[TokenTree, list[int], int, bool]:
        return self.batch.step({0: committed}, {0: remaining}, clock)[0]


class BatchCapturedStep:
    """The captured step over a batch of requests of one tree shape (``treespec.core.batch``'s step interface):
    every row's levels in one draft forward each, every row's tree in one target forward, each row's own random
    numbers and acceptance (``captured_runner``). A finished row stays in its slot and commits nothing (a
    runner's graphs are made for its number of rows: shrinking the batch would compile new ones)."""

    name = "captured, batched"

    def __init__(self, reqs: Sequence[Request], gens: Sequence[torch.Generator], spec: Capture) -> None:
        """``spec``: the rows' drafter's :class:`Capture` (:func:`capturable` of the first row: every row has a copy
        of the same drafter)."""
        req = reqs[0]
        if not req.params.greedy:  # refuse a verifier not exact for the shape before any work, as the eager step does
            verifiers.check_exact(req.verifier, construction(spec))
        self.reqs, self.gens, self.spec = list(reqs), list(gens), spec
        backend, mode = compile_options(req.compile, req.device)
        envelope, any_covering = envelope_for(req, spec)
        longest = max(len(r.prompt) for r in reqs)
        # the target writes a step's nodes past its length, the draft every level's rows past its own
        written = max(envelope.nodes, envelope.draft_slots)
        capacity = capacity_for(longest, max(r.max_new_tokens for r in reqs) + written + 2, reqs[0].device)
        self.runner = runner_for(req, spec, envelope, capacity, backend, mode, any_covering, len(reqs))
        self.runner.params, self.runner.draft_params = req.params, req.params.for_draft()
        self.runner.verifier = req.verifier
        self.buf, self.tree, self.levels, self.forwarded = self.runner.tree_data(spec.parent, spec.rank, spec.given)
        self.depth = layout(spec.parent)[0].tolist()  # each shape node's depth
        self.vocab = req.vocab
        self.empty = torch.zeros(len(reqs), 0, device=req.device)
        self.active = torch.ones(len(reqs), dtype=torch.bool, device=req.device)

    def prefill(self, prompts: Sequence[list[int]], clock: Clock) -> None:
        self.state = self.runner.prefill(prompts)

    def _noise(self) -> tuple[list[torch.Tensor], Noise | None]:
        """A step's random numbers, each row's from one seeded draw of its own generator: Gumbel uniforms per
        drafted level (its kept rows; none for top-k), and the acceptance's (``padded.Noise``: one uniform per
        non-root node, its proposal's test under ``rrs``, its leaf test under traversal; the correction's
        exponentials), None when greedy. Stacked by row: ``[B, ...]``."""
        runner, v, device = self.runner, self.vocab, self.reqs[0].device
        rows = [0 if runner.mode == "topk" else runner.envelope.kept_rows(d) for d in range(len(self.levels))]
        accept = 0 if self.reqs[0].params.greedy else runner.envelope.nodes - 1 + v
        if not sum(rows) and not accept:
            return [self.empty] * len(rows), None
        u = torch.empty(len(self.gens), sum(rows) * v + accept, device=device)
        for row, g in zip(u, self.gens):  # each row's draw in its own generator's order, in place (no copy)
            torch.rand(row.shape, generator=g, device=device, out=row)
        u.clamp_(torch.finfo(torch.float32).tiny)
        b = u.shape[0]
        # each part a tensor of its own (slices of the one draw keep its row stride, which follows the tree's
        # levels: a graph guards on strides, and compiled one per tree depth)
        gumbel = [g.reshape(b, -1, v).clone(memory_format=torch.contiguous_format)
                  for g in u[:, : sum(rows) * v].split([r * v for r in rows], dim=1)]
        if not accept:
            return gumbel, None
        rest = u[:, sum(rows) * v :]
        n = runner.envelope.nodes - 1
        return gumbel, Noise(rest[:, :n].clone(memory_format=torch.contiguous_format), -rest[:, n:].log())

    def step(self, committed: dict[int, list[int]], remaining: dict[int, int], clock: Clock
             ) -> dict[int, tuple[TokenTree, list[int], int, bool]]:
        """One step of every row; the outcomes of the rows in ``committed`` (row -> its tokens so far; ``remaining``:
        row -> the tokens it still wants), each with whether the end of the generation capped its tree
        (:meth:`_capped`)."""
        runner = self.runner
        gumbel, noise = self._noise()
        clock.charge("overhead")
        drafted, qs, levels = runner.draft_tree(self.state, self.tree, self.levels, self.forwarded, gumbel,
                                                self.spec.min_confidence, self.active, self._given(committed))
        clock.charge("drafting")
        state, packed = runner.verify_step(drafted, qs, levels, noise, self.state, self.tree, self.active)
        self.state = StepState(*(t.clone() for t in state)) if runner.clone_between else state
        outcomes = packed.tolist()  # the step's one device->host copy
        clock.charge("verifying")
        out = {}
        for row, tokens in committed.items():
            o = Outcome.unpack(outcomes[row], runner.envelope.nodes)
            out[row] = self._outcome(row, tokens, remaining[row], o)
        return out

    def _outcome(self, row: int, committed: list[int], remaining: int, o: Outcome
                 ) -> tuple[TokenTree, list[int], int, bool]:
        """A row's step as the host-drafted steps report it: the shape is drafted whole, so near the end of the
        generation its nodes past the depth a host-drafted tree is capped at (``step.tree_depth``; the drafters
        propose the same nodes on the host, where the cap drops them) are left out of the tree, an accepted path is
        cut there and its next token is the step's extra one (the tokens emitted are the same, and the statistics:
        accepted lengths, the drafters' counts, tree sizes); and whether the end capped the step (``end_capped``)."""
        max_depth = tree_depth(self.reqs[row], committed, remaining)
        tree, node_of = self._tree(committed[-1], o.tokens, o.exists, max_depth)
        too_deep = sum(1 for v in range(1, self.spec.size) if o.exists[v] and self.depth[v] > max_depth)
        path, extra = list(o.path), o.extra  # root first: path[d] sits at depth d
        keep = max(max_depth, 0) + 1
        if len(path) > keep:  # the token at the cap's depth + 1 is what the host-drafted step emits as its extra
            path, extra = path[:keep], int(o.tokens[path[keep]])
        return tree, [node_of[i] for i in path], extra, end_capped(self.reqs[row], max_depth, too_deep)

    def _given(self, committed: dict[int, list[int]]) -> torch.Tensor | None:
        """This step's tokens of the chain of given tokens (``[B, envelope.chain]``, -1 past each chain's end and
        for rows not stepping): each row's chain drafter asked on its committed tokens. None without a chain."""
        if self.spec.given is None:
            return None
        width = self.runner.envelope.chain  # the drafter proposes at most its chain's length, which is within it
        given = torch.full((len(self.reqs), width), -1, dtype=torch.long)
        for row, tokens in committed.items():
            chain = self.reqs[row].drafters[self.spec.given_by].propose(tokens).tokens[:width]
            given[row, : len(chain)] = torch.as_tensor(chain, dtype=torch.long)
        return given.to(self.reqs[0].device)

    def advance(self, runs: dict[int, Progress], clock: Clock) -> dict[int, tuple[TokenTree, list[int], int, bool]]:
        """``batch.BatchEagerStep.advance``'s interface: one step of the rows in ``runs`` (row -> its Progress)."""
        return self.step({row: run.committed for row, run in runs.items()},
                         {row: run.remaining for row, run in runs.items()}, clock)

    def drop(self, rows: Sequence[int]) -> None:
        """These rows finished: they commit nothing from now on."""
        self.active[list(rows)] = False

    def _tree(self, root: int, tokens: list[int], exists: list[int], max_depth: int
              ) -> tuple[TokenTree, dict[int, int]]:
        """The drafted tree to ``max_depth`` as a host ``TokenTree`` (for statistics; a chain's token equal to a
        drafted sibling's shares its trie node); ``node_of``: shape node -> tree node."""
        parent, given, by = self.spec.parent, self.spec.given, self.spec.given_by
        model = 0 if given is None else 1 - by  # the drafters' indices in the request
        tree, node_of = TokenTree.rooted_at(root), {0: 0}
        for v in range(1, self.spec.size):
            if exists[v] and self.depth[v] <= max_depth:
                drafter = by if given is not None and given[v] >= 0 else model
                node_of[v] = tree.add(node_of[int(parent[v])], Proposal(int(tokens[v]), -1, drafter))
        return tree, node_of
