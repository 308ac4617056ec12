"""What a GGUF file's header says that transformers' loading of the file drops or mishandles.

transformers turns a GGUF file into a model and a tokenizer, but it keeps the file's one end-of-sequence id (its
end-of-turn and end-of-message ids are lost), drops the ``rope_freqs.weight`` tensor (Llama 3.1's RoPE scaling,
stored as factors that llama.cpp divides each rotary frequency by: the model ran another RoPE than the file's),
fills a tensor the file lacks with random weights (a report on stderr, then a wrong model), fails on a file cut
short in numpy's words, and encodes some prompts otherwise than llama.cpp (no BOS for Llama 3's files, a
SentencePiece vocabulary's word-start marks). :func:`read_header` reads the header once; ``loading._load_gguf``
refuses what cannot load as the file says and applies the rest (:func:`with_rope_factors`, :func:`fit_tokenizer`,
:func:`with_end_of_text_ids`, which the built-in models' caches, made from GGUF files, take too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

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
    tokenizer_model: str = ""  # ``tokenizer.ggml.model``: "llama" (SentencePiece), "gpt2" (byte-level BPE), ...
    pre: str = ""  # ``tokenizer.ggml.pre``: the byte-level tokenizer's pre-tokenizer
    add_bos: bool | None = None  # ``tokenizer.ggml.add_bos_token``; None where the file does not say
    add_space_prefix: bool | None = None  # ``tokenizer.ggml.add_space_prefix``; None where the file does not say


def architecture(reader: Any) -> str:
    """The ``general.architecture`` of the file ``reader`` (a ``gguf.GGUFReader``) reads ("" where it has none)."""
    field = reader.fields.get("general.architecture")
    return "" if field is None else str(field.contents())


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

    def value(key: str) -> object:
        return fields[key].contents() if key in fields else None

    add_bos, prefix = value("tokenizer.ggml.add_bos_token"), value("tokenizer.ggml.add_space_prefix")
    return Header(architecture=architecture(reader),
                  tokens=len(tokens.data) if tokens is not None else 0,
                  end_ids=tuple(int(fields[k].contents()) for k in END_KEYS if k in fields),
                  rope_factors=factors, tokenizer_model=str(value("tokenizer.ggml.model") or ""),
                  pre=str(value("tokenizer.ggml.pre") or ""),
                  add_bos=None if add_bos is None else bool(add_bos),
                  add_space_prefix=None if prefix is None else bool(prefix))


#: byte-level pre-tokenizers whose files llama.cpp starts with a BOS where the header does not say (Llama 3's and
#: its kin's: their Hugging Face tokenizers add it in a post-processor, which the converter does not write down)
BOS_BY_DEFAULT = ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken")


def fit_tokenizer(tokenizer: Any, header: Header) -> Any:
    """``tokenizer`` (transformers' from the file) encoding prompts as llama.cpp encodes them from the file:
    a BOS where the file's pre-tokenizer starts with one by default (:data:`BOS_BY_DEFAULT`; transformers added
    none), and for a SentencePiece vocabulary the word-start mark before the text after each special token and
    none at all where ``add_space_prefix`` is false (transformers marked the first text only, and always: a chat
    template's ``<s>[INST]`` became ``<s>``, ``[`` where llama.cpp and the model's release have ``<s>``,
    ``\u2581[``)."""
    from tokenizers import pre_tokenizers

    if header.add_bos is None and header.pre in BOS_BY_DEFAULT and tokenizer.bos_token is not None:
        tokenizer.add_bos_token = True
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if header.tokenizer_model == "llama" and backend is not None \
            and isinstance(backend.pre_tokenizer, pre_tokenizers.Metaspace):
        meta = backend.pre_tokenizer
        meta.prepend_scheme = "never" if header.add_space_prefix is False else "always"
        backend.pre_tokenizer = meta
    return tokenizer


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


#: the spellings of the end-of-text tokens a GGUF's own runtime (llama.cpp) ends a generation at besides the file's
#: one EOS id
END_OF_TEXT = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|eom_id|>", "<end_of_turn>", "<|end|>",
               "<EOT>", "<end_of_utterance>")


def with_end_of_text_ids(model: torch.nn.Module, tokenizer: Any, file_ids: Sequence[int] = ()
                         ) -> tuple[torch.nn.Module, Any]:
    """A model converted from a GGUF file ends generations at the end-of-generation ids its header names
    (``file_ids``: EOS, end of turn, end of message) and at each end-of-text token its tokenizer adds to the vocabulary
    (``END_OF_TEXT``, special or not), not only at the file's one EOS id.

    A GGUF file holds no generation config: transformers makes one with the file's EOS alone (Qwen2.5's
    ``<|im_end|>``), where llama.cpp on the same file, and the model's own Hugging Face release, stop at
    ``<|endoftext|>`` too. Without it a code completion ran on past the end of its document into the next one of
    the training text (HumanEval 5: ``<|endoftext|><|fim_prefix|># Write a function ...``).
    """
    eos = model.generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    ids += [i for i in dict.fromkeys(file_ids) if i not in ids]
    ids += sorted(i for i, t in tokenizer.added_tokens_decoder.items()
                  if t.content in END_OF_TEXT and i not in ids and i < getattr(model.config, "vocab_size", i + 1))
    model.generation_config.eos_token_id = ids[0] if len(ids) == 1 else ids
    return model, tokenizer
