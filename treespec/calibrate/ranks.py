"""Which proposal rank the exact acceptance rule accepts at each position of a continuation: the observation
behind every acceptance measurement (``treespec.calibrate.acceptance``, whose module docstring describes the
two ways a continuation is written: by the rule itself, :func:`walk_ranks`, or by the target alone and then
scored, :func:`accepted_ranks` over :func:`continuation_logits`)."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from ..common.device import execution_device
from ..core.drafting import Forward
from ..core.kv import RowsCache, causal_allowed
from ..core.rule import point_masses, verify_proposals
from ..core.sampling import SamplingParams, draw_children

#: floats per chunk of ``[positions, width, V]`` proposal distributions (bounds memory: 32 MiB)
_CHUNK_FLOATS = 1 << 23


def _proposal_q(q: torch.Tensor, tokens: torch.Tensor, mode: str) -> torch.Tensor:
    """The distribution each proposal was drawn from, ``[n, w, V]`` (docs/design.md, "Exactness rule")."""
    safe = tokens.clamp_min(0)
    if mode == "topk":
        return point_masses(safe, q.shape[-1])
    if mode == "sample":
        return q[:, None, :].expand(-1, tokens.shape[1], -1)
    hot = point_masses(safe, q.shape[-1]) * (tokens >= 0)[..., None]
    earlier = hot.cumsum(1) - hot  # tokens drawn before each proposal
    qi = q[:, None, :] * (1.0 - earlier)
    return qi / qi.sum(-1, keepdim=True).clamp_min(1e-30)


def accepted_ranks(r: torch.Tensor, q: torch.Tensor, width: int, mode: str, greedy: bool,
                   gen: torch.Generator) -> torch.Tensor:
    """Rank of the accepted proposal at each of ``n`` positions (-1: none), ``[n]`` long.

    ``r``: target distributions ``[n, V]``; ``q``: draft distributions the proposals come from.
    """
    tokens = draw_children(q, width, mode, gen)
    if greedy:
        hit = tokens == r.argmax(-1, keepdim=True)
        return torch.where(hit.any(-1), hit.float().argmax(-1), -1)
    out = torch.empty(r.shape[0], dtype=torch.long, device=r.device)
    chunk = max(1, _CHUNK_FLOATS // (width * r.shape[-1]))
    for s in range(0, r.shape[0], chunk):
        tok = tokens[s : s + chunk]
        u = torch.rand(tok.shape, generator=gen, device=r.device)
        u = torch.where(tok >= 0, u, torch.inf)  # a missing draw is never accepted
        k, _ = verify_proposals(r[s : s + chunk], tok.clamp_min(0), _proposal_q(q[s : s + chunk], tok, mode), u)
        out[s : s + chunk] = k
    return out


class Walk(NamedTuple):
    """One prompt's ``"walk"`` continuation (:func:`walk_ranks`)."""

    ranks: torch.Tensor  # [n] long: each position's accepted rank (-1: the correction token was drawn)
    tokens: list[int]  # the tokens written
    overlap: float  # the sum over positions of sum_x min(r, q)
    proposal_q: torch.Tensor  # [n, width]: each proposal's draft probability q(token) (0: a draw q cannot support)


def walk_ranks(target: torch.nn.Module, draft: torch.nn.Module, prompts: Sequence[list[int]], n: int,
               params: SamplingParams, width: int, mode: str, gens: Sequence[torch.Generator],
               eos: frozenset[int] = frozenset()) -> list[Walk]:
    """The ``"walk"`` continuations (module doc) of several prompts at once: ``n`` positions each (fewer at an
    EOS), each written by the acceptance rule over ``width`` proposals of the draft. The prompts are the rows
    of one incremental forward per model and position (``treespec.core.kv.RowsCache``: each row attends to its
    own tokens only), and prompt ``b`` draws from ``gens[b]`` in the order it would alone, so its walk is the
    one it would have alone (up to the rounding of a batched forward). ``proposal_q`` is what the model
    drafter's confidence stop multiplies along a path."""
    device = execution_device(target)
    draft_params = params.for_draft()
    caches = (RowsCache(len(prompts)), RowsCache(len(prompts)))
    pending = {b: torch.tensor(p, device=device) for b, p in enumerate(prompts)}  # each row's tokens to forward
    ranks: list[list[int]] = [[] for _ in prompts]
    written: list[list[int]] = [[] for _ in prompts]
    proposal_q: list[list[torch.Tensor]] = [[] for _ in prompts]
    overlap = [0.0] * len(prompts)
    for _ in range(n):
        if not pending:
            break
        r_rows = _last_logits(target, caches[0], pending, device)
        d_rows = _last_logits(draft, caches[1], pending, device)
        following = {}
        for b in pending:
            rank, token, beta, props_q = _write_position(r_rows[b], d_rows[b], params, draft_params, width, mode,
                                                            gens[b])
            ranks[b].append(rank)
            written[b].append(token)
            overlap[b] += beta
            proposal_q[b].append(props_q)
            if token not in eos:
                following[b] = torch.tensor([token], device=device)
        ended = [b for b in pending if b not in following]
        if ended:
            for cache in caches:
                cache.drop(ended)
        pending = following
    return [Walk(torch.tensor(ranks[b], dtype=torch.long), written[b], overlap[b],
                 (torch.stack(proposal_q[b]) if proposal_q[b] else torch.zeros(0, width)).float().cpu())
            for b in range(len(prompts))]


def _write_position(r_logits: torch.Tensor, d_logits: torch.Tensor, params: SamplingParams,
                    draft_params: SamplingParams, width: int, mode: str, gen: torch.Generator
                    ) -> tuple[int, int, float, torch.Tensor]:
    """One position of a walk: the draft proposes ``width`` children, the exact rule accepts one (its token is
    written) or the correction token is drawn from the residual. Returns the accepted rank (-1: none), the token,
    ``sum_x min(r, q)`` and each proposal's ``q(token)`` (``[width]``)."""
    r, q = params.probs(r_logits), draft_params.probs(d_logits)
    # beta compares both under the target's parameters (the draft's differ only under greedy decoding)
    beta = float(torch.minimum(r, q if draft_params == params else params.probs(d_logits)).sum())
    tokens = draw_children(q, width, mode, gen)
    u = torch.rand(tokens.shape, generator=gen, device=r.device)
    u = torch.where(tokens >= 0, u, torch.inf)  # a missing draw is never accepted
    k, left = verify_proposals(r, tokens.clamp_min(0), _proposal_q(q, tokens, mode), u)
    rank = int(k[0])
    token = int(tokens[0, rank]) if rank >= 0 else int(torch.multinomial(left[0], 1, generator=gen))
    return rank, token, beta, torch.where(tokens >= 0, q.gather(-1, tokens.clamp_min(0)), 0.0)[0]


def _last_logits(model: torch.nn.Module, cache: RowsCache, pending: dict[int, torch.Tensor],
                 device: torch.device) -> dict[int, torch.Tensor]:
    """Each row's pending tokens appended to its cache in one forward: the last one's logits ``[1, V]`` (float32,
    on ``device``) by row."""
    on = execution_device(model)
    asks = {}
    for b, ids in pending.items():
        past = cache.length_of(b)
        asks[b] = Forward(ids.to(on), torch.arange(past, past + len(ids), device=on),
                          causal_allowed(past, len(ids), on), last=True)
    return {b: logits.float().to(device) for b, logits in cache.forward(model, asks).items()}


@torch.inference_mode()
def continuation_logits(model: torch.nn.Module, ids: list[int], n: int, device: torch.device) -> torch.Tensor:
    """Logits of the last ``n`` positions of one teacher-forced forward over ``ids[:-1]`` (float32)."""
    x = torch.tensor([ids[:-1]], device=device)
    return model(input_ids=x, use_cache=False, logits_to_keep=n).logits[0].float()
