"""The split-K draft products of bench_gpu's ``default+matmul+split-k`` levers (experiments/gpu_protocol/split_k.py):
the same products, swapped in for a block and back, and a sum that inductor lowers into the kernel reading it."""

import contextlib
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

from gpu_protocol.split_k import SplitKLinear, split_k  # noqa: E402


def test_a_split_k_linear_is_the_linears_product():
    torch.manual_seed(0)
    for splits, bias in ((8, False), (7, True)):
        linear = torch.nn.Linear(56, 24, bias=bias)
        x = torch.randn(2, 3, 56)
        assert torch.allclose(SplitKLinear(linear, splits)(x), linear(x), atol=1e-5)
    with pytest.raises(ValueError, match="divide the input width 56"):
        SplitKLinear(linear, 5)


def test_split_k_swaps_the_named_linears_for_the_block_and_the_same_twins_each_time():
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                      num_hidden_layers=2, vocab_size=64)
    model = Qwen2ForCausalLM(cfg).eval()
    ids = torch.arange(1, 9)[None]
    with torch.no_grad():
        reference = model(ids).logits
        originals = [(layer.mlp.down_proj, layer.self_attn.o_proj) for layer in model.model.layers]
        with split_k(model, {"mlp.down_proj": 8, "self_attn.o_proj": 4}) as swapped:
            assert swapped == 4
            twins = [(layer.mlp.down_proj, layer.self_attn.o_proj) for layer in model.model.layers]
            assert all(isinstance(m, SplitKLinear) for pair in twins for m in pair)
            assert [m.splits for m in twins[0]] == [8, 4]
            assert torch.allclose(model(ids).logits, reference, atol=1e-5)
            assert torch._inductor.config.unroll_reductions_threshold > 8  # the sum of 8 unrolled by inductor
        assert [(layer.mlp.down_proj, layer.self_attn.o_proj) for layer in model.model.layers] == originals
        assert torch._inductor.config.unroll_reductions_threshold == 8
        with split_k(model, {"mlp.down_proj": 8, "self_attn.o_proj": 4}):  # a compiled graph's guards hold them
            assert [(layer.mlp.down_proj, layer.self_attn.o_proj) for layer in model.model.layers] == twins
    with pytest.raises(ValueError, match=r"no nn.Linear named \*mlp.up"):
        with split_k(model, {"mlp.down_proj": 8, "mlp.up": 2}):
            pass
    assert model.model.layers[0].mlp.down_proj is originals[0][0]


class _Block(torch.nn.Module):
    """A decoder's down projection, the residual add and the next RMS norm."""

    def __init__(self) -> None:
        super().__init__()
        self.down_proj = torch.nn.Linear(64, 32, bias=False)
        self.weight = torch.nn.Parameter(torch.randn(32))

    def forward(self, gate_up: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = residual + self.down_proj(torch.nn.functional.silu(gate_up[:, :64]) * gate_up[:, 64:])
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight, h


def test_the_sum_of_the_pieces_lowers_as_additions_inside_the_next_kernel():
    """Under ``split_k`` inductor lowers the sum of 8 pieces as pointwise additions (one IR node fewer than the
    same graph whose sum stays a reduction: the control, inductor's threshold put back to 1), so on CUDA it joins
    the residual add and norm's kernel instead of a reduction kernel of its own (a CPU fuses both alike, so the
    IR, not the kernel count, tells them apart)."""
    from torch._inductor import metrics

    torch.manual_seed(0)
    block, inputs = _Block(), (torch.randn(4, 128), torch.randn(4, 32))
    with torch.no_grad():
        expected = block(*inputs)

    def ir_nodes(unroll: int | None) -> int:
        torch._dynamo.reset()
        metrics.reset()
        with (torch.no_grad(), split_k(block, {"down_proj": 8}),
              torch._inductor.config.patch(unroll_reductions_threshold=unroll) if unroll else contextlib.nullcontext(),
              torch._inductor.config.patch(fx_graph_cache=False)):
            out = torch.compile(block, fullgraph=True)(*inputs)
        assert all(torch.allclose(o, e, atol=1e-5) for o, e in zip(out, expected))
        return metrics.ir_nodes_pre_fusion

    try:
        assert ir_nodes(None) == ir_nodes(1) - 1
    finally:
        torch._dynamo.reset()
