"""Precision as a measured choice: names, int8 quantisation, ``auto`` by timing, the cached decision."""

from __future__ import annotations

import json

import pytest
import torch

from test_models import GGUF_TOKENS, logits, tiny_qwen2, word_tokenizer
from treespec.models.tiny import tiny_model
from treespec.core import checks
from treespec.models import loading as models
from treespec.models import packaged
from treespec.models import precision
from treespec.common.machine import cpu_model
from treespec.models.precision import auto_precision, parse_precision, precision_of, to_precision


@pytest.mark.parametrize("given,name", [
    ("auto", "auto"), ("float32", "float32"), ("bf16", "bfloat16"), (torch.bfloat16, "bfloat16"),
    (torch.float16, "float16"), ("INT8", "int8"), ("torch.float32", "float32"), (torch.float32, "float32"),
    ("int4", "int4"), ("qint4", "int4"),
])
def test_parse_precision(given, name):
    assert parse_precision(given) == name


@pytest.mark.parametrize("bad", ["int2", torch.int8, 3, "fp8"])
def test_parse_precision_refuses_with_the_choices(bad):
    with pytest.raises(ValueError, match="auto"):
        parse_precision(bad)


def test_bfloat16_is_the_model_hf_loads_in_bfloat16(tmp_path):
    """Converting a float32 model to bfloat16 gives the model ``from_pretrained(dtype=torch.bfloat16)`` loads: the
    same logits to the bit, RoPE's frequencies kept in float32 as HF keeps them. Control: ``model.to`` rounds them
    too, and the logits move."""
    from transformers import AutoModelForCausalLM

    model = tiny_model("qwen2", vocab=96, hidden=64, max_positions=512)
    model.save_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    ids = torch.arange(300).remainder(96)[None]
    ours = to_precision(model, "bfloat16")
    assert ours.model.rotary_emb.inv_freq.dtype == torch.float32 and precision_of(ours) == "bfloat16"
    assert torch.equal(ours(ids).logits, hf(ids).logits)
    rounded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval().to(torch.bfloat16)
    assert not torch.equal(rounded(ids).logits, hf(ids).logits)


def test_int8_quantises_every_linear_and_keeps_the_vocab_readable():
    model = tiny_model("qwen2", vocab=96, hidden=64)
    ref = model(torch.tensor([[1, 2, 3, 4]])).logits
    to_precision(model, "int8")
    assert precision_of(model) == "int8"
    assert not any(type(m) is torch.nn.Linear for m in model.modules())  # the LM head included
    assert checks.vocab_size(model) == 96
    out = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert (out - ref).abs().max() < 0.1 * ref.abs().max()  # close, not equal: int8 weights
    with pytest.raises(ValueError, match="float32"):
        to_precision(tiny_model("llama").to(torch.bfloat16), "int8")


def fake_timer(costs, calls):
    def timer(model, sizes):
        calls.append(precision_of(model))
        return costs[precision_of(model)]
    return timer


@pytest.mark.parametrize("role,costs,expected", [
    ("target", {"float32": 0.3, "bfloat16": 0.1}, "bfloat16"),
    ("target", {"float32": 0.1, "bfloat16": 0.3}, "float32"),
    ("draft", {"float32": 0.3, "bfloat16": 0.2, "int8": 0.1, "int4": 0.15}, "int8"),
    ("draft", {"float32": 0.3, "bfloat16": 0.05, "int8": 0.1, "int4": 0.15}, "bfloat16"),
    ("draft", {"float32": 0.3, "bfloat16": 0.2, "int8": 0.1, "int4": 0.05}, "int4"),
])
def test_auto_keeps_the_fastest_measured(role, costs, expected, tmp_path):
    calls: list[str] = []
    model, record = auto_precision(tiny_model("llama"), role, name="m", decisions=tmp_path / "d.json",
                                   timer=fake_timer(costs, calls))
    assert precision_of(model) == expected and record["precision"] == expected and not record["cached"]
    assert sorted(calls) == sorted(precision.AUTO_CANDIDATES[role]) and record["seconds"] == costs
    # the decision is cached: a second load converts without measuring
    calls.clear()
    again, record2 = auto_precision(tiny_model("llama"), role, name="m", decisions=tmp_path / "d.json",
                                    timer=fake_timer(costs, calls))
    assert calls == [] and record2["cached"] and precision_of(again) == expected
    assert expected in precision.describe_choice(record2)


def test_auto_for_a_compiled_step_times_traceable_precisions_only(tmp_path):
    calls: list[str] = []
    costs = {"float32": 0.3, "bfloat16": 0.2, "int8": 0.05, "int4": 0.1}
    model, record = auto_precision(tiny_model("llama"), "draft", name="m", decisions=tmp_path / "d.json",
                                   timer=fake_timer(costs, calls), traceable=True)
    assert "int8" not in calls and precision_of(model) == "int4" and "traceable" in record["key"]
    eager, record2 = auto_precision(tiny_model("llama"), "draft", name="m", decisions=tmp_path / "d.json",
                                    timer=fake_timer(costs, calls))  # decided apart: int8 wins the eager step
    assert precision_of(eager) == "int8" and not record2["cached"]


def test_auto_decision_key_names_model_role_device_cpu_and_threads(tmp_path):
    path = tmp_path / "d.json"
    auto_precision(tiny_model("llama"), "draft", name="m", decisions=path,
                   timer=fake_timer({"float32": 1, "bfloat16": 2, "int8": 3, "int4": 4}, []))
    (key,) = json.loads(path.read_text())
    assert key.startswith("m|draft|cpu|") and cpu_model() in key and "threads=" in key
    assert f"threads={torch.get_num_threads()}" in key
    threads = torch.get_num_threads()
    try:  # another thread count is another machine as far as timings go: measure again
        torch.set_num_threads(threads + 1)
        calls: list[str] = []
        auto_precision(tiny_model("llama"), "draft", name="m", decisions=path,
                       timer=fake_timer({"float32": 1, "bfloat16": 2, "int8": 3, "int4": 4}, calls))
        assert calls and len(json.loads(path.read_text())) == 2
    finally:
        torch.set_num_threads(threads)


def test_auto_with_the_real_timer_measures(tmp_path):
    torch.manual_seed(0)
    model, record = auto_precision(tiny_model("llama", vocab=64, hidden=32), "draft", name="tiny",
                                   decisions=tmp_path / "d.json")
    assert set(record["seconds"]) == {"float32", "bfloat16", "int8", "int4"}
    assert all(s > 0 for s in record["seconds"].values())
    assert record["precision"] == min(record["seconds"], key=record["seconds"].get) == precision_of(model)


def test_load_with_dtype_auto_and_int8(tmp_path, monkeypatch):
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    model = tiny_qwen2()
    packaged.save_dequantized(model, word_tokenizer(GGUF_TOKENS), tmp_path / "ckpt")
    monkeypatch.setattr(precision, "default_timer",
                        lambda m, sizes: {"float32": 2.0, "bfloat16": 1.0, "int8": 3.0}[precision_of(m)])
    loaded, _ = models.load(tmp_path / "ckpt", dtype="auto", role="target")
    assert loaded.dtype == torch.bfloat16 and loaded.treespec_precision["precision"] == "bfloat16"
    assert (tmp_path / "cache" / models.PRECISION_DECISIONS).is_file()
    draft, _ = models.load(tmp_path / "ckpt", dtype="int8", role="draft")
    assert precision_of(draft) == "int8" and draft.treespec_precision["precision"] == "int8"
    assert torch.allclose(logits(draft), logits(model), atol=0.5)
    draft4, _ = models.load(tmp_path / "ckpt", dtype="int4", role="draft")
    assert precision_of(draft4) == "int4" and draft4.treespec_precision["precision"] == "int4"
    assert torch.allclose(logits(draft4), logits(model), atol=0.5)
    with pytest.raises(ValueError, match="role"):
        models.load(tmp_path / "ckpt", role="drafter")


def test_unknown_name_never_touches_the_hub_unless_allowed(tmp_path, monkeypatch):
    calls = []

    def fake(source, dtype, **kwargs):
        calls.append(kwargs.get("local_files_only", False))
        raise OSError("not cached")

    monkeypatch.setattr(models, "_from_pretrained", fake)
    monkeypatch.setattr(models, "_hub_offline", lambda: False)
    with pytest.raises(OSError, match="not a built-in name") as info:
        models.load("no-such-org/no-such-model", cache_dir=tmp_path)
    assert calls == [True]  # the local HF cache only
    message = str(info.value)
    assert "allow_download=True" in message and "local directory" in message and "local Hugging Face cache" in message
    calls.clear()
    with pytest.raises(OSError, match="could not be fetched from the hub"):
        models.load("no-such-org/no-such-model", cache_dir=tmp_path, allow_download=True)
    assert calls == [True, False]


def test_int4_refuses_a_model_no_layer_of_which_fits_its_kernel():
    """Hidden size 24 fits no int4 group: every layer would keep float32 weights, and the model was returned as
    int4 (``load`` recorded it so) while it ran in float32."""
    from treespec.models.precision import to_precision
    from treespec.models.tiny import tiny_model

    with pytest.raises(ValueError, match="no Linear layer of this model fits the int4 kernel"):
        to_precision(tiny_model("llama", vocab=48, hidden=24), "int4")
