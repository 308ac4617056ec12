"""The weight-first ``nn.Linear`` layout (``treespec.core.linear_layout``): the same product, switched only inside
treespec's forwards and only for the models that chose it, exact through the steps, and chosen by measurement."""

import json

import pytest
import torch

import treespec
from test_exactness import BUSHY, joint_p
from treespec.core import compiling
from treespec.core import linear_layout as ll
from treespec.core.compiling import compile_graph
from treespec.core.static_cache import StaticTreeCache
from treespec.models.layout import auto_layout, describe_layout
from treespec.models.loading import load
from treespec.models.precision import to_precision
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model


@pytest.fixture
def seen(monkeypatch):
    """Calls of the weight-first forward (a list dynamo replays its appends to, on every call of a graph)."""
    calls = []
    original = ll.WeightFirstLinear.forward

    def counting(self, x):
        calls.append(type(self).__name__)
        return original(self, x)

    monkeypatch.setattr(ll.WeightFirstLinear, "forward", counting)
    return calls


def weight_first(model):
    return ll.set_layout(model, ll.WEIGHT_FIRST)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(24,), (5, 24), (2, 5, 24)])
def test_weight_first_is_the_same_product(bias, shape):
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(shape)
    stock = layer(x)
    layer.__class__ = ll.WeightFirstLinear
    out = layer(x)
    assert out.shape == stock.shape == (*shape[:-1], 40)
    torch.testing.assert_close(out, stock, rtol=1e-5, atol=1e-6)


def test_the_switch_covers_marked_models_and_float_layers_only_and_restores_them():
    marked, other = weight_first(tiny_model("qwen2", vocab=40)), tiny_model("llama", vocab=40)
    quantised = weight_first(to_precision(tiny_model("llama", vocab=40, seed=3), "int8"))
    assert len(ll.switchable(marked)) == 7 * 2 + 1 and ll.switchable(quantised) == []  # 2 layers and the LM head

    def classes(model):
        return {type(m) for m in model.modules() if isinstance(m, torch.nn.Linear)}

    with ll.linear_layout(marked, other, quantised):
        assert classes(marked) == {ll.WeightFirstLinear} and classes(other) == {torch.nn.Linear}
    assert classes(marked) == {torch.nn.Linear}
    with pytest.raises(RuntimeError), ll.linear_layout(marked):
        raise RuntimeError("a failing forward")
    assert classes(marked) == {torch.nn.Linear}
    with pytest.raises(ValueError, match="unknown Linear layout"):
        ll.set_layout(marked, "column-major")
    # a cached timing's key names which model runs weight-first: the target's or its draft's, not the same key
    assert ll.layout_tags(marked, other) == ["linear[0]=weight-first"]
    assert ll.layout_tags(other, marked) == ["linear[1]=weight-first"]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_through_weight_first_layers_equals_hf(family, seen):
    """The target and draft run weight-first in treespec's forwards; HF's greedy decoding of the same model (stock
    layers, after) is the reference."""
    target = weight_first(tiny_model(family, vocab=64, hidden=64, scale=6, seed=0))
    draft = weight_first(perturbed_copy(target, 0.3))
    for prompt in ([1, 5, 7, 9, 3], [4]):
        out = treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(draft, BUSHY)], max_new_tokens=30)
        assert out.new_tokens == greedy_reference(target, prompt, 30)
    assert seen and set(seen) == {"WeightFirstLinear"}
    assert all(type(m) is torch.nn.Linear for m in ll.switchable(target))


def test_a_step_graph_runs_the_layout_switched_outside_it(seen):
    """``compile_graph`` switches the layout around its calls; the graph traced the weight-first layers (its
    output says so, read inside the graph) and gives the eager weight-first logits; the model is stock after."""
    model = weight_first(tiny_model("qwen2", vocab=40, seed=2))
    cache = StaticTreeCache(model, 64)
    args = (torch.tensor([4, 5, 6]), torch.arange(3), torch.ones(3, 3, dtype=torch.bool).tril())

    def forward(ids, pos, blk, at):
        return cache.forward(model, ids, pos, blk, at), isinstance(model.lm_head, ll.WeightFirstLinear)

    with torch.inference_mode():
        out, switched = compile_graph(forward, "eager", None, (model,))(*args, cache.length + 0)
        eager = cache.forward(model, *args, cache.length + 0)
    torch.testing.assert_close(out, eager)
    assert switched and len(seen) == 2 * len(ll.switchable(model))  # the graph's call and the eager one
    assert type(model.lm_head) is torch.nn.Linear


def test_a_frozen_graph_runs_stock_layers(monkeypatch):
    """A frozen graph (inductor on a CPU; with CUDA graphs while ``CUDA_GRAPHS_FREEZE``) packs a stock
    ``nn.Linear``'s weight for oneDNN and not a weight-first product: ``compile_graph`` leaves such a graph's models
    stock, and switches them for any other backend (``torch.compile`` made the identity here: what the call wrapper
    does is what is read)."""
    model = weight_first(tiny_model("qwen2", vocab=40, seed=2))
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)

    def forward():
        return isinstance(model.lm_head, ll.WeightFirstLinear)

    assert compile_graph(forward, "inductor", None, (model,))() is False
    assert compile_graph(forward, "inductor", "reduce-overhead", (model,))() is False  # frozen CUDA graphs
    monkeypatch.setattr(compiling, "CUDA_GRAPHS_FREEZE", False)
    assert compile_graph(forward, "inductor", "reduce-overhead", (model,))() is True  # CUDA graphs, not frozen
    assert compile_graph(forward, "aot_eager", None, (model,))() is True


def test_sampled_law_through_weight_first_layers():
    """The joint law of 3 sampled tokens (tests/test_exactness.py's G-test) with weight-first target and draft."""
    target = weight_first(tiny_model("llama", vocab=6, hidden=16, layers=1, scale=3, seed=5))
    draft = weight_first(perturbed_copy(target, 2.0, seed=2))
    assert joint_p(target, draft, lambda: [treespec.ModelDrafter(draft, BUSHY, "sample")], "weight-first",
                   temperature=1.0) > 1e-3


def test_auto_layout_keeps_the_faster_and_caches_it(tmp_path):
    model = tiny_model("llama", vocab=40)
    timed = []

    def timer(m, sizes):
        timed.append(ll.layout_of(m))
        return {"stock": 2.0, "weight-first": 1.0}[ll.layout_of(m)]

    decisions = tmp_path / "layout.json"
    model, record = auto_layout(model, "target", name="tiny", decisions=decisions, timer=timer)
    assert ll.layout_of(model) == ll.WEIGHT_FIRST and timed == ["stock", "weight-first"] and not record["cached"]
    assert "weight-first (measured now" in describe_layout(record) and "Conv1D" not in describe_layout(record, model)
    from treespec.models.tiny import tiny_family_model  # GPT-2: its products are Conv1D, the LM head alone switches

    assert describe_layout(record, tiny_family_model("gpt2")).endswith("; 8 Conv1D layers keep their own)")
    assert json.loads(decisions.read_text())[record["key"]]["layout"] == ll.WEIGHT_FIRST
    again, cached = auto_layout(tiny_model("llama", vocab=40), "target", name="tiny", decisions=decisions,
                                timer=timer)
    assert ll.layout_of(again) == ll.WEIGHT_FIRST and cached["cached"] and len(timed) == 2
    quantised, record = auto_layout(to_precision(tiny_model("llama", vocab=40), "int8"), "draft", timer=timer)
    assert ll.layout_of(quantised) == ll.STOCK and record["why"] == "no float nn.Linear layers" and len(timed) == 2


def test_load_refuses_an_unknown_layout():
    with pytest.raises(ValueError, match="linear_layout must be 'auto'"):
        load("no-such-model", linear_layout="transposed")
