"""Random-weight Qwen2 models in the real pair's configs (or tiny ones, for the smoke), and a weak draft."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

# Qwen2.5-Coder-{1.5B,0.5B}-Instruct (HF config.json; the GGUF-dequantised copies agree except that
# they untie the LM head, which does not change the cost of a forward).
REAL = {
    "target": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                   intermediate_size=8960),
    "draft": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, use_sliding_window=False)
# the smoke checks the script's paths: layers cost compile time (dynamo traces each), so as few as the checks need
TINY = {
    "target": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128),
    "draft": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=64),
}
# untied: a tiny random model with a tied head repeats its last token, and every draft then agrees
TINY_COMMON = dict(COMMON, vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False)


def build(kind: str, tiny: bool, dtype: torch.dtype, device: torch.device, seed: int,
          layers: int | None = None) -> torch.nn.Module:
    """A Qwen2 model of the real (or tiny) ``kind`` config with random weights; ``layers`` overrides depth."""
    sizes = dict((TINY if tiny else REAL)[kind])
    if layers is not None:
        sizes["num_hidden_layers"] = layers
    cfg = Qwen2Config(**sizes, **(TINY_COMMON if tiny else COMMON), attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype).eval()


def weak_draft(target: torch.nn.Module, layers: int, noise: float = 2.0, seed: int = 2) -> torch.nn.Module:
    """The target's first ``layers`` layers with its embeddings, final norm and head, every weight
    perturbed by Gaussian noise of ``noise`` times its tensor's std: a draft that agrees with the
    target sometimes, not always (random weights give no real draft; a truncated copy alone agrees
    almost always on tiny random models)."""
    settings = {**target.config.to_dict(), "num_hidden_layers": layers}
    settings.pop("layer_types", None)  # derived from the number of layers
    cfg = Qwen2Config(**settings)
    p = next(target.parameters())
    with torch.device(p.device):
        draft = Qwen2ForCausalLM(cfg).to(p.dtype).eval()
    draft.load_state_dict(target.state_dict(), strict=False)  # the missing layers are simply not copied
    g = torch.Generator(p.device).manual_seed(seed)
    with torch.no_grad():
        for w in draft.parameters():
            if w.numel() > 1:
                w.add_(noise * w.float().std().to(w.dtype) * torch.randn(w.shape, generator=g, device=w.device,
                                                                         dtype=w.dtype))
    return draft
