"""q, k and v as one product in a frozen graph (``treespec.core.fused_qkv``), and when the step's graphs use it."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from transformers import Qwen2Config, Qwen2ForCausalLM

import treespec
from treespec.core import captured, compiling, fused_qkv, prefill
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

pytestmark = pytest.mark.xdist_group("freezing")


def frozen_code(model: torch.nn.Module, ids: torch.Tensor, rewrite: bool) -> tuple[torch.Tensor, str]:
    """The model's logits compiled frozen, with or without the rewrite, and inductor's code for them."""
    torch._dynamo.reset()
    # oneDNN's and MKL's weight packing would take each product first (as on a CPU; the rewrite is for CUDA's graphs):
    # off, and the model in float64, which they never pack (once a graph of the process registered their patterns,
    # the switch alone no longer keeps them out)
    settings = {"freezing": True, "cpp.weight_prepack": False}
    with torch.inference_mode(), torch._inductor.config.patch(settings), fused_qkv.uncached(), \
            fused_qkv.applied() if rewrite else contextlib.nullcontext():
        got, (code,) = run_and_get_code(torch.compile(lambda x: model(x).logits), ids)
    return got, code


def test_grouped_attention_q_k_v_become_one_product_with_the_same_logits():
    """A layer under grouped-query attention (q 64 columns, k and v 32 each): three biased products in inductor's
    frozen code without the rewrite, one with it, the logits eager's either way."""
    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=96)
    model = Qwen2ForCausalLM(cfg).eval().double()
    ids = torch.arange(5)[None]
    with torch.inference_mode():
        want = model(ids).logits
    for rewrite, products in ((False, 3), (True, 1)):
        got, code = frozen_code(model, ids, rewrite)
        assert code.count("extern_kernels.addmm(") == products, code
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # rope runs in float32
    assert not fused_qkv.ENABLED[0]  # switched off again after the block


def test_step_graphs_freeze_and_join_q_k_v_with_cuda_graphs_only(monkeypatch):
    assert compiling.graph_settings("inductor", None) == (True, False)  # a CPU: frozen, measured without the rewrite
    assert compiling.graph_settings("inductor", "reduce-overhead") == (True, True)
    assert compiling.graph_settings("eager", None) == (False, False)
    monkeypatch.setattr(compiling, "CUDA_GRAPHS_ONE_QKV", False)
    assert compiling.graph_settings("inductor", "reduce-overhead") == (True, False)
    monkeypatch.setattr(compiling, "CUDA_GRAPHS_FREEZE", False)
    assert compiling.graph_settings("inductor", "reduce-overhead") == (False, False)


def test_captured_step_with_the_cuda_graph_settings_is_exact_on_a_cpu(monkeypatch):
    """The captured step compiled as on CUDA (inductor, ``reduce-overhead``: frozen, q/k/v joined; CUDA graphs
    themselves skipped on a CPU), in float64 (no CPU weight packing takes the products first): the rewrite takes
    the attention triples of both models' graphs and the greedy output is HF's."""
    target = tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=0).double()
    draft = perturbed_copy(target, 0.3)
    assert target.config.num_key_value_heads < target.config.num_attention_heads  # q wider than k and v
    monkeypatch.setattr(captured, "compile_options", lambda compile, device: ("inductor", "reduce-overhead"))
    captured.RUNNERS.clear()
    taken = fused_qkv.TAKEN[0]
    prompt = list(range(3, 13))  # shorter than prefill.CHUNKED_MIN: prefilled eagerly (no prefill graph to compile)
    # one level: one level graph (a deeper tree's levels of other widths would each compile one more)
    with fused_qkv.uncached():  # compiled here, not loaded from an earlier run's cache (which would skip the pass)
        out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, [(0,), (1,)], "topk")],
                                max_new_tokens=16, compile=True)
    captured.RUNNERS.clear()
    assert len(prompt) < prefill.CHUNKED_MIN and out.stats.step == "captured"
    assert fused_qkv.TAKEN[0] - taken >= 2  # the draft's level graph and the target's verification
    assert out.new_tokens == greedy_reference(target, prompt, 16)
