"""Tiny random HuggingFace causal LMs built in-process (no downloads)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

FAMILIES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def tiny_model(family: str = "llama", *, vocab: int = 64, seed: int = 0, attn: str = "sdpa",
               hidden: int = 32, layers: int = 2, scale: float = 1.0) -> torch.nn.Module:
    """A random model whose logits are scaled by ``scale`` (larger = peakier distributions)."""
    config_cls, model_cls = FAMILIES[family]
    config = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=512, tie_word_embeddings=False,
                        attn_implementation=attn)
    torch.manual_seed(seed)
    model = model_cls(config).eval().float()
    if scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
    return model


def perturbed_copy(model: torch.nn.Module, noise: float, seed: int = 1) -> torch.nn.Module:
    """A draft correlated with ``model``: each weight plus Gaussian noise of ``noise`` times its tensor's std."""
    import copy

    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std().nan_to_num(0.0) * torch.randn(p.shape, generator=g))
    return draft


def opposite_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A draft that ranks tokens in the reverse order of ``model`` (its top-1 is the target's least likely)."""
    import copy

    draft = copy.deepcopy(model)
    with torch.no_grad():
        draft.lm_head.weight.neg_()
    return draft


def greedy_reference(model: torch.nn.Module, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """The target's own greedy decoding through HF ``generate``."""
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos if eos is not None else 0
    out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n)
    return out[0, len(prompt):].tolist()


def cycle_model(cycle: list[int], vocab: int = 64) -> torch.nn.Module:
    """A Llama whose greedy continuation follows ``cycle`` (t -> the token after t in it).

    Attention and MLP outputs are zeroed, so the last hidden state is the normalised embedding of
    the current token; the LM head maps it to its successor. Tokens off the cycle map to 0.
    """
    model = tiny_model("llama", vocab=vocab, hidden=vocab, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        head = torch.zeros(vocab, vocab)
        head[0, :] = 0.5
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            head[:, a] = 0.0
            head[b, a] = 1.0
        model.lm_head.weight.copy_(head)
    return model
