"""The compiled steps' prefill in fixed-width compiled chunks (treespec.core.prefill): the cache it fills
equals the eager prefill's, long prompts keep greedy output equal to HF's (compiled and captured
steps, weight freezing included), one graph serves every prompt length, short prompts stay eager."""

import pytest
import torch
from torch._dynamo.utils import counters

import treespec
from treespec.core import captured, compiled, prefill
from treespec.core.kv import StaticTreeCache
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

KARY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]


def prompt_of(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_chunks_fill_the_cache_as_the_eager_prefill_does(family):
    model = tiny_model(family, vocab=64, hidden=64, scale=6, seed=0)
    chunked, eager = StaticTreeCache(model, 256), StaticTreeCache(model, 256)
    fill = prefill.ChunkedPrefill(model, chunked, "aot_eager", None)
    with torch.inference_mode():
        for n in (prefill.CHUNKED_MIN, prefill.CHUNK, prefill.CHUNK + 1, 2 * prefill.CHUNK + 30):
            prompt = prompt_of(n + 1, seed=n)
            for layer in chunked.layers:  # stale rows of a longer earlier prompt must not matter
                layer.keys.normal_()
            fill(prompt)
            eager.prefill(model, prompt)
            assert int(chunked.length) == int(eager.length) == n
            for a, b in zip(chunked.layers, eager.layers):
                torch.testing.assert_close(a.keys[..., :n, :], b.keys[..., :n, :], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(a.values[..., :n, :], b.values[..., :n, :], atol=1e-5, rtol=1e-5)
            # the control: the first chunk's rows differ from a prefill of another prompt
            eager.prefill(model, prompt_of(n + 1, seed=n + 1))
            assert not torch.allclose(chunked.layers[0].keys[..., :n, :], eager.layers[0].keys[..., :n, :])


def test_short_prompts_prefill_eagerly_long_ones_in_chunks(monkeypatch):
    model = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=0)
    fill = prefill.ChunkedPrefill(model, StaticTreeCache(model, 256), "aot_eager", None)
    calls = []
    step = fill.step
    monkeypatch.setattr(fill, "step", lambda *args: calls.append(args[1].item()) or step(*args))
    with torch.inference_mode():
        fill(prompt_of(prefill.CHUNKED_MIN))  # CHUNKED_MIN - 1 tokens to cache
        assert calls == []
        fill(prompt_of(prefill.CHUNK + 11))
    assert calls == [prefill.CHUNK, 10]


@pytest.mark.parametrize("mode", ["topk", "sample"], ids=["captured", "host-drafted"])
def test_long_prompts_keep_greedy_output_equal_to_hf(mode):
    target = tiny_model("qwen2", vocab=64, hidden=64, scale=6, seed=1)
    draft = perturbed_copy(target, 0.3)
    for n in (40, 150):
        prompt = prompt_of(n, seed=n)
        out = treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(draft, KARY, mode)], max_new_tokens=24,
                                budget=8, compile="aot_eager")
        assert out.stats.step.startswith("captured" if mode == "topk" else "compiled")
        assert out.new_tokens == greedy_reference(target, prompt, 24)


def test_weight_freezing_keeps_long_prompts_exact_and_reuses_the_chunk_graph():
    """Inductor with weight freezing: the chunk graph mutates the cache and its length (never folded into
    constants); a second prompt of another length adds no graph."""
    target = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=2)
    draft = perturbed_copy(target, 0.3)
    captured._RUNNERS.clear()
    compiled._RUNNERS.clear()
    with torch._inductor.config.patch(freezing=True):
        for i, n in enumerate((70, 100)):
            prompt = prompt_of(n, seed=n)
            graphs = counters["stats"]["unique_graphs"]
            for mode in ("topk", "sample"):
                out = treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(draft, KARY, mode)],
                                        max_new_tokens=20, budget=8, compile="inductor")
                assert out.new_tokens == greedy_reference(target, prompt, 20)
            if i:
                assert counters["stats"]["unique_graphs"] == graphs
    captured._RUNNERS.clear()
    compiled._RUNNERS.clear()


def test_the_cache_holds_the_last_chunk_padding():
    """Capacity covers the padded prompt even when few new tokens follow it."""
    assert compiled.capacity_for(1000, 4) == 1024
    assert compiled.capacity_for(1020, 2) == 1024 and prefill.padded_length(1019) == 1024
    assert compiled.capacity_for(1026, 2) == 2048  # 1025 tokens to cache pad to 1088
    assert compiled.capacity_for(1025, 30) == 2048
