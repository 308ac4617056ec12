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

On a CPU the envelope is the tree's own (width is not free there: padding would cost every step); on
CUDA the levels are padded to one row count (width is nearly free; one level graph), and a runner whose
envelope covers a new tree serves it. ``treespec.generate(envelope=...)`` pads to a given envelope
(a sweep passes the envelope of all its trees).

No compiled output is read after another compiled call unless cloned first on CUDA (CUDA graphs
may reuse a graph's output memory at its next replay). Random numbers are drawn up front by one
seeded eager call per step. The step's only device->host copy is the packed :class:`Outcome`
(path rows, its length, the extra token, the tree's tokens and which nodes exist), from which the host
rebuilds the token tree for the statistics. The stock HF forward is driven with a 4D mask, position
ids and the cache.
"""

from __future__ import annotations

import numpy as np
import torch

from . import verifiers
from .buffers import Envelope, TreeBuffers, tree_buffers
from .checks import has_dynamic_int8, vocab_size
from .compiled import capacity_for
from .compiling import compile_graph, compile_options
from .constructions import Construction
from .drafting import Capture, DraftProposals
from .kv import StaticTreeCache
from .padded import Noise
from .prefill import ChunkedPrefill, prefill_for
from .request import Request
from .rule import greedy_path, path_rows, sampled_path, traversal_path
from .runners import RunnerCache
from .sampling import SamplingParams
from .step import Clock
from .step_state import Drafted, LevelTensors, Outcome, StepState, TreeTensors
from .tree import TokenTree

MODES = ("topk", "sample_without_replacement")


def capturable(req: Request) -> Capture | str:
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


class _CapturedRunner:
    """The compiled calls of a captured step in one envelope and the caches they share.

    Every static tensor a compiled call reads it also mutates, or gets as an input: inductor's weight
    freezing folds a static tensor that a graph only reads into a constant. The tree's buffers are inputs
    too (never constants), which is what lets one graph serve many trees.
    """

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module, mode: str, envelope: Envelope,
                 capacity: int, backend: str, mode_compile: str | None, track_confidence: bool = False) -> None:
        self.target, self.draft, self.mode, self.envelope = target, draft, mode, envelope
        # the confidence stop: the graphs compute each node's path probability (a fixed choice per runner);
        # the threshold is read on the host only, so another threshold needs no other graph
        self.track_confidence = track_confidence
        self.cache = StaticTreeCache(target, capacity)
        self.draft_cache = StaticTreeCache(draft, capacity)
        self.prefills = [ChunkedPrefill(target, self.cache, backend, mode_compile),
                         prefill_for(draft, self.draft_cache, backend, mode_compile)]
        self.params = self.draft_params = SamplingParams()
        self.verifier = "rrs"  # the request's rule for sampled steps (set like params; dynamo guards on both)
        self.clone_between = mode_compile == "reduce-overhead"  # CUDA graphs may reuse an output at the next replay
        device = self.cache.length.device
        self.level_counts = [torch.tensor(d, device=device) for d in range(envelope.depth + 1)]
        vocab = vocab_size(target)
        # the levels a tree does not draft (shallower than the envelope, or cut by the confidence stop): no q
        self.no_q = [] if mode == "topk" else [torch.zeros(envelope.kept_rows(d), vocab, device=device)
                                               for d in range(envelope.depth)]
        self._trees: dict[tuple[bytes, bytes], tuple] = {}  # tree_data, per shape
        self.level_step = compile_graph(self._level, backend, mode_compile)
        self.verify_step = compile_graph(self._verify, backend, mode_compile)

    def tree_data(self, parent: np.ndarray, rank: np.ndarray) -> tuple[TreeBuffers, TreeTensors, list[LevelTensors],
                                                                       list[torch.Tensor]]:
        """A tree's buffers in this runner's envelope and their device tensors: the node arrays, each drafted
        level's, and the nodes each level forwards (what the confidence stop reads); made once per shape."""
        key = (parent.tobytes(), rank.tobytes())
        if key not in self._trees:
            buf = tree_buffers(parent, rank, self.envelope)
            device = self.cache.length.device
            levels = buf.levels[: buf.depth_of_shape]
            self._trees[key] = (buf, TreeTensors.of(buf, device), [LevelTensors.of(lv, d, device) for d, lv in
                                                                     enumerate(levels)],
                                [torch.as_tensor(lv.forwarded, device=device) for lv in levels])
        return self._trees[key]

    def prefill(self, prompt: list[int]) -> StepState:
        """Cache ``prompt[:-1]`` in both models; returns the state the first step starts from."""
        for fill in self.prefills:
            fill(prompt)
        device, n = self.cache.length.device, self.envelope.nodes
        first = torch.arange(n, device=device) == 0
        tokens = torch.where(first, prompt[-1], 0)
        length = torch.tensor(len(prompt) - 1, device=device)
        return StepState(tokens, first, first.float(), tokens[:1] * 0, length, length.clone())

    def draft_tree(self, state: StepState, tree: TreeTensors, levels: list[LevelTensors], forwarded: list[torch.Tensor],
              noise: list[torch.Tensor], min_confidence: float | None) -> tuple[Drafted, list[torch.Tensor], int]:
        """The tree, level by level: ``(the drafted tree, q of each level, levels drafted)``. Nothing runs between
        the compiled calls but this loop (no eager operator), except where a confidence stop (CPU only) ends it:
        the depths not drafted are missing nodes."""
        keep = (lambda out: tuple(t.clone() for t in out)) if self.clone_between else (lambda out: out)
        drafted, qs = Drafted(state.tokens, state.exists, state.conf), []
        for d, level in enumerate(levels):
            if d and min_confidence is not None and float(drafted.conf[forwarded[d]].max()) < min_confidence:
                break
            *out, q = keep(self.level_step(drafted, state, tree, level, noise[d], self.envelope.keep_from(d)))
            drafted = Drafted(*out)
            qs.append(q)
        n = len(qs)
        return drafted, (qs + self.no_q[n:] if self.mode != "topk" else []), n

    def _level(self, drafted: Drafted, state: StepState, tree: TreeTensors, level: LevelTensors, noise: torch.Tensor,
               keep_from: int) -> tuple[torch.Tensor, ...]:
        """One draft forward over the level's rows, then the next depth's tokens from their parent rows' choices:
        ``(tokens, exists, conf, q of the kept rows)``."""
        ext = torch.cat([drafted.tokens, state.pending, state.pending * 0])  # the pending and padding ids
        pending_used = state.draft_length < state.length
        block = level.block & ((torch.arange(level.block.shape[1], device=ext.device) != 0) | pending_used)
        rows = level.nodes.shape[0]
        logits = self.draft_cache.forward(self.draft, ext[level.nodes], (state.length + level.slot_depth).clamp_min(0),
                                          block, state.draft_length, state.draft_length + level.start,
                                          logits_to_keep=rows - keep_from if keep_from else 0)
        p = None
        if self.mode == "topk":
            choice, q = _select(logits, self.envelope.children), logits.new_zeros(0)
        else:
            p = q = self.draft_params.probs(logits)
            choice = _select(p.log() - (-noise.log()).log(), self.envelope.children)  # Gumbel-top-k: w/o replacement
        row = tree.row.clamp_max(choice.shape[0] - 1)  # nodes of other levels index in range (and are not used)
        cand = choice[row, tree.rank.clamp_max(choice.shape[1] - 1)]
        here = tree.chosen_at == level.index
        exists = torch.where(here, (cand >= 0) & drafted.exists[tree.flat_parent], drafted.exists)
        tokens = torch.where(here, cand.clamp_min(0), drafted.tokens)
        conf = drafted.conf
        if self.track_confidence:
            p = self.draft_params.probs(logits) if p is None else p
            conf = torch.where(here, torch.where(exists, conf[tree.flat_parent] * p[row, tokens], 0.0), conf)
        return tokens, exists, conf, q

    def _verify(self, drafted: Drafted, qs: list[torch.Tensor], levels_drafted: torch.Tensor, noise: Noise | None,
                state: StepState, tree: TreeTensors) -> tuple[StepState, torch.Tensor]:
        """Target forward, acceptance, both commits: ``(the next step's state, the packed Outcome)``."""
        tokens, exists, length = drafted.tokens, drafted.exists, self.cache.length
        logits = self.cache.forward(self.target, tokens, length + tree.depth, tree.ancestors)
        if self.params.greedy:
            on_path, extra = greedy_path(logits, tokens, tree.flat_parent, tree.ancestors, exists)
        else:
            on_path, extra = self._walk(self.params.probs(logits), drafted, qs, noise, tree)
        rows, m = path_rows(on_path)
        self.cache.commit(length + rows, m)
        pending, draft_length = self._commit_draft(on_path, rows, m, tokens, levels_drafted, state, tree)
        first = torch.arange(tokens.shape[0], device=tokens.device) == 0
        nxt = StepState(torch.where(first, extra, 0), first, first.float(), pending, self.cache.length + 0, draft_length)
        return nxt, torch.cat([rows, m[None], extra[None], tokens, exists.long()])

    def _commit_draft(self, on_path: torch.Tensor, rows: torch.Tensor, m: torch.Tensor, tokens: torch.Tensor,
                      levels_drafted: torch.Tensor, state: StepState, tree: TreeTensors) -> tuple[torch.Tensor, ...]:
        """Keep the pending row (if it was used) and the rows of the accepted nodes the draft forwarded (those of
        the levels drafted: a confidence stop leaves the deepest chosen ones unforwarded); returns the next
        pending token (the deepest accepted node: a leaf the draft never saw when its cache is one row short)
        and the draft's committed length."""
        cache = self.draft_cache
        pending_used = state.draft_length < state.length
        kept_node = torch.cat([on_path, pending_used.view(1), on_path.new_zeros(1)])  # node ids, pending, padding
        keep = kept_node[tree.slot_node] & (tree.slot_level < levels_drafted)
        kept, kept_n = path_rows(keep)
        cache.commit(cache.length + kept, kept_n)
        pending = tokens.index_select(0, rows.index_select(0, (m - 1).clamp_min(0).view(1)))
        return pending, cache.length + 0

    def _without_older_siblings(self, q: torch.Tensor, tokens: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
        """Each proposal's ``q`` with its older siblings' tokens removed, renormalised (the distribution a draw
        without replacement came from); ``earlier`` ``[P, K - 1]``, -1 padding."""
        # scatter-add, not scatter: a padding entry (-1, read as the root) may share its token with a real older
        # sibling, and a plain scatter's later write would then clear that sibling's mark
        drop = torch.zeros_like(q).scatter_add_(1, tokens[earlier.clamp_min(0)], (earlier >= 0).to(q.dtype)) > 0
        q = q.masked_fill(drop, 0.0)
        return q / q.sum(-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)

    def _walk(self, probs: torch.Tensor, drafted: Drafted, qs: list[torch.Tensor], noise: Noise,
              tree: TreeTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's rule over the tree (``rule.sampled_path``, or ``rule.traversal_path``: traversal, and
        block on a chain); node ``v``'s proposal is entry ``v - 1``, and missing nodes are no proposals."""
        tokens, exists = drafted.tokens, drafted.exists
        n = tokens.shape[0]
        props = exists[1:]
        pparent = torch.where(props, tree.flat_parent[1:], -1)
        pchild = torch.arange(1, n, device=tokens.device)
        if self.mode == "topk":
            q = torch.nn.functional.one_hot(tokens[1:], probs.shape[-1]).float()
        else:
            q = self._without_older_siblings(torch.cat(qs)[tree.q_row[1:]], tokens, tree.earlier_siblings[1:])
        if self.verifier != "rrs":  # one uniform per leaf test of a non-root node
            return traversal_path(probs, q, tokens[1:], pparent, pchild, tree.ancestors, tree.post_order,
                                  noise.uniforms, noise.exponentials)
        nxt = tree.next_sibling[1:]
        plast = props & ~((nxt >= 0) & exists[nxt.clamp_min(0)])
        has_props = torch.zeros(n, dtype=torch.long, device=tokens.device).index_add_(
            0, tree.flat_parent[1:], props.long()) > 0
        return sampled_path(probs, q, tokens[1:], pparent, pchild, plast, has_props, noise.uniforms, noise.exponentials)


#: each holds two full KV caches
RUNNERS: RunnerCache[_CapturedRunner] = RunnerCache(2)


def runner_for(req: Request, spec: Capture, envelope: Envelope, capacity: int, backend: str, mode: str | None,
               any_covering: bool) -> _CapturedRunner:
    """The (cached) runner: reusing it reuses its compiled graphs and caches. ``any_covering``: a cached runner
    of another envelope that covers ``envelope`` serves too (padded trees)."""
    track = spec.min_confidence is not None
    base = (id(req.target), id(spec.model), spec.mode, capacity, backend, mode, track)

    def fits(key: tuple, runner: _CapturedRunner) -> bool:
        return any_covering and key[:-1] == base and runner.envelope.covers(envelope)

    return RUNNERS.get((*base, envelope), lambda: _CapturedRunner(req.target, spec.model, spec.mode, envelope, capacity,
                                                                  backend, mode, track), fits)


def envelope_for(req: Request, spec: Capture) -> tuple[Envelope, bool]:
    """The envelope a request's tree runs in, and whether any cached runner covering it may serve: the given
    one (``generate(envelope=...)``), else on CUDA the tree's own padded to one row count per level, else (a
    CPU, where padding costs every step) the tree's own."""
    own = Envelope.exact(spec.parent, spec.rank)
    if req.envelope is not None:
        if not req.envelope.covers(own):
            raise ValueError(f"the drafter's tree ({own.describe()}) does not fit envelope=({req.envelope.describe()}); "
                             "give an envelope that covers every tree it should run (Envelope.padded)")
        return req.envelope, False
    if req.device.type == "cuda":
        return Envelope.padded([own]), True
    return own, False


class CapturedStep:
    """The engine's step (``treespec.core.step.Step``) with a static draft tree drafted on the device.

    Cache capacity is bucketed (``compiled.CAPACITY_BUCKET``) from prompt + ``max_new_tokens`` + the
    envelope, so prompts of similar length reuse the compiled calls. The tree is never capped by the end
    of the generation (its shape is fixed): tokens past ``max_new_tokens`` are dropped by the loop,
    which keeps the output exact (the emitted tokens are a prefix of an exact continuation).
    Seconds: ``drafting`` the level calls, ``verifying`` the verify call up to the one device->host copy.
    """

    name = "captured"

    def __init__(self, req: Request, gen: torch.Generator, spec: Capture) -> None:
        if not req.params.greedy:  # refuse a verifier not exact for the shape before any work, as the eager step does
            verifiers.check_exact(req.verifier, construction(spec))
        self.req, self.gen, self.spec = req, gen, spec
        self.width = spec.size
        backend, mode = compile_options(req.compile, req.device)
        envelope, any_covering = envelope_for(req, spec)
        capacity = capacity_for(len(req.prompt), req.max_new_tokens + envelope.nodes + 2)
        self.runner = runner_for(req, spec, envelope, capacity, backend, mode, any_covering)
        self.runner.params, self.runner.draft_params = req.params, req.params.for_draft()
        self.runner.verifier = req.verifier
        self.buf, self.tree, self.levels, self.forwarded = self.runner.tree_data(spec.parent, spec.rank)
        self.vocab = req.vocab
        self.empty = torch.zeros(0, device=req.device)

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        self.state = self.runner.prefill(prompt)

    def _noise(self) -> tuple[list[torch.Tensor], Noise | None]:
        """A step's random numbers from one seeded draw: Gumbel uniforms per drafted level (its kept rows; none
        for top-k), and the acceptance's (``padded.Noise``: one uniform per non-root node, its proposal's test
        under ``rrs``, its leaf test under traversal; the correction's exponentials), None when greedy."""
        runner, v, device = self.runner, self.vocab, self.req.device
        rows = [0 if runner.mode == "topk" else runner.envelope.kept_rows(d) for d in range(len(self.levels))]
        accept = 0 if self.req.params.greedy else runner.envelope.nodes - 1 + v
        if not sum(rows) and not accept:
            return [self.empty] * len(rows), None
        u = torch.rand(sum(rows) * v + accept, generator=self.gen, device=device).clamp_(torch.finfo(torch.float32).tiny)
        gumbel = [g.view(-1, v) for g in u[: sum(rows) * v].split([r * v for r in rows])]
        if not accept:
            return gumbel, None
        rest = u[sum(rows) * v :]
        n = runner.envelope.nodes - 1
        return gumbel, Noise(rest[:n], -rest[n:].log())

    def advance(self, committed: list[int], remaining: int, clock: Clock) -> tuple[TokenTree, list[int], int, bool]:
        runner = self.runner
        gumbel, noise = self._noise()
        clock.charge("overhead")
        drafted, qs, n_levels = runner.draft_tree(self.state, self.tree, self.levels, self.forwarded, gumbel,
                                             self.spec.min_confidence)
        clock.charge("drafting")
        state, packed = runner.verify_step(drafted, qs, runner.level_counts[n_levels], noise, self.state, self.tree)
        self.state = StepState(*(t.clone() for t in state)) if runner.clone_between else state
        out = Outcome.unpack(packed.tolist(), runner.envelope.nodes)  # the step's one device->host copy
        clock.charge("verifying")
        tree, node_of = self._tree(committed[-1], out.tokens, out.exists)
        return tree, [node_of[i] for i in out.path], out.extra, False

    def _tree(self, root: int, tokens: list[int], exists: list[int]) -> tuple[TokenTree, dict[int, int]]:
        """The drafted tree as a host ``TokenTree`` (for statistics); ``node_of``: shape node -> tree node."""
        parent = self.spec.parent
        kept = [i for i in range(1, self.spec.size) if exists[i]]
        index = {v: j for j, v in enumerate(kept)}
        tree = TokenTree.rooted_at(root)
        tree.merge([DraftProposals([tokens[v] for v in kept], [index.get(int(parent[v]), -1) for v in kept])])
        return tree, {0: 0, **{v: j + 1 for j, v in enumerate(kept)}}
