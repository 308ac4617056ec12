"""compile=... with drafting on the host (treespec.core.compiled): exact, one compiled call per step, no
recompiles (CPU, aot_eager). Drafters the captured step cannot take (i.i.d. sampling, several drafters, a
shape over the budget) run here; tests/test_captured.py covers the captured step."""

import pytest
import torch
from torch._dynamo.utils import counters

import treespec
from stats import ALPHA
from test_exactness import BUSHY, four_token_pair, joint_p
from treespec.models.tiny import greedy_reference, tiny_model
from treespec.core import compiled, rule
from treespec.core.compiling import UNCOMPILED
from treespec.core.static_cache import StaticTreeCache

KARY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
BACKEND = "aot_eager"
#: the tests of the step's behaviour (greedy exactness, EOS, stale cache slots, one call per step) and the
#: joint-distribution tests run the step's functions uncompiled (tracing costs seconds a graph, running the steps a
#: fraction of that); the compiled graphs are tied to that code token for token, greedy (and HF's tokens) and
#: sampled with the same seed (test_no_graph_break_and_no_recompile_after_warmup)
STEP_BACKEND = UNCOMPILED
JOINT_BACKEND = UNCOMPILED


def run(target, draft, prompt, n, shape=BUSHY, mode="topk", **kwargs):
    return treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(draft, shape, mode)], max_new_tokens=n,
                             **kwargs)


@pytest.mark.parametrize("budget", [8, None], ids=["budget8", "no-budget"])
def test_compiled_greedy_equals_eager(models, budget):
    target, draft = models
    for k, prompt in enumerate([[1, 5, 7, 9, 3], [4], [10, 11, 12, 13, 14, 15, 16, 17]]):
        eager = run(target, draft, prompt, 30, budget=budget, seed=k)
        compiled = run(target, draft, prompt, 30, budget=budget, seed=k, compile=STEP_BACKEND)
        assert compiled.new_tokens == eager.new_tokens == greedy_reference(target, prompt, 30)
        assert compiled.sequences[0].tolist() == prompt + compiled.new_tokens
        assert compiled.stats.steps == sum(compiled.stats.accepted_hist)


def test_compiled_steps_record_the_verifier_the_call_named(models):
    """Both steps run under one loop: the stats name the call's verifier (greedy walks ignore it)."""
    target, draft = models
    for compile in (False, STEP_BACKEND):
        out = run(target, draft, [1, 5, 7], 6, budget=8, verifier="traversal", compile=compile)
        assert out.stats.verifier == "traversal"


def test_compiled_eos_stops_like_hf(models):
    target, draft = models
    prompt = [1, 5, 7, 9, 3]
    eos = greedy_reference(target, prompt, 30)[17]
    out = run(target, draft, prompt, 30, budget=8, eos_token_id=eos, compile=STEP_BACKEND)
    assert out.new_tokens == greedy_reference(target, prompt, 30, eos=eos)


def test_identical_draft_accepts_whole_path():
    target = tiny_model("llama", vocab=64, hidden=64, layers=1, scale=6)
    chain = [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (1,), (1, 0)]
    out = run(target, target, [1, 2, 3], 41, shape=chain, budget=6, compile=STEP_BACKEND)  # over budget: host-drafted
    assert out.stats.step.startswith("compiled, drafted on the host")
    # the budget keeps the shape's first 5 nodes in BFS order, a chain of depth 3 (and a sibling);
    # the last step wants only the bonus token: no drafting
    assert out.stats.accepted_hist == [1, 0, 0, 10]
    assert out.new_tokens == greedy_reference(target, [1, 2, 3], 41)


# each family with one rule: the graphs' model forward is the family's whatever the rule, their acceptance the
# rule's whatever the family (a graph break or recompile in either shows in the pair that traces it)
@pytest.mark.parametrize("models,temperature", [("llama", 0.0), ("qwen2", 1.0)], ids=["llama-greedy", "qwen2-sampled"],
                         indirect=["models"])
def test_no_graph_break_and_no_recompile_after_warmup(models, temperature):
    target, draft = models
    mode = "sample"  # drafted on the host (topk is captured: tests/test_captured.py)
    run(target, draft, [1, 2, 3], 8, shape=KARY, mode=mode, budget=8, temperature=temperature, seed=0,
        compile=BACKEND)  # warm-up: compiles the step's graphs
    graphs = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = run(target, draft, [9, 8, 7, 6], 80, shape=KARY, mode=mode, budget=8, temperature=temperature, seed=1,
                  compile=BACKEND)
    assert counters["stats"]["unique_graphs"] == graphs
    assert not counters["graph_break"]
    assert out.stats.steps >= 20
    assert sum(1 for c in out.stats.accepted_hist if c) >= 2  # acceptance varied across the steps
    # the graphs are the step's code: uncompiled, the same seed gives the same tokens (what the joint tests run)
    plain = run(target, draft, [9, 8, 7, 6], 80, shape=KARY, mode=mode, budget=8, temperature=temperature, seed=1,
                compile=UNCOMPILED)
    assert plain.new_tokens == out.new_tokens and plain.stats.step_tokens == out.stats.step_tokens
    if temperature == 0:  # and greedy, the graphs give HF's own tokens
        assert out.new_tokens == greedy_reference(target, [9, 8, 7, 6], 80)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_one_compiled_call_per_step_and_no_graph_output_feeds_another(models, monkeypatch, temperature):
    """Under CUDA graphs (``mode="reduce-overhead"``) replaying one graph may overwrite the outputs of
    another (pytorch issue 160281), so a step is ONE compiled call whose inputs are never the output
    of an earlier call. Checked on CPU by watching the calls: outputs are kept alive (their memory
    cannot be reused) and no later input may share their storage."""
    target, draft = models
    kwargs = dict(shape=KARY, mode="sample", budget=8, temperature=temperature, compile=STEP_BACKEND)
    run(target, draft, [1, 2, 3], 4, seed=0, **kwargs)  # builds the runner
    runner = next(r for r in compiled.RUNNERS.values()
                  if r.model is target and r.width == 8 and r.backend == STEP_BACKEND)
    outputs, calls = [], []

    def storages(args):
        for a in args:
            for x in (a if isinstance(a, tuple) else [a]):
                if isinstance(x, torch.Tensor):
                    yield x.untyped_storage().data_ptr()

    for name in ("step", "forward"):
        def watched(*args, _fn=getattr(runner, name), _name=name):
            held = {o.untyped_storage().data_ptr() for o in outputs}
            assert not held & set(storages(args)), f"{_name} was fed the output of an earlier compiled call"
            calls.append(_name)
            out = _fn(*args)
            outputs.append(out)
            return out
        monkeypatch.setattr(runner, name, watched)
    out = run(target, draft, [9, 8, 7, 6], 24, seed=1, **kwargs)
    assert calls == ["step"] * out.stats.steps


def test_garbage_in_unused_cache_slots_changes_nothing(models):
    """Stale tree rows, and large junk, beyond the committed length are masked out exactly."""
    target, draft = models
    prompt = [1, 5, 7, 9, 3]
    clean = run(target, draft, prompt, 30, mode="sample", budget=8, compile=STEP_BACKEND, seed=0)
    runner = next(r for r in compiled.RUNNERS.values()
                  if r.model is target and r.width == 8 and r.backend == STEP_BACKEND)
    gen = torch.Generator().manual_seed(0)

    def poison(_tokens):
        n = int(runner.cache.length)
        for layer in runner.cache.layers:
            for buf in (layer.keys, layer.values):
                junk = 1e4 * torch.randn(buf[..., n:, :].shape, generator=gen)
                buf[..., n:, :] = junk
    poisoned = run(target, draft, prompt, 30, mode="sample", budget=8, compile=STEP_BACKEND, on_tokens=poison,
                   seed=0)
    assert poisoned.new_tokens == clean.new_tokens
    # the control: the same junk inside the committed rows does change the output
    def poison_committed(_tokens):
        for layer in runner.cache.layers:
            layer.keys[..., 2:4, :] = 1e4 * torch.randn(layer.keys[..., 2:4, :].shape, generator=gen)
    broken = run(target, draft, prompt, 30, mode="sample", budget=8, compile=STEP_BACKEND, on_tokens=poison_committed,
                 seed=0)
    assert broken.new_tokens != clean.new_tokens


def test_static_cache_commit_gathers_rows_for_all_layers():
    target = tiny_model("qwen2", vocab=32, hidden=32)
    cache = StaticTreeCache(target, 16)
    assert all(not layer.keys.any() for layer in cache.layers)  # zero-filled
    head_dim = target.config.hidden_size // target.config.num_attention_heads
    assert all(layer.k_head_dim == layer.v_head_dim == head_dim for layer in cache.layers)  # HF's layer fields
    for i, layer in enumerate(cache.layers):
        layer.keys[0, 0, :, 0] = torch.arange(16.0) + 100 * i
    cache.length.fill_(3)
    rows = torch.tensor([3, 5, 6, 6, 7, 8, 9, 10])  # path rows 3, 5, 6 then identity padding
    rows[3:] = 3 + torch.arange(3, 8)
    cache.commit(rows, torch.tensor(3))
    assert int(cache.length) == 6
    for i, layer in enumerate(cache.layers):
        assert layer.keys[0, 0, :6, 0].tolist() == [100 * i + v for v in (0, 1, 2, 3, 5, 6)]


def test_greedy_path_is_the_deepest_matching_node():
    # tree: 0 -> 1 -> 2, 0 -> 3; padded to width 5
    tokens = torch.tensor([9, 4, 5, 6, 0])
    parent = torch.tensor([0, 0, 1, 0, 0])
    valid = torch.tensor([True, True, True, True, False])
    anc = torch.eye(5, dtype=torch.bool)
    anc[1, 0] = anc[2, 0] = anc[2, 1] = anc[3, 0] = True
    logits = torch.zeros(2, 5, 10)  # two rows of one batch: the same tree, different targets
    logits[:, 0, 4] = logits[:, 1, 5] = logits[:, 2, 7] = 1.0  # argmax: 4 after root, 5 after node 1, then 7
    logits[1, 1, 5], logits[1, 1, 1] = 0.0, 1.0  # row 1: node 2 does not match: stop at node 1, extra = 1
    on_path, extra = rule.greedy_path(logits, tokens.expand(2, 5), parent, anc, valid.expand(2, 5))
    assert on_path.tolist() == [[True, True, True, False, False], [True, True, False, False, False]]
    assert extra.tolist() == [7, 1]
    on_path = on_path[1]
    rows, m = rule.path_rows(on_path)
    assert rows.tolist() == [0, 1, 2, 3, 4] and int(m) == 2


def test_compiled_joint_distribution_matches_target():
    """The host-drafted compiled step (i.i.d. draws: merged duplicates); trials sized by ``test_exactness.trials``
    on its 4-token pair (this step runs its trials one by one). (Top-k trees of one drafter are captured:
    tests/test_captured.py.)"""
    target, draft = four_token_pair()
    assert joint_p(target, draft, lambda: [treespec.ModelDrafter(draft, BUSHY, "sample")], "compiled-sample",
                   temperature=1.0, budget=8, compile=JOINT_BACKEND) > ALPHA


def test_compiled_exactness_test_detects_a_biased_verifier(monkeypatch):
    """Negative control at the same size: accepting every proposal (the shared rule patched) is biased, and the
    host-drafted compiled step's test sees it."""
    target, draft = four_token_pair()

    def always_accept(r, tokens, q, u):
        return torch.zeros(r.shape[:-1], dtype=torch.long, device=r.device), r

    monkeypatch.setattr(rule, "verify_proposals", always_accept)
    assert joint_p(target, draft, lambda: [treespec.ModelDrafter(draft, BUSHY, "sample")], "compiled-biased",
                   temperature=1.0, budget=8, compile=JOINT_BACKEND) < ALPHA


def test_bad_compile_argument_is_refused():
    target = tiny_model("llama", vocab=32, hidden=32)
    with pytest.raises(ValueError, match="compile must be"):
        treespec.generate(target, [1, 2], max_new_tokens=2, compile=3)


def test_float16_sampling_is_refused():
    target = tiny_model("llama", vocab=32, hidden=32).half()
    with pytest.raises(ValueError, match="float16"):
        treespec.generate(target, [1, 2], max_new_tokens=2, temperature=1.0)


def test_compiled_without_drafters_and_with_an_ngram_drafter(models):
    """No drafter (a one-node tree: compiled for real), and an n-gram drafter beside a model drafter (the step's
    behaviour: its functions uncompiled, as the other behaviour tests)."""
    target, draft = models
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    ref = greedy_reference(target, prompt, 20)
    assert treespec.generate(target, prompt, max_new_tokens=20, compile=BACKEND).new_tokens == ref
    mixed = [treespec.NGramDrafter(width=2), treespec.ModelDrafter(draft, KARY)]
    out = treespec.generate(target, prompt, drafters=mixed, max_new_tokens=20, budget=8, compile=STEP_BACKEND)
    assert out.new_tokens == ref
    sampled = treespec.generate(target, prompt, drafters=mixed, max_new_tokens=20, budget=8, temperature=1.0, seed=5,
                                compile=STEP_BACKEND)
    assert len(sampled.new_tokens) == 20


def test_a_compiled_forward_is_not_compiled_again_when_another_model_class_comes(monkeypatch):
    """The forward's cache-argument name is memoised per model class in a dict; a graph that read the memo
    would guard on its length and compile again once another class fills it (a wasted compile per graph,
    tens of seconds on a GPU for a real model; in one process, a second pair's first run recompiled the
    first pair's runners). Compiled forwards pass the name resolved when their cache is made."""
    from treespec.core import attention, static_cache
    from treespec.core.prefill import ChunkedPrefill

    other = tiny_model("qwen2", vocab=32, hidden=32)
    other(torch.tensor([[1, 2]]))  # transformers' own registries hold both classes (its graphs guard on them)

    def graphs_after_another_class(model) -> int:
        """Graphs the second prompt compiles once another class filled the memo (the first prompt compiles, or
        passes the guards of a graph another test of this worker made: what it does is not counted). No
        ``torch._dynamo.reset()``: it would wipe the graphs of every runner this worker shares across tests."""
        monkeypatch.setattr(attention, "_CACHE_ARGUMENT", {})  # as in a fresh process
        prefill = ChunkedPrefill(model, StaticTreeCache(model, 256), "eager", None, chunk=16)  # guards: dynamo alone
        prefill([i % 40 + 1 for i in range(40)])
        before = counters["stats"]["unique_graphs"]
        attention.cache_argument(type(other))  # another class's first lookup
        prefill([i % 40 + 1 for i in range(70)])
        return counters["stats"]["unique_graphs"] - before

    model = tiny_model(seed=3)
    assert graphs_after_another_class(model) == 0
    # negative control: the forward translates ``past_key_values`` through the memo inside the graph
    name = attention.cache_argument(type(model))
    monkeypatch.setattr(static_cache, "tree_forward",
                        lambda m, **kw: attention.tree_forward(m, past_key_values=kw.pop(name), **kw))
    assert graphs_after_another_class(model) == 1
