"""Bad input gets an error that says what is wrong and how to fix it."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import treespec
from treespec.testing import tiny_model


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab=64)


def test_vocabulary_mismatch(target):
    draft = tiny_model("llama", vocab=80)
    with pytest.raises(ValueError, match="vocabulary of 80 tokens but the target has 64"):
        treespec.generate(target, [1, 2], drafters=[treespec.ModelDrafter(draft, [(0,)])], max_new_tokens=2)


def test_empty_shape(target):
    with pytest.raises(ValueError, match="shape is empty"):
        treespec.ModelDrafter(target, [])


@pytest.mark.parametrize("shape,fragment", [([(0, 0)], "ancestor-closed"), ([(1,)], "contiguous")])
def test_malformed_shape(target, shape, fragment):
    with pytest.raises(ValueError, match=fragment):
        treespec.ModelDrafter(target, shape)


def test_unknown_mode(target):
    with pytest.raises(ValueError, match="unknown ModelDrafter mode"):
        treespec.ModelDrafter(target, [(0,)], mode="beam")


@pytest.mark.parametrize("kwargs,fragment", [
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.01}, r"top_p must be in \(0, 1\]"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
    ({"budget": 0}, "budget must be an int >= 1"),
])
def test_bad_arguments(target, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        treespec.generate(target, [1, 2], **{"max_new_tokens": 2, **kwargs})


def test_batch_larger_than_one(target):
    with pytest.raises(ValueError, match="batch size 2 is not supported"):
        treespec.generate(target, torch.tensor([[1, 2], [3, 4]]), max_new_tokens=2)


def test_prompt_longer_than_context(target):
    with pytest.raises(ValueError, match="exceeds the model's context of 512 positions"):
        treespec.generate(target, list(range(60)) * 8, max_new_tokens=40)


def test_empty_prompt(target):
    with pytest.raises(ValueError, match="prompt is empty"):
        treespec.generate(target, [], max_new_tokens=2)


def test_unsupported_family():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    with pytest.raises(ValueError, match="model family 'gpt2' is not supported"):
        treespec.generate(gpt2, [1, 2], max_new_tokens=2)


def test_sliding_window_refused():
    model = tiny_model("qwen2")
    model.config.use_sliding_window = True
    with pytest.raises(ValueError, match="sliding-window"):
        treespec.generate(model, [1, 2], max_new_tokens=2)


def test_dynamic_arguments(target):
    with pytest.raises(ValueError, match="nodes must be an int >= 1"):
        treespec.ModelDrafter(target, mode="dynamic", nodes=0)
    with pytest.raises(ValueError, match="not a shape"):
        treespec.ModelDrafter(target, [(0,)], mode="dynamic")
