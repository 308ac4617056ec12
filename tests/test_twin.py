"""An int4 target's prompts on its layers' bfloat16 twins or on their kernels, as measured here
(``treespec.models.twin``): the faster is kept (the twins dropped otherwise), the LM head is not timed, the choice is
cached and read back, and ``load`` takes it as asked."""

from __future__ import annotations

import pytest

from test_models import GGUF_TOKENS, tiny_qwen2, word_tokenizer
from treespec.models import loading as models
from treespec.models import packaged
from treespec.models.precision import to_precision
from treespec.models.quantized import BFloat16Linear, KernelLinear
from treespec.models.tiny import greedy_reference, tiny_model
from treespec.models.twin import auto_twin, prompt_seconds


def int4_target():
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2, seed=3)
    return to_precision(model, "int4", twin="bfloat16")


def twins(model) -> int:
    return sum(isinstance(m, KernelLinear) and isinstance(m.wide, BFloat16Linear) for m in model.modules())


@pytest.mark.parametrize("faster", ["twin", "kernel"])
def test_the_faster_is_kept_and_cached(tmp_path, faster):
    model = int4_target()
    assert twins(model) == 15  # 7 a layer, and the LM head
    timed = []

    def timer(layers, on_twins):
        timed.append(layers)
        return 1.0 if on_twins == (faster == "twin") else 2.0

    prompt = [5, 9, 2, 7] * 10  # 40 tokens: a prompt wide enough for the twins
    expected = greedy_reference(model, prompt, 6)  # the model with its twins
    decisions = tmp_path / "twin.json"
    kept, record = auto_twin(model, name="tiny", decisions=decisions, timer=timer)
    assert record["prompt"] == faster and not record["cached"] and record["seconds"] == {
        "twin": 1.0 if faster == "twin" else 2.0, "kernel": 2.0 if faster == "twin" else 1.0}
    assert twins(kept) == (15 if faster == "twin" else 0)
    assert all(model.lm_head is not layer for layers in timed for layer in layers)  # the head takes one row
    assert len(timed[0]) == 1  # the largest int4 layer (no int8 layer here)
    # the same model either way, up to bfloat16 rounding: its greedy tokens here
    assert greedy_reference(kept, prompt, 6) == expected
    again, cached = auto_twin(int4_target(), name="tiny", decisions=decisions,
                              timer=lambda *_: pytest.fail("a cached decision is not measured again"))
    assert cached["prompt"] == faster and cached["cached"] and twins(again) == twins(kept)


def test_prompt_seconds_times_the_twin_and_the_kernel():
    layer = next(m for m in int4_target().modules() if isinstance(m, KernelLinear))
    assert prompt_seconds([layer], True) > 0 and prompt_seconds([layer], False) > 0


def test_load_takes_the_choice_as_asked(tmp_path):
    with pytest.raises(ValueError, match="prompt_twin must be one of auto, twin, kernel"):
        models.load(tmp_path, dtype="int4", prompt_twin="bfloat16")
    packaged.save_dequantized(tiny_qwen2(), word_tokenizer(GGUF_TOKENS), tmp_path / "ckpt")
    for choice, kept in (("twin", 14), ("kernel", 0)):
        target, _ = models.load(tmp_path / "ckpt", dtype="int4", prompt_twin=choice)
        assert twins(target) == kept and target.treespec_precision["prompt_twin"]["prompt"] == choice
    draft, _ = models.load(tmp_path / "ckpt", dtype="int4", role="draft")  # a draft's twins are int8: untouched
    assert "prompt_twin" not in draft.treespec_precision
    assert all(m.wide is not None for m in draft.modules() if isinstance(m, KernelLinear))


def test_load_measures_once_and_then_builds_no_twins_it_would_drop(tmp_path, monkeypatch):
    """``prompt_twin="auto"``: the first load builds the twins, times them against the kernels (here the kernels
    win) and drops them; a later load reads the decision and builds none."""
    from treespec.models import quantized, twin

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    packaged.save_dequantized(tiny_qwen2(), word_tokenizer(GGUF_TOKENS), tmp_path / "ckpt")
    monkeypatch.setattr(twin, "prompt_seconds", lambda layers, on_twins: 2.0 if on_twins else 1.0)
    first, _ = models.load(tmp_path / "ckpt", dtype="int4")
    record = first.treespec_precision["prompt_twin"]
    assert record["prompt"] == "kernel" and not record["cached"] and twins(first) == 0
    monkeypatch.setattr(twin, "prompt_seconds", lambda *_: pytest.fail("a cached decision is not measured again"))
    built = []  # each int4 layer's twin argument
    make = quantized.Int4Linear.from_groups.__func__
    monkeypatch.setattr(quantized.Int4Linear, "from_groups",
                        classmethod(lambda cls, *a, **k: built.append(a[4] if len(a) > 4 else k.get("twin"))
                                    or make(cls, *a, **k)))
    again, _ = models.load(tmp_path / "ckpt", dtype="int4")
    assert again.treespec_precision["prompt_twin"]["cached"] and twins(again) == 0
    assert built and set(built) == {None}  # no twin built
    assert greedy_reference(again, [5, 9, 2, 7] * 10, 6) == greedy_reference(first, [5, 9, 2, 7] * 10, 6)


def test_a_timing_with_the_twins_is_not_read_back_for_the_model_without_them():
    """The tuner's profile key (and the pilots') tells an int4 target whose prompts run on its kernels from the same
    model with its twins: a tree of ``PROMPT_ROWS`` tokens or more forwards on the twins in one and on the kernels in
    the other (on a CPU without bfloat16 arithmetic, the slower), so a profile timed with the twins is not theirs."""
    from treespec.calibrate.tuning import _key
    from treespec.models.precision import kernel_tags
    from treespec.models.quantized import without_twins

    target, draft = int4_target(), to_precision(tiny_model("qwen2", vocab=64, hidden=32, layers=1, seed=4), "int4")
    with_twins = _key(target, draft)
    assert kernel_tags(target, draft) == []  # the draft keeps its int8 twins
    without_twins(target)
    assert kernel_tags(target, draft) == ["twins=none"]
    assert _key(target, draft) != with_twins and _key(target, draft).replace("|twins=none", "") == with_twins
