"""The compiled steps' prefill (treespec.core.prefill), in exact pieces of a dynamic token count or in fixed
chunks: the cache it fills equals the eager prefill's, long prompts keep greedy output equal to HF's
(compiled and captured steps; weight freezing: tests/test_freezing.py), one graph serves every prompt length, short
prompts stay eager."""

import pytest
import torch
from torch._dynamo.utils import counters

import treespec
from treespec.core import compiled, prefill
from treespec.core.compiling import UNCOMPILED
from treespec.core.static_cache import StaticTreeCache
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

KARY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]


def prompt_of(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family,fixed", [("llama", True), ("qwen2", True), ("qwen2", False)])
def test_chunks_fill_the_cache_as_the_eager_prefill_does(family, fixed):
    model = tiny_model(family, vocab=64, hidden=64, layers=1, scale=6, seed=0)
    chunked, eager = StaticTreeCache(model, 256), StaticTreeCache(model, 256)
    fill = prefill.ChunkedPrefill(model, chunked, "aot_eager", None, chunk=64 if fixed else 100, fixed=fixed)
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


@pytest.mark.parametrize("rows", [None, 3])
def test_the_eager_prefill_caches_what_a_masked_forward_over_the_static_cache_writes(rows):
    """``prefill_rows`` runs each prompt without a mask (``kv.forward_prompt``) and copies its keys and values into
    the row's slots: the same as the static cache's own forward under a causal mask over its capacity (the route
    before), row by row at each row's own length; padding slots stay zero."""
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2, scale=6, seed=1)
    prompts = [prompt_of(n, seed=n) for n in ((9,) if rows is None else (9, 4, 13))]
    new, masked = StaticTreeCache(model, 64, rows), StaticTreeCache(model, 64, rows)
    with torch.inference_mode():
        new.prefill_rows(model, prompts)
        for b, p in enumerate(prompts):  # the masked route, one row at a time at slot 0
            n = len(p) - 1
            alone = StaticTreeCache(model, 64)
            alone.forward(model, torch.tensor(p[:-1]), torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
            for a, ref in zip(new.layers, alone.layers):
                torch.testing.assert_close(a.keys[b, :, :n], ref.keys[0, :, :n], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(a.values[b, :, :n], ref.values[0, :, :n], atol=1e-5, rtol=1e-5)
                assert not a.keys[b, :, n:].any()
        assert new.length.view(-1).tolist() == [len(p) - 1 for p in prompts]
        masked.prefill_rows(model, [prompt_of(9, seed=99)] * len(prompts))  # control: another prompt differs
        assert not torch.allclose(masked.layers[0].keys[0, :, :8], new.layers[0].keys[0, :, :8])


@pytest.mark.parametrize("mode,calls_of_74", [("reduce-overhead", [(64, 64), (64, 10)]), (None, [(74, 74)])])
def test_short_prompts_prefill_eagerly_long_ones_in_chunks_or_exact_pieces(monkeypatch, mode, calls_of_74):
    """CUDA graphs' mode pads fixed chunks; every other mode sends the prompt as it is (no padding)."""
    model = tiny_model("llama", vocab=64, hidden=64, layers=1, scale=6, seed=0)
    fill = prefill.ChunkedPrefill(model, StaticTreeCache(model, 256), "aot_eager", None)
    fill.fixed = mode == "reduce-overhead"  # the mode's cutting, run under aot_eager on the CPU
    fill.chunk = prefill.CHUNK if fill.fixed else prefill.PIECE
    calls = []
    step = fill.step
    monkeypatch.setattr(fill, "step", lambda ids, m, *rest: calls.append((len(ids), m.item())) or step(ids, m, *rest))
    with torch.inference_mode():
        fill(prompt_of(prefill.CHUNKED_MIN))  # CHUNKED_MIN - 1 tokens to cache
        assert calls == []
        fill(prompt_of(75))
    assert calls == calls_of_74


def test_pieces_are_near_equal_and_never_longer_than_allowed():
    for n in (16, 511, 512, 513, 1030, 5000):
        sizes = prefill.pieces(n)
        assert sum(sizes) == n and max(sizes) <= prefill.PIECE and max(sizes) - min(sizes) <= 1
        assert len(sizes) == -(-n // prefill.PIECE)
    assert prefill.pieces(513) == [257, 256]


def test_exact_pieces_compile_one_graph_for_every_length():
    """The token count is dynamic: prompts of many lengths, one and several pieces, add no graph after the
    first; the cache equals the eager prefill's."""
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=0, max_positions=1100)  # the prompts fit
    compiled_cache, eager = StaticTreeCache(model, 1100), StaticTreeCache(model, 1100)
    fill = prefill.ChunkedPrefill(model, compiled_cache, "aot_eager", None)
    with torch.inference_mode():
        fill(prompt_of(40))
        graphs = counters["stats"]["unique_graphs"]
        for n in (17, 99, 512, 513, 1030):
            prompt = prompt_of(n + 1, seed=n)
            fill(prompt)
            eager.prefill(model, prompt)
            assert int(compiled_cache.length) == n
            torch.testing.assert_close(compiled_cache.layers[-1].keys[..., :n, :], eager.layers[-1].keys[..., :n, :],
                                       atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.parametrize("mode", ["topk", "sample"], ids=["captured", "host-drafted"])
def test_long_prompts_keep_greedy_output_equal_to_hf(mode):
    """The steps' code (uncompiled: the prefill's graphs are the tests above, the steps' graphs are tied to their code
    in tests/test_captured.py and tests/test_compile.py) prefills a long prompt in pieces and stays exact."""
    target = tiny_model("qwen2", vocab=64, hidden=64, layers=1, scale=6, seed=1)
    draft = perturbed_copy(target, 0.3)
    for n in (40, 150):
        prompt = prompt_of(n, seed=n)
        out = treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(draft, KARY, mode)], max_new_tokens=24,
                                budget=8, compile=UNCOMPILED)
        assert out.stats.step.startswith("captured" if mode == "topk" else "compiled")
        assert out.new_tokens == greedy_reference(target, prompt, 24)


def test_the_cache_holds_the_last_chunk_padding():
    """Capacity covers the padded prompt even when few new tokens follow it."""
    assert compiled.capacity_for(1000, 4) == 1024
    assert compiled.capacity_for(1020, 2) == 1024 and prefill.padded_length(1019) == 1024
    assert compiled.capacity_for(1026, 2) == 2048  # 1025 tokens to cache pad to 1088
    assert compiled.capacity_for(1025, 30) == 2048
    # on CUDA in buckets of 512 (attention reads every row of the capacity): the H200 run's 128 + 48 + 130 rows
    assert compiled.capacity_for(128, 48 + 130, "cuda") == 512 and compiled.capacity_for(128, 48 + 130) == 1024
    assert compiled.capacity_for(1000, 4, torch.device("cuda")) == 1024
