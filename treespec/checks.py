"""Input validation with errors that say what is wrong and how to fix it."""

from __future__ import annotations

from typing import Sequence

import torch

#: families whose stock HF modelling code takes a 4D tree mask with full (non-sliding) attention
SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


def check_model(model: torch.nn.Module, role: str = "target") -> None:
    """Refuse models whose attention cannot express a token tree."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"the {role} model family {family!r} is not supported for tree attention; supported: "
            f"{', '.join(SUPPORTED_FAMILIES)} (models with sliding-window or hybrid caches such as "
            "Gemma2/3 or Cohere2 need a different cache). Use a model of a supported family."
        )
    if getattr(config, "use_sliding_window", False) or (
        family == "mistral" and getattr(config, "sliding_window", None) is not None
    ):
        raise ValueError(
            f"the {role} model uses sliding-window attention, which a tree mask cannot express with "
            "the stock cache; use a checkpoint without a window (e.g. set config.sliding_window=None "
            "if the context stays within it)."
        )
    attn = getattr(config, "_attn_implementation", None)
    if attn not in (None, "sdpa", "eager"):
        raise ValueError(
            f"the {role} model uses attn_implementation={attn!r}, which cannot take a tree mask "
            "(FlashAttention cannot express one); load it with attn_implementation='sdpa'."
        )


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the model's logits: the LM head's output size (also for an int8-quantised head)."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    out = getattr(head, "out_features", None)  # a quantised Linear keeps its weight behind a method
    return int(out) if out is not None else int(model.config.vocab_size)


def check_vocab(target_vocab: int, drafter_vocab: int | None, name: str) -> None:
    if drafter_vocab is not None and drafter_vocab != target_vocab:
        raise ValueError(
            f"drafter {name} has a vocabulary of {drafter_vocab} tokens but the target has "
            f"{target_vocab}; a drafter must share the target's tokenizer and vocabulary. Use a draft "
            "model from the same family and tokenizer as the target."
        )


def as_prompt(input_ids: torch.Tensor | Sequence[int]) -> list[int]:
    """The single prompt of a batch-of-one ``[1, L]`` tensor (or a list of ints)."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(
                    f"batch size {input_ids.shape[0]} is not supported: treespec generates one sequence "
                    "at a time; call generate once per prompt with input_ids of shape [1, L]."
                )
            input_ids = input_ids[0]
        elif input_ids.dim() != 1:
            raise ValueError(f"input_ids must have shape [1, L] or [L], got {tuple(input_ids.shape)}")
        prompt = input_ids.tolist()
    else:
        prompt = [int(t) for t in input_ids]
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
    return prompt


def check_lengths(prompt_len: int, max_new_tokens: int, max_positions: int | None) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if max_positions is not None and prompt_len + max_new_tokens > max_positions:
        raise ValueError(
            f"the prompt ({prompt_len} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"context of {max_positions} positions; shorten the prompt or lower max_new_tokens."
        )


def check_budget(budget: int | None) -> None:
    if budget is not None and (not isinstance(budget, int) or budget < 1):
        raise ValueError(
            f"budget must be an int >= 1 (tokens per verification pass, root included), got {budget!r}; "
            "budget=1 verifies the root alone (plain decoding), None means no cap."
        )
