"""Grouped-query SDPA (``treespec.core.attention``): the same numbers as HF's own ``sdpa`` path, used only
for the call and only for ``sdpa`` models, traced by ``torch.compile`` without a graph break."""

import pytest
import torch
from torch._dynamo.utils import counters
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from treespec.core import attention
from treespec.core.static_cache import StaticTreeCache
from treespec.models.tiny import tiny_model


class _Module(torch.nn.Module):  # what HF's attention functions read from their module
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True
        self.eval()


def _inputs(q: int, k: int = 11, heads: int = 6, kv: int = 2, boolean: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    query, key = torch.randn(1, heads, q, 8, generator=g), torch.randn(1, kv, k, 8, generator=g)
    value = torch.randn(1, kv, k, 8, generator=g)
    allowed = torch.rand(q, k, generator=g) < 0.6
    allowed[:, 0] = True  # every row attends somewhere
    mask = allowed if boolean else torch.zeros(q, k).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return query, key, value, mask[None, None]


@pytest.mark.parametrize("q", [1, 5])
@pytest.mark.parametrize("boolean", [False, True], ids=["additive", "bool"])
def test_grouped_equals_hf_sdpa_with_copied_heads(q, boolean):
    query, key, value, mask = _inputs(q, boolean=boolean)
    module = _Module(3)
    ours, _ = attention.grouped_sdpa(module, query, key, value, mask, scaling=0.3)
    # HF's path with the key/value heads copied (what it runs for a 4D mask under torch.compile)
    ref = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, 3), repeat_kv(value, 3),
                                                           attn_mask=mask, scale=0.3).transpose(1, 2)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    hf, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    torch.testing.assert_close(ours, hf, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("q", [1, 5])
@pytest.mark.parametrize("boolean", [False, True], ids=["additive", "bool"])
@pytest.mark.parametrize("heads", [6, 2], ids=["grouped", "one group"])
def test_grouped_matmul_equals_hf_sdpa(q, boolean, heads):
    """The attention written out as two products and a softmax (``TREE_ATTENTION = "matmul"``) gives HF's numbers;
    a row that sees nothing stays finite."""
    query, key, value, mask = _inputs(q, heads=heads, boolean=boolean)
    module = _Module(heads // 2)
    ours, _ = attention.grouped_matmul(module, query, key, value, mask, scaling=0.3)
    hf, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    torch.testing.assert_close(ours, hf, rtol=1e-5, atol=1e-6)
    default_scale, _ = attention.grouped_matmul(module, query, key, value, mask)
    torch.testing.assert_close(default_scale, sdpa_attention_forward(module, query, key, value, mask)[0],
                               rtol=1e-5, atol=1e-6)
    blind = mask.clone()
    blind[..., 0, :] = False if boolean else torch.finfo(torch.float32).min
    assert torch.isfinite(attention.grouped_matmul(module, query, key, value, blind)[0]).all()


def test_negative_control_another_head_order_differs():
    """Stacking the query heads in the other order (head h -> key/value head h mod Hkv) is wrong, and the
    comparison above sees it."""
    query, key, value, mask = _inputs(3)
    ref = torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key, 3), repeat_kv(value, 3),
                                                           attn_mask=mask).transpose(1, 2)
    swapped = query.view(1, 3, 2, 3, 8).transpose(1, 2).reshape(1, 6, 3, 8)
    wrong, _ = attention.grouped_sdpa(_Module(3), swapped, key, value, mask)
    wrong = wrong.view(1, 3, 2, 3, 8).transpose(2, 3).reshape(1, 3, 6, 8)
    assert not torch.allclose(wrong, ref, atol=1e-3)


def test_without_mask_or_groups_it_is_hf_sdpa():
    query, key, value, _ = _inputs(4, heads=2, kv=2)
    for mask in (None, _inputs(4, heads=2, kv=2)[3]):
        ours, _ = attention.grouped_sdpa(_Module(1), query, key, value, mask)
        hf, _ = sdpa_attention_forward(_Module(1), query, key, value, mask)
        assert torch.equal(ours, hf)


@pytest.fixture
def calls(monkeypatch):
    seen = []
    original = attention.grouped_sdpa

    def counting(*args, **kwargs):
        seen.append(args[1].shape)
        return original(*args, **kwargs)

    from transformers import AttentionInterface
    monkeypatch.setitem(AttentionInterface._global_mapping, attention.GROUPED_SDPA, counting)
    return seen


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tree_forward_gives_the_models_own_logits_and_restores_its_setting(family, calls):
    model = tiny_model(family, vocab=40, seed=3)  # 4 query heads over 2 key/value heads
    ids = torch.tensor([[3, 9, 1, 7, 22]])
    with torch.inference_mode():
        ref = model(input_ids=ids).logits
        ours = attention.tree_forward(model, input_ids=ids, attention_mask=torch.zeros(1, 1, 5, 5).masked_fill(
            ~torch.ones(5, 5, dtype=torch.bool).tril(), torch.finfo(torch.float32).min))
    torch.testing.assert_close(ours.logits, ref, rtol=1e-5, atol=1e-5)
    assert len(calls) == model.config.num_hidden_layers
    assert model.config._attn_implementation == "sdpa"


def test_eager_models_keep_their_attention_and_errors_restore_the_setting(calls):
    eager = tiny_model("llama", vocab=40, attn="eager")
    with torch.inference_mode():
        attention.tree_forward(eager, input_ids=torch.tensor([[1, 2]]))
    assert not calls and eager.config._attn_implementation == "eager"
    model = tiny_model("llama", vocab=40)
    with pytest.raises(Exception):
        attention.tree_forward(model, input_ids=torch.tensor([[1, 2]]), position_ids=torch.zeros(1, 5, 7))
    assert model.config._attn_implementation == "sdpa"


def test_compiled_static_forward_uses_it_without_a_graph_break(calls):
    model = tiny_model("qwen2", vocab=40, seed=2)
    cache = StaticTreeCache(model, 64)
    block = torch.ones(3, 3, dtype=torch.bool).tril()
    args = (torch.tensor([4, 5, 6]), torch.arange(3), block)
    counters.clear()
    compiled = torch.compile(lambda ids, pos, blk, at: cache.forward(model, ids, pos, blk, at), fullgraph=True,
                             backend="aot_eager")
    with torch.inference_mode():
        out = compiled(*args, cache.length + 0)
        ref = cache.forward(model, *args, cache.length + 0)
    torch.testing.assert_close(out, ref)
    assert calls and not counters["graph_break"] and model.config._attn_implementation == "sdpa"


def test_compile_graph_switches_its_models_outside_the_graph(calls):
    """A step's graph (``compiling.compile_graph``) finds grouped attention switched already: no config write is
    traced into it (read after the forward, inside the graph, the setting is still the grouped one; switched by
    ``tree_forward`` it would read ``sdpa`` again), and the model is given back as it was."""
    from treespec.core.compiling import compile_graph

    model = tiny_model("qwen2", vocab=40, seed=2)
    cache = StaticTreeCache(model, 64)
    args = (torch.tensor([4, 5, 6]), torch.arange(3), torch.ones(3, 3, dtype=torch.bool).tril())

    def forward(ids, pos, blk, at):
        return cache.forward(model, ids, pos, blk, at), model.config._attn_implementation

    counters.clear()
    with torch.inference_mode():
        out, seen = compile_graph(forward, "eager", None, (model,))(*args, cache.length + 0)
        torch.testing.assert_close(out, cache.forward(model, *args, cache.length + 0))
    assert seen == attention.GROUPED_SDPA and calls and not counters["graph_break"]
    assert model.config._attn_implementation == "sdpa"


def test_an_eager_logits_to_keep_gathers_the_last_rows_and_keeps_the_logits():
    """``tree_forward`` turns an eager ``logits_to_keep=k`` into the index of the last ``k`` rows (HF slices for an
    int, and the LM head over that slice takes a slow CPU kernel): the same logits as the int gives."""
    from treespec.core.attention import last_rows, tree_forward
    from treespec.models.tiny import tiny_model

    model = tiny_model("qwen2", vocab=32, hidden=32)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    assert last_rows(ids, 2).tolist() == [4, 5] and last_rows(ids, 9).tolist() == list(range(6))
    with torch.no_grad():
        full = model(input_ids=ids).logits
        kept = tree_forward(model, input_ids=ids, logits_to_keep=2).logits
    assert kept.shape == (1, 2, 32) and torch.allclose(kept, full[:, -2:])


def test_flex_tree_attention_equals_grouped_sdpa_on_a_tree_mask():
    """``tree_flex`` over the block mask of a tree's boolean mask (some cache rows unseen, others seen by some
    queries) equals :func:`grouped_sdpa` over the same mask (grouped heads read in the kernel; eager FlexAttention
    is its reference implementation here); any other mask goes to grouped SDPA."""
    g = torch.Generator().manual_seed(4)
    b, heads, kv_heads, q, c, d = 1, 6, 2, 5, 40, 16
    query, key, value = (torch.randn(b, h, n, d, generator=g) for h, n in ((heads, q), (kv_heads, c), (kv_heads, c)))
    allowed = torch.rand(b, 1, q, c, generator=g) > 0.4
    allowed[..., 0] = True  # every query sees a row
    allowed[..., 30:] = False  # rows past the used length: a whole block no query sees
    module = torch.nn.Module()
    want, _ = attention.grouped_sdpa(module, query, key, value, allowed, scaling=0.25)
    got, _ = attention.tree_flex(module, query, key, value, attention.block_mask(allowed), scaling=0.25)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    wrong = allowed.clone()
    wrong[0, 0, 2, 0] = False  # negative control: one entry of the mask moved changes the output
    wrong[0, 0, 2, 1] = True
    other, _ = attention.tree_flex(module, query, key, value, attention.block_mask(wrong), scaling=0.25)
    assert not torch.allclose(other, want, atol=1e-4)
    plain, _ = attention.tree_flex(module, query, key, value, allowed, scaling=0.25)  # a tensor mask: grouped SDPA
    torch.testing.assert_close(plain, want)


#: a dynamo backend that runs the traced graphs eagerly and records the query shapes of their FlexAttention calls
#: (a spy inside the traced code would put its growing list under dynamo's guards: a recompile per call)
FLEX_QUERIES: list[tuple[int, ...]] = []


def _recording_backend(gm: torch.fx.GraphModule, example_inputs):
    FLEX_QUERIES.extend(tuple(n.args[0].meta["example_value"].shape) for n in gm.graph.nodes
                        if n.op == "call_function" and "flex_attention" in str(n.target))
    return gm.forward


@pytest.mark.parametrize("backend, which", [("uncompiled", "flex"), ("uncompiled", "flex-levels"),
                                            ("traced", "flex")])
def test_captured_step_with_flex_tree_attention_is_exact(monkeypatch, backend, which):
    """The captured step's level and verification forwards over block masks (``TREE_ATTENTION = "flex"``, the
    GPU benchmark's lever), uncompiled and traced whole by dynamo (its graphs run eagerly): greedy output is HF's
    (inductor's CPU flex template takes no mask computed in the graph: a CUDA lever)."""
    from torch._dynamo.backends.registry import list_backends, register_backend

    import treespec
    from treespec.core import captured
    from treespec.models.tiny import greedy_reference, perturbed_copy

    target = tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=0)
    draft = perturbed_copy(target, 0.3)
    monkeypatch.setattr(attention, "TREE_ATTENTION", which)
    made, original = [], attention.block_mask

    def spy(allowed):
        made.append(tuple(allowed.shape))
        return original(allowed)

    if backend == "traced":
        if "treespec_flex_queries" not in list_backends(exclude_tags=()):
            register_backend(_recording_backend, name="treespec_flex_queries")
        backend = "treespec_flex_queries"
        FLEX_QUERIES.clear()
    else:
        monkeypatch.setattr(attention, "block_mask", spy)
    captured.RUNNERS.clear()
    prompt = list(range(3, 13))  # prefilled eagerly (dynamo traces the level and the verification alone)
    out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, [(0,), (1,), (0, 0), (0, 1)], "topk")],
                            max_new_tokens=16, compile=backend)
    captured.RUNNERS.clear()
    assert out.stats.step == "captured" and out.new_tokens == greedy_reference(target, prompt, 16)
    made = made or FLEX_QUERIES
    assert made  # the tree forwards attended over block masks (traced: FlexAttention calls in the graphs)
    rows = {shape[2] for shape in made}  # a level forwards its rows, the verification the tree's 5 nodes
    assert (5 in rows) == (which == "flex")


@pytest.mark.parametrize("compile", [False, "uncompiled", pytest.param(True, marks=pytest.mark.slow)],
                         ids=["eager", "captured", "inductor"])  # inductor: a minute and a half on two cores
def test_steps_with_matmul_tree_attention_are_exact(monkeypatch, compile):
    """``TREE_ATTENTION = "matmul"`` (the GPU benchmark's lever: the keys read in place, no copy of the cache's)
    runs every tree forward through :func:`attention.grouped_matmul`: greedy output is HF's, eager, captured, and
    compiled by inductor with freezing."""
    import treespec
    from treespec.core import captured
    from treespec.models.tiny import greedy_reference, perturbed_copy

    target = tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=0)
    draft = perturbed_copy(target, 0.3)
    monkeypatch.setattr(attention, "TREE_ATTENTION", "matmul")
    calls, original = [], attention.grouped_matmul

    def spy(*args, **kwargs):
        calls.append(args[1].shape[2])  # query rows
        return original(*args, **kwargs)

    monkeypatch.setattr(attention, "grouped_matmul", spy)
    monkeypatch.setitem(attention.AttentionInterface._global_mapping, attention.GROUPED_MATMUL, spy)
    captured.RUNNERS.clear()
    prompt = list(range(3, 13))
    out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, [(0,), (1,), (0, 0), (0, 1)], "topk")],
                            max_new_tokens=16, compile=compile)
    captured.RUNNERS.clear()
    assert out.new_tokens == greedy_reference(target, prompt, 16)
    assert out.stats.step == ("eager" if compile is False else "captured")
    assert calls  # traced into the graphs, or called by each eager forward
