"""A draft model with its own tokenizer: it drafts text, and the text is proposed as target tokens.

A proposal that is a point mass in the *target's* vocabulary is verified exactly whatever produced
it (``docs/design.md``, "Exactness rule"), so a draft model of another family can propose for any
target. Each step :class:`CrossTokenizerDrafter`

1. decodes the committed target tokens to text and re-encodes the text with the draft tokenizer.
   The re-encoding is done on the whole text, so where the last word is split differently once
   more text arrives, the draft ids change at the end: the draft's KV cache keeps the rows of the
   longest unchanged prefix of draft ids (plus the rows of last step's drafted tokens that the
   committed text followed) and only the rest is fed again;
2. drafts ``width`` chains of ``depth`` draft tokens: the ``width`` most likely first tokens, each
   continued greedily (one draft forward per level, all chains in one tree-masked forward);
3. decodes each chain to text, re-encodes ``(last committed target tokens as text) + chain text``
   with the target tokenizer from a boundary where the committed tokens re-encode to themselves (alone, or as
   inside a text for a tokenizer that encodes a sequence's start apart: ``TextCodec.encode_within``),
   and keeps the target tokens after that boundary, less the last one (it may be a word the draft
   text cut in the middle). A chain whose re-encoding does not reproduce the committed tokens is
   not proposed: the target cannot represent it consistently after what it committed.

The resulting target-token paths are merged into one trie of point-mass proposals (the greedy
chain first). Alignment needs the draft tokenizer to decode what it encodes unchanged; one that
cannot (unknown characters, a normalizer) raises :class:`AlignmentError` with the fix, at ``reset``
for the prompt's text or at the step whose committed text it cannot carry. Where the *target*
tokenizer would re-split committed text, that step simply proposes nothing.

Tokenizers are HuggingFace tokenizers (``PreTrainedTokenizerBase``; encoded without special
tokens added, decoded without skipping or cleaning anything) or any object with
``encode(text) -> list[int]`` and ``decode(ids) -> str``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Sequence

import torch

from ..common.device import execution_device
from ..common.machine import model_name
from ..core.checks import check_int, context_of
from ..core.drafting import ROOT, DraftProposals, Drafter
from ..core.kv import TreeCache, causal_allowed, forward_masked
from ..core.sampling import SamplingParams

__all__ = ["TextCodec", "CrossTokenizerDrafter", "AlignmentError", "common_prefix"]

LOOKBEHIND = 8  # tokens decoded before a suffix so that the suffix's text comes out as in context
ANCHOR = "a"  # a text a committed tail is encoded after, to tokenize it as inside a text (TextCodec.encode_within)


class AlignmentError(ValueError):
    """The committed text cannot be carried between the target's and the draft's tokenizers."""


class TextCodec:
    """Plain ``encode(text)``/``decode(ids)`` over an HF tokenizer or any object with those two methods.

    HF tokenizers encode without adding special tokens (BOS/EOS) and decode without skipping
    special tokens or cleaning up spaces, so that decode(encode(text)) is text itself.
    """

    def __init__(self, tokenizer: object, name: str | None = None) -> None:
        if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))):
            raise TypeError(f"{type(tokenizer).__name__} is not a tokenizer: it needs encode(text) -> list[int] "
                            "and decode(ids) -> str (an HF tokenizer, or an object with these two methods)")
        from transformers import PreTrainedTokenizerBase

        self.tokenizer = tokenizer
        self.hf = isinstance(tokenizer, PreTrainedTokenizerBase)
        self.name = name or getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__

    def encode(self, text: str) -> list[int]:
        if self.hf:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        return [int(t) for t in self.tokenizer.encode(text)]

    @functools.cached_property
    def _anchor(self) -> list[int]:
        """:data:`ANCHOR`'s own tokens (encoded once: every step's tail search asks for them)."""
        return self.encode(ANCHOR)

    def encode_within(self, text: str) -> list[int] | None:
        """``text``'s tokens as they come inside a longer text, where they differ from :meth:`encode`'s: encoded
        after :data:`ANCHOR`, whose own tokens are then cut (a SentencePiece tokenizer that prepends "▁" to what it
        encodes, as Llama-2's does, gives a text that starts with a space an extra piece at the start of a sequence
        and not inside one). None where the anchor's tokens do not come out apart (the text merged into them)."""
        anchor = self._anchor
        ids = self.encode(ANCHOR + text)
        return ids[len(anchor):] if ids[:len(anchor)] == anchor else None

    def decode(self, ids: Sequence[int]) -> str:
        if self.hf:
            return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return self.tokenizer.decode(list(ids))

    def suffix_text(self, ids: Sequence[int], start: int) -> str | None:
        """The text that ``ids[start:]`` adds after ``ids[:start]`` (None if decoding is not prefix-stable).

        Decodes from ``LOOKBEHIND`` tokens earlier, so that a leading space or a UTF-8 character split
        across tokens comes out as it does in context.
        """
        a = max(0, start - LOOKBEHIND)
        head, full = self.decode(ids[a:start]), self.decode(ids[a:])
        return full[len(head):] if full.startswith(head) else None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CrossTokenizerDrafter(Drafter):
    """A draft model whose tokenizer differs from the target's; proposes target-token point masses.

    Args:
        model: the draft HF causal LM (a family that takes a tree mask: ``checks.SUPPORTED_FAMILIES``).
        draft_tokenizer: the draft model's tokenizer.
        target_tokenizer: the target model's tokenizer (its ids are what is proposed).
        depth: draft tokens per chain (one draft forward per token after the first).
        width: chains per step: the ``width`` most likely first draft tokens, each continued greedily.
    """

    vocab_size = None  # proposals are target ids

    def __init__(self, model: torch.nn.Module, draft_tokenizer: object, target_tokenizer: object, *,
                 depth: int = 6, width: int = 1) -> None:
        self.depth = check_int("depth", depth, 1, "CrossTokenizerDrafter's draft tokens per chain.")
        self.width = check_int("width", width, 1, "CrossTokenizerDrafter's chains per step.")
        self.model = model
        self.draft = TextCodec(draft_tokenizer)
        self.target = TextCodec(target_tokenizer)
        self.device = execution_device(model)
        self.model_name = model_name(model)
        self.context = context_of(model) or 2**62  # positions the draft takes, in its own tokens
        self.reset([], sampling=SamplingParams(), seed=0)

    def describe(self) -> str:
        return f"cross({self.model_name}, depth={self.depth}, width={self.width})"

    def reset(self, prompt: Sequence[int], *, sampling: SamplingParams, seed: int) -> None:
        self.cache = TreeCache()
        self._ids: list[int] = []  # draft ids whose K/V are cache rows [0, len)
        self._chains: list[tuple[list[int], list[int]]] = []  # last step's chains: (draft tokens, cache rows)
        self.fed_tokens = 0  # draft context tokens fed so far (not counting drafted tree tokens)
        self._past_context = False  # warned that the text outgrew the draft's context
        if prompt:  # fail early, before any target work, if the draft cannot carry the prompt's text
            self._check_round_trip(self.draft, self.target.decode(prompt), "draft")

    @torch.inference_mode()
    def prefill(self, prompt: Sequence[int]) -> None:
        """Cache the prompt's draft ids but the last (the first step feeds it, as every step feeds its newest): the
        draft's pass over the prompt is the prefill's, not the first step's drafting."""
        ids = self.draft.encode(self.target.decode(prompt))
        if len(ids) < 2 or self._ids or len(ids) > self.context:
            return
        n = len(ids) - 1
        forward_masked(self.model, self.cache, torch.as_tensor(ids[:-1], dtype=torch.long, device=self.device),
                       torch.arange(n, device=self.device), causal_allowed(0, n, self.device), logits_to_keep=1)
        self._ids, self.fed_tokens = ids[:-1], self.fed_tokens + n

    # -- alignment -------------------------------------------------------------------------------

    def _check_round_trip(self, codec: TextCodec, text: str, role: str, ids: list[int] | None = None) -> list[int]:
        ids = codec.encode(text) if ids is None else ids
        back = codec.decode(ids)
        if back != text:
            i = common_prefix(text, back)  # type: ignore[arg-type]  # works on strings too
            raise AlignmentError(
                f"cross-tokenizer drafting with draft model {self.model_name!r} (tokenizer {self.draft.name!r}) "
                f"for a target with tokenizer {self.target.name!r} needs the {role} tokenizer "
                f"({codec.name!r}) to decode what it encodes unchanged, but it turns {text[i:i + 20]!r} into "
                f"{back[i:i + 20]!r} (at character {i}): it cannot represent this text (unknown characters or a "
                "normalizer). Use a draft whose tokenizer is byte-level (e.g. smollm2-135m-instruct, or any "
                "GPT-2/Llama-3/Qwen style BPE), or a drafter that shares the target's tokenizer (a same-family "
                "draft model or the n-gram drafter).")
        return ids

    def _align(self, context: Sequence[int]) -> tuple[list[int], torch.Tensor] | None:
        """Draft ids of the committed text, cache rows reused where unchanged; the root's logits. None while the
        committed tokens decode to no text (tokens of no characters): nothing for the draft to go on."""
        text = self.target.decode(context)
        ids = self._check_round_trip(self.draft, text, "draft", self.draft.encode(text))
        if not ids:
            return None
        if len(ids) > self.context:  # the text outgrew the draft's context: it drafts no more
            if not self._past_context:
                warnings.warn(f"the draft {self.model_name!r} (another tokenizer) reached its context of "
                              f"{self.context} positions in its own tokens: it drafts nothing more this run, and the "
                              "target decodes the rest alone (exact, without speculation)", stacklevel=2)
                self._past_context = True
            return None
        old = len(self._ids)
        m = common_prefix(self._ids, ids)
        keep: list[int] = []
        if m == old:  # the text went on: keep the cache rows of the drafted tokens it followed
            for tokens, rows in self._chains:
                n = common_prefix(tokens, ids[old:])
                if n > len(keep):
                    keep = rows[:n]
        cached = min(m + len(keep), len(ids) - 1)  # the last id is always fed: its logits are needed
        if cached > m:
            self.cache.keep(m, keep[: cached - m])
        else:
            self.cache.keep(cached, [])
        pending = torch.as_tensor(ids[cached:], dtype=torch.long, device=self.device)
        logits = forward_masked(self.model, self.cache, pending,
                                torch.arange(cached, len(ids), device=self.device),
                                causal_allowed(cached, len(pending), self.device), logits_to_keep=1)
        self.fed_tokens += len(pending)
        self._ids, self._chains = ids, []
        return ids, logits[-1]

    # -- drafting --------------------------------------------------------------------------------

    def _draft_chains(self, ids: list[int], root_logits: torch.Tensor) -> list[list[int]]:
        """``width`` chains of ``depth`` draft tokens (fewer where the draft's context ends): the top first tokens,
        each continued greedily."""
        n_ctx = len(ids)
        first = torch.topk(root_logits.float(), min(self.width, root_logits.shape[-1])).indices.tolist()
        chains = [[t] for t in first]
        rows: list[list[int]] = [[] for _ in chains]
        w = len(chains)
        for d in range(1, min(self.depth, self.context - n_ctx + 1)):  # the last chain token at position n_ctx - 1 + d
            base = self.cache.length
            allowed = torch.zeros(w, base + w, dtype=torch.bool)
            allowed[:, :n_ctx] = True
            for i, r in enumerate(rows):
                allowed[i, r] = True
            allowed[:, base:] = torch.eye(w, dtype=torch.bool)
            tokens = torch.as_tensor([c[-1] for c in chains], device=self.device)
            pos = torch.full((w,), n_ctx - 1 + d, device=self.device)
            logits = forward_masked(self.model, self.cache, tokens, pos, allowed)
            for i, c in enumerate(chains):
                rows[i].append(base + i)
                c.append(int(logits[i].argmax()))
        self._chains = list(zip(chains, rows))
        return chains

    def _target_tail(self, context: Sequence[int]) -> tuple[int, str, bool] | None:
        """The most committed tokens (up to LOOKBEHIND) whose text re-encodes to exactly them, and whether as
        inside a text (``TextCodec.encode_within``: a tail that does not start the sequence, for a tokenizer that
        encodes a sequence's start apart)."""
        tokens = list(context[-LOOKBEHIND:])
        for j in range(min(LOOKBEHIND, len(context)), 0, -1):
            text = self.target.suffix_text(context, len(context) - j)
            if text is None:
                continue
            if self.target.encode(text) == tokens[-j:]:
                return j, text, False
            if j < len(context) and self.target.encode_within(text) == tokens[-j:]:
                return j, text, True
        return None

    def to_target(self, context: Sequence[int], tail: tuple[int, str, bool], continuation: str) -> list[int]:
        """Target tokens for ``continuation`` after ``context`` (``tail``: from ``_target_tail``).

        Empty when the target tokenizer would re-split the committed tail. The last token is dropped
        (unless it is the only one): the continuation may end inside a word.
        """
        j, tail_text, within = tail
        enc = (self.target.encode_within if within else self.target.encode)(tail_text + continuation)
        if enc is None or enc[:j] != list(context[-j:]):
            return []
        path = enc[j:]
        return path[:-1] if len(path) > 1 else path

    @torch.inference_mode()
    def propose(self, context: Sequence[int]) -> DraftProposals:
        aligned = self._align(context)
        if aligned is None:
            return DraftProposals()
        ids, root_logits = aligned
        chains = self._draft_chains(ids, root_logits)
        tail = self._target_tail(context)
        out = DraftProposals()
        if tail is None:
            return out
        node: dict[tuple[int, int], int] = {}
        for chain in chains:
            text = self.draft.suffix_text(ids + chain, len(ids))
            if not text:
                continue
            parent = ROOT
            for tok in self.to_target(context, tail, text.rstrip("\ufffd")):
                key = (parent, tok)
                if key not in node:
                    node[key] = len(out.tokens)
                    out.tokens.append(tok)
                    out.parents.append(parent)
                parent = node[key]
        return out
