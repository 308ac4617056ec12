"""Which proposal rank the exact acceptance rule accepts at each position of a continuation: the observation
behind every acceptance measurement (``treespec.calibrate.acceptance``, whose module docstring describes the
two ways a continuation is written: by the rule itself, :func:`walk_ranks`, or by the target alone and then
scored, :func:`accepted_ranks` over :func:`continuation_logits`)."""

from __future__ import annotations

import torch

from ..common.device import execution_device
from ..core.kv import TreeCache, causal_allowed, forward_masked
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


def walk_ranks(target: torch.nn.Module, draft: torch.nn.Module, prompt: list[int], n: int, params: SamplingParams,
               width: int, mode: str, gen: torch.Generator, eos: frozenset[int] = frozenset()
               ) -> tuple[torch.Tensor, list[int], float, torch.Tensor]:
    """The ``"walk"`` continuation (module doc): ``n`` positions (fewer at an EOS), each written by the
    acceptance rule over ``width`` proposals of the draft. Returns every position's accepted rank
    (``[n]``, -1: the correction token was drawn), the tokens written, the sum over positions of
    ``sum_x min(r, q)`` and each proposal's draft probability ``q(token)`` (``[n, width]``, 0 for a draw
    ``q`` could not support: what the model drafter's confidence stop multiplies along a path)."""
    device = execution_device(target)
    draft_params = params.for_draft()
    caches = (TreeCache(), TreeCache())
    context = torch.tensor(prompt, device=device)

    def last_logits(model: torch.nn.Module, cache: TreeCache, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.to(execution_device(model))
        positions = torch.arange(cache.length, cache.length + len(ids), device=ids.device)
        allowed = causal_allowed(cache.length, len(ids), ids.device)
        return forward_masked(model, cache, ids, positions, allowed, logits_to_keep=1)[-1].float().to(device)

    ranks, written, overlap, proposal_q = [], [], 0.0, []
    for _ in range(n):
        r = params.probs(last_logits(target, caches[0], context))[None]
        d_logits = last_logits(draft, caches[1], context)[None]
        q = draft_params.probs(d_logits)
        # beta compares both under the target's parameters (the draft's differ only under greedy decoding)
        overlap += float(torch.minimum(r, q if draft_params == params else params.probs(d_logits)).sum())
        tokens = draw_children(q, width, mode, gen)
        proposal_q.append(torch.where(tokens >= 0, q.gather(-1, tokens.clamp_min(0)), 0.0)[0])
        u = torch.rand(tokens.shape, generator=gen, device=device)
        u = torch.where(tokens >= 0, u, torch.inf)  # a missing draw is never accepted
        k, left = verify_proposals(r, tokens.clamp_min(0), _proposal_q(q, tokens, mode), u)
        rank = int(k[0])
        token = int(tokens[0, rank]) if rank >= 0 else int(torch.multinomial(left[0], 1, generator=gen))
        ranks.append(rank)
        written.append(token)
        if token in eos:
            break
        context = torch.tensor([token], device=device)
    probs = torch.stack(proposal_q) if proposal_q else torch.zeros(0, width)
    return torch.tensor(ranks, dtype=torch.long), written, overlap, probs.float().cpu()


@torch.inference_mode()
def continuation_logits(model: torch.nn.Module, ids: list[int], n: int, device: torch.device) -> torch.Tensor:
    """Logits of the last ``n`` positions of one teacher-forced forward over ``ids[:-1]`` (float32)."""
    x = torch.tensor([ids[:-1]], device=device)
    return model(input_ids=x, use_cache=False, logits_to_keep=n).logits[0].float()
