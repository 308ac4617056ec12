"""The static-shape step behind ``treespec.generate(..., compile=...)``: one compiled target call per step.

Every step has the same tensor shapes and is ONE compiled call (forward, acceptance and commit:
no compiled output ever feeds another compiled graph), so ``torch.compile`` (and CUDA graphs under
``mode="reduce-overhead"``) capture the target's verification forward once and replay it:

* ``StaticTreeCache``: a ``transformers`` ``Cache`` whose layers own zero-filled ``[1, H, C, D]``
  key/value buffers at fixed addresses, ``C`` bucketed from prompt + ``max_new_tokens`` + tree
  width (a multiple of 1024, so prompts and a sweep reuse its graphs). The committed length is one device
  tensor shared by all layers. Step ``t`` writes its tree into slots ``[L, L + W)``; the commit
  gathers the accepted rows into ``[L, L + m)`` with one index tensor for all layers.
* The tree is padded to a fixed width ``W`` (the budget): padding rows attend only to themselves
  and write their own scratch slot of the block. The 4D additive mask ``[1, 1, W, C]`` is built on
  the device from the committed length and the tree's ancestor matrix; positions = ``L + depth``.
* Acceptance runs on the device. Greedy: the deepest node whose whole path matches the target's
  argmax. Sampled: the fixed tree is walked proposal by proposal with ``verify_proposals`` (the
  engine's one rule, see ``docs/design.md``, "Exactness rule") on uniforms drawn up front, or, for
  ``verifier="traversal"`` / ``"block"``, by :func:`traversal_path` (``docs/verifiers.md``); the
  correction token is an exponential race ``argmax r / E`` with ``E ~ Exp(1)`` drawn up front.
  The accepted path, its length and the extra token come back in one small device->host copy,
  the only sync of a step.
* The prompt is cached through one more compiled graph, for every prompt length
  (``treespec.core.prefill``: exact pieces of a dynamic token count, fixed chunks under CUDA graphs).

Drafters, the trie merge and flattening stay on the host and eager: the loop is ``treespec.core.engine.decode``,
shared with the eager step; this module is only where the forward and the acceptance run.
The stock HF forward is driven with a 4D mask, position ids and the cache; no modelling file is forked.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .compiling import allow_recompiles, compile_graph, compile_options
from .drafting import POINT_MASS
from .kv import StaticTreeCache
from .prefill import ChunkedPrefill, padded_length
from .request import Request
from .buffers import post_order
from .rule import child_log_weight, log_weight_after_rejection, residual, verify_proposals
from .sampling import SamplingParams
from .step import Clock, HostDrafted
from .tree import FlatTree, TokenTree

#: cache rows are allocated in multiples of this: prompts up to ~1k tokens share one set of compiled graphs
#: (a compile costs tens of seconds to minutes on a CPU; attending over masked rows costs little next to the weights)
CAPACITY_BUCKET = 1024


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def capacity_for(prompt: int, after: int) -> int:
    """Cache rows for a prompt of ``prompt`` tokens and ``after`` more rows (new tokens, a tree), bucketed;
    a chunked prefill's padding included."""
    return round_up(max(prompt + after, padded_length(prompt - 1)), CAPACITY_BUCKET)


def next_pow2(n: int, least: int = 8) -> int:
    return max(least, 1 << (max(n, 1) - 1).bit_length())


# -- acceptance on the device: small pure functions on tensors -----------------------------------


def _at(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """``x[i]`` for a one-element device index, without turning ``i`` into a host int."""
    return x.index_select(0, i)[0]


def greedy_path(logits: torch.Tensor, tokens: torch.Tensor, parent: torch.Tensor, anc: torch.Tensor,
                valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance over a padded flat tree: ``(on_path [W] bool, extra token)``.

    Node ``i`` matches when its token is the target's argmax at its parent; the accepted node is the
    deepest one whose ancestors (itself included, the root excepted) all match. In a trie siblings
    differ, so at most one node per depth qualifies.
    """
    best = logits.argmax(-1)
    first = torch.arange(tokens.shape[0], device=tokens.device) == 0
    match = first | ((tokens == best[parent]) & valid)
    ok = valid & ~(anc & ~match[None, :]).any(-1)
    depth = anc.sum(-1)
    node = torch.argmax(torch.where(ok, depth, -1)).view(1)
    return _at(anc, node), _at(best, node)


def sampled_path(probs: torch.Tensor, q: torch.Tensor, ptok: torch.Tensor, pparent: torch.Tensor,
                 pchild: torch.Tensor, plast: torch.Tensor, has_props: torch.Tensor, uniforms: torch.Tensor,
                 exponentials: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-draft speculative sampling down a padded flat tree: ``(on_path [W] bool, extra token)``.

    Proposals come in a fixed list ``[P]`` sorted by their parent's flat index (DFS order), each
    parent's proposals in proposal order; padding has ``pparent == -1``. Walking the list once applies
    ``verify_proposals`` at the current node, one proposal at a time (the rule is sequential, so this
    is the same rule): accept -> move to the child; reject -> keep the residual; the last proposal of
    the node rejected (or a leaf reached) -> stop. The correction token is ``argmax r / E``, an exact
    draw from ``r`` (exponential race) with no host sync.
    """
    w = probs.shape[0]
    nodes = torch.arange(w, device=probs.device)
    cur = torch.zeros(1, dtype=torch.long, device=probs.device)
    r = probs[0]
    on_path = nodes == 0
    done = ~has_props[0]
    for p in range(ptok.shape[0]):
        here = ~done & (pparent[p] == cur)
        acc, residual = verify_proposals(r, ptok[p : p + 1], q[p : p + 1], uniforms[p : p + 1])
        take = here & (acc == 0)
        reject = here & ~take
        child = pchild[p : p + 1]
        r = torch.where(take, _at(probs, child), torch.where(reject, residual, r))
        cur = torch.where(take, child, cur)
        on_path = on_path | (take & (nodes == child))
        done = done | (reject & plast[p]) | (take & ~_at(has_props, child))
    return on_path, torch.argmax(r / exponentials)


def traversal_path(probs: torch.Tensor, q: torch.Tensor, ptok: torch.Tensor, pparent: torch.Tensor,
                   pchild: torch.Tensor, anc: torch.Tensor, post: torch.Tensor, uniforms: torch.Tensor,
                   exponentials: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Traversal verification (``verifiers.traversal``; ``block`` on a chain) over a padded flat tree:
    ``(on_path [W] bool, extra token)``.

    The proposals come as for :func:`sampled_path` (each parent's proposals contiguous, in proposal
    order, parents before their children; ``pparent == -1``: no proposal), with the ancestor matrix
    ``anc [W, W]`` and ``post [W]``, each node's rank in post-order (``buffers.post_order``).
    The walk's only random decisions are its leaf tests (Weng et al., NeurIPS 2025, Algorithm 1): a node's
    test is reached only once all of its children's subtrees were rejected, i.e. after every update of
    its proposals, so each node's weight and target at its test follow from the tree alone. One pass
    over the proposals computes them (per proposal: the child's entry weight ``min(1, w P(x)/q(x))``,
    then the parent's update ``P <- normalize(max(wP - q, 0))``, ``w <- R/(R + 1 - w)``, in float64 logs)
    and each node's extra token from its final ``P`` (exponential race, one ``E`` for every node: only
    the accepted node's is used). Node ``v >= 1`` passes its test with ``uniforms[v - 1] < w_v``, the
    root always; the accepted node is the first to pass in post-order. Weight-0 subtrees stay at
    ``-inf`` (no NaN). A merged duplicate (a later proposal of an already proposed child) only updates
    the parent: the child had weight ``< 1`` when it was rejected (a weight-1 node is always accepted),
    so ``P(x)`` was zeroed and the host walk's re-visit has weight 0.
    """
    w, device = probs.shape[0], probs.device
    nodes = torch.arange(w, device=device)
    j = torch.arange(ptok.shape[0], device=device)
    valid = pparent >= 0
    first = valid & ~((pchild[:, None] == pchild) & valid & (j < j[:, None])).any(-1)
    log_w = torch.zeros(w, dtype=torch.float64, device=device).masked_fill(nodes > 0, -math.inf)
    extra = torch.argmax(probs / exponentials, -1)  # nodes without proposals: their target's draw
    cur = torch.full((1,), -1, dtype=pparent.dtype, device=device)  # the parent whose proposals run
    r, lw = probs[0].double(), log_w[:1]  # its current P and log weight
    for p in range(ptok.shape[0]):
        par, here = pparent[p : p + 1], valid[p : p + 1]
        start = here & (par != cur)
        r = torch.where(start, _at(probs, par.clamp_min(0)).double(), r)
        lw = torch.where(start, log_w.index_select(0, par.clamp_min(0)), lw)
        cur = torch.where(here, par, cur)
        x, qp = ptok[p : p + 1], q[p].double()
        entry = child_log_weight(lw, r.index_select(0, x), qp.index_select(0, x))
        log_w = torch.where(here & first[p] & (nodes == pchild[p]), entry, log_w)
        r_after, mass = residual(r, qp, lw.exp())
        lw = torch.where(here, log_weight_after_rejection(lw, mass), lw)
        r = torch.where(here, r_after, r)
        mine = here & (nodes == par)
        log_w = torch.where(mine, lw, log_w)
        extra = torch.where(mine, torch.argmax(r / exponentials), extra)
    passed = torch.cat([nodes[:1] == 0, uniforms[: w - 1].double() < log_w[1:].exp()])
    node = torch.argmin(torch.where(passed, post, w)).view(1)
    return _at(anc, node), _at(extra, node)


def path_rows(on_path: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of the path nodes first (increasing), then ``j`` at position ``j``; and the path length."""
    w = on_path.shape[0]
    j = torch.arange(w, device=on_path.device)
    m = on_path.sum()
    first = torch.where(on_path, j, w + j).sort().values
    return torch.where(j < m, first, j), m


class _Runner:
    """One compiled step (target forward, acceptance, commit) for one (model, capacity, width), its
    static cache and its prompt's prefill (``prefill(prompt)``: compiled chunks, ``treespec.core.prefill``).
    A step is ONE compiled call: no output of a compiled graph is ever the input of
    another (under CUDA graphs a second graph's replay may overwrite the first one's outputs), and
    its only output is the small packed path, copied to the host before the next step. ``forward``
    (the verification forward alone) is compiled separately for timing it (``experiments/bench_gpu.py``).
    """

    def __init__(self, model: torch.nn.Module, capacity: int, width: int, backend: str, mode: str | None) -> None:
        self.model, self.width = model, width
        self.cache = StaticTreeCache(model, capacity)
        self.prefill = ChunkedPrefill(model, self.cache, backend, mode)
        self.params = SamplingParams()
        self.verifier = "rrs"  # the request's rule for sampled steps (set like params; dynamo guards on both)
        self.forward = compile_graph(self.run_eager, backend, mode)
        self.step_greedy = compile_graph(self._step_greedy, backend, mode)
        self.step_sampled = compile_graph(self._step_sampled, backend, mode)

    def run_eager(self, ids: torch.Tensor, depth: torch.Tensor, anc: torch.Tensor) -> torch.Tensor:
        """The target over ``ids`` written at ``[L, L + n)`` (not committed); logits ``[n, V]``."""
        return self.cache.forward(self.model, ids, self.cache.length + depth, anc)

    def _commit(self, on_path: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        rows, m = path_rows(on_path)
        self.cache.commit(self.cache.length + rows, m)
        return torch.cat([rows, m[None], extra[None]])

    def _step_greedy(self, tree: "_PaddedTree") -> torch.Tensor:
        logits = self.run_eager(tree.tokens, tree.depth, tree.anc)
        return self._commit(*greedy_path(logits, tree.tokens, tree.parent, tree.anc, tree.valid))

    def _step_sampled(self, tree: "_PaddedTree", q, ptok, pparent, pchild, plast, has_props, post, uniforms,
                      exponentials) -> torch.Tensor:
        probs = self.params.probs(self.run_eager(tree.tokens, tree.depth, tree.anc))
        if self.verifier == "rrs":
            return self._commit(*sampled_path(probs, q, ptok, pparent, pchild, plast, has_props, uniforms,
                                              exponentials))
        # traversal, and block (the same rule on a chain; the request refuses it on other trees)
        return self._commit(*traversal_path(probs, q, ptok, pparent, pchild, tree.anc, post, uniforms, exponentials))


_RUNNERS: dict[tuple, _Runner] = {}
_MAX_RUNNERS = 4  # each holds a full KV cache; a sweep typically needs one per budget


def runner_for(model: torch.nn.Module, capacity: int, width: int, backend: str, mode: str | None) -> _Runner:
    """The (cached) runner for these shapes; reusing it reuses its compiled graphs and cache."""
    key = (id(model), capacity, width, backend, mode)
    runner = _RUNNERS.get(key)
    if runner is None or runner.model is not model:
        while len(_RUNNERS) >= _MAX_RUNNERS:
            _RUNNERS.pop(next(iter(_RUNNERS)))
        allow_recompiles()
        runner = _RUNNERS[key] = _Runner(model, capacity, width, backend, mode)
    return runner


class _PaddedTree:
    """A flat tree padded to width ``w``, as device tensors (two host->device copies)."""

    def __init__(self, flat: FlatTree, w: int, device: torch.device) -> None:
        n = len(flat)
        ints = np.zeros((4, w), dtype=np.int64)  # tokens, depth, flat parent, valid
        ints[0, :n] = flat.tokens
        ints[1, :n] = flat.depth
        ints[2, :n] = flat.parent
        ints[3, :n] = 1
        anc = np.eye(w, dtype=bool)  # padding rows attend to themselves only
        anc[:n, :n] = flat.ancestors
        t = torch.from_numpy(ints).to(device, non_blocking=True)
        self.tokens, self.depth, self.parent, self.valid = t[0], t[1], t[2], t[3].bool()
        self.anc = torch.from_numpy(anc).to(device, non_blocking=True)


def proposal_tensors(tree: TokenTree, flat: FlatTree, vocab: int, w: int, device: torch.device):
    """The tree's proposals as fixed-size device tensors for ``sampled_path`` and ``traversal_path``.

    ``P`` is a power of two >= ``w`` (so a fixed shape keeps one graph). Returns ``q [P, V]``, ``ptok``,
    ``pparent``, ``pchild`` (flat indices; ``pparent == -1`` marks padding), ``plast`` (the last
    proposal of its parent), ``has_props [w]`` and ``post [w]`` (post-order ranks, padding last).
    """
    props = [(i, p) for i, node in enumerate(flat.order) for p in tree.proposals[node]]
    n, size = len(props), next_pow2(len(props), w)
    ints = np.zeros((6, size), dtype=np.int64)  # token, parent, child, last, (per flat node: has_props, post)
    ints[1] = -1
    ints[5, :w] = np.arange(w)
    ints[5, : len(flat)] = post_order(flat.parent)
    for j, (i, p) in enumerate(props):
        ints[:3, j] = (p.token, i, flat.index[p.child])
    if n:
        ints[3, :n] = np.r_[ints[1, 1:n] != ints[1, : n - 1], True]
    ints[4, ints[1, :n]] = 1  # size >= w, so the flat nodes fit in this row
    t = torch.from_numpy(ints).to(device, non_blocking=True)
    point = [j for j, (_, p) in enumerate(props) if p.row == POINT_MASS]
    dense = [j for j, (_, p) in enumerate(props) if p.row != POINT_MASS]
    q = torch.zeros(size, vocab, device=device)
    if point:
        q[torch.tensor(point, device=device), t[0, point]] = 1.0
    if dense:
        q[torch.tensor(dense, device=device)] = torch.stack([props[j][1].q(vocab, device) for j in dense])
    return q, t[0], t[1], t[2], t[3].bool(), t[4, :w].bool(), t[5, :w]


class CompiledStep(HostDrafted):
    """The engine's step (``treespec.core.engine.Step``) as one compiled target call per step.

    The tree is padded to the request's budget; without one, to the first step's tree size rounded
    up to a power of two, and later trees are merged under that cap (dropping proposals in proposal
    order keeps the output exact). The runner (compiled graphs and static cache) is chosen at the
    first step, so the prefill runs then. Seconds: ``overhead`` is the host's padding, ``verifying``
    the target forward, acceptance and commit up to the step's one device->host copy.
    """

    name = "compiled"

    def __init__(self, req: Request, gen: torch.Generator) -> None:
        self.req, self.gen, self.width = req, gen, req.budget
        self.backend, self.mode = compile_options(req.compile, req.device)
        self.runner: _Runner | None = None

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        """Deferred to the first :meth:`verify`: the padded width, and so the runner, is known then."""

    def _start(self, first_tree_size: int, clock: Clock) -> _Runner:
        clock.charge("overhead")
        req = self.req
        width = req.budget or next_pow2(first_tree_size)
        capacity = capacity_for(len(req.prompt), req.max_new_tokens + width)
        self.runner = runner_for(req.target, capacity, width, self.backend, self.mode)
        self.runner.params, self.runner.verifier, self.width = req.params, req.verifier, width
        self.runner.prefill(req.prompt)
        clock.charge("prefill")
        return self.runner

    def verify(self, tree: TokenTree, flat: FlatTree, clock: Clock) -> tuple[list[int], int]:
        runner = self.runner or self._start(len(flat), clock)
        req, w = self.req, runner.width
        padded = _PaddedTree(flat, w, req.device)
        if not req.params.greedy:
            props = proposal_tensors(tree, flat, req.vocab, w, req.device)
            uniforms = torch.rand(props[1].shape[0], generator=self.gen, device=req.device)
            expo = torch.empty(req.vocab, device=req.device).exponential_(generator=self.gen)
        clock.charge("overhead")
        if req.params.greedy:
            packed = runner.step_greedy(padded)
        else:
            packed = runner.step_sampled(padded, *props, uniforms, expo)
        out = packed.tolist()  # the step's one device->host copy
        clock.charge("verifying")
        m, extra = out[w], out[w + 1]
        return [int(flat.order[i]) for i in out[:m]], extra
