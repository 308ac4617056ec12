"""Exact verification rules for a token tree, pluggable: ``rrs``, ``block``, ``traversal``, ``spectr``.

A verifier sees one step's token tree (its nodes, and at every node the proposals of its children in
proposal order, each with the distribution ``q`` it was drawn from), the target distribution at
every node (lazily, through ``target(node)``) and a source of randomness (:class:`Coins`). It returns
the accepted path (tree nodes, root first) and the extra token drawn where the path stops. Every
rule here is exact (the committed tokens are distributed as the target's) *for the tree
constructions it declares* (:data:`VERIFIERS`); ``generate`` refuses the others with a clear error.
See ``docs/verifiers.md`` for the table and ``docs/design.md`` ("Exactness rule") for the base rule.

Rules:

* ``rrs``: token-level recursive rejection sampling, top-down, child by child (SpecInfer /
  Sequoia; Leviathan et al. 2023, Algorithm 1, applied to each proposal in turn). Exact for every
  construction whose proposals carry their genuine ``q`` (point masses included).
* ``block``: block verification of a single chain (Sun et al., "Block Verification Accelerates
  Speculative Decoding", ICLR 2025, Algorithm 2). Optimal for one path.
* ``traversal``: traversal verification of a tree, leaf to root in post-order (Weng et al.,
  "Traversal Verification for Speculative Tree Decoding", NeurIPS 2025, Algorithm 1); equals
  ``block`` on a chain. Each proposal is weighed against its own ``q``, which makes it exact for
  every construction ``rrs`` is exact for.
* ``spectr``: SpecTr's K-SEQ at every node (Sun et al., "SpecTr: Fast Speculative Decoding via
  Optimal Transport", NeurIPS 2023), for i.i.d. draws with duplicates kept.

Numerics: the path weights are kept as float64 logarithms (a product of ratios along a deep path
underflows in float32), ``1 - w`` is computed as ``-expm1(log w)`` (exact near ``w = 1``) and every
distribution is handled in float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
import torch
from scipy.optimize import brentq

from .constructions import Construction, chain_only, classify, every_construction, iid_uncut
from .rule import child_log_weight, log_weight_after_rejection, residual
from .sampling import SamplingParams
from .tree import FlatTree, TokenTree

Target = Callable[[int], torch.Tensor]  # tree node -> target distribution at that node, float64 [V]
DTYPE = torch.float64


def node_targets(flat: FlatTree, logits: torch.Tensor, params: SamplingParams) -> Target:
    """``node -> target distribution at that node`` (float64), computed once per node when a walk asks."""
    probs: dict[int, torch.Tensor] = {}

    def target(node: int) -> torch.Tensor:
        if node not in probs:
            probs[node] = params.probs(logits[flat.index[node]]).to(DTYPE)
        return probs[node]

    return target


class Coins(Protocol):
    """The verifier's randomness: every random decision goes through these two calls."""

    def accept(self, prob: float) -> bool:
        """True with probability ``prob`` (a fresh uniform each call)."""

    def draw(self, dist: torch.Tensor) -> int:
        """A token drawn from ``dist`` (a probability vector)."""


class TorchCoins:
    """:class:`Coins` from a seeded ``torch.Generator``: fresh float64 uniforms every call."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def accept(self, prob: float) -> bool:
        if prob >= 1.0:
            return True
        if prob <= 0.0:
            return False
        u = torch.rand((), generator=self.generator, device=self.generator.device, dtype=DTYPE)
        return bool(u < prob)

    def draw(self, dist: torch.Tensor) -> int:
        return int(torch.multinomial(dist, 1, generator=self.generator))


Verifier = Callable[[TokenTree, Target, Coins], tuple[list[int], int]]


# -- rrs ----------------------------------------------------------------------------------------


def rrs(tree: TokenTree, target: Target, coins: Coins) -> tuple[list[int], int]:
    """Token-level recursive rejection sampling down the tree.

    At a node with target ``r``, proposal ``x_i ~ q_i`` is accepted with probability
    ``min(1, r(x_i) / q_i(x_i))`` (Leviathan et al. 2023, Algorithm 1); on rejection
    ``r <- normalize(max(r - q_i, 0))`` and the next proposal is tried; when none is left, the extra
    token is drawn from ``r``. Every proposal keeps its own residual update, merged duplicates
    included. Exact whenever each ``x_i`` is a draw from ``q_i`` given everything before it.
    """
    vocab, device = target(0).shape[-1], target(0).device
    path, node = [0], 0
    while True:
        r = target(node)
        for p in tree.proposals[node]:
            q = p.q(vocab, device, DTYPE)
            if coins.accept(math.exp(_log_weight(0.0, r[p.token], q[p.token]))):
                node = p.child
                path.append(node)
                break
            r = residual(r, q)[0]
        else:
            return path, coins.draw(r)


# -- block --------------------------------------------------------------------------------------


def block(tree: TokenTree, target: Target, coins: Coins) -> tuple[list[int], int]:
    """Block verification of a chain (Sun et al., ICLR 2025, Algorithm 2).

    With the chain ``x_1..x_g`` (``x_i ~ q_i``), targets ``P_0..P_g`` at its nodes, weights
    ``p_0 = 1``, ``p_i = min(1, p_{i-1} P_{i-1}(x_i) / q_i(x_i))`` and residual masses
    ``R_i = sum_x max(p_i P_i(x) - q_{i+1}(x), 0)``, position ``i`` is kept with probability
    ``h_i = R_i / (R_i + 1 - p_i)`` (``h_g = p_g``); scanning from the deepest position, the first
    kept ``i`` is the accepted length ``tau``. The extra token is drawn from ``P_g`` if ``tau = g``,
    else from ``normalize(max(p_tau P_tau - q_{tau+1}, 0))``.
    """
    vocab, device = target(0).shape[-1], target(0).device
    nodes, qs = [0], []
    while props := tree.proposals[nodes[-1]]:
        if len(props) > 1:
            raise ValueError(f"block verification needs a chain; node {nodes[-1]} has {len(props)} proposals")
        qs.append(props[0].q(vocab, device, DTYPE))
        nodes.append(props[0].child)
    g = len(qs)
    P = torch.stack([target(v) for v in nodes])  # [g + 1, V]
    if g == 0:
        return nodes, coins.draw(P[0])
    x = torch.tensor([tree.tokens[v] for v in nodes[1:]], device=device)
    Q = torch.stack(qs)  # [g, V]: q_i is row i - 1
    steps = torch.arange(g, device=device)
    # log p_i, i = 1..g: a running sum of log ratios, capped at 0 (Algorithm 2, line "p_i = min{...}")
    log_ratio = P[steps, x].log() - Q[steps, x].clamp_min(1e-300).log()  # -inf where P(x) = 0
    log_p = torch.zeros(g + 1, dtype=DTYPE, device=device)
    for i in range(g):
        log_p[i + 1] = torch.clamp(log_p[i] + log_ratio[i], max=0.0)
    res, mass = residual(P[:g], Q, log_p[:g, None].exp())  # [g, V], positions 0..g-1
    one_minus_p = -torch.expm1(log_p[:g])  # 1 - p_i computed separately
    denom = mass + one_minus_p
    h = torch.where(denom > 0, mass / denom.clamp_min(1e-300), torch.ones_like(mass))
    for tau in range(g, 0, -1):
        keep = float(log_p[g].exp()) if tau == g else float(h[tau])
        if coins.accept(keep):
            break
    else:
        tau = 0
    if tau == g:
        return nodes, coins.draw(P[g])
    return nodes[: tau + 1], coins.draw(res[tau])


# -- traversal ----------------------------------------------------------------------------------


def traversal(tree: TokenTree, target: Target, coins: Coins) -> tuple[list[int], int]:
    """Traversal verification (Weng et al., NeurIPS 2025, Algorithm 1), leaf to root in post-order.

    Every node carries a weight ``w`` (the root 1). A child ``x`` proposed from ``q`` under a node
    of weight ``w`` and current target ``P`` gets ``min(1, w P(x) / q(x))`` (the sequence-level
    ratio, computed as a capped running sum of log ratios). The first leaf in post-order is accepted
    with probability its weight: the whole root-to-leaf path is committed and the extra token drawn
    from the leaf's (current) target. A rejected child is deleted and its parent updated:
    ``P <- normalize(max(w P - q, 0))`` and ``w <- R / (R + 1 - w)`` with ``R`` the mass of
    ``max(w P - q, 0)`` (``rule.log_weight_after_rejection``); the parent's next proposal is weighed
    against the updated ``P`` and ``w``; a node whose proposals are all rejected becomes a leaf. The
    root's weight stays 1, so it is always accepted. On a chain this is :func:`block`.

    Our version verifies every *proposal* against the distribution it was drawn from, exactly like
    :func:`rrs`: a point mass for a deterministic candidate, ``q`` for an i.i.d. draw, ``q`` minus
    the earlier draws for sampling without replacement, and a merged duplicate keeps its own update
    (its child, already explored and rejected, has weight 0 the second time). Why this is exact
    whenever every proposal is a draw from its ``q``: by induction over subtrees, a node reached with
    weight ``w`` is accepted with probability exactly ``w``, and then its continuation follows the
    target; so a rejected child carries no information about later proposals, and the update above
    is the one that keeps the parent's acceptance at ``w`` with continuation law ``P``. The rule is
    *biased* when a proposal is weighed against a distribution it was not drawn from: top-k children
    weighed against the draft ``q`` (the paper's setting), i.i.d. siblings updated as if drawn without
    replacement, siblings re-sorted after sampling (tests/test_verifiers.py shows the first two).
    """
    vocab, device = target(0).shape[-1], target(0).device

    def visit(node: int, log_w: float) -> tuple[list[int], int] | None:
        P = target(node)
        for prop in tree.proposals[node]:
            child, q = prop.child, prop.q(vocab, device, DTYPE)
            log_wc = _log_weight(log_w, P[prop.token], q[prop.token])
            if log_wc > -math.inf and (found := visit(child, log_wc)) is not None:
                return [node] + found[0], found[1]
            P, mass = residual(P, q, math.exp(log_w))
            log_w = float(log_weight_after_rejection(torch.tensor(log_w, dtype=DTYPE), mass))
        if node == 0 or coins.accept(math.exp(log_w)):  # the root's weight stays 1
            return [node], coins.draw(P)
        return None

    return visit(0, 0.0)


def _log_weight(log_w: float, p_x: torch.Tensor, q_x: torch.Tensor) -> float:
    """``log min(1, w p(x) / q(x))`` (``rule.child_log_weight``, the compiled steps' arithmetic) as a float."""
    return float(child_log_weight(torch.tensor(log_w, dtype=DTYPE), p_x.to(DTYPE), q_x.to(DTYPE)))


# -- spectr (K-SEQ) -----------------------------------------------------------------------------


def kseq_rho(r: torch.Tensor, q: torch.Tensor, k: int) -> tuple[float, float]:
    """SpecTr's division factor for ``k`` i.i.d. draws from ``q`` against target ``r``.

    With ``beta(rho) = sum_x min(q(x), r(x) / rho)`` (one draw's acceptance probability) and
    ``c(rho) = (1 - (1 - beta)^k) / beta`` (the expected number of tries, each accepting ``x`` with
    mass ``min(q(x), r(x) / rho)``), the output never exceeds ``r`` iff ``c(rho) <= rho`` (Sun et al.,
    NeurIPS 2023, K-SEQ, Algorithm 3 and its choice of ``rho``). ``c(1) >= 1`` and ``c(k) <= k``: Brent's
    method finds where ``c(rho) = rho`` on ``[1, k]``, and ``(rho, c(rho))`` is returned on the feasible side of
    it, within 1e-12 (the smallest feasible ``rho``: the largest acceptance).
    """

    q_np, r_np = q.double().cpu().numpy(), r.double().cpu().numpy()  # one copy: the root search reads them often

    def c_of(rho: float) -> float:
        beta = float(np.minimum(q_np, r_np / rho).sum())
        if beta <= 0:
            return float(k)
        # (1 - (1 - beta)^k) / beta with the power in log space
        return -math.expm1(k * math.log1p(-min(beta, 1.0))) / beta if beta < 1 else 1.0

    if c_of(1.0) <= 1.0:
        return 1.0, c_of(1.0)
    if c_of(float(k)) >= k:  # k = 1 (c = 1 up to rounding), or no crossing before k
        return float(k), c_of(float(k))
    rho, step = brentq(lambda x: c_of(x) - x, 1.0, float(k), xtol=1e-13), 1e-13
    while c_of(rho) > rho:  # on the infeasible side within the root's tolerance: step over (c(k) < k ends it)
        rho, step = min(rho + step, float(k)), 2 * step
    return rho, c_of(rho)


def spectr(tree: TokenTree, target: Target, coins: Coins) -> tuple[list[int], int]:
    """SpecTr's K-SEQ at every node, top-down (Sun et al., "SpecTr", NeurIPS 2023, Algorithm 3).

    The ``k`` proposals at a node are i.i.d. draws ``x_1..x_k`` from one ``q`` (duplicates kept).
    With ``rho`` from :func:`kseq_rho`, draw ``i`` is accepted with probability
    ``min(1, r(x_i) / (rho q(x_i)))`` in order; if none is, the extra token is drawn from
    ``normalize(max(r - c min(q, r / rho), 0))`` with ``c = (1 - (1 - beta)^k) / beta``. For ``k = 1``
    it is the standard rule. Exact only for i.i.d. draws with every duplicate kept as a proposal.
    """
    vocab, device = target(0).shape[-1], target(0).device
    path, node = [0], 0
    while True:
        r = target(node)
        props = tree.proposals[node]
        if props:
            q = props[0].q(vocab, device, DTYPE)
            rho, c = kseq_rho(r, q, len(props))
            for p in props:
                if coins.accept(math.exp(_log_weight(-math.log(rho), r[p.token], q[p.token]))):
                    node = p.child
                    path.append(node)
                    break
            else:
                r = residual(r, c * torch.minimum(q, r / rho))[0]
                return path, coins.draw(r)
            continue
        return path, coins.draw(r)


@dataclass(frozen=True)
class VerifierSpec:
    """A verification rule, the constructions it is exact for, and a one-line summary of them."""

    verify: Verifier
    exact_for: Callable[[Construction], bool]
    summary: str


VERIFIERS: dict[str, VerifierSpec] = {
    "rrs": VerifierSpec(rrs, every_construction, "every construction"),
    "block": VerifierSpec(block, chain_only,
                          "trees of one proposal per node (chains; not independent chains, whose root has several)"),
    "traversal": VerifierSpec(traversal, every_construction, "every construction (each proposal against its own q)"),
    "spectr": VerifierSpec(spectr, iid_uncut,
                           "one drafter's i.i.d. draws with duplicates kept, not cut by the budget"),
}


class NotExactError(ValueError):
    """The chosen verifier is not proven exact for the tree construction it was given."""


def get(name: str) -> VerifierSpec:
    """The verifier called ``name``; a clear error for an unknown name."""
    if not isinstance(name, str) or name not in VERIFIERS:
        raise ValueError(f"unknown verifier {name!r}; choose one of {', '.join(VERIFIERS)} (one name)")
    return VERIFIERS[name]


def check_tree(name: str, tree: TokenTree, truncated: bool) -> None:
    """Raise :class:`NotExactError` when verifier ``name`` is not exact for ``tree``'s construction."""
    if get(name).exact_for is not every_construction:
        check_exact(name, classify(tree, truncated))


def check_exact(name: str, construction: Construction) -> None:
    """Raise :class:`NotExactError` when verifier ``name`` is not exact for ``construction``."""
    if get(name).exact_for(construction):
        return
    ok = [n for n, spec in VERIFIERS.items() if spec.exact_for(construction)]
    raise NotExactError(
        f"verifier {name!r} is not exact for this tree ({construction.describe()}); it is exact for "
        f"{VERIFIERS[name].summary}. Verifiers exact for this tree: {', '.join(ok)}. Pick one of them, "
        "or change the drafters (mode, mix) or the budget."
    )
