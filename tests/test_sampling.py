"""Standardised sampling follows HuggingFace's conventions (temperature, then top-k, then top-p)."""

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from treespec.core.sampling import SamplingParams, standardize


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 5, 1.0),
                                                     (1.0, 0, 0.9), (0.6, 10, 0.8), (1.3, 3, 0.5)])
def test_matches_hf_warpers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(8, 50) * 3
    warpers = LogitsProcessorList([TemperatureLogitsWarper(temperature)])
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    ref = torch.softmax(warpers(None, logits.clone()), -1)
    torch.testing.assert_close(standardize(logits, temperature, top_k, top_p), ref)


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0]])
    assert standardize(logits, 0.0).tolist() == [[0.0, 1.0, 0.0]]


def test_top_p_keeps_smallest_set_reaching_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    out = standardize(probs.log(), 1.0, 0, 0.8)
    assert torch.allclose(out, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    out = standardize(probs.log(), 1.0, 0, 0.81)
    assert (out > 0).tolist() == [True, True, True, False]


def test_the_top_p_boundary_keeps_hfs_tokens_at_ties_and_rounding():
    """The nucleus is HF's token for token where ties or rounding decide its last member: tied tokens
    ([0.3, 0.3, 0.4] at top_p 0.5: HF keeps tokens 1 and 2), and a large vocabulary of bfloat16-rounded logits,
    where a formulation over the descending order kept another set in 195 of 200 rows."""
    def hf(logits, top_p):
        return torch.softmax(TopPLogitsWarper(top_p)(None, logits.clone()), -1)

    tied = torch.tensor([[0.3, 0.3, 0.4]]).log()
    assert torch.equal(standardize(tied, 1.0, 0, 0.5) > 0, hf(tied, 0.5) > 0)
    torch.manual_seed(0)
    logits = (torch.randn(200, 32000) * 2).bfloat16().float()
    assert torch.equal(standardize(logits, 1.0, 0, 0.9) > 0, hf(logits, 0.9) > 0)


@pytest.mark.parametrize("kwargs,fragment", [({"temperature": -0.1}, "temperature must be >= 0"),
                                            ({"temperature": 1e-39}, "overflow float32"),
                                            ({"top_p": 0.0}, "top_p must be in (0, 1]"),
                                            ({"top_p": 1.5}, "top_p must be in (0, 1]"),
                                            ({"top_k": -1}, "top_k must be")])
def test_bad_parameters(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        SamplingParams(**kwargs)
