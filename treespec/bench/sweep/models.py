"""The models a sweep runs: loaded by name (or built tiny for tests) once per pair, and their prompts' ids."""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ...models import check_source, load
from ...models.precision import to_precision
from ...models.tiny import ByteTokenizer, parse_tiny_spec, tiny_from_spec


def load_model(spec: str, device: str, dtype: str, role: str = "target") -> tuple[torch.nn.Module, Any]:
    """Load a model by name (``treespec.models.load``, as ``role``: a draft's int8 and int4 are drafts' precisions,
    its ``auto`` times them too) or build a tiny one; returns (model, tokenizer).

    The model's ``generation_config`` is replaced by a neutral one (every baseline sets its
    sampling explicitly, and no checkpoint default may leak in).
    """
    from transformers import GenerationConfig

    if spec.startswith("tiny:"):
        model = to_precision(tiny_from_spec(spec).to(device=device), dtype)
        tokenizer: Any = ByteTokenizer(model.config.vocab_size)
    else:
        model, tokenizer = load(spec, device=device, dtype=dtype, role=role)
    model.generation_config = GenerationConfig()
    return model, tokenizer


def check_specs(specs: Iterable[str]) -> None:
    """Refuse, before any point runs, a model that a point would fail to load (:func:`load_model`): a tiny spec
    that does not parse (``treespec.models.tiny.parse_tiny_spec``), a name ``treespec.models.load`` cannot find
    (``treespec.models.check_source``). No model is built or read. A sweep's points would otherwise each record the
    same error, after the baselines that ran."""
    for spec in sorted(set(specs)):
        if spec.startswith("tiny:"):
            parse_tiny_spec(spec)
        else:
            check_source(spec)


def encode(tokenizer: Any, text: str, max_tokens: int = 0) -> list[int]:
    """Raw text -> ids (no chat template); keeps the last ``max_tokens`` ids when ``max_tokens > 0``."""
    ids = list(tokenizer(text)["input_ids"])
    return ids[-max_tokens:] if max_tokens > 0 else ids


def pad_id(tokenizer: Any) -> int:
    """The id HF ``generate`` pads with: the tokenizer's pad token, else its EOS, else 0."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return 0 if pad is None else int(pad)


class SweepModels:
    """Models of the current pair, loaded once and kept while the pair's points run."""

    def __init__(self, device: str, dtype: str) -> None:
        self.device, self.dtype = device, dtype
        self.loaded: dict[tuple[str, str, str], tuple[torch.nn.Module, Any]] = {}

    def get(self, spec: str, dtype: str | None = None, role: str = "target") -> tuple[torch.nn.Module, Any]:
        """Model ``spec`` in ``dtype`` (default: the run's dtype) as ``role`` ("target" or "draft"), loaded once."""
        key = (spec, dtype or self.dtype, role)
        if key not in self.loaded:
            self.loaded[key] = load_model(spec, self.device, key[1], role)
        return self.loaded[key]

    def keep_only(self, specs: set[str]) -> None:
        for key in list(self.loaded):
            if key[0] not in specs:
                del self.loaded[key]
