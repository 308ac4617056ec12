"""The captured step: a static draft tree drafted, verified and committed on the device in compiled calls only.

For one model drafter with a fixed tree shape (``Drafter.capture``: top-k or sampling without
replacement), everything a step does is a function of the shape, fixed once
(``treespec.core.buffers``), and of device tensors. A step is a fixed sequence of compiled calls:

1. **start**: commit the draft rows of the last step's accepted path (rollback is an index),
   forward the root, with the *pending* token before it (the last accepted token of the previous
   step when it was a leaf the draft never forwarded), and choose the root's children.
2. **level**, once per further depth: one fixed-width draft forward over the previous depth's
   children that have children, on its block of the draft's ``StaticTreeCache``, then each of
   them chooses its children on the device (``topk`` of the draft logits, or Gumbel-top-k of ``q``:
   its key order is the order of sequential draws without replacement; a draw ``q``'s support
   cannot give is marked missing and drops its subtree). One compiled function serves every depth:
   depths of equal widths replay one graph. With the drafter's confidence stop (CPU only, where
   reading a number costs no device sync) each depth also gives each child's path probability,
   and when the best one that would be forwarded is below the threshold the host drafts no deeper:
   the missing depths are no proposals (``ModelDrafter``'s rule, at the same point).
3. **verify**: the target's forward over the whole tree, the acceptance on the device
   (``treespec.core.compiled``: the greedy argmax path, the token-level rule walked proposal by
   proposal, or traversal verification's leaf tests; a without-replacement proposal's ``q`` has its
   older siblings removed), the commit
   of the target's cache, and the packed result the next **start** takes as input.

No compiled output is read after another compiled call unless cloned first on CUDA (CUDA graphs
may reuse a graph's output memory at its next replay). Random numbers are drawn up front by one
seeded eager call per step. The step's only device->host copy is the packed result (path rows,
its length, the extra token, the tree's tokens and which nodes exist), from which the host
rebuilds the token tree for the statistics. The stock HF forward is driven with a 4D mask,
position ids and the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import verifiers
from .buffers import ShapeBuffers, shape_buffers
from .checks import has_dynamic_int8
from .compiled import capacity_for, greedy_path, path_rows, sampled_path, traversal_path
from .compiling import allow_recompiles, compile_graph, compile_options
from .constructions import Construction
from .drafting import Capture, DraftProposals
from .kv import StaticTreeCache
from .prefill import ChunkedPrefill, prefill_for
from .request import Request
from .sampling import SamplingParams
from .step import Clock
from .tree import TokenTree

MODES = ("topk", "sample_without_replacement")


def capture_plan(req: Request) -> Capture | str:
    """The drafter's :class:`Capture` when ``req`` can run the captured step, else why it cannot."""
    if len(req.drafters) != 1:
        return f"{len(req.drafters)} drafters merge into a trie on the host (captured: one model drafter)"
    spec = req.drafters[0].capture()
    if isinstance(spec, str):
        return spec
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
    duplicates, no budget cut; point masses (top-k), or draws without replacement (one per node on a chain)."""
    chain = bool(np.bincount(spec.parent[1:], minlength=spec.size).max() <= 1)
    draws = "point_mass" if spec.mode == "topk" else "sampled" if chain else "without_replacement"
    return Construction(draws, 1, chain, merged=False, truncated=False)


def _select(scores: torch.Tensor, width: int) -> torch.Tensor:
    """The ``width`` best columns of each row of ``scores``, best first; -1 where the score is -inf."""
    top = torch.topk(scores, min(width, scores.shape[-1]), dim=-1)
    return torch.where(torch.isfinite(top.values), top.indices, -1)


@dataclass(frozen=True)
class _Depth:
    """One depth of the shape on the device (``buffers.Level``): its children are choice ``rank`` of row
    ``parent_row`` of the previous forward (``width`` choices per row); ``forward`` (rows among the ``n``
    children) are the ones with children, in draft slots ``slots`` at depths ``slot_depth``."""

    parent_row: torch.Tensor
    rank: torch.Tensor
    width: int
    forward: torch.Tensor
    slot_depth: torch.Tensor
    slots: slice
    n: int


class _Buffers:
    """:class:`ShapeBuffers` on the device (index tensors moved once), and each depth's arguments."""

    def __init__(self, shape: ShapeBuffers, device: torch.device) -> None:
        def t(a: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(a, device=device)

        self.shape, self.size = shape, shape.size
        self.depth, self.anc, self.flat_parent = t(shape.depth), t(shape.ancestors), t(shape.flat_parent)
        self.parent = t(shape.parent)
        self.slot_node, self.slot_anc, self.slot_depth = t(shape.slot_node), t(shape.slot_ancestors), t(shape.slot_depth)
        self.next_sibling, self.earlier = t(shape.next_sibling), t(shape.earlier_siblings)
        self.post = t(shape.post_order)
        # per depth: how its children are chosen (parent_row, rank, width), which of them the draft forwards
        # (rows among the children; forwarded by the next depth's call), their slots' depth and slot range
        self.levels = [_Depth(t(lv.parent_row), t(lv.rank), lv.width, t(lv.forward - lv.children.start),
                              t(shape.slot_depth[lv.slots]), lv.slots, lv.children.stop - lv.children.start)
                       for lv in shape.levels]


class _CapturedRunner:
    """The compiled calls of a captured step and the caches they share.

    A step is ``start`` (commit the last step's draft rows, forward the root, choose its children), one
    ``level`` call per further depth (forward the previous depth's children that have children, choose
    theirs), and ``verify``. ``level`` is one
    compiled function for all depths: depths of the same widths run the same graph, so a chain's
    levels compile once (an unrolled tree compiled as one graph took minutes of inductor time per
    depth for the 0.5B draft on a CPU). What a step hands the next is the verify call's packed result,
    ``[path rows N, m, extra, tokens N, exists N, drafted depths, length]``, an ordinary input of the next
    ``start``.
    Every static tensor a compiled call reads it also mutates, or gets as an input computed by another
    call: inductor's weight freezing folds a static tensor that a graph only reads into a constant.
    """

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module, shape: ShapeBuffers, mode: str,
                 capacity: int, backend: str, mode_compile: str | None, track_confidence: bool = False) -> None:
        self.target, self.draft, self.mode = target, draft, mode
        # the confidence stop: the graphs compute each node's path probability (a fixed choice per runner);
        # the threshold is read on the host only, so another threshold needs no other graph
        self.track_confidence, self.min_confidence = track_confidence, 1.0
        self.buf = _Buffers(shape, next(target.parameters()).device)
        self.cache = StaticTreeCache(target, capacity)
        self.draft_cache = StaticTreeCache(draft, capacity)
        self.prefills = [ChunkedPrefill(target, self.cache, backend, mode_compile),
                         prefill_for(draft, self.draft_cache, backend, mode_compile)]
        self.params = self.draft_params = SamplingParams()
        self.verifier = "rrs"  # the request's rule for sampled steps (set like params; dynamo guards on both)
        # uniforms each depth's Gumbel-top-k takes: one row per parent (none for top-k), fixed by the shape
        self.noise_rows = [0 if mode == "topk" else int(lv.parent_row.max()) + 1 for lv in shape.levels]
        self.clone_between = mode_compile == "reduce-overhead"  # CUDA graphs may reuse an output at the next replay
        device = self.cache.length.device
        self.depth_counts = [torch.tensor(d, device=device) for d in range(len(shape.levels) + 1)]
        self.start_step = compile_graph(self._start, backend, mode_compile)
        self.level_step = compile_graph(self._level, backend, mode_compile)
        self.verify_step = compile_graph(self._verify, backend, mode_compile)

    def prefill(self, prompt: list[int]) -> torch.Tensor:
        """Cache ``prompt[:-1]`` in both models; returns the state the first draft call starts from."""
        for fill in self.prefills:
            fill(prompt)
        n = self.buf.size
        # no path to commit yet
        state = [*range(n), 0, prompt[-1], *[0] * (2 * n), len(self.buf.levels), len(prompt) - 1]
        return torch.tensor(state, device=self.cache.length.device)

    def draft_tree(self, state: torch.Tensor, noise: list[torch.Tensor]
                   ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """The whole tree, depth by depth: ``(tokens, exists, q of each proposal)`` per depth (root first), and
        how many depths were chosen. Nothing runs between the compiled calls but this loop (no eager
        operator), except after a confidence stop (CPU only): the depths not drafted are missing nodes."""
        keep = (lambda out: tuple(t.clone() for t in out)) if self.clone_between else (lambda out: out)
        levels = self.buf.levels
        first = levels[0]
        tokens, exists, q, conf, draft_length, root, root_exists, *where = keep(self.start_step(
            state, noise[0], first.parent_row, first.rank, first.width))
        out_tokens, out_exists, out_q = [root, tokens], [root_exists, exists], [q]
        for d in range(1, len(levels)):
            above, here = levels[d - 1], levels[d]
            if self.track_confidence and float(conf[above.forward].max()) < self.min_confidence:
                for rest in levels[d:]:  # the confidence stop: deeper depths are not drafted
                    out_tokens.append(root.new_zeros(rest.n))
                    out_exists.append(root.new_zeros(rest.n, dtype=torch.bool))
                    out_q.append(q.new_zeros(rest.n if q.numel() else 0, *q.shape[1:]))
                return out_tokens, out_exists, out_q, self.depth_counts[d]
            positions, block, write_start = where[3 * (d - 1) : 3 * d]
            tokens, exists, q, conf = keep(self.level_step(
                tokens, exists, conf, noise[d], above.forward, positions, block, draft_length, write_start,
                here.parent_row, here.rank, here.width))
            out_tokens.append(tokens)
            out_exists.append(exists)
            out_q.append(q)
        return out_tokens, out_exists, out_q, self.depth_counts[len(levels)]

    def _start(self, state: torch.Tensor, noise: torch.Tensor, parent_row: torch.Tensor, rank: torch.Tensor,
               width: int) -> tuple[torch.Tensor, ...]:
        """Commit the last step's draft rows, forward ``[pending, root]`` and choose the depth-1 children:
        ``(their tokens, exists, q, confidence, draft length, root, the root's existence, then per depth:
        positions, mask block, write start of its children with children)``."""
        buf, cache = self.buf, self.draft_cache
        n = buf.size
        rows, m, root, last_tokens, length = state[:n], state[n], state[n + 1 : n + 2], state[n + 2 : 2 * n + 2], state[-1]
        pending = self._commit_draft(rows, m, last_tokens, length, state[-2])
        draft_length = cache.length + 0
        pending_used = draft_length < length
        # the pending slot is attended to only when it holds a token
        slot_anc = buf.slot_anc & ((torch.arange(buf.slot_anc.shape[1], device=length.device) != 0) | pending_used)
        logits = cache.forward(self.draft, torch.cat([pending, root]), (length + buf.slot_depth[:2]).clamp_min(0),
                               slot_anc[:2], draft_length, logits_to_keep=1)
        where = []
        for lv in buf.levels:
            where += [length + lv.slot_depth, slot_anc[lv.slots], draft_length + lv.slots.start]
        one = torch.ones(1, dtype=torch.bool, device=root.device)
        chosen = self._choose(logits, noise, one, one.float(), parent_row, rank, width)
        return (*chosen, draft_length, root + 0, one, *where)

    def _level(self, tokens: torch.Tensor, exists: torch.Tensor, conf: torch.Tensor, noise: torch.Tensor,
               forward: torch.Tensor, positions: torch.Tensor, block: torch.Tensor, draft_length: torch.Tensor,
               write_start: torch.Tensor, parent_row: torch.Tensor, rank: torch.Tensor,
               width: int) -> tuple[torch.Tensor, ...]:
        """One depth: forward the previous depth's children that have children (``tokens[forward]``), then
        choose their children: ``(tokens, exists, q of each proposal, confidence)``."""
        logits = self.draft_cache.forward(self.draft, tokens[forward], positions, block, draft_length, write_start)
        return self._choose(logits, noise, exists[forward], conf[forward] if self.track_confidence else conf,
                            parent_row, rank, width)

    def _choose(self, scores: torch.Tensor, noise: torch.Tensor, parents_exist: torch.Tensor,
                parents_conf: torch.Tensor, parent_row: torch.Tensor, rank: torch.Tensor,
                width: int) -> tuple[torch.Tensor, ...]:
        """Each parent's children from its draft ``scores`` (logits): ``(tokens, exists, q of each proposal,
        confidence)``; the confidence (the path's cumulative draft probability, what the confidence stop
        reads) is computed only when the stop is on."""
        p = None
        if self.mode == "topk":
            choice, q = _select(scores, width), scores.new_zeros(0)
        else:
            p = self.draft_params.probs(scores)
            choice = _select(p.log() - (-noise.log()).log(), width)  # Gumbel-top-k: draws without replacement
            q = p[parent_row]
        kids = choice[parent_row, rank]
        exists = (kids >= 0) & parents_exist[parent_row]
        tokens = kids.clamp_min(0)
        if not self.track_confidence:
            return tokens, exists, q, parents_conf.new_zeros(0)
        p = self.draft_params.probs(scores) if p is None else p
        conf = torch.where(exists, parents_conf[parent_row] * p[parent_row, tokens], 0.0)
        return tokens, exists, q, conf

    def _commit_draft(self, rows: torch.Tensor, m: torch.Tensor, tokens: torch.Tensor,
                      length: torch.Tensor, drafted: torch.Tensor) -> torch.Tensor:
        """Keep the last step's pending row (if it was used) and the rows of the accepted nodes the draft
        forwarded (nodes above the ``drafted`` depths: a confidence stop leaves the deepest chosen ones
        unforwarded); returns the new pending token (the deepest accepted node: a leaf the draft never saw
        when the draft cache is still one row short)."""
        buf, cache = self.buf, self.draft_cache
        nodes = torch.arange(buf.size, device=rows.device)
        on_path = ((rows[:, None] == nodes) & (nodes[:, None] < m)).any(0)
        slot_node = buf.slot_node
        keep = torch.where(slot_node < 0, cache.length < length - m,
                           on_path[slot_node.clamp_min(0)] & (buf.slot_depth < drafted))
        kept, kept_n = path_rows(keep)
        cache.commit(cache.length + kept, kept_n)
        return tokens.index_select(0, rows.index_select(0, (m - 1).clamp_min(0).view(1)))

    def _without_older_siblings(self, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Each proposal's ``q`` (rows for nodes 1..N-1) with its older siblings' tokens removed, renormalised
        (the distribution a draw without replacement came from)."""
        older = self.buf.earlier[1:]
        drop = torch.zeros_like(q, dtype=torch.bool).scatter_(1, tokens[older.clamp_min(0)], older >= 0)
        q = q.masked_fill(drop, 0.0)
        return q / q.sum(-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)

    def _verify(self, tokens: list[torch.Tensor], exists: list[torch.Tensor], proposal_q: list[torch.Tensor],
                drafted: torch.Tensor, uniforms: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
        """Target forward, acceptance, commit; returns the packed state (see the class docstring; ``drafted``:
        the depths whose children were chosen, passed on to the next ``start``)."""
        buf, length = self.buf, self.cache.length
        tokens, exists = torch.cat(tokens), torch.cat(exists)
        if self.mode != "topk" and not self.params.greedy:
            proposal_q = self._without_older_siblings(torch.cat(proposal_q), tokens)
        logits = self.cache.forward(self.target, tokens, length + buf.depth, buf.anc)
        if self.params.greedy:
            on_path, extra = greedy_path(logits, tokens, buf.flat_parent, buf.anc, exists)
        else:
            on_path, extra = self._walk(self.params.probs(logits), tokens, exists, proposal_q, uniforms, exponentials)
        rows, m = path_rows(on_path)
        self.cache.commit(length + rows, m)
        return torch.cat([rows, m[None], extra[None], tokens, exists.long(), drafted[None], self.cache.length[None]])

    def _walk(self, probs: torch.Tensor, tokens: torch.Tensor, exists: torch.Tensor, proposal_q: torch.Tensor,
              uniforms: torch.Tensor, exponentials: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's rule over the tree: the token-level rule down it (``compiled.sampled_path``) or
        traversal verification (``compiled.traversal_path``; ``block`` on a chain); node ``v``'s proposal is
        entry ``v - 1``, and missing nodes are no proposals."""
        buf = self.buf
        n = tokens.shape[0]
        props = exists[1:]
        pparent = torch.where(props, buf.parent[1:], -1)
        pchild = torch.arange(1, n, device=tokens.device)
        q = proposal_q if self.mode != "topk" else torch.nn.functional.one_hot(tokens[1:], probs.shape[-1]).float()
        if self.verifier != "rrs":  # one uniform per leaf test of a non-root node
            return traversal_path(probs, q, tokens[1:], pparent, pchild, buf.anc, buf.post, uniforms, exponentials)
        nxt = buf.next_sibling[1:]
        plast = props & ~((nxt >= 0) & exists[nxt.clamp_min(0)])
        has_props = torch.zeros(n, dtype=torch.long, device=tokens.device).index_add_(0, buf.parent[1:],
                                                                                        props.long()) > 0
        return sampled_path(probs, q, tokens[1:], pparent, pchild, plast, has_props, uniforms, exponentials)


_RUNNERS: dict[tuple, _CapturedRunner] = {}
_MAX_RUNNERS = 2  # each holds two full KV caches


def _runner_for(req: Request, spec: Capture, capacity: int, backend: str, mode: str | None) -> _CapturedRunner:
    """The (cached) runner: reusing it reuses its compiled graphs and caches (one compile for many prompts)."""
    track = spec.min_confidence is not None
    key = (id(req.target), id(spec.model), spec.parent.tobytes(), spec.rank.tobytes(), spec.mode, capacity, backend,
           mode, track)
    runner = _RUNNERS.get(key)
    if runner is None or runner.target is not req.target or runner.draft is not spec.model:
        while len(_RUNNERS) >= _MAX_RUNNERS:
            _RUNNERS.pop(next(iter(_RUNNERS)))
        allow_recompiles()
        runner = _RUNNERS[key] = _CapturedRunner(req.target, spec.model, shape_buffers(spec.parent, spec.rank),
                                                 spec.mode, capacity, backend, mode, track)
    return runner


class CapturedStep:
    """The engine's step (``treespec.core.step.Step``) with a static draft tree drafted on the device.

    Cache capacity is bucketed (``compiled.CAPACITY_BUCKET``) from prompt + ``max_new_tokens`` + the
    tree, so prompts of similar length reuse the compiled calls. The tree is never capped by the end
    of the generation (its shape is fixed): tokens past ``max_new_tokens`` are dropped by the loop,
    which keeps the output exact (the emitted tokens are a prefix of an exact continuation).
    Seconds: ``drafting`` the start and level calls, ``verifying`` the verify call up to the one
    device->host copy.
    """

    name = "captured"

    def __init__(self, req: Request, gen: torch.Generator, spec: Capture) -> None:
        if not req.params.greedy:  # refuse a verifier not exact for the shape before any work, as the eager step does
            verifiers.check_exact(req.verifier, construction(spec))
        self.req, self.gen, self.spec = req, gen, spec
        self.width = spec.size
        self.backend, self.mode = compile_options(req.compile, req.device)
        capacity = capacity_for(len(req.prompt), req.max_new_tokens + spec.size + 2)
        self.runner = _runner_for(req, spec, capacity, self.backend, self.mode)
        self.runner.params, self.runner.draft_params = req.params, req.params.for_draft()
        self.runner.verifier = req.verifier
        if spec.min_confidence is not None:
            self.runner.min_confidence = spec.min_confidence
        self.vocab = req.vocab
        self.empty = torch.zeros(0, device=req.device)

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        self.state = self.runner.prefill(prompt)

    def _noise(self) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """A step's random numbers from one seeded draw: Gumbel uniforms per depth, the acceptance uniforms (one
        per non-root node: its proposal's test under ``rrs``, its leaf test under traversal) and the exponentials
        of the correction's race (empty where unused)."""
        runner, v, n, device = self.runner, self.vocab, self.spec.size, self.req.device
        rows = runner.noise_rows
        accept = 0 if self.req.params.greedy else n - 1 + v
        if not sum(rows) and not accept:
            return [self.empty] * len(rows), self.empty, self.empty
        u = torch.rand(sum(rows) * v + accept, generator=self.gen, device=device).clamp_(torch.finfo(torch.float32).tiny)
        gumbel = list(u[: sum(rows) * v].split([r * v for r in rows]))
        rest = u[sum(rows) * v :]
        return [g.view(-1, v) for g in gumbel], rest[: n - 1], -rest[n - 1 :].log()

    def advance(self, committed: list[int], remaining: int, clock: Clock) -> tuple[TokenTree, list[int], int, bool]:
        runner, n = self.runner, self.spec.size
        gumbel, uniforms, exponentials = self._noise()
        clock.charge("overhead")
        drafted = runner.draft_tree(self.state, gumbel)
        clock.charge("drafting")
        packed = runner.verify_step(*drafted, uniforms, exponentials)
        self.state = packed.clone() if runner.clone_between else packed
        out = packed.tolist()  # the step's one device->host copy
        clock.charge("verifying")
        m, extra, tokens, exists = out[n], out[n + 1], out[n + 2 : 2 * n + 2], out[2 * n + 2 : 3 * n + 2]
        tree, node_of = self._tree(committed[-1], tokens, exists)
        return tree, [node_of[i] for i in out[:m]], extra, False

    def _tree(self, root: int, tokens: list[int], exists: list[int]) -> tuple[TokenTree, dict[int, int]]:
        """The drafted tree as a host ``TokenTree`` (for statistics); ``node_of``: shape node -> tree node."""
        parent = self.spec.parent
        kept = [i for i in range(1, len(tokens)) if exists[i]]
        index = {v: j for j, v in enumerate(kept)}
        tree = TokenTree.rooted_at(root)
        tree.merge([DraftProposals([tokens[v] for v in kept], [index.get(int(parent[v]), -1) for v in kept])])
        return tree, {0: 0, **{v: j + 1 for j, v in enumerate(kept)}}
