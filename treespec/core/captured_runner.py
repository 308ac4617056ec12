"""The captured step's compiled calls over a batch of rows: one draft level, and the verify call.

``treespec.core.captured`` describes the step; this module holds what runs it: a :class:`CapturedRunner` owns
the two models' static caches (``B`` rows, each at its own length), the prefills and the two compiled calls.
A batch of one is the single-prompt step; a batch of ``B`` decodes ``B`` prompts of one tree shape at once
(``captured.BatchCapturedStep``). The forwards are batched (one draft forward per level, one target forward
per step, over every row); the acceptance is each row's own (``treespec.core.rule``'s functions, applied per
row inside the verify graph), with its own random numbers and its own commit. A row that left the batch stays
in its slot but commits nothing (``active``), so its cache never grows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from . import attention
from .buffers import Envelope, TreeBuffers, tree_buffers
from .checks import vocab_size
from .compiling import compile_graph
from .padded import Noise
from .prefill import prefill_for
from .rule import greedy_path, path_rows, sampled_path, traversal_path
from .sampling import SamplingParams
from .static_cache import StaticTreeCache
from .step_state import Drafted, LevelTensors, StepState, TreeTensors


def _select(scores: torch.Tensor, width: int) -> torch.Tensor:
    """The ``width`` best columns of each row of ``scores``, best first; -1 where the score is -inf."""
    top = torch.topk(scores, min(width, scores.shape[-1]), dim=-1)
    return torch.where(torch.isfinite(top.values), top.indices, -1)


class CapturedRunner:
    """The compiled calls of a captured step in one envelope, for ``rows`` rows, and the caches they share.

    Every static tensor a compiled call reads it also mutates, or gets as an input: inductor's weight
    freezing folds a static tensor that a graph only reads into a constant. The tree's buffers are inputs
    too (never constants), which is what lets one graph serve many trees.
    """

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module, mode: str, envelope: Envelope,
                 capacity: int, backend: str, mode_compile: str | None, track_confidence: bool = False,
                 rows: int = 1) -> None:
        self.target, self.draft, self.mode, self.envelope, self.rows = target, draft, mode, envelope, rows
        # the confidence stop: the graphs compute each node's path probability (a fixed choice per runner);
        # the threshold is read on the host only, so another threshold needs no other graph
        self.track_confidence = track_confidence
        self.cache = StaticTreeCache(target, capacity, rows)
        self.draft_cache = StaticTreeCache(draft, capacity, rows)
        self.prefills = [prefill_for(target, self.cache, backend, mode_compile),
                         prefill_for(draft, self.draft_cache, backend, mode_compile)]
        self.params = self.draft_params = SamplingParams()
        self.verifier = "rrs"  # the request's rule for sampled steps (set like params; dynamo guards on both)
        self.clone_between = mode_compile == "reduce-overhead"  # CUDA graphs may reuse an output at the next replay
        device = self.cache.length.device
        vocab = vocab_size(target)
        # inference tensors, as the tensors that take their place are (the confidence stop's per-row ones, the
        # drafted levels' q, a step's given chain: made in the decoding loop's inference mode): a graph guards on
        # the kind of tensor it was given, and a placeholder of another kind compiled a graph of its own
        with torch.inference_mode():
            #: levels drafted by every row, as the verify call takes them ([B] per row)
            self.level_counts = [torch.full((rows,), d, device=device) for d in range(envelope.depth + 1)]
            self.all_rows = torch.ones(rows, dtype=torch.bool, device=device)
            # the levels a tree does not draft (shallower than the envelope, or cut by the confidence stop): no q
            self.no_q = [] if mode == "topk" else [torch.zeros(rows, envelope.kept_rows(d), vocab, device=device)
                                                   for d in range(envelope.depth)]
            #: the chain's given tokens of a step without any ([B, chain], -1: none)
            self.no_given = torch.full((rows, envelope.chain), -1, dtype=torch.long, device=device)
        self._trees: dict[tuple[bytes, ...], tuple] = {}  # tree_data, per shape
        self.level_step = compile_graph(self._level, backend, mode_compile, (draft,))
        self.verify_step = compile_graph(self._verify, backend, mode_compile, (target,))

    def tree_data(self, parent: np.ndarray, rank: np.ndarray, given: np.ndarray | None = None
                  ) -> tuple[TreeBuffers, TreeTensors, list[LevelTensors], list[torch.Tensor]]:
        """A tree's buffers in this runner's envelope and their device tensors: the node arrays, each drafted
        level's, and the nodes each level forwards (what the confidence stop reads); made once per shape.
        ``given``: the chain of given tokens (``buffers.with_chain``)."""
        key = (parent.tobytes(), rank.tobytes(), b"" if given is None else given.tobytes())
        if key not in self._trees:
            buf = tree_buffers(parent, rank, self.envelope, given)
            device = self.cache.length.device
            levels = buf.levels[: buf.depth_of_shape]
            self._trees[key] = (buf, TreeTensors.of(buf, device), [LevelTensors.of(lv, d, device) for d, lv in
                                                                     enumerate(levels)],
                                [torch.as_tensor(lv.forwarded, device=device) for lv in levels])
        return self._trees[key]

    def prefill(self, prompts: Sequence[list[int]]) -> StepState:
        """Cache each row's ``prompt[:-1]`` in both models; returns the state the first step starts from."""
        for fill in self.prefills:
            fill.rows(prompts)
        device, n = self.cache.length.device, self.envelope.nodes
        first = (torch.arange(n, device=device) == 0).repeat(len(prompts), 1)
        last = torch.tensor([p[-1] for p in prompts], device=device)
        tokens = torch.where(first, last[:, None], 0)
        length = torch.tensor([len(p) - 1 for p in prompts], device=device)
        return StepState(tokens, first, first.float(), tokens[:, :1] * 0, length, length.clone())

    def draft_tree(self, state: StepState, tree: TreeTensors, levels: list[LevelTensors], forwarded: list[torch.Tensor],
                   noise: list[torch.Tensor], min_confidence: float | None, active: torch.Tensor,
                   given: torch.Tensor | None = None) -> tuple[Drafted, list[torch.Tensor], torch.Tensor]:
        """The tree, level by level: ``(the drafted tree, q of each level, levels drafted per row)``. Nothing runs
        between the compiled calls but this loop (no eager operator), except where a confidence stop (CPU only)
        ends a row's drafting: its depths not drafted are missing nodes, and the levels end when no active row
        drafts deeper. ``given``: each row's tokens of the chain of given tokens (``[B, chain]``, -1 past its
        end; None: none this step)."""
        given = self.no_given if given is None else given
        keep = (lambda out: tuple(t.clone() for t in out)) if self.clone_between else (lambda out: out)
        drafted, qs = Drafted(state.tokens, state.exists, state.conf), []
        drafting, counts = self.all_rows, self.level_counts[len(levels)]
        for d, level in enumerate(levels):
            if d and min_confidence is not None:
                going = drafting & (drafted.conf[:, forwarded[d]].amax(-1) >= min_confidence)
                if not bool((going & active).any()):
                    counts = torch.where(drafting, d, counts)
                    break
                counts = torch.where(drafting & ~going, d, counts)
                drafting = going
            *out, q = keep(self.level_step(drafted, state, tree, level, noise[d], self.envelope.keep_from(d),
                                           drafting, given))
            drafted = Drafted(*out)
            qs.append(q)
        n = len(qs)
        return drafted, (qs + self.no_q[n:] if self.mode != "topk" else []), counts

    def _level(self, drafted: Drafted, state: StepState, tree: TreeTensors, level: LevelTensors, noise: torch.Tensor,
               keep_from: int, drafting: torch.Tensor, given: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One draft forward over the level's rows of every row of the batch, then the next depth's tokens from
        their parent rows' choices (rows not ``drafting`` choose none): ``(tokens, exists, conf, q of the kept
        rows)``, each ``[B, ...]``. The chain's nodes take the ``given`` tokens (every level alike: level 0,
        which forwards them, is the first)."""
        if self.envelope.chain:
            at = given[:, tree.given.clamp_min(0)]  # [B, N]; a chain's tokens form a prefix (-1 past its end)
            chain = tree.given >= 0
            drafted = Drafted(torch.where(chain, at.clamp_min(0), drafted.tokens),
                              torch.where(chain, at >= 0, drafted.exists), drafted.conf)
        ext = torch.cat([drafted.tokens, state.pending, state.pending * 0], dim=1)  # the pending and padding ids
        pending_used = state.draft_length < state.length
        not_pending = torch.arange(level.block.shape[1], device=ext.device) != 0
        block = level.block & (not_pending | pending_used[:, None, None])  # [B, rows, S]: each row's pending slot
        rows = level.nodes.shape[0]
        logits = self.draft_cache.forward(self.draft, ext[:, level.nodes],
                                          (state.length[:, None] + level.slot_depth).clamp_min(0), block,
                                          state.draft_length, state.draft_length + level.start,
                                          logits_to_keep=rows - keep_from if keep_from else 0,
                                          flex=attention.flex_in("level"))
        p = None
        if self.mode == "topk":
            choice, q = _select(logits, self.envelope.children), logits.new_zeros(0)
        else:
            p = q = self.draft_params.probs(logits)
            choice = _select(p.log() - (-noise.log()).log(), self.envelope.children)  # Gumbel-top-k: w/o replacement
        row = tree.row.clamp_max(choice.shape[1] - 1)  # nodes of other levels index in range (and are not used)
        cand = choice[:, row, tree.rank.clamp_max(choice.shape[2] - 1)]
        here = tree.chosen_at == level.index
        # a rank past the vocabulary (a node wider than it) has no token: it does not exist, as the host step drops it
        exists = torch.where(here, (cand >= 0) & (tree.rank < choice.shape[2]) & drafted.exists[:, tree.flat_parent]
                             & drafting[:, None], drafted.exists)
        tokens = torch.where(here, cand.clamp_min(0), drafted.tokens)
        conf = drafted.conf
        if self.track_confidence:
            p = self.draft_params.probs(logits) if p is None else p
            batch = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
            conf = torch.where(here, torch.where(exists, conf[:, tree.flat_parent] * p[batch, row, tokens], 0.0), conf)
        return tokens, exists, conf, q

    def _verify(self, drafted: Drafted, qs: list[torch.Tensor], levels_drafted: torch.Tensor, noise: Noise | None,
                state: StepState, tree: TreeTensors, active: torch.Tensor) -> tuple[StepState, torch.Tensor]:
        """Target forward, every row's acceptance (one walk over the batch), both commits: ``(the next step's
        state, the packed Outcome of each row)``. A row not ``active`` commits nothing."""
        tokens, exists, length = drafted.tokens, drafted.exists, self.cache.length
        logits = self.cache.forward(self.target, tokens, length[:, None] + tree.depth, tree.ancestors,
                                    flex=attention.flex_in("verify"))
        if self.params.greedy:
            on_path, extra = greedy_path(logits, tokens, tree.flat_parent, tree.ancestors, exists)
        else:
            q = torch.cat(qs, dim=1) if qs else None
            on_path, extra = self._walk(self.params.probs(logits), tokens, exists, q, noise, tree)
        rows, m = path_rows(on_path)
        m = m * active
        self.cache.commit(length[:, None] + rows, m)
        pending, draft_length = self._commit_draft(on_path, rows, m, tokens, levels_drafted, state, tree, active)
        first = (torch.arange(tokens.shape[1], device=tokens.device) == 0).expand_as(tokens)
        nxt = StepState(torch.where(first, extra[:, None], 0), first.clone(), first.float(), pending,
                        self.cache.length + 0, draft_length)
        return nxt, torch.cat([rows, m[:, None], extra[:, None], tokens, exists.long()], dim=1)

    def _commit_draft(self, on_path: torch.Tensor, rows: torch.Tensor, m: torch.Tensor, tokens: torch.Tensor,
                      levels_drafted: torch.Tensor, state: StepState, tree: TreeTensors, active: torch.Tensor
                      ) -> tuple[torch.Tensor, ...]:
        """Keep each row's pending row (if it was used) and the rows of its accepted nodes the draft forwarded
        (those of the levels it drafted: a confidence stop leaves the deepest chosen ones unforwarded); returns
        the next pending token (the deepest accepted node: a leaf the draft never saw when its cache is one row
        short) and the draft's committed lengths."""
        cache = self.draft_cache
        pending_used = state.draft_length < state.length
        kept_node = torch.cat([on_path, pending_used[:, None], on_path[:, :1] & False], dim=1)  # nodes, pending, pad
        keep = kept_node[:, tree.slot_node] & (tree.slot_level < levels_drafted[:, None])
        kept, kept_n = path_rows(keep)
        cache.commit(cache.length[:, None] + kept, kept_n * active)
        pending = tokens.gather(1, rows.gather(1, (m - 1).clamp_min(0)[:, None]))
        return pending, cache.length + 0

    def _without_older_siblings(self, q: torch.Tensor, tokens: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
        """Each proposal's ``q`` (``[B, P, V]``) with its older siblings' tokens (``tokens`` ``[B, N]``) removed,
        renormalised (the distribution a draw without replacement came from); ``earlier`` ``[P, K - 1]``, -1
        padding."""
        # scatter-add, not scatter: a padding entry (-1, read as the root) may share its token with a real older
        # sibling, and a plain scatter's later write would then clear that sibling's mark
        marks = tokens[:, earlier.clamp_min(0)]  # [B, P, K - 1]
        drop = torch.zeros_like(q).scatter_add_(2, marks, (earlier >= 0).to(q.dtype).expand(marks.shape)) > 0
        q = q.masked_fill(drop, 0.0)
        return q / q.sum(-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)

    def _proposal_q(self, qs: torch.Tensor | None, tokens: torch.Tensor, tree: TreeTensors, vocab: int) -> torch.Tensor:
        """Each row's non-root nodes' proposal distributions ``[B, N - 1, V]``: a point mass for top-k and for a
        given token (the chain's), else its level's draft distribution with its older siblings removed."""
        point = torch.nn.functional.one_hot(tokens[:, 1:], vocab).float()
        if self.mode == "topk":
            return point
        q = self._without_older_siblings(qs[:, tree.q_row[1:]], tokens, tree.earlier_siblings[1:])
        return torch.where((tree.given[1:] >= 0)[:, None], point, q)

    def _walk(self, probs: torch.Tensor, tokens: torch.Tensor, exists: torch.Tensor, qs: torch.Tensor | None,
              noise: Noise, tree: TreeTensors) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's rule over every row's tree at once (``rule.sampled_path``, or ``rule.traversal_path``:
        traversal, and block on a chain); node ``v``'s proposal is entry ``v - 1``, and missing nodes are no
        proposals. ``qs``: each row's draft distributions of every level's kept rows (None for top-k)."""
        b, n = tokens.shape
        props = exists[:, 1:]
        parent = tree.flat_parent[1:].expand(b, n - 1)
        pparent = torch.where(props, parent, -1)
        pchild = torch.arange(1, n, device=tokens.device)
        q = self._proposal_q(qs, tokens, tree, probs.shape[-1])
        if self.verifier != "rrs":  # one uniform per leaf test of a non-root node
            return traversal_path(probs, q, tokens[:, 1:], pparent, pchild, tree.ancestors, tree.post_order,
                                  noise.uniforms, noise.exponentials)
        # the last proposal of its parent: no younger sibling exists (a missing draw may precede the chain's node)
        zeros = torch.zeros(b, n, dtype=torch.long, device=tokens.device)
        last = zeros.scatter_reduce(1, parent, torch.where(props, pchild, 0), "amax")
        plast = props & (pchild == last.gather(1, parent))
        has_props = zeros.scatter_add(1, parent, props.long()) > 0
        return sampled_path(probs, q, tokens[:, 1:], pparent, pchild, plast, has_props, noise.uniforms,
                            noise.exponentials)
