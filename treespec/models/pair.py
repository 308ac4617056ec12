"""A target and its drafts, loaded together: precisions by device, drafts of another tokenizer, EOS ids."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from ..common.device import check_device
from ..drafters.cross_tokenizer import CrossTokenizerDrafter
from .loading import check_tokenizers, load
from .precision import parse_precision


@dataclass(frozen=True)
class CrossDraft:
    """A draft model whose tokenizer differs from the target's (``treespec.drafters.cross_tokenizer``)."""

    model: torch.nn.Module
    tokenizer: Any
    target_tokenizer: Any


def draft_model(draft: "torch.nn.Module | CrossDraft") -> torch.nn.Module:
    """The model behind a draft: its own, for a draft of another tokenizer."""
    return draft.model if isinstance(draft, CrossDraft) else draft


def default_precision(name: str | None, device: str | torch.device) -> str:
    """A precision name for :func:`treespec.models.load`; None: ``auto`` (measured) on CPU, bfloat16 on CUDA."""
    if name is None:
        return "bfloat16" if str(device).startswith("cuda") else "auto"
    return parse_precision(name)


def load_pair(target: str, drafts: Sequence[str], *, device: str = "cpu", target_dtype: str | None = None,
              draft_dtype: str | None = None, compile: bool | str = False
              ) -> tuple[torch.nn.Module, Any, list[torch.nn.Module | CrossDraft]]:
    """The target, its tokenizer and the drafts: a model where it shares the target's tokenizer, a
    :class:`CrossDraft` where it does not (it then drafts text, proposed in the target's tokens).

    Precisions: names as in :func:`treespec.models.load` (``"auto"`` times the candidates on this
    machine and keeps the fastest; the decision is cached); None means ``auto`` on CPU (int8 is among
    a draft's candidates, not the target's) and bfloat16 on CUDA. With ``compile`` (the captured step
    drafts in compiled calls) ``auto`` times only the draft precisions ``torch.compile`` can trace.
    """
    check_device(device)
    model, tok = load(target, device=device, dtype=default_precision(target_dtype, device), role="target")
    out: list[torch.nn.Module | CrossDraft] = []
    for name in drafts:
        draft, draft_tok = load(name, device=device, dtype=default_precision(draft_dtype, device), role="draft",
                                traceable=compile is not False)
        out.append(draft if tokenizers_match(tok, draft_tok) else CrossDraft(draft, draft_tok, tok))
    return model, tok, out


def tokenizers_match(target_tokenizer: PreTrainedTokenizerBase, draft_tokenizer: PreTrainedTokenizerBase) -> bool:
    """True when the two tokenizers share one vocabulary (:func:`treespec.models.check_tokenizers` passes)."""
    try:
        check_tokenizers(target_tokenizer, draft_tokenizer)
    except ValueError:
        return False
    return True


def load_cross_drafter(draft_name: str | os.PathLike, target_tokenizer: PreTrainedTokenizerBase, *, depth: int = 6,
                       width: int = 1, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                       **load_kwargs: Any) -> CrossTokenizerDrafter:
    """Load the draft model ``draft_name`` (a built-in name, a directory or a hub id; see
    :func:`treespec.models.load`, as a draft: its ``int8``, ``int4`` and ``auto`` are a draft's) as a
    ``CrossTokenizerDrafter`` for ``target_tokenizer``."""
    model, tokenizer = load(draft_name, device=device, dtype=dtype, **{"role": "draft", **load_kwargs})
    return CrossTokenizerDrafter(model, tokenizer, target_tokenizer, depth=depth, width=width)


def eos_ids(model: torch.nn.Module, tok: Any) -> list[int]:
    """The model's end-of-sequence ids (its generation config's, else the tokenizer's)."""
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    return eos or ([tok.eos_token_id] if tok.eos_token_id is not None else [])
