"""Every admitted model family (``checks.SUPPORTED_FAMILIES``) takes a token tree through its stock forward: greedy
output equal to HF's own greedy decoding of a tiny random model of the family, on the eager step (a chain and a
bushy tree), a batch of prompts, and the captured step (uncompiled: its graphs' code). Inductor and int8/int4
drafts: ``experiments/check_families.py`` (minutes a family). A family that applies its sliding window in every layer
is held to runs inside it."""

from __future__ import annotations

import pytest

import treespec
from tree_builders import chain, kary
from treespec.core.checks import SUPPORTED_FAMILIES, sliding_window
from treespec.core.compiling import UNCOMPILED
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_family_model

PROMPTS = [[5, 9, 13, 2, 7, 30, 11, 4], [3]]
TOKENS = 16


@pytest.mark.parametrize("family", SUPPORTED_FAMILIES)
def test_a_family_decodes_a_tree_as_its_own_greedy_decoding(family):
    target = tiny_family_model(family)
    draft = perturbed_copy(target, 0.1)
    want = [greedy_reference(target, p, TOKENS) for p in PROMPTS]
    for shape in (chain(5), kary((3, 2, 2))):
        for p, ref in zip(PROMPTS, want):
            out = treespec.generate(target, p, [treespec.ModelDrafter(draft, shape, "topk")], max_new_tokens=TOKENS)
            assert out.new_tokens == ref, (family, shape.widths, p)
    batch = treespec.generate(target, PROMPTS, [treespec.ModelDrafter(draft, kary((3, 2, 2)), "topk")],
                              max_new_tokens=TOKENS)
    assert [row.new_tokens for row in batch.rows] == want
    captured = treespec.generate(target, PROMPTS[0], [treespec.ModelDrafter(draft, kary((3, 2, 2)), "topk")],
                                 max_new_tokens=TOKENS, compile=UNCOMPILED)
    assert captured.stats.step == "captured" and captured.new_tokens == want[0]


@pytest.mark.parametrize("family", ["mistral", "mixtral", "phi3", "starcoder2", "qwen3_moe"])
def test_a_window_every_layer_applies_holds_a_run_inside_it(family):
    """Phi-3 (its 4k checkpoints: 2047), Starcoder2 (4096), Mixtral and Qwen3-MoE apply a set window in every layer,
    as Mistral does; a tree's mask does not express it, so a run past it is refused and one inside it is exact (a
    hunt found Phi-3, Starcoder2 and Mixtral past their window parting from HF in every run, unrefused)."""
    target = tiny_family_model(family, sliding_window=12, **({"use_sliding_window": True}
                                                            if family == "qwen3_moe" else {}))
    assert sliding_window(target) == 12
    draft = perturbed_copy(target, 0.1)
    drafters = [treespec.ModelDrafter(draft, chain(3), "topk")]
    with pytest.raises(ValueError, match="sliding window of 12 positions"):
        treespec.generate(target, PROMPTS[0], drafters, max_new_tokens=8)
    out = treespec.generate(target, PROMPTS[0], drafters, max_new_tokens=4)
    assert out.new_tokens == greedy_reference(target, PROMPTS[0], 4)
