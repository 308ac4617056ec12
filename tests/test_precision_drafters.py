"""bfloat16, int8 and int4 drafters through ``generate`` with a float32 target, and the confidence stop."""

from __future__ import annotations

import copy

import pytest
import torch

import treespec
from treespec.models.quantized import Int4Linear
from stats import ALPHA, exact_joint, g_test
from test_exactness import K, PROMPT, sample_joint, trials
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model
from treespec.models.precision import precision_of, to_precision

BUSHY = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]
CHAIN = [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen2", vocab=64, hidden=64, scale=6, seed=0)
    return target, perturbed_copy(target, 0.3)


@pytest.mark.parametrize("precision", ["bfloat16", "int8", "int4"])
@pytest.mark.parametrize("mode", ["topk", "sample", "dynamic"])
def test_low_precision_drafter_greedy_equals_hf_greedy(pair, precision, mode):
    target, draft = pair
    low = to_precision(copy.deepcopy(draft), precision)
    assert precision_of(low) == precision
    for k, prompt in enumerate([[1, 5, 7, 9, 3], [4]]):
        drafter = (treespec.ModelDrafter(low, mode="dynamic", depth=4, topk=3, nodes=8) if mode == "dynamic"
                   else treespec.ModelDrafter(low, BUSHY, mode))
        out = treespec.generate(target, prompt, drafters=[drafter], max_new_tokens=30, seed=k)
        assert out.new_tokens == greedy_reference(target, prompt, 30)
        if mode != "sample":  # draws at temperature 1 are rarely the argmax; top-k guesses are
            assert out.stats.tau > 1.2  # the low-precision draft still gets its guesses accepted


@pytest.mark.parametrize("precision", ["bfloat16", "int8", "int4"])
def test_low_precision_draft_probabilities_are_float32(pair, precision):
    low = to_precision(copy.deepcopy(pair[1]), precision)
    drafter = treespec.ModelDrafter(low, BUSHY, "sample")
    drafter.reset([1, 2], sampling=treespec.SamplingParams(1.0), seed=0)
    props = drafter.propose([1, 2, 3])
    assert props.dists.dtype == torch.float32 and drafter.vocab_size == 64
    assert torch.allclose(props.dists.sum(-1), torch.ones(len(props.dists)), atol=1e-5)


@pytest.mark.parametrize("mode,kwargs", [("topk", {"shape": CHAIN}), ("topk", {"shape": BUSHY}),
                                         ("dynamic", {"depth": 5, "topk": 3, "nodes": 10})])
def test_confidence_stop_saves_draft_forwards_and_keeps_greedy_output(mode, kwargs):
    target = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=0)
    draft = perturbed_copy(target, 0.5)
    prompt = [1, 5, 7, 9, 3]
    ref = greedy_reference(target, prompt, 40)
    forwards = {}
    for stop in (None, 0.6):
        drafter = treespec.ModelDrafter(draft, mode=mode, min_confidence=stop, **kwargs)
        out = treespec.generate(target, prompt, drafters=[drafter], max_new_tokens=40)
        assert out.new_tokens == ref
        forwards[stop] = drafter.levels_forwarded / out.stats.steps
    assert forwards[0.6] < forwards[None]
    never = treespec.ModelDrafter(draft, mode=mode, min_confidence=0.0, **kwargs)  # nothing is below 0
    treespec.generate(target, prompt, drafters=[never], max_new_tokens=40)
    always = treespec.ModelDrafter(draft, mode=mode, min_confidence=1.0, **kwargs)  # a stop after level 1
    out = treespec.generate(target, prompt, drafters=[always], max_new_tokens=40)
    assert always.levels_forwarded == 0 and out.new_tokens == ref


def test_min_confidence_is_checked():
    with pytest.raises(ValueError, match="min_confidence"):
        treespec.ModelDrafter(tiny_model("llama"), CHAIN, min_confidence=1.5)


def test_shape_path_with_fractional_rank_is_refused():
    with pytest.raises(ValueError, match="non-integer"):
        treespec.ModelDrafter(tiny_model("llama"), [(0.5,)])


# --- the joint law with a quantised sampling drafter (G-test, 6-token vocabulary) ---------------
# test_exactness's pair with the draft quantised to int8, and its power calculation (``trials``): at T=1 the
# G-test detects the quantised draft's unverified first token with probability 0.99 from 1,250 trials (the
# 0.6-noise draft this test used before needed 9,200 for that, more than the 3,000 it ran:
# `python experiments/size_tests.py quantised`)

SMALL_BUSHY = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


@pytest.fixture(scope="module")
def small_pair():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    target = tiny_model("llama", vocab=6, hidden=16, layers=1, scale=3, seed=5)
    yield target, to_precision(perturbed_copy(target, 2.0, seed=2), "int8")
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", ["sample", "sample-confidence-stop", "sample_without_replacement-confidence-stop"])
def test_quantised_sampling_drafter_keeps_the_joint_law(small_pair, case):
    """The confidence stop at T=1 (tuned recipes use 0.1 when sampling), i.i.d. and without replacement."""
    target, draft = small_pair
    stop = 0.3 if case.endswith("confidence-stop") else None
    mode = case.removesuffix("-confidence-stop")
    counts = sample_joint(target, lambda: [treespec.ModelDrafter(draft, SMALL_BUSHY, mode, min_confidence=stop)],
                          f"int8-{case}", trials(target, draft, PROMPT, temperature=1.0), temperature=1.0)
    assert g_test(counts, exact_joint(target, PROMPT, K, 1.0)) > ALPHA


def test_an_int4_target_keeps_the_joint_law():
    """A quantised target (int4, its prompt on a bfloat16 twin of its own weights: no int8 twin) with a float draft:
    the output follows the int4 target's own law (test_exactness's power calculation), the law as loaded."""
    base = tiny_model("llama", vocab=6, hidden=32, layers=1, scale=3, seed=5)
    draft = perturbed_copy(base, 2.0, seed=2)
    target = to_precision(base, "int4", twin="bfloat16")
    assert sum(isinstance(m, Int4Linear) for m in target.modules()) == 7  # every layer but the 6-row head
    counts = sample_joint(target, lambda: [treespec.ModelDrafter(draft, SMALL_BUSHY, "sample")], "int4-target",
                          trials(target, draft, PROMPT, temperature=1.0), temperature=1.0)
    assert g_test(counts, exact_joint(target, PROMPT, K, 1.0)) > ALPHA
