"""What a GGUF file's header says that transformers' loading of the file drops or mishandles.

transformers turns a GGUF file into a model and a tokenizer, but it keeps the file's one end-of-sequence id (its
end-of-turn and end-of-message ids are lost), drops the ``rope_freqs.weight`` tensor (Llama 3.1's RoPE scaling,
stored as factors that llama.cpp divides each rotary frequency by: the model ran another RoPE than the file's),
fills a tensor the file lacks with random weights (a report on stderr, then a wrong model), and fails on a file cut
short in numpy's words. :func:`read_header` reads the header once; ``loading._load_gguf`` refuses what cannot load
as the file says and applies the rest (:func:`with_rope_factors`, ``loading.with_end_of_text_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

#: the header keys naming end-of-generation tokens (llama.cpp stops at each)
END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


@dataclass(frozen=True)
class Header:
    """The parts of a GGUF file's header that loading checks or applies."""

    architecture: str
    tokens: int  # entries of the token list
    end_ids: tuple[int, ...]  # the ids :data:`END_KEYS` name, in that order
    rope_factors: np.ndarray | None  # ``rope_freqs.weight``: each rotary frequency is divided by its factor


def read_header(path: str | Path) -> Header:
    """The header of the GGUF file at ``path``; a file the reader cannot read (cut short, damaged, not GGUF) is
    refused in one line naming it."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as error:  # noqa: BLE001 - the reader's errors are numpy's and struct's: said as one line
        raise ValueError(f"{path}: not a readable GGUF file, cut short or damaged ({type(error).__name__}: "
                         f"{error}); download or convert it again") from None
    fields = reader.fields
    tokens = fields.get("tokenizer.ggml.tokens")
    factors = next((np.array(t.data, dtype=np.float32).reshape(-1) for t in reader.tensors
                    if t.name == "rope_freqs.weight"), None)
    return Header(architecture=str(fields["general.architecture"].contents()),
                  tokens=len(tokens.data) if tokens is not None else 0,
                  end_ids=tuple(int(fields[k].contents()) for k in END_KEYS if k in fields),
                  rope_factors=factors)


def check_end_ids(header: Header, path: str | Path) -> None:
    """Refuse end-of-generation ids past the file's token list (transformers fails on them with an IndexError)."""
    past = [i for i in header.end_ids if header.tokens and i >= header.tokens]
    if past:
        raise ValueError(f"{path}: its end-of-generation id {past[0]} is past its token list ({header.tokens} "
                         "tokens): a damaged file; download or convert it again")


def with_rope_factors(model: torch.nn.Module, factors: np.ndarray | None, path: str | Path) -> torch.nn.Module:
    """``model`` with each rotary embedding's frequencies divided by the file's ``rope_freqs`` factors, as llama.cpp
    runs the file (Llama 3.1's "llama3" RoPE scaling, which the model's own release applies through its config).
    Refused where the model has no rotary frequencies of the factors' length to scale."""
    if factors is None:
        return model
    scale = torch.from_numpy(factors)
    rotary = [m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
    if not rotary or any(m.inv_freq.shape != scale.shape for m in rotary):
        raise ValueError(f"{path}: its rope_freqs tensor ({len(factors)} factors) matches no rotary embedding of "
                         "the model transformers builds from it; convert the model's Hugging Face release instead")
    for m in rotary:
        for name in ("inv_freq", "original_inv_freq"):
            if isinstance(getattr(m, name, None), torch.Tensor):
                setattr(m, name, getattr(m, name) / scale.to(getattr(m, name)))
    return model
