"""Tiny random HuggingFace causal LMs built in-process (no downloads), and their byte tokenizer.

Used by the test suite, the example and benchmark scripts, and sweeps over ``"tiny:..."`` model
names. Everything here is deterministic: the same arguments give the same weights.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch

#: model families a tiny model can be built from
FAMILIES = ("llama", "qwen2")


def _classes(family: str) -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if family not in classes:
        raise ValueError(f"tiny model family must be one of {', '.join(FAMILIES)}, got {family!r}")
    return classes[family]


def tiny_model(family: str = "llama", *, vocab: int = 64, seed: int = 0, attn: str = "sdpa", hidden: int = 32,
               layers: int = 2, scale: float = 1.0, max_positions: int = 512) -> torch.nn.Module:
    """A random model whose logits are scaled by ``scale`` (larger = peakier distributions) and whose
    context holds ``max_positions`` tokens."""
    config_cls, model_cls = _classes(family)
    config = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=max_positions, tie_word_embeddings=False, attn_implementation=attn)
    torch.manual_seed(seed)
    model = model_cls(config).eval().float()
    if scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
    model.requires_grad_(False)
    return model


#: the config of a tiny model of most families (``AutoConfig.for_model``); :data:`FAMILY_CONFIGS` names the others'
_BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=0,
             bos_token_id=1, eos_token_id=2)
_GPT = dict(vocab_size=96, n_positions=256, n_embd=32, n_layer=2, n_head=4, n_inner=64, tie_word_embeddings=False,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)
_NO_KV_HEADS = {k: v for k, v in _BASE.items() if k != "num_key_value_heads"}
_FULL = ["full_attention"] * 2
#: per family, a tiny config's settings where the base's do not fit it (no window where one is the default: a
#: window is checked apart)
FAMILY_CONFIGS: dict[str, dict[str, Any]] = {
    "mistral": dict(_BASE, sliding_window=None), "mixtral": dict(_BASE, num_local_experts=4, num_experts_per_tok=2,
                                                                 sliding_window=None),
    "qwen3_moe": dict(_BASE, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
    "gemma": dict(_BASE, head_dim=8), "gemma3_text": dict(_BASE, head_dim=8, layer_types=_FULL),
    "olmo3": dict(_BASE, layer_types=_FULL),
    "granite": dict(_BASE, embedding_multiplier=12.0, logits_scaling=0.5, residual_multiplier=0.22,
                    attention_multiplier=0.0078125),
    "gpt_neox": _NO_KV_HEADS, "persimmon": _NO_KV_HEADS, "gptj": dict(_GPT, rotary_dim=4),
    "starcoder2": dict(_BASE, sliding_window=None), "exaone4": dict(_BASE, layer_types=_FULL, sliding_window=None),
    **{f: dict(_BASE, head_dim=8) for f in ("helium", "glm", "glm4", "nemotron", "arcee", "seed_oss")},
    "opt": dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, ffn_dim=64, max_position_embeddings=256,
                word_embed_proj_dim=32, num_attention_heads=4, tie_word_embeddings=False, pad_token_id=0,
                bos_token_id=1, eos_token_id=2),
    "gpt2": _GPT, "gpt_bigcode": _GPT, "codegen": dict(_GPT, n_ctx=256, rotary_dim=4),
}


def tiny_family_model(family: str, *, seed: int = 0, scale: float = 4.0, **settings: Any) -> torch.nn.Module:
    """A tiny random model (float32, SDPA, vocabulary 96) of any family ``AutoConfig.for_model`` knows, its logits
    scaled by ``scale``: the base settings, or :data:`FAMILY_CONFIGS`' for ``family``, updated with ``settings``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(family, **{**FAMILY_CONFIGS.get(family, _BASE), **settings})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval().float()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    model.requires_grad_(False)
    model.generation_config.eos_token_id = None  # HF's greedy runs its max_new_tokens, as the engine's does
    return model


def perturbed_copy(model: torch.nn.Module, noise: float, seed: int = 1) -> torch.nn.Module:
    """A draft correlated with ``model``: each weight plus Gaussian noise of ``noise`` times its tensor's std."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            spread = p.std() if p.numel() > 1 else p.new_zeros(())  # (a one-element tensor has no spread)
            p.add_(noise * spread.nan_to_num(0.0) * torch.randn(p.shape, generator=g))
    return draft


def opposite_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A draft that ranks tokens in the reverse order of ``model`` (its top-1 is the target's least likely)."""
    draft = copy.deepcopy(model)
    with torch.no_grad():
        draft.lm_head.weight.neg_()
    return draft


def cycle_model(cycle: list[int], vocab: int = 64) -> torch.nn.Module:
    """A Llama whose greedy continuation follows ``cycle`` (t -> the token after t in it; a logit gap
    of 8, :func:`bigram_model`). Tokens off the cycle map to 0 (a gap of 4)."""
    table = torch.zeros(vocab, vocab)
    table[:, 0] = 4.0
    for a, b in zip(cycle, cycle[1:] + cycle[:1]):
        table[a] = 0.0
        table[a, b] = 8.0
    return bigram_model(table)


def bigram_model(logits: torch.Tensor) -> torch.nn.Module:
    """A Llama whose next-token logits depend only on the current token: ``logits[t]`` after token ``t``.

    Attention and MLP outputs are zeroed and the embedding is one-hot, so the last hidden state is
    ``sqrt(hidden)`` times the current token's unit vector (RMS norm); the LM head divides that back
    out. Lets a test write the exact conditional laws of a target and a draft."""
    vocab = logits.shape[0]
    if logits.shape != (vocab, vocab):
        raise ValueError(f"bigram logits must be a square [vocab, vocab] table, got {tuple(logits.shape)}")
    hidden = max(8, -(-vocab // 8) * 8)
    model = tiny_model("llama", vocab=vocab, hidden=hidden, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab, hidden))
        head = torch.zeros(vocab, hidden)
        head[:, :vocab] = logits.float().T / hidden**0.5
        model.lm_head.weight.copy_(head)
    return model


def model_key(model: torch.nn.Module) -> str:
    """A stable key of a model's architecture and weights (equal weights, equal key)."""
    h = hashlib.sha1(model.config.to_json_string(use_diff=False).encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


_GREEDY: dict[tuple, list[int]] = {}


def greedy_reference(model: torch.nn.Module, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    """The target's own greedy decoding through HF ``generate`` (cached by :func:`model_key`). The attention
    mask is given: HF infers one from the pad token otherwise, and would mask a prompt's own token 0."""
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos if eos is not None else 0
    key = (model_key(model), tuple(int(t) for t in prompt), int(n), eos)
    if key not in _GREEDY:
        with torch.no_grad():
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
        _GREEDY[key] = out[0, len(prompt):].tolist()
    return list(_GREEDY[key])


# ---------------------------------------------------------------------------------------------
# Named tiny models (sweeps) and their tokenizer

_SPEC_OPTIONS: dict[str, float] = {"seed": 0, "vocab": 64, "hidden": 32, "layers": 2, "scale": 1.0, "noise": 0.0,
                                   "noise_seed": 1}


def parse_tiny_spec(spec: str) -> tuple[str, dict[str, float]]:
    """The family and options of ``"tiny:FAMILY[:key=value]..."`` (:func:`tiny_from_spec`), checked without building
    the model: ValueError naming what is wrong."""
    parts = spec.split(":")
    if len(parts) < 2 or parts[0] != "tiny":
        raise ValueError(f"a tiny model spec looks like 'tiny:llama:seed=0', got {spec!r}")
    if parts[1] not in FAMILIES:
        raise ValueError(f"tiny model family must be one of {', '.join(FAMILIES)}, got {parts[1]!r} in {spec!r}")
    opts = dict(_SPEC_OPTIONS)
    for kv in (p for part in parts[2:] for p in part.split(",") if p):
        k, _, v = kv.partition("=")
        if k not in opts:
            raise ValueError(f"unknown tiny model option {k!r} in {spec!r}; known: {', '.join(opts)}")
        try:
            opts[k] = float(v)
        except ValueError:
            raise ValueError(f"tiny model option {k!r} in {spec!r} must be a number, got {v!r}") from None
    return parts[1], opts


def tiny_from_spec(spec: str) -> torch.nn.Module:
    """A tiny model from ``"tiny:FAMILY[:key=value]..."`` (keys: seed, vocab, hidden, layers, scale,
    noise, noise_seed); ``noise > 0`` is :func:`perturbed_copy` of the ``noise=0`` model of the same
    seed (a correlated draft). The spec becomes the model's ``_name_or_path``."""
    family, opts = parse_tiny_spec(spec)
    model = tiny_model(family, vocab=int(opts["vocab"]), seed=int(opts["seed"]), hidden=int(opts["hidden"]),
                       layers=int(opts["layers"]), scale=opts["scale"], max_positions=4096)
    if opts["noise"] > 0:
        model = perturbed_copy(model, opts["noise"], int(opts["noise_seed"]))
    model.config._name_or_path = spec
    return model


class ByteTokenizer:
    """Text -> UTF-8 bytes modulo ``vocab``: the tokenizer of the in-process tiny models.

    ``max_tokens > 0`` keeps the last ``max_tokens`` ids of a call (``tok(text)``).
    """

    def __init__(self, vocab: int, max_tokens: int = 0) -> None:
        self.vocab = vocab
        self.max_tokens = max_tokens
        self.pad_token_id = 0
        self.eos_token_id = None

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab for b in text.encode("utf-8")] or [0]

    def __call__(self, text: str) -> dict[str, list[int]]:
        ids = self.encode(text)
        return {"input_ids": ids[-self.max_tokens:] if self.max_tokens > 0 else ids}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return bytes(int(i) % 256 for i in ids).decode("utf-8", errors="replace")
