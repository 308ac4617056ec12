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


@pytest.mark.parametrize("family, positions", [("opt", None), ("gpt2", 64)])
def test_a_tuned_tree_times_a_model_inside_its_position_table(tmp_path, monkeypatch, family, positions):
    """OPT, GPT-2 and GPT-BigCode index a table of positions: the tuner's timings ran past a 256-position model's
    (a draft prefill of 512 tokens) and a tuned run died in an IndexError; they are held to the model's positions,
    HF's timed plain decoding too (128 + 12 tokens, past a 64-position model's)."""
    from treespec.recipes import Recipe

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path))
    target = tiny_family_model(family, **({"n_positions": positions} if positions else {}))
    draft = perturbed_copy(target, 0.1)
    out = treespec.run(Recipe(tree="chain", acceptance=[0.6, 0.3]), target, [draft], PROMPTS[0], max_new_tokens=8)
    assert out.new_tokens == greedy_reference(target, PROMPTS[0], 8)


def test_a_pilot_keeps_its_prompts_inside_a_sliding_window():
    """A pilot trimmed its prompts to the context only, so a run inside a window was refused for the pilot's length
    ("this one needs 25"); its prompts now end inside the window, and a window too short for it is named."""
    from treespec.calibrate.pilot import run_pilot

    target = tiny_family_model("phi3", sliding_window=40)
    seen = []

    def plain(ids, n):
        seen.append(len(ids))
        return treespec.generate(target, ids, [], max_new_tokens=n)

    pilot = run_pilot(plain, plain, target, [list(range(1, 61))], depth=1, chain=True, progress=False)
    assert set(seen) == {8} and pilot.steps > 0  # 40 positions less the pilot's 32 tokens
    with pytest.raises(ValueError, match=r"sliding window \(20 positions\) leaves no room for the pilot's 32"):
        run_pilot(plain, plain, tiny_family_model("phi3", sliding_window=20), [[1, 2]], depth=1, chain=True,
                  progress=False)


def test_prompts_past_a_window_are_refused_before_any_runs_or_is_measured():
    """``treespec generate`` checked each prompt's window when its turn came (after earlier records were written,
    the prompt unnamed or named by its place in a batch) and ``treespec accept`` not at all (a walk of another model
    than a run may use): both now refuse first, naming the prompt."""
    from treespec.calibrate.acceptance import measure
    from treespec.cli_input import check_context

    target = tiny_family_model("phi3", sliding_window=16)
    draft = perturbed_copy(target, 0.1)
    prompts = [[1] * 4, [2] * 3, [3] * 8]
    check_context(prompts[:2], 9, target, drafts=[draft])
    with pytest.raises(ValueError, match="prompt 3 of 3: the target model applies a sliding window of 16"):
        check_context(prompts, 9, target, drafts=[draft])
    with pytest.raises(ValueError, match="prompt 2 of 3: the target model applies a sliding window of 16"):
        measure(target, draft, prompts, width=2, max_new_tokens=9, max_depth=2, progress=False)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_int8_and_int4_refuse_a_model_whose_experts_are_no_linear_layers(family):
    """A mixture of experts keeps its experts as fused 3-D weights (transformers 5): int8/int4, which quantise Linear
    layers, left them (nearly all of a real MoE's weights) in float32 under an int4 name; they are refused, and the
    automatic choice does not offer them."""
    from treespec.models.precision import auto_precision, to_precision

    with pytest.raises(ValueError, match="fused expert weights"):
        to_precision(tiny_family_model(family), "int4")
    _, record = auto_precision(tiny_family_model(family), "draft", timer=lambda model, sizes: 1.0)
    assert set(record["seconds"]) <= {"float32", "bfloat16", "float16"}


def test_gpt2s_conv1d_layers_are_quantised_as_the_linear_layers_they_are():
    """GPT-2 keeps its projections in transformers' Conv1D (``x @ W + b``, ``W`` stored [in, out]), which int8 and
    int4 quantise as Linear layers: none is left in float32 (the int4 name would hide it), the converted layer
    computes what the Conv1D did, and the int8/int4 drafts keep the target's greedy output; an int4 target's is
    its own greedy decoding."""
    import torch
    from transformers.pytorch_utils import Conv1D

    from treespec.models.precision import to_precision
    from treespec.models.quantized import conv1d_as_linear

    target = tiny_family_model("gpt2")
    block = target.transformer.h[0].attn.c_attn
    x = torch.randn(3, block.weight.shape[0])
    want = block(x)
    converted = conv1d_as_linear(perturbed_copy(target, 0.0))
    assert not any(isinstance(m, Conv1D) for m in converted.modules())
    torch.testing.assert_close(converted.transformer.h[0].attn.c_attn(x), want, rtol=0, atol=1e-6)
    ref = greedy_reference(target, PROMPTS[0], TOKENS)
    for precision in ("int8", "int4"):
        draft = to_precision(perturbed_copy(target, 0.1), precision)
        assert not [m for m in draft.transformer.modules() if type(m) in (Conv1D, torch.nn.Linear)], precision
        out = treespec.generate(target, PROMPTS[0], [treespec.ModelDrafter(draft, kary((3, 2, 2)), "topk")],
                                max_new_tokens=TOKENS)
        assert out.new_tokens == ref, precision
    int4_target = to_precision(perturbed_copy(target, 0.0), "int4", twin="bfloat16")
    draft = to_precision(perturbed_copy(target, 0.1), "int8")
    out = treespec.generate(int4_target, PROMPTS[0], [treespec.ModelDrafter(draft, chain(4), "topk")],
                            max_new_tokens=TOKENS)
    assert out.new_tokens == greedy_reference(int4_target, PROMPTS[0], TOKENS)


def test_a_draft_of_fewer_positions_than_the_run_needs_is_refused_up_front():
    """A draft of the target's tokenizer whose position table (GPT-2: 64) the run outgrows: refused before anything
    runs, naming the draft's context, through the API (one prompt, a batch, a tuned run) and the CLI's check
    (before: an IndexError when the run passed 64 positions, mid-run)."""
    from treespec.cli_input import check_context
    from treespec.recipes import Recipe

    target = tiny_family_model("llama")
    draft = tiny_family_model("gpt2", n_positions=64)
    prompt = list(range(3, 50))
    drafter = treespec.ModelDrafter(draft, chain(4), "topk")
    with pytest.raises(ValueError, match="draft model's context is 64 positions and this run needs 67"):
        treespec.generate(target, prompt, [drafter], max_new_tokens=20)
    with pytest.raises(ValueError, match="prompt 1 of the batch: the draft model's context is 64"):
        treespec.run(Recipe(tree="chain", acceptance=[0.5]), target, [draft], [[3, 4], prompt], max_new_tokens=20)
    with pytest.raises(ValueError, match="draft model's context is 64"):
        check_context([prompt], 20, target, drafts=[draft])
    out = treespec.generate(target, prompt, [drafter], max_new_tokens=17)  # 64 positions: the run fits
    assert out.new_tokens == greedy_reference(target, prompt, 17)
