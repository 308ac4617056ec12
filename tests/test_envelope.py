"""One compiled step for many tree shapes: the captured step in a padded envelope (treespec.core.buffers).

The tree enters the compiled calls as data, so after the first tree of an envelope every other tree inside
it runs without a new graph (dynamo's counters do not move), and each one's output is still exact: greedy
equal to the eager step and to HF greedy in float32 (with inductor's weight freezing, which folds what a
graph only reads into constants: tests/test_freezing.py). The joint law of sampled tokens through a
padded envelope is tests/test_captured.py's (its T=0.7 case runs padded)."""

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

import treespec
from tree_builders import chain, for_budget, kary
from treespec.core import captured
from treespec.core.compiling import UNCOMPILED
from treespec.core.buffers import Envelope
from conftest import tiny_pair
from treespec.models.tiny import greedy_reference

BACKEND = "aot_eager"
ACCEPTANCE = [0.6, 0.2, 0.1]
#: six shapes of different builders, widths and depths
SHAPES = {
    "sequoia-8": for_budget("sequoia", 8, ACCEPTANCE, max_depth=5).paths,
    "chain-4": chain(4).paths,
    "kary-2x2x2": kary([2, 2, 2]).paths,
    "fan-4": [(0,), (1,), (2,), (3,)],
    "deep": [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)],
    "sequoia-12": for_budget("sequoia", 12, ACCEPTANCE, max_depth=4).paths,
}


#: one worker runs this file's tests in order, so that a later test's runs reuse an earlier test's runners
pytestmark = pytest.mark.xdist_group("envelope")


@pytest.fixture(scope="module")
def models():
    """One family's pair (the families share the step; tests/test_captured.py runs both families through it)."""
    return tiny_pair("qwen2")


def run(target, draft, prompt, shape, n, mode="topk", **kwargs):
    return treespec.generate(target, prompt, [treespec.ModelDrafter(draft, shape, mode)], max_new_tokens=n, **kwargs)


def test_the_default_envelope_is_the_trees_own_on_a_cpu(models):
    """On a CPU width costs every step, so without ``envelope=`` each shape runs in its own envelope."""
    target, draft = models
    captured.RUNNERS.clear()
    for shape in (SHAPES["chain-4"], SHAPES["fan-4"]):  # the choice of envelope, not the graphs: uncompiled
        run(target, draft, [1, 2, 3], shape, 6, compile=UNCOMPILED)
    envs = sorted((r.envelope for r in captured.RUNNERS.values()), key=lambda e: e.nodes)
    assert envs == [Envelope(5, (2, 1, 1, 1), 1), Envelope(5, (2,), 4)]


def test_six_shapes_share_one_envelope_and_stay_exact(models):
    """The first tree compiles the envelope's graphs; five more shapes (Sequoia, chain, k-ary, a fan, a deep
    tree) compile nothing, and each one's greedy output equals the eager step's and HF's."""
    target, draft = models
    env = Envelope.for_shapes(SHAPES.values())
    runners = len(captured.RUNNERS)
    prompt = [1, 5, 7, 9, 3]
    graphs = None
    for name, shape in SHAPES.items():
        ref = greedy_reference(target, prompt, 24)
        eager = run(target, draft, prompt, shape, 24)
        with torch._dynamo.config.patch(error_on_recompile=graphs is not None):
            out = run(target, draft, prompt, shape, 24, compile=BACKEND, envelope=env)
        assert out.stats.step == "captured", name
        assert out.new_tokens == eager.new_tokens == ref, name
        assert out.stats.step_tokens[:-1] == eager.stats.step_tokens[: len(out.stats.step_tokens) - 1], name
        if graphs is None:
            graphs = counters["stats"]["unique_graphs"]
        assert counters["stats"]["unique_graphs"] == graphs, name
    assert len(captured.RUNNERS) <= runners + 1  # one runner for all six (the one the first made or found)


def test_padded_and_exact_envelopes_draft_the_same_trees(models):
    """Top-k trees are a function of the draft alone: padded or exact, the same trees step by step."""
    target, draft = models
    shape = SHAPES["chain-4"]  # the steps' code (uncompiled): the test above ties an envelope's graphs to it
    exact = run(target, draft, [4, 2, 9], shape, 20, compile=UNCOMPILED)
    padded = run(target, draft, [4, 2, 9], shape, 20, compile=UNCOMPILED,
                 envelope=Envelope.for_shapes(SHAPES.values()))
    assert padded.new_tokens == exact.new_tokens
    assert padded.stats.tree_sizes == exact.stats.tree_sizes and padded.stats.step_tokens == exact.stats.step_tokens
    assert np.sum(exact.stats.tree_sizes) > len(exact.stats.tree_sizes)  # trees were drafted


def test_an_envelope_that_does_not_cover_the_tree_is_refused(models):
    target, draft = models
    small = Envelope.for_shapes([SHAPES["chain-4"]])
    with pytest.raises(ValueError, match="does not fit envelope"):
        run(target, draft, [1, 2], SHAPES["fan-4"], 4, compile=BACKEND, envelope=small)
    with pytest.raises(ValueError, match="envelope must be"):
        run(target, draft, [1, 2], SHAPES["fan-4"], 4, compile=BACKEND, envelope=(8, 2, 2))


def test_a_wide_envelope_fits_its_caches_at_the_edge_of_their_capacity(models, monkeypatch):
    """A padded envelope's draft levels can hold more rows than it has nodes (16 rows x 6 levels for 8 nodes):
    the caches hold every row a step writes, even with no bucket rounding their capacity up (on CUDA the
    write past the end was a device-side assert in an H200 sweep with 256-row buckets)."""
    target, draft = models
    monkeypatch.setattr(treespec.core.compiled, "CAPACITY_BUCKET", 1)
    env = Envelope(8, (16,) * 6, 4)
    assert env.draft_slots > env.nodes
    prompt = [1, 5, 7, 9, 3]
    out = run(target, draft, prompt, SHAPES["sequoia-8"], 24, compile=UNCOMPILED, envelope=env)  # the same writes
    assert out.new_tokens == greedy_reference(target, prompt, 24)


@pytest.mark.parametrize("mode", ["topk", "sample"], ids=["captured", "host-drafted compiled"])
def test_a_runner_of_larger_capacity_serves_shorter_prompts(models, monkeypatch, mode):
    """Capacities in buckets of 64 rows here: after the longest prompt's run, prompts of smaller buckets run on its
    runner (its graphs serve any prompt that fits), exact; a prompt longer still makes a new one. Without the
    reuse a run over prompts of several lengths would compile a set of graphs per bucket (the GPU's buckets are
    512 rows)."""
    from treespec.core import compiled

    target, draft = models
    monkeypatch.setattr(compiled, "CAPACITY_BUCKET", 64)
    runners = captured.RUNNERS if mode == "topk" else compiled.RUNNERS
    runners.clear()
    shape, n = SHAPES["fan-4"], 12
    made = []
    for length in (150, 20, 90, 150, 260):
        prompt = [(7 * i + 3) % 60 + 2 for i in range(length)]
        out = run(target, draft, prompt, shape, n, mode, seed=0, compile=UNCOMPILED, budget=8)
        assert out.stats.step.split(",")[0] == ("captured" if mode == "topk" else "compiled")
        assert out.new_tokens == greedy_reference(target, prompt, n)
        made.append(len(runners))
    capacities = sorted(r.cache.capacity for r in runners.values())
    assert made == [1, 1, 1, 1, 2] and len(set(capacities)) == 2  # only the 260-token prompt outgrew the first
    assert capacities[0] < 260 + n < capacities[1]
    runners.clear()


def test_an_envelope_and_a_budgeted_tree_refuse_what_they_cannot_build_by_name():
    """No shapes, or the root alone, has no envelope (``max()`` of an empty sequence, or an envelope of one level
    and no child, before); the dynamic tree is a drafter mode, not a budgeted shape (the error offered it)."""
    with pytest.raises(ValueError, match="got none"):
        Envelope.for_shapes([])
    with pytest.raises(ValueError, match="the root alone"):
        Envelope.for_shapes([chain(2), chain(0)])
    with pytest.raises(ValueError, match="model drafter in mode 'dynamic'"):
        for_budget("dynamic", 5)


def test_sampled_trees_stops_and_chains_replay_the_envelopes_graphs():
    """After an envelope's first run compiles its graphs, nothing more compiles for: a shallower sampled tree (the
    placeholder q of undrafted levels was no inference tensor, and each step's noise kept the whole draw's strides,
    which follow the tree's depth), a confidence stop cutting steps at varying depths, a model drafter alone after
    a run with a given chain (the placeholder chain), and the same through a batch of two."""
    from tree_builders import chain as chain_of
    from treespec.core.buffers import with_chain
    from treespec.drafters.model import _Layout, as_shape
    from treespec.models.tiny import perturbed_copy, tiny_model

    target = tiny_model("llama", vocab=64, seed=0, scale=6.0)
    draft = perturbed_copy(target, 0.2)
    prompt = list(range(1, 10))  # prefilled eagerly: the level and verify graphs alone

    def graphs_after(runs):
        """New graphs of each run after the first (which compiles the envelope's)."""
        counts = []
        for go in runs:
            before = counters["stats"]["unique_graphs"]
            go()
            counts.append(counters["stats"]["unique_graphs"] - before)
        return counts[1:]

    env = Envelope.for_shapes([chain_of(4).paths, chain_of(3).paths])

    def sampled(shape, prompts=prompt, **kw):
        return lambda: treespec.generate(target, prompts, [treespec.ModelDrafter(draft, shape,
                                                                                 "sample_without_replacement", **kw)],
                                         max_new_tokens=12, temperature=0.7, seed=1, compile="eager", envelope=env)

    assert graphs_after([sampled(chain_of(4).paths), sampled(chain_of(3).paths), sampled(chain_of(4).paths)]) == [0, 0]
    assert graphs_after([sampled(chain_of(4).paths, [[1, 2, 3], [4, 5, 6, 7]]),
                         sampled(chain_of(3).paths, [[1, 2, 3], [4, 5, 6, 7]])]) == [0]
    # a confidence stop that never cuts, then one that cuts steps at several depths: the same runner (the threshold
    # is read on the host), and no graph for the cut steps' undrafted levels
    stops = [sampled(chain_of(4).paths, min_confidence=c) for c in (0.0, 0.05)]
    assert graphs_after(stops) == [0]
    assert len(set(stops[1]().stats.tree_sizes)) > 1  # it did cut steps at several depths
    shape = [(0,), (1,), (0, 0)]
    lay = _Layout.of(as_shape(shape))
    env = Envelope.padded([Envelope.exact(*with_chain(lay.parent, lay.rank, 3)), Envelope.exact(lay.parent, lay.rank)])
    with_ngram = [treespec.ModelDrafter(draft, shape), treespec.NGramDrafter(width=1, max_tokens=3)]
    assert graphs_after([lambda: treespec.generate(target, prompt, with_ngram, max_new_tokens=12, compile="eager",
                                                   envelope=env),
                         lambda: treespec.generate(target, prompt, [treespec.ModelDrafter(draft, shape)],
                                                   max_new_tokens=12, compile="eager", envelope=env)]) == [0]


def test_one_prefill_graph_serves_prompts_of_one_piece_and_of_several(monkeypatch):
    """A prompt of several prefill pieces after one of one piece compiles no prefill of its own (each piece was a
    slice keeping the whole prompt's row stride, which the first prompt's graph guards)."""
    from treespec.core import prefill
    from treespec.models.tiny import perturbed_copy, tiny_model

    monkeypatch.setattr(prefill, "PIECE", 24)  # pieces of at most 24 tokens (512 by default): short prompts
    target = tiny_model("llama", vocab=64, seed=1)
    draft = perturbed_copy(target, 0.3)
    new = []
    for n in (17, 60):
        before = counters["stats"]["unique_graphs"]
        out = treespec.generate(target, [(7 * i) % 63 + 1 for i in range(n)],
                                [treespec.ModelDrafter(draft, [(0,), (0, 0)])], max_new_tokens=4, compile="eager")
        assert out.stats.step == "captured"
        new.append(counters["stats"]["unique_graphs"] - before)
    assert new[0] > 0 and new[1] == 0
