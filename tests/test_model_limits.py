"""What a model's attention and RoPE allow under a tree mask: a sliding window the run stays inside, LongRoPE's
short-factor range; beyond them a run is refused in one line, never run with output that parts from the model's.
And a model the engine refuses is refused before a tuned recipe times it."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, \
    MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

import treespec
from treespec.calibrate.vectors import default_acceptance
from treespec.models.tiny import perturbed_copy

SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
TREE = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)]


def built(config_cls, model_cls, seed: int = 0, **extra) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = model_cls(config_cls(**SIZES, **extra)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # peaky: the draft's proposals are often accepted, so trees go deep
    return model.requires_grad_(False)


def greedy_pair(model: torch.nn.Module, prompt: list[int], n: int) -> tuple[list[int], list[int]]:
    """(treespec's greedy tokens with a perturbed copy drafting TREE, HF generate's greedy tokens)."""
    drafter = treespec.ModelDrafter(perturbed_copy(model, 0.1), TREE, "topk")
    ours = treespec.generate(model, prompt, drafters=[drafter], max_new_tokens=n).new_tokens
    hf = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=[],
                        pad_token_id=0)[0, len(prompt):].tolist()
    return ours, hf


@pytest.mark.parametrize("kind", ["qwen2", "qwen2 flag off after loading", "mistral"])
def test_a_sliding_window_is_allowed_while_the_run_fits_it(kind):
    """A tree's 4D mask replaces the model's windowed mask: exact while every position fits the window, refused
    past it. A Qwen2 whose ``use_sliding_window`` is turned off after loading still applies its window (HF builds
    the mask from ``layer_types``): admitted before, its output parted from HF's in 6 of 6 runs."""
    if kind == "mistral":
        model = built(MistralConfig, MistralForCausalLM, sliding_window=24)
    else:
        model = built(Qwen2Config, Qwen2ForCausalLM, sliding_window=24, use_sliding_window=True, max_window_layers=0)
        if kind != "qwen2":
            model.config.use_sliding_window = False
    prompt = [5, 9, 13, 2, 7, 30, 11, 4]
    ours, hf = greedy_pair(model, prompt, 16)  # 24 positions: inside the window
    assert ours == hf
    with pytest.raises(ValueError, match="sliding window of 24 positions, which a tree mask does not express: runs "
                                         "of prompt plus max_new_tokens up to 24 positions are exact, this one "
                                         "needs 28"):
        treespec.generate(model, prompt, max_new_tokens=20)


def test_longrope_runs_inside_its_short_factor_range_and_is_refused_past_it():
    """HF switches a LongRoPE model's whole forward to its long factors once the forward's last position reaches
    ``original_max_position_embeddings``; a tree forward's deepest node reaches it before one-token decoding
    would switch, so the accepted tokens were rotated otherwise (2-5 of 12 runs parted from HF). Runs inside the
    short range are exact; a run past it is refused, saying why."""
    head = SIZES["hidden_size"] // SIZES["num_attention_heads"]
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32,
            "short_factor": [1.0] * (head // 2), "long_factor": [4.0 + i for i in range(head // 2)]}
    model = built(LlamaConfig, LlamaForCausalLM, seed=3, rope_parameters=rope)
    for prompt in ([5, 9, 13], [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3]):
        ours, hf = greedy_pair(model, prompt, 32 - len(prompt))
        assert ours == hf
    with pytest.raises(ValueError, match="exceeds the model's context of 32 positions \\(its LongRoPE switches to "
                                         "long factors past 32 positions"):
        treespec.generate(model, [5, 9, 13], max_new_tokens=30)


def test_a_tuned_recipe_refuses_an_unsupported_model_before_timing_it():
    """``treespec.run`` of a recipe the tuner sizes profiled the model first: a family the engine refuses failed
    inside the tuner's forwards (Bloom: "too many values to unpack", Mamba: an IndexError)."""
    from transformers import BloomConfig, BloomForCausalLM

    bloom = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=2)).eval()
    recipe = treespec.Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0))
    with pytest.raises(ValueError, match="model family 'bloom' is not supported"):
        treespec.run(recipe, bloom, [bloom], [1, 2, 3], max_new_tokens=4)
