"""Standardised sampling: logits -> one probability distribution (Leviathan et al. 2023, sec. 2.2).

Temperature, top-k and top-p are applied in HuggingFace's order (temperature first, then top-k,
then top-p) and identically to target and draft logits, so that speculative sampling preserves
the distribution the user asked for. Probabilities are float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import check_int, check_real


#: the smallest positive temperature: logits over a smaller one come near float32's range (3.4e38), and ordinary
#: logits over one under about 1e-37 overflow it (NaN probabilities: HF's sampling raises, treespec drew token 0)
MIN_TEMPERATURE = 1e-30


@dataclass(frozen=True)
class SamplingParams:
    """How logits become a distribution. ``temperature == 0`` means greedy decoding."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        temperature = check_real("temperature", self.temperature,
                                 "pass temperature=0.0 for greedy decoding or a positive value to sample.")
        if temperature < 0:
            raise ValueError(
                f"temperature must be >= 0 (0 means greedy), got {self.temperature!r}; "
                "pass temperature=0.0 for greedy decoding or a positive value to sample."
            )
        if 0 < temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature {self.temperature!r} is below {MIN_TEMPERATURE:g}: logits over it overflow float32; "
                "pass temperature=0.0 for greedy decoding (what such a temperature samples, but at exact ties)"
            )
        check_int("top_k", self.top_k, 0, "0 disables it; pass e.g. top_k=50 to keep the 50 most likely tokens.")
        top_p = check_real("top_p", self.top_p, "use top_p=1.0 to disable nucleus sampling.")
        if not (0.0 < top_p <= 1.0):
            raise ValueError(
                f"top_p must be in (0, 1], got {self.top_p!r}; use top_p=1.0 to disable nucleus sampling."
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_draft(self) -> "SamplingParams":
        """Parameters drafters sample with. Under greedy decoding drafts sample at temperature 1."""
        return SamplingParams(1.0, self.top_k, self.top_p) if self.greedy else self

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Distribution over the last dimension of ``logits`` (any leading shape)."""
        return standardize(logits, self.temperature, self.top_k, self.top_p)


def standardize(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Turn logits ``[..., V]`` into float32 probabilities with temperature, top-k and top-p, as HF ``generate``'s
    warpers do in that order (the same operations, so that ties and rounding at the top-p boundary keep the same
    tokens as the target's own sampling).

    Temperature 0 returns the one-hot distribution of the argmax. Top-p keeps the smallest set of
    most likely tokens whose mass reaches ``top_p`` (at least one token): sorted ascending, a token is dropped while
    the mass up to and including it is at most ``1 - top_p``.
    """
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ascending, order = torch.sort(logits, dim=-1, descending=False)
        drop_sorted = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        drop_sorted[..., -1] = False  # the most likely token stays
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return torch.softmax(logits, dim=-1)


def draw_children(q: torch.Tensor, b: int, mode: str, generator: torch.Generator) -> torch.Tensor:
    """``b`` children per row of ``q`` (``[P, V]``) the way drafters propose them; -1 = no draw.

    ``topk``: the ``b`` most likely tokens; ``sample``: ``b`` i.i.d. draws; ``sample_without_replacement``:
    Gumbel-top-k, whose key order is the order of sequential draws without replacement (a draw that
    ``q`` cannot support, once its support is exhausted, is -1).
    """
    w = min(b, q.shape[-1])
    if mode == "topk":
        out = torch.topk(q, w, dim=-1).indices
    elif mode == "sample":
        out = torch.multinomial(q, b, replacement=True, generator=generator)
    else:
        u = torch.rand(q.shape, generator=generator, device=q.device).clamp_(1e-20, 1.0)
        top = torch.topk(q.log() - (-u.log()).log(), w, dim=-1)
        out = torch.where(torch.isfinite(top.values), top.indices, -1)
    if out.shape[-1] < b:
        out = torch.cat([out, out.new_full((*out.shape[:-1], b - out.shape[-1]), -1)], dim=-1)
    return out


def spread_seed(*parts: object) -> int:
    """A 56-bit seed hashed from ``parts`` (joined with "/").

    Seeds of many seeded trials must be spread, not consecutive: consecutive ``torch.Generator``
    seeds gave a reproducible false failure in one of our statistical checks (docs/design.md,
    "Exactness rule").
    """
    import hashlib

    key = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=7).digest(), "little")
