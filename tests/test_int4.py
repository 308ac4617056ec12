"""int4 drafts (``treespec.models.quantized``): the kernel computes with the quantised weights it was given, layers
the kernel cannot take stay float, and an int4 draft runs in every step (eager, host-drafted compiled, captured)
with the target's greedy output. The step tests here run the compiled steps' functions uncompiled
(``UNCOMPILED``): the captured step's graphs with an int4 draft are traced and compiled, and checked against the
target's greedy output, under inductor with weight freezing in tests/test_freezing.py (the same tiny pair)."""

from __future__ import annotations


import pytest
import torch

import treespec
from treespec.core import checks
from treespec.core.compiling import UNCOMPILED
from treespec.models import quantized as int4
from treespec.models.precision import precision_of, to_precision
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

# Int4Linear.from_linear called directly builds its int8 twin with torch.ao, whose quantised tensors warn that they
# are deprecated (quantize_int4 and quantize_int8 silence it for their calls)
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor, torch.quantize_per_channel:UserWarning")

def _dequantised(layer: int4.Int4Linear, linear: torch.nn.Linear) -> torch.Tensor:
    """The weight the codes stand for, rebuilt independently of the kernel's packed layout: each group's
    minimum plus its code times its step, codes recomputed from the float weight."""
    w = linear.weight.detach().float()
    n, k = w.shape
    g = w.view(n, k // layer.group_size, layer.group_size)
    low, high = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    step = (high - low) / 15
    codes = ((g - low) / step).round().clamp(0, 15)
    scale, zero = layer.scales_and_zeros.float().unbind(-1)  # [k / group, n] each, bfloat16-rounded
    return ((codes - 8) * scale.t()[..., None] + zero.t()[..., None]).view(n, k)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_the_kernel_multiplies_by_the_quantised_weight(group):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 48, bias=True)
    layer = int4.Int4Linear.from_linear(linear, group)
    x = torch.randn(5, 256)
    expected = x.bfloat16().float() @ _dequantised(layer, linear).t() + linear.bias
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (5, 48)
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)  # bfloat16 accumulation and output
    # and the quantised weight is within half a step of the float one
    w = _dequantised(layer, linear)
    steps = (layer.scales_and_zeros[..., 0].float().t().repeat_interleave(group, 1))
    assert ((w - linear.weight).abs() <= 0.5 * steps + 1e-2).all()
    # a negative control: another group size's codes would not match
    other = int4.Int4Linear.from_linear(linear, 64 if group != 64 else 32)
    assert not torch.allclose(other(x), expected, rtol=2e-3, atol=2e-3)


def test_batched_rows_are_independent():
    torch.manual_seed(1)
    layer = int4.Int4Linear.from_linear(torch.nn.Linear(64, 32, bias=False))
    x = torch.randn(2, 3, 64)
    out = layer(x)
    assert out.shape == (2, 3, 32)
    torch.testing.assert_close(out[1, 2], layer(x[1, 2:3])[0])


def test_wide_inputs_take_the_int8_twin_outside_compile_only():
    torch.manual_seed(2)
    linear = torch.nn.Linear(128, 32)
    layer = int4.Int4Linear.from_linear(linear)
    x = torch.randn(int4.WIDE_ROWS, 128)
    assert torch.equal(layer(x), layer.wide(x))  # a prompt-wide input: fbgemm int8
    narrow = layer(x[:4])
    assert not torch.equal(narrow, layer.wide(x[:4]))  # a few rows: the int4 kernel
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)  # traced: always the int4 kernel
    torch.testing.assert_close(compiled[:4], narrow)
    torch.testing.assert_close(layer(x), linear(x), rtol=0.05, atol=0.05)
    assert not any(type(m).__module__.startswith("torch.ao") for m in layer.modules())  # still traceable


def test_a_targets_bfloat16_twins_hold_the_kernels_own_weights_bit_for_bit():
    """A quantised target's prompt runs on bfloat16 twins of its kernel weights (the module doc): the weights the
    kernels multiply with, read back through an identity input, equal the twins bit for bit, for the int4 kernel
    (a file's codes, scales and offsets) and the int8 one (a weight rounded per row). Control: the same twin
    computed in bfloat16 arithmetic (rounded twice) is not the kernel's."""
    torch.manual_seed(0)
    n, k, group = 64, 256, 32
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    layer = int4.Int4Linear.from_groups(codes, torch.rand(n, k // group) * 0.1, torch.randn(n, k // group) * 0.1,
                                        None, "bfloat16")
    eye = torch.eye(k, dtype=torch.bfloat16)
    kernel_weight = layer.kernel(eye).t()
    assert torch.equal(kernel_weight.view(torch.int16), layer.wide.weight.view(torch.int16))
    scale, zero = (g.t().repeat_interleave(group, dim=1) for g in layer.scales_and_zeros.unbind(-1))
    rounded_twice = (codes.to(torch.bfloat16) - 8) * scale + zero
    assert not torch.equal(kernel_weight, rounded_twice)
    int8 = int4.Int8Linear.from_weight(torch.randn(n, k))
    assert torch.equal(int8.kernel(eye).t().view(torch.int16), int8.wide.weight.view(torch.int16))


def test_quantize_int4_keeps_layers_the_kernel_cannot_take_in_float():
    model = tiny_model("qwen2", vocab=40, hidden=64)  # a 40-token head: not a multiple of 16
    ref = model(torch.tensor([[1, 2, 3, 4]])).logits
    to_precision(model, "int4")
    assert precision_of(model) == "int4"
    assert isinstance(model.lm_head, torch.nn.Linear) and checks.vocab_size(model) == 40
    assert isinstance(model.model.layers[0].mlp.down_proj, int4.Int4Linear)
    assert model.model.layers[0].self_attn.k_proj.group_size == 64
    out = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert out.dtype == torch.float32 and (out - ref).abs().max() < 0.15 * ref.abs().max()
    assert int4.group_size_for(torch.nn.Linear(96, 32)) == 32 and int4.group_size_for(torch.nn.Linear(64, 24)) is None


def test_int4_refusals():
    with pytest.raises(ValueError, match="float32"):
        to_precision(tiny_model("llama").to(torch.bfloat16), "int4")
    with pytest.raises(ValueError, match="group_size"):
        int4.quantize_int4(tiny_model("llama"), group_size=48)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=0)
    return target, to_precision(perturbed_copy(target, 0.3), "int4")


SHAPE = [(0,), (1,), (0, 0), (0, 0, 0)]


@pytest.mark.parametrize("compile", [False, UNCOMPILED], ids=["eager", "captured"])
def test_int4_draft_greedy_equals_the_target(pair, compile):
    target, draft = pair
    prompt = [1, 5, 7, 9, 3]
    out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, SHAPE, "topk")],
                            max_new_tokens=24, compile=compile)
    assert out.new_tokens == greedy_reference(target, prompt, 24)
    assert out.stats.tau > 1.5
    if compile:
        assert out.stats.step == "captured"  # an int4 draft is traced (torch.ao's int8 is refused)
        int8 = to_precision(perturbed_copy(target, 0.3), "int8")
        host = treespec.generate(target, prompt, [treespec.ModelDrafter(int8, [(0,), (0, 0)], "topk")],
                                 max_new_tokens=8, compile=compile)
        assert host.stats.step.startswith("compiled, drafted on the host")


@pytest.mark.parametrize("drafters", ["none", "ngram", "model"])
def test_an_int4_target_runs_every_compiled_step(drafters):
    """An int4 target (its prompt on its bfloat16 twins, eagerly: ``prefill.EagerPrefill``) through the compiled step
    drafted on the host (plain decoding, the n-gram drafter) and the captured one (a model draft): the greedy output
    of the int4 model as loaded. (The host-drafted step called its prefill as one prompt, which only the compiled
    one took: a TypeError before.)"""
    target = to_precision(tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=0), "int4",
                          twin="bfloat16")
    draft = to_precision(perturbed_copy(tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=0), 0.3),
                         "int4")
    make = {"none": [], "ngram": [treespec.NGramDrafter(max_order=2)],
            "model": [treespec.ModelDrafter(draft, SHAPE, "topk")]}[drafters]
    prompt = [1, 5, 7, 9, 3, 1, 5, 7]
    out = treespec.generate(target, prompt, make, max_new_tokens=12, compile=UNCOMPILED)
    assert out.stats.step.startswith("captured" if drafters == "model" else "compiled, drafted on the host")
    assert out.new_tokens == greedy_reference(target, prompt, 12)


def test_captured_int4_draft_prefills_a_long_prompt_eagerly(pair, monkeypatch):
    """A prompt of 30 tokens: the target in compiled chunks, the int4 draft in one eager forward whose wide
    layers take their int8 twin; the output is still the target's greedy one."""
    from treespec.core import prefill

    target, draft = pair
    used = []
    monkeypatch.setattr(prefill.EagerPrefill, "rows", lambda self, prompts: (
        used.extend(len(p) for p in prompts), self.cache.prefill_rows(self.model, prompts))[-1])
    prompt = [(7 * i + 3) % 64 for i in range(30)]
    out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, SHAPE, "topk")], max_new_tokens=10,
                            compile=UNCOMPILED)
    assert used == [30] and out.stats.step == "captured"
    assert out.new_tokens == greedy_reference(target, prompt, 10)


def test_layers_built_in_row_chunks_equal_the_whole_weights_conversion(monkeypatch):
    """A layer is built ``CHUNK_ROWS`` rows at a time (its codes, the kernel's packing, its twin): the same buffers
    as the whole weight converted at once, over several chunks and a last one of 16 rows; codes given two a byte
    make the same layer. (By hand: 16-row chunks pack otherwise on an AVX2 host, and this test fails.)"""
    monkeypatch.setattr(int4, "CHUNK_ROWS", 64)
    torch.manual_seed(0)
    n, k, group = 208, 256, 32
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scale, zero = torch.rand(n, k // group) * 0.1, torch.randn(n, k // group) * 0.1
    layer = int4.Int4Linear.from_groups(codes, scale, zero, None, "bfloat16")
    assert torch.equal(layer.packed, torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int(), 1))
    s, z = (g.float().t().repeat_interleave(group, dim=1) for g in layer.scales_and_zeros.unbind(-1))
    whole = ((codes.float() - 8) * s + z).bfloat16()
    assert torch.equal(layer.wide.weight.view(torch.int16), whole.view(torch.int16))
    two_a_byte = int4.Int4Linear.from_groups(codes[:, 0::2] | (codes[:, 1::2] << 4), scale, zero, None, "bfloat16",
                                             nibbles=True)
    assert torch.equal(two_a_byte.packed, layer.packed) and torch.equal(two_a_byte.wide.weight, layer.wide.weight)
    # from a float weight: the group-wise rounding of the whole weight
    linear = torch.nn.Linear(k, n)
    groups = linear.weight.detach().view(n, k // group, group)
    low, high = groups.amin(-1), groups.amax(-1)
    steps = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
    rounded = ((groups - low[..., None]) / steps[..., None]).round().clamp(0, 15).view(n, k)
    assert torch.equal(int4.Int4Linear.from_linear(linear, group, None).packed,
                       int4.Int4Linear.from_groups(rounded, steps, low + 8 * steps).packed)
    # int8 per row: codes and twin
    w = torch.randn(n, k)
    int8 = int4.Int8Linear.from_weight(w)
    rows = int8.scales.float()[:, None]
    assert torch.equal(int8.codes, torch.div(w, rows).round().clamp(-127, 127).to(torch.int8))
    assert torch.equal(int8.wide.weight.view(torch.int16), (int8.codes.float() * rows).bfloat16().view(torch.int16))


def test_int8_layers_converted_on_threads_are_quantize_dynamics():
    """``quantize_int8`` converts layers two at a time (``threads=2``): every layer's packed
    weights (codes, per-channel scales, offsets), bias and the model's logits are ``quantize_dynamic``'s."""
    import copy
    import warnings

    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from treespec.models.quantized import quantize_int8

    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2)
    reference = copy.deepcopy(model)
    with pytest.warns(Warning):  # torch.ao's eager API is deprecated (quantize_int8 silences it)
        torch.ao.quantization.quantize_dynamic(
            reference, {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8,
            inplace=True)
    filters = list(warnings.filters)
    quantize_int8(model, threads=2)
    assert warnings.filters == filters  # torch.ao's warnings silenced for the call only, whatever its threads did
    ours, theirs = ([m for m in each.modules() if isinstance(m, DynamicLinear)] for each in (model, reference))
    assert len(ours) == len(theirs) == 15  # 7 a layer, and the LM head
    for a, b in zip(ours, theirs):
        qa, qb = a.weight(), b.weight()
        assert torch.equal(qa.int_repr(), qb.int_repr()) and torch.equal(qa.q_per_channel_scales(),
                                                                          qb.q_per_channel_scales())
        assert torch.equal(qa.q_per_channel_zero_points(), qb.q_per_channel_zero_points())
        assert (a.bias() is None) == (b.bias() is None) and (a.bias() is None or torch.equal(a.bias(), b.bias()))
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.equal(model(ids).logits, reference(ids).logits)
