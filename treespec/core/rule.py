"""Acceptance math on tensors: multi-draft iterative speculative sampling at one tree node.

One rule covers every tree (``docs/design.md``, "Exactness rule"): at a node with target distribution
``r``, try the proposals ``x_i ~ q_i`` in proposal order;

1. accept ``x_i`` with probability ``min(1, r(x_i) / q_i(x_i))``;
2. on rejection ``r <- normalize(max(r - q_i, 0))`` and try the next proposal;
3. when none is left, the correction token is drawn from the final ``r``.

A point mass ``q_i = onehot(x_i)`` reduces step 1 to "accept with probability r(x_i)" and step 2 to
"zero r(x_i) and renormalise". Everything here is batched over leading dimensions so that tests can
run many trials at once; the engine calls it with no batch dimension.
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
    under a node of weight ``w`` and target ``p`` (Weng et al., NeurIPS 2025, Algorithm 1; the tensor form of
    ``verifiers._log_weight``). ``-inf`` where ``p(x) = 0`` or ``w = 0``; ``q(x) = 0`` (never for a genuine
    draw) counts as ratio 1. Never NaN."""
    tiny = torch.finfo(log_w.dtype).tiny
    ratio = (log_w + p_x.clamp_min(tiny).log() - q_x.clamp_min(tiny).log()).clamp_max(0.0)
    return torch.where((p_x > 0) & (log_w > -math.inf), torch.where(q_x > 0, ratio, 0.0), -math.inf)


def log_weight_after_rejection(log_w: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """A node's new log weight once a child (with its subtree) was rejected: ``log R / (R + 1 - w)``, ``R`` the
    mass of ``max(w p - q, 0)`` (the tensor form of ``verifiers._weight_after_rejection``; ``1 - w`` as
    ``-expm1(log w)``). Where ``R + 1 - w = 0`` the rejection had probability 0 and the weight stays 1."""
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
