"""The split-K products of bench_gpu's ``default+matmul+split-k`` levers (experiments/gpu_protocol/split_k.py): the
same product, the products a frozen graph holds rewritten by shape (q/k/v's one product among them) and no other,
and a sum that inductor lowers into the kernels reading it."""

import sys
from pathlib import Path

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from transformers import Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

from gpu_protocol.split_k import SplitK, settings, shapes_of, split_product  # noqa: E402


def test_a_split_product_is_the_product():
    torch.manual_seed(0)
    x = torch.randn(5, 56)
    for splits, bias in ((8, None), (7, torch.randn(24))):
        weight = torch.randn(24, 56)  # a linear's [N, K]: the product's weight is its transpose, a strided view
        expected = torch.nn.functional.linear(x, weight, bias)
        assert torch.allclose(split_product(x, weight.t(), bias, splits), expected, atol=1e-5)


def test_the_roles_name_the_shapes_of_a_decoders_products():
    cfg = Qwen2Config(hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864)
    assert shapes_of(cfg, {"down": 8, "o": 8, "qkv": 8}) == {(4864, 896): 8, (896, 896): 8, (896, 1152): 8}
    with pytest.raises(ValueError, match="not split in 5 equal pieces"):
        shapes_of(cfg, {"o": 5})
    with pytest.raises(ValueError, match="no product named 'up'"):
        shapes_of(cfg, {"up": 2})
    square = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64)
    with pytest.raises(ValueError, match="the shape .* of another product named"):  # o and down both 64 x 64
        shapes_of(square, {"o": 4, "down": 8})


class _Layer(torch.nn.Module):
    """An attention block's q, k and v (of other widths: freezing makes them one product), o of another input, and
    an MLP whose down projection's sum is read by the residual add and the next RMS norm."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(128, n) for n in (128, 32, 32))
        self.o = torch.nn.Linear(128, 128, bias=False)
        self.gate_up = torch.nn.Linear(128, 512, bias=False)
        self.down = torch.nn.Linear(256, 128, bias=False)
        self.weight = torch.nn.Parameter(torch.randn(128))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        h = x + self.o(q * torch.cat((k, v, k, v), -1).sigmoid())
        gate_up = self.gate_up(h)
        h = h + self.down(torch.nn.functional.silu(gate_up[:, :256]) * gate_up[:, 256:])
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _compiled(layer, x, split: SplitK | None, unroll: int | None = None) -> tuple[torch.Tensor, str, int]:
    """``layer(x)`` compiled frozen, with q/k/v concatenated (as on CUDA) and ``split``'s pass; its code and how
    many q/k/v triples were concatenated. (In float64: a CPU's freezing packs float32 weights for its BLAS before
    the pass could see them.)"""
    from treespec.core import fused_qkv

    torch._dynamo.reset()
    taken = fused_qkv.TAKEN[0]
    options = settings(split) if split else {}
    if unroll:
        options["unroll_reductions_threshold"] = unroll
    try:
        with (torch.no_grad(), fused_qkv.applied(), fused_qkv.uncached(),
              torch._inductor.config.patch(freezing=True, **options)):
            out, codes = run_and_get_code(torch.compile(layer, fullgraph=True), x)
    finally:
        torch._dynamo.reset()
    return out, "\n".join(codes), fused_qkv.TAKEN[0] - taken


def test_the_pass_rewrites_the_listed_products_of_a_frozen_graph_and_no_other():
    """q/k/v's one product (which only freezing makes: no module holds it), o and down are listed: each becomes one
    batched product reading its weight in place, and the graph computes the same; gate/up, not listed, stays a
    product. Without the pass (the control) the graph holds no batched product."""
    torch.manual_seed(0)
    layer, x = _Layer().eval().double(), torch.randn(16, 128, dtype=torch.float64)
    with torch.no_grad():
        expected = layer(x)
    out, plain, concatenated = _compiled(layer, x, None)
    assert torch.allclose(out, expected) and "extern_kernels.bmm" not in plain and concatenated == 1
    # q/k/v's one product with its biases; o and down with the residual they are added to (inductor's addmm)
    assert plain.count("extern_kernels.addmm") == 3 and plain.count("extern_kernels.mm(") == 1
    split = SplitK({(128, 192): 4, (128, 128): 8, (256, 128): 8})  # q/k/v's one product, o, down
    out, code, concatenated = _compiled(layer, x, split)
    assert torch.allclose(out, expected) and concatenated == 1
    assert split.taken == 3 and code.count("extern_kernels.bmm") == 3
    assert "extern_kernels.addmm" not in code and code.count("extern_kernels.mm(") == 1  # gate/up alone
    assert "reinterpret_tensor(_frozen_param" in code  # the weights' slices read in place (views, no copy)


def test_the_sum_of_the_pieces_lowers_as_additions_inside_the_next_kernel():
    """Under the pass's settings inductor lowers the sum of 8 pieces as pointwise additions inside the residual add
    and norm's kernel, which reads the pieces: the sum is written to no buffer of its own (one buffer fewer than the
    same graph whose sum stays a reduction: the control, inductor's threshold put back to 1), so on CUDA no reduction
    kernel of its own (a CPU fuses the reduction into that kernel too, so the buffers, not the kernel count, tell
    them apart)."""
    torch.manual_seed(0)
    layer, x = _Layer().eval().double(), torch.randn(16, 128, dtype=torch.float64)
    with torch.no_grad():
        expected = layer(x)
    buffers = []
    for unroll in (None, 1):
        split = SplitK({(256, 128): 8})
        out, code, _ = _compiled(layer, x, split, unroll)
        assert torch.allclose(out, expected) and split.taken == 1
        buffers.append(code.count("empty_strided_cpu("))
    assert buffers[0] == buffers[1] - 1


def test_the_pass_is_part_of_inductors_cache_key():
    """Inductor's graph cache keys a graph by the pass's uuid: two tables, two keys; the same table, one."""
    assert SplitK({(64, 32): 8}).uuid() == SplitK({(64, 32): 8}).uuid() != SplitK({(64, 32): 4}).uuid()


def test_on_cuda_the_pieces_multiply_in_bfloat16_into_float32_partial_sums():
    """The CUDA form the levers run, traced with fake CUDA tensors (no GPU needed): one ``bmm`` of bfloat16 pieces
    with float32 output (cuBLAS's split-K keeps its partial sums so), the sum in float32, rounded once to bfloat16,
    the bias added after; and inductor has a lowering for that product (its extern cuBLAS call). The control: the
    same bfloat16 product on a CPU multiplies without the float32 output."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def traced(device: str) -> list[tuple[object, torch.dtype]]:
        with FakeTensorMode():
            x, weight, bias = (torch.empty(*shape, dtype=torch.bfloat16, device=device)
                               for shape in ((16, 4864), (4864, 896), (896,)))
            graph = make_fx(lambda x, w, b: split_product(x, w, b, 8))(x, weight, bias).graph
        return [(n.target, n.meta["val"].dtype) for n in graph.nodes if n.op == "call_function"]

    aten = torch.ops.aten
    ops = traced("cuda")
    assert (aten.bmm.dtype, torch.float32) in ops and (aten.sum.dim_IntList, torch.float32) in ops
    assert ops[-1] == (aten.add.Tensor, torch.bfloat16) and aten.bmm.default not in dict(ops)
    assert aten.bmm.dtype in torch._inductor.lowering.lowerings
    cpu = dict(traced("cpu"))
    assert aten.bmm.dtype not in cpu and cpu[aten.bmm.default] == torch.bfloat16
