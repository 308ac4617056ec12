"""Acceptance math on tensors: the one implementation of every acceptance rule the steps run.

The eager step, the compiled step and the captured step all call the functions here (the first two
through ``padded.accept``), compiled into a step's graph or eagerly, and the host walkers of
``treespec.core.verifiers`` (kept for the rules with no tensor walk and for exhaustive enumeration over
their coin flips) use the same arithmetic (:func:`child_log_weight`, :func:`log_weight_after_rejection`,
:func:`residual`).

Multi-draft iterative speculative sampling at one tree node:

One rule covers every tree (``docs/design.md``, "Exactness rule"): at a node with target distribution
``r``, try the proposals ``x_i ~ q_i`` in proposal order;

1. accept ``x_i`` with probability ``min(1, r(x_i) / q_i(x_i))``;
2. on rejection ``r <- normalize(max(r - q_i, 0))`` and try the next proposal;
3. when none is left, the correction token is drawn from the final ``r``.

A point mass ``q_i = onehot(x_i)`` reduces step 1 to "accept with probability r(x_i)" and step 2 to
"zero r(x_i) and renormalise". The per-node functions are batched over leading dimensions so that
tests can run many trials at once. Below them, the walks over a batch of flat trees of fixed size, one row
per request (:func:`greedy_path`, :func:`sampled_path`, :func:`traversal_path`, :func:`path_rows`).
"""

from __future__ import annotations

import math

import torch


def residual(r: torch.Tensor, q: torch.Tensor, weight: torch.Tensor | float = 1.0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """``normalize(max(w r - q, 0))`` over the last dimension, and its mass before normalising.

    The distribution left after a rejection (rule 2 above; ``w`` is the path weight of block and
    traversal verification, 1 for the token-level rule). Where the mass is 0, rejection had
    probability 0 (``w r <= q`` everywhere) and ``r`` itself is returned. Batched over leading
    dimensions (``weight`` broadcasts against them with a trailing dimension of 1).
    """
    res = (weight * r - q).clamp_min(0.0)
    mass = res.sum(-1, keepdim=True)
    return torch.where(mass > 0, res / mass.clamp_min(torch.finfo(res.dtype).tiny), r), mass[..., 0]


def child_log_weight(log_w: torch.Tensor, p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """``log min(1, w p(x) / q(x))``: the weight traversal (and block) verification gives a child ``x ~ q``
    under a node of weight ``w`` and target ``p`` (Weng et al., NeurIPS 2025, Algorithm 1). ``-inf`` where
    ``p(x) = 0`` or ``w = 0``; ``q(x) = 0`` (never for a genuine draw) counts as ratio 1. Never NaN."""
    tiny = torch.finfo(log_w.dtype).tiny
    ratio = (log_w + p_x.clamp_min(tiny).log() - q_x.clamp_min(tiny).log()).clamp_max(0.0)
    return torch.where((p_x > 0) & (log_w > -math.inf), torch.where(q_x > 0, ratio, 0.0), -math.inf)


def log_weight_after_rejection(log_w: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """A node's new log weight once a child (with its subtree) was rejected: ``log R / (R + 1 - w)``, ``R`` the
    mass of ``max(w p - q, 0)`` (``1 - w`` as ``-expm1(log w)``). It keeps the node's total acceptance
    probability equal to ``w`` (Weng et al., Algorithm 1, the update of ``p`` at the parent; on a chain it is
    ``h_i`` of block verification). Where ``R + 1 - w = 0`` the rejection had probability 0 and the weight stays 1."""
    denom = mass - torch.expm1(log_w)
    return torch.where(denom > 0, (mass / denom.clamp_min(torch.finfo(denom.dtype).tiny)).log(), 0.0)


def verify_proposals(
    r: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the acceptance rule over ``K`` proposals at one node.

    Args:
        r: target distribution ``[..., V]``.
        tokens: proposed tokens ``[..., K]`` (long), in proposal order.
        q: the distribution each proposal was drawn from, ``[..., K, V]``.
        uniforms: fresh U(0, 1) draws ``[..., K]``, one per proposal.

    Returns:
        ``(accepted, residual)``: the index of the accepted proposal (``-1`` if all were
        rejected) and the distribution left after the rejections made before stopping; when
        ``accepted == -1`` the correction token must be drawn from ``residual``.
    """
    r = r.float()
    accepted = torch.full(r.shape[:-1], -1, dtype=torch.long, device=r.device)
    for i in range(tokens.shape[-1]):
        x = tokens[..., i : i + 1]
        qi = q[..., i, :].float()
        r_x = r.gather(-1, x).squeeze(-1)
        q_x = qi.gather(-1, x).squeeze(-1)
        active = accepted < 0
        # u < min(1, r/q)  <=>  u * q < r  (q(x) > 0 for a genuine draw)
        take = active & (uniforms[..., i] * q_x < r_x)
        accepted = torch.where(take, i, accepted)
        reject = active & ~take
        r = torch.where(reject.unsqueeze(-1), residual(r, qi)[0], r)
    return accepted, r


def point_masses(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """One-hot distributions ``[..., K, V]`` for deterministic proposals ``[..., K]``."""
    return torch.nn.functional.one_hot(tokens, vocab_size).float()


def draw_without_replacement_q(q: torch.Tensor, exclude: tuple[int, ...]) -> torch.Tensor:
    """``q`` with earlier draws ``exclude`` removed and renormalised (Sequoia's sampling w/o replacement)."""
    if not exclude:
        return q
    q = q.clone()
    q[list(exclude)] = 0.0
    return q / q.sum()


# -- a whole tree: the walks over a batch of flat trees of fixed size (one graph each under torch.compile) ------
#
# Every walk runs over ``B`` rows at once (a batch's requests, or one tree as ``B = 1``): per-row tensors carry a
# leading ``[B]``; the tree's structure (``parent``, ``anc``, ``pchild``, ``post``) may be one tree's, shared by
# every row, or ``[B, ...]``. A row's loop over its proposals is the same loop for every row, so the walk is one
# sequence of batched ops whatever ``B`` is (a graph that does not grow with the batch).


def _pick(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """``x[b, i[b]]`` for each row ``b`` (``x`` ``[B, W, ...]``, ``i`` ``[B]``), on the device (no host sync)."""
    index = i.view(-1, *([1] * (x.dim() - 1))).expand(x.shape[0], 1, *x.shape[2:])
    return x.gather(1, index)[:, 0]


def greedy_path(logits: torch.Tensor, tokens: torch.Tensor, parent: torch.Tensor, anc: torch.Tensor,
                valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance over padded flat trees: ``(on_path [B, W] bool, extra token [B])``.

    ``logits`` ``[B, W, V]``, ``tokens`` and ``valid`` ``[B, W]``; ``parent`` ``[W]`` and ``anc`` ``[W, W]``
    (or per row). Node ``i`` matches when its token is the target's argmax at its parent; the accepted node
    is the deepest one whose ancestors (itself included, the root excepted) all match. In a trie siblings
    differ, so at most one node per depth qualifies.
    """
    b, w = tokens.shape
    best = logits.argmax(-1)
    anc = anc.expand(b, w, w)
    first = torch.arange(w, device=tokens.device) == 0
    match = first | ((tokens == best.gather(1, parent.expand(b, w))) & valid)
    ok = valid & ~(anc & ~match[:, None, :]).any(-1)
    node = torch.argmax(torch.where(ok, anc.sum(-1), -1), -1)
    return _pick(anc, node), _pick(best, node)


def sampled_path(probs: torch.Tensor, q: torch.Tensor, ptok: torch.Tensor, pparent: torch.Tensor,
                 pchild: torch.Tensor, plast: torch.Tensor, has_props: torch.Tensor, uniforms: torch.Tensor,
                 exponentials: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Multi-draft speculative sampling down padded flat trees: ``(on_path [B, W] bool, extra token [B])``.

    ``probs`` ``[B, W, V]``; each row's proposals come in a fixed list ``[B, P]`` (``q`` ``[B, P, V]``) sorted
    by their parent's flat index (DFS order), each parent's proposals in proposal order; padding has
    ``pparent == -1``; ``pchild`` may be shared ``[P]``. Walking the list once applies
    ``verify_proposals`` at the current node, one proposal at a time (the rule is sequential, so this
    is the same rule): accept -> move to the child; reject -> keep the residual; the last proposal of
    the node rejected (or a leaf reached) -> stop. The correction token is ``argmax r / E``, an exact
    draw from ``r`` (exponential race; ``exponentials`` ``[B, V]``) with no host sync.
    """
    b, w, _ = probs.shape
    nodes = torch.arange(w, device=probs.device)
    pchild = pchild.expand_as(ptok)
    cur = torch.zeros(b, dtype=torch.long, device=probs.device)
    r = probs[:, 0]
    on_path = (nodes == 0).expand(b, w)
    done = ~has_props[:, 0]
    for p in range(ptok.shape[1]):
        here = ~done & (pparent[:, p] == cur)
        acc, residual = verify_proposals(r, ptok[:, p : p + 1], q[:, p : p + 1], uniforms[:, p : p + 1])
        take = here & (acc == 0)
        reject = here & ~take
        child = pchild[:, p]
        r = torch.where(take[:, None], _pick(probs, child), torch.where(reject[:, None], residual, r))
        cur = torch.where(take, child, cur)
        on_path = on_path | (take[:, None] & (nodes == child[:, None]))
        done = done | (reject & plast[:, p]) | (take & ~_pick(has_props, child))
    return on_path, torch.argmax(r / exponentials, -1)


def traversal_path(probs: torch.Tensor, q: torch.Tensor, ptok: torch.Tensor, pparent: torch.Tensor,
                   pchild: torch.Tensor, anc: torch.Tensor, post: torch.Tensor, uniforms: torch.Tensor,
                   exponentials: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Traversal verification (``verifiers.traversal``; ``block`` on a chain) over padded flat trees:
    ``(on_path [B, W] bool, extra token [B])``.

    The proposals come as for :func:`sampled_path` (each parent's proposals contiguous, in proposal
    order, parents before their children; ``pparent == -1``: no proposal), with the ancestor matrix
    ``anc [W, W]`` and ``post [W]``, each node's rank in post-order (``tree.post_order``; both may be per row).
    The walk's only random decisions are its leaf tests (Weng et al., NeurIPS 2025, Algorithm 1): a node's
    test is reached only once all of its children's subtrees were rejected, i.e. after every update of
    its proposals, so each node's weight and target at its test follow from the tree alone. One pass
    over the proposals computes them (per proposal: the child's entry weight ``min(1, w P(x)/q(x))``,
    then the parent's update ``P <- normalize(max(wP - q, 0))``, ``w <- R/(R + 1 - w)``, in float64 logs)
    and each node's extra token from its final ``P`` (exponential race, one ``E`` per row for every node: only
    the accepted node's is used). Node ``v >= 1`` passes its test with ``uniforms[:, v - 1] < w_v``, the
    root always; the accepted node is the first to pass in post-order. Weight-0 subtrees stay at
    ``-inf`` (no NaN). A merged duplicate (a later proposal of an already proposed child) only updates
    the parent: the child had weight ``< 1`` when it was rejected (a weight-1 node is always accepted),
    so ``P(x)`` was zeroed and the host walk's re-visit has weight 0.
    """
    b, w, _ = probs.shape
    device = probs.device
    nodes = torch.arange(w, device=device)
    pchild = pchild.expand_as(ptok)
    j = torch.arange(ptok.shape[1], device=device)
    valid = pparent >= 0
    # a proposal's child is proposed for the first time (no earlier proposal of the row has the same child)
    first = valid & ~((pchild[:, :, None] == pchild[:, None, :]) & valid[:, None, :] & (j < j[:, None])).any(-1)
    log_w = torch.zeros(b, w, dtype=torch.float64, device=device).masked_fill(nodes > 0, -math.inf)
    extra = torch.argmax(probs / exponentials[:, None, :], -1)  # nodes without proposals: their target's draw
    cur = torch.full((b,), -1, dtype=pparent.dtype, device=device)  # the parent whose proposals run
    r, lw = probs[:, 0].double(), log_w[:, 0]  # its current P and log weight
    for p in range(ptok.shape[1]):
        par, here = pparent[:, p], valid[:, p]
        start = here & (par != cur)
        r = torch.where(start[:, None], _pick(probs, par.clamp_min(0)).double(), r)
        lw = torch.where(start, _pick(log_w, par.clamp_min(0)), lw)
        cur = torch.where(here, par, cur)
        x, qp = ptok[:, p : p + 1], q[:, p].double()
        entry = child_log_weight(lw, r.gather(1, x)[:, 0], qp.gather(1, x)[:, 0])
        log_w = torch.where((here & first[:, p])[:, None] & (nodes == pchild[:, p, None]), entry[:, None], log_w)
        r_after, mass = residual(r, qp, lw.exp()[:, None])
        lw = torch.where(here, log_weight_after_rejection(lw, mass), lw)
        r = torch.where(here[:, None], r_after, r)
        mine = here[:, None] & (nodes == par[:, None])
        log_w = torch.where(mine, lw[:, None], log_w)
        extra = torch.where(mine, torch.argmax(r / exponentials, -1)[:, None], extra)
    passed = torch.cat([(nodes[:1] == 0).expand(b, 1), uniforms[:, : w - 1].double() < log_w[:, 1:].exp()], 1)
    node = torch.argmin(torch.where(passed, post, w), -1)
    return _pick(anc.expand(b, w, w), node), _pick(extra, node)


def path_rows(on_path: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of the path nodes first (increasing), then ``j`` at position ``j``; and the path length
    (over the last dimension: ``[W]``, or ``[B, W]`` for a batch of rows)."""
    w = on_path.shape[-1]
    j = torch.arange(w, device=on_path.device)
    m = on_path.sum(-1)
    first = torch.where(on_path, j, w + j).sort(-1).values
    return torch.where(j < m[..., None], first, j), m
