"""The captured step (treespec.core.captured): a static draft tree drafted, verified and committed in
compiled calls only (start, one per depth, verify). Exact (greedy = HF greedy; sampled joint law = the target's),
one graph per call with no recompiles, and correct when every compiled output dies at the next compiled call
(under inductor's weight freezing: tests/test_freezing.py)."""

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

import treespec
from stats import ALPHA
from test_exactness import BUSHY, joint_p, pair  # noqa: F401 (pair is a fixture)
from treespec.core import captured, captured_runner
from treespec.core import rule
from treespec.core.buffers import Envelope, tree_buffers
from treespec.core.compiling import UNCOMPILED
from treespec.core.engine import step_for
from treespec.core.request import Request
from treespec.drafters.model import _Layout, as_shape
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

#: one worker runs this file: its tests of one pair reuse each other's runners (compiled graphs)
pytestmark = pytest.mark.xdist_group("captured")

BACKEND = "aot_eager"
#: the tests of the step's behaviour (exactness, EOS, stale cache rows, outputs that die) run the step's functions
#: uncompiled: tracing costs 2-3 s a graph and a test's runner compiles two, where running its steps takes a fraction
#: of a second. The compiled graphs are tied to that code token for token, greedy and sampled with the same seed, in
#: the tests about compiling (test_no_graph_break_and_no_recompile_over_varying_steps, the confidence stop's test,
#: tests/test_batch_captured.py, tests/test_compiled_traversal.py, tests/test_captured_chain.py)
STEP_BACKEND = UNCOMPILED
JOINT_BACKEND = UNCOMPILED
KARY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
DEEP = [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)]  # a leaf at depth 1 under node 2
CHAIN4 = [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]
CHAIN5 = [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)]
#: an envelope larger and deeper than every tree of this file: a tree of it runs padded. The tests that are not
#: about envelopes run their trees in it, so that the tests of one pair share one runner's graphs (one level graph
#: and one verify graph) instead of compiling each tree's own (the CPU default, a level graph per level width;
#: tests/test_envelope.py checks the default envelope)
PADDED = Envelope.for_shapes([BUSHY, DEEP, KARY, CHAIN5, [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (0, 0, 0)]])


def run(target, draft, prompt, n, shape=KARY, mode="topk", **kwargs):
    kwargs.setdefault("envelope", PADDED)
    return treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(draft, shape, mode)], max_new_tokens=n,
                             **kwargs)


def test_tree_buffers_lay_out_levels_slots_and_siblings():
    layout = _Layout.of(as_shape(DEEP))
    buf = tree_buffers(layout.parent, layout.rank)
    assert buf.envelope == Envelope(8, (2, 2, 1, 1), 2)
    assert buf.parent.tolist() == [-1, 0, 0, 1, 2, 3, 3, 5]
    assert buf.depth.tolist() == [0, 1, 1, 2, 2, 3, 3, 4]
    # slots: pending (id 8), root, then the nodes with children level by level (node 4, a leaf at depth 2, has none)
    assert buf.slot_node.tolist() == [8, 0, 1, 2, 3, 5]
    assert [lv.nodes.tolist() for lv in buf.levels] == [[8, 0], [1, 2], [3], [5]]
    assert buf.chosen_at.tolist() == [-1, 0, 0, 1, 1, 2, 2, 3]
    # level 0 keeps the root's logits only (its pending row is no parent): depth-1 nodes read row 0
    assert buf.row.tolist() == [0, 0, 0, 0, 1, 0, 0, 0] and buf.rank.tolist() == [0, 0, 1, 0, 0, 0, 1, 0]
    assert buf.q_row.tolist() == [0, 0, 0, 1, 2, 3, 3, 4]
    assert buf.levels[3].block[0].tolist() == [True, True, True, False, True, True]  # node 5: pending, 0, 1, 3, self
    assert buf.earlier_siblings[:, 0].tolist() == [-1, -1, 1, -1, -1, -1, 5, -1]
    with pytest.raises(ValueError, match="BFS"):
        tree_buffers(np.array([-1, 0, 1, 0]), np.array([0, 0, 0, 1]))


def test_tree_buffers_in_a_padded_envelope():
    """Padding nodes never exist and attend to themselves; every level forwards the envelope's rows, the
    pending row's logits kept (one graph for every level); a tree outside the envelope is refused."""
    layout = _Layout.of(as_shape(DEEP))
    env = Envelope.padded([Envelope.exact(layout.parent, layout.rank), Envelope(10, (2, 3), 3)])
    assert env == Envelope(10, (3, 3, 3, 3), 3) and env.covers(Envelope(8, (2, 2, 1, 1), 2))
    buf = tree_buffers(layout.parent, layout.rank, env)
    assert buf.size == 8 and buf.parent.tolist()[8:] == [-1, -1] and buf.chosen_at.tolist()[8:] == [-1, -1]
    assert not buf.ancestors[8:, :8].any() and buf.ancestors[8:, 8:].diagonal().all()
    assert [lv.nodes.tolist() for lv in buf.levels] == [[10, 0, 11], [1, 2, 11], [3, 11, 11], [5, 11, 11]]
    assert buf.row.tolist()[:8] == [0, 1, 1, 0, 1, 0, 0, 0]  # the root is row 1 of level 0
    assert buf.post_order.tolist()[8:] == [8, 9]
    with pytest.raises(ValueError, match="does not fit the envelope"):
        tree_buffers(layout.parent, layout.rank, Envelope(8, (2, 2, 1), 2))


# each family with one drafting mode (the modes share the step; the families share nothing but it)
@pytest.mark.parametrize("models,mode", [("llama", "topk"), ("qwen2", "sample_without_replacement")],
                         indirect=["models"])
def test_captured_greedy_equals_hf_and_the_eager_step(models, mode):
    target, draft = models
    for k, prompt in enumerate([[1, 5, 7, 9, 3], [4], [10, 11, 12, 13, 14, 15, 16, 17]]):
        for shape in (KARY, DEEP):
            eager = run(target, draft, prompt, 30, shape=shape, mode=mode, seed=k)
            out = run(target, draft, prompt, 30, shape=shape, mode=mode, seed=k, compile=STEP_BACKEND)
            assert out.stats.step == "captured"
            assert out.new_tokens == eager.new_tokens == greedy_reference(target, prompt, 30)
            assert out.sequences[0].tolist() == prompt + out.new_tokens
            assert sum(out.stats.step_tokens) == 30
            if mode == "topk":  # the same deterministic trees: the same walk, step by step
                assert out.stats.step_tokens[:-1] == eager.stats.step_tokens[: len(out.stats.step_tokens) - 1]


def test_an_identical_draft_accepts_every_path(models):
    target, _ = models
    out = run(target, target, [1, 2, 3], 40, shape=CHAIN4, compile=STEP_BACKEND)
    assert out.stats.step_tokens == [5] * 8 and out.new_tokens == greedy_reference(target, [1, 2, 3], 40)


def test_eos_stops_like_hf(models):
    target, draft = models
    prompt = [1, 5, 7, 9, 3]
    eos = greedy_reference(target, prompt, 30)[17]
    out = run(target, draft, prompt, 30, eos_token_id=eos, compile=STEP_BACKEND)
    assert out.new_tokens == greedy_reference(target, prompt, 30, eos=eos)


def test_a_dynamic_rope_target_near_the_end_of_its_context_equals_hf():
    """The captured step forwards its whole tree, so near the end of the context it holds nodes past it (never
    used). A "dynamic" RoPE (HF's ``dynamic_rope_update``) recomputes its frequencies for a whole forward that shows
    it a position past the context, which changed the kept nodes' logits (30 of 40 runs parted from HF's greedy
    here); those positions are clamped (``StaticTreeCache.forward``). Single and batched runs, up to the last
    position."""
    import transformers

    config = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                      rope_scaling={"rope_type": "dynamic", "factor": 8.0}, rope_theta=10.0,
                                      attn_implementation="sdpa")
    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(config).eval().requires_grad_(False)
    with torch.no_grad():  # sharper attention: positions matter to the logits
        for layer in target.model.layers:
            layer.self_attn.q_proj.weight.mul_(6), layer.self_attn.k_proj.weight.mul_(6)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (8, 10, 12, 14)]
    for prompt in prompts:
        n = 16 - len(prompt)
        out = run(target, target, prompt, n, shape=CHAIN5, compile=STEP_BACKEND)
        assert out.stats.step == "captured" and out.new_tokens == greedy_reference(target, prompt, n)
    batch = run(target, target, prompts[:2], 6, shape=CHAIN5, compile=STEP_BACKEND)
    assert [row.new_tokens for row in batch.rows] == [greedy_reference(target, p, 6) for p in prompts[:2]]


def route(target, drafters, budget=None) -> str:
    """The step ``generate(compile=...)`` takes for a request (``engine.step_for``; nothing compiled: the runs'
    own ``stats.step`` is asserted by the tests that run them)."""
    req = Request.checked(target, [1, 2], drafters, 4, 0.0, 0, 1.0, None, 0, budget, None, "rrs", BACKEND)
    return step_for(req, torch.Generator()).name


def test_which_configurations_are_captured_and_why_not(models):
    target, draft = models
    assert route(target, [treespec.ModelDrafter(draft, KARY)]) == "captured"
    assert route(target, [treespec.ModelDrafter(draft, KARY, min_confidence=0.1)]) == "captured"  # read on the host
    assert route(target, [treespec.NGramDrafter(), treespec.ModelDrafter(draft, KARY)]) == "captured"  # + given chain
    for drafters, why in [([treespec.ModelDrafter(draft, KARY, "sample")], "mode='sample'"),
                          ([treespec.ModelDrafter(draft, KARY), treespec.NGramDrafter(width=2)], "width 2"),
                          ([treespec.ModelDrafter(draft, KARY), treespec.ModelDrafter(draft, KARY),
                           treespec.NGramDrafter()], "3 drafters"),
                          ([treespec.NGramDrafter()], "drafts on the host")]:
        step = route(target, drafters)
        assert step.startswith("compiled, drafted on the host") and why in step, step
    from treespec.models.precision import quantize_int8
    int8 = quantize_int8(perturbed_copy(target, 0.3))
    step = route(target, [treespec.ModelDrafter(int8, KARY)])
    assert "int8" in step and "bfloat16" in step
    # on a GPU the stop would copy the confidence to the host after every level: host drafting there
    req = Request.checked(target, [1, 2], [treespec.ModelDrafter(draft, KARY, min_confidence=0.1)],
                          4, 0.0, 0, 1.0, None, 0, None, None, "rrs", BACKEND)
    cuda = type("CudaRequest", (), {"drafters": req.drafters, "budget": None, "device": torch.device("cuda")})()
    assert "CPU only" in captured.capturable(cuda)
    assert "over the budget 4" in route(target, [treespec.ModelDrafter(draft, KARY)], budget=4)


# each family with one rule: the graphs' model forward is the family's whatever the rule, their acceptance the
# rule's whatever the family (a graph break or recompile in either shows in the pair that traces it)
@pytest.mark.parametrize("models,temperature", [("llama", 0.0), ("qwen2", 1.0)], ids=["llama-greedy", "qwen2-sampled"],
                         indirect=["models"])
def test_no_graph_break_and_no_recompile_over_varying_steps(models, temperature):
    target, draft = models
    mode = "topk" if temperature == 0 else "sample_without_replacement"
    run(target, draft, [1, 2, 3], 8, mode=mode, temperature=temperature, seed=0, compile=BACKEND)  # compiles
    graphs = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = run(target, draft, [9, 8, 7, 6, 5, 4, 3], 90, mode=mode, temperature=temperature, seed=1,
                  compile=BACKEND)
    assert counters["stats"]["unique_graphs"] == graphs
    assert not counters["graph_break"]
    assert out.stats.steps >= 30
    assert sum(1 for c in out.stats.accepted_hist if c) >= 2  # acceptance varied across the steps
    # the graphs are the step's code: uncompiled, the same seed gives the same tokens (what the joint tests run)
    plain = run(target, draft, [9, 8, 7, 6, 5, 4, 3], 90, mode=mode, temperature=temperature, seed=1,
                compile=UNCOMPILED)
    assert plain.new_tokens == out.new_tokens and plain.stats.step_tokens == out.stats.step_tokens
    if temperature == 0:  # and greedy, the graphs give HF's own tokens
        assert out.new_tokens == greedy_reference(target, [9, 8, 7, 6, 5, 4, 3], 90)


@pytest.mark.parametrize("clone", [True, False], ids=["cloned", "control-not-cloned"])
def test_correct_when_each_compiled_output_dies_at_the_next_compiled_call(models, monkeypatch, clone):
    """CUDA graphs (``reduce-overhead``) may reuse a graph's output memory at the next replay
    (pytorch issue 160281). Simulated on CPU at its strictest: every output of a compiled call is
    overwritten with junk as soon as any compiled call runs again. With the clones the runner makes
    under CUDA graphs, output stays HF's greedy; without them (the control) it breaks. (The runner's calls run
    uncompiled: what is checked is the runner's cloning between them, the same code around compiled calls.)"""
    target, draft = models
    captured.RUNNERS.clear()
    run(target, draft, [1, 2], 2, compile=STEP_BACKEND)
    (runner,) = captured.RUNNERS.values()
    monkeypatch.setattr(runner, "clone_between", clone)
    live: list[torch.Tensor] = []

    def dying(fn):
        def call(*args):
            for t in live:
                t.fill_(-7 if not t.dtype.is_floating_point else float("nan"))
            live.clear()
            out = fn(*args)
            live.extend(t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor))
            return out
        return call

    for name in ("level_step", "verify_step"):
        monkeypatch.setattr(runner, name, dying(getattr(runner, name)))
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]
    try:
        ok = run(target, draft, prompt, 30, compile=STEP_BACKEND).new_tokens == greedy_reference(target, prompt, 30)
    except (IndexError, RuntimeError):  # junk indices
        ok = False
    assert ok == clone
    captured.RUNNERS.clear()


def test_garbage_in_unused_rows_of_both_caches_changes_nothing(models):
    target, draft = models
    prompt = [1, 5, 7, 9, 3]
    captured.RUNNERS.clear()
    clean = run(target, draft, prompt, 30, compile=STEP_BACKEND)
    (runner,) = captured.RUNNERS.values()
    gen = torch.Generator().manual_seed(0)

    # the draft's next step first commits rows of its last tree: junk goes past that tree's slots
    tree_slots = {id(runner.cache): 0, id(runner.draft_cache): sum(runner.envelope.rows)}

    def poison(_tokens):
        for cache in (runner.cache, runner.draft_cache):
            rows = slice(int(cache.length) + tree_slots[id(cache)], None)
            for layer in cache.layers:
                for buf in (layer.keys, layer.values):
                    buf[..., rows, :] = 1e4 * torch.randn(buf[..., rows, :].shape, generator=gen)

    def poison_committed(_tokens):
        rows = slice(0, int(runner.cache.length))
        for layer in runner.cache.layers:
            for buf in (layer.keys, layer.values):
                buf[..., rows, :] = 1e4 * torch.randn(buf[..., rows, :].shape, generator=gen)
    poisoned = run(target, draft, prompt, 30, compile=STEP_BACKEND, on_tokens=poison)
    assert poisoned.new_tokens == clean.new_tokens and poisoned.stats.step_tokens == clean.stats.step_tokens
    broken = run(target, draft, prompt, 30, compile=STEP_BACKEND, on_tokens=poison_committed)
    assert broken.new_tokens != clean.new_tokens  # the control: junk in committed rows does show


@pytest.mark.parametrize("mode,kwargs", [("topk", dict(temperature=1.0)),
                                         ("sample_without_replacement", dict(temperature=0.7)),
                                         ("sample_without_replacement", dict(temperature=1.0, top_p=0.6))],
                         ids=["topk-T1", "wor-T0.7", "wor-topp0.6"])
def test_captured_joint_distribution_matches_target(pair, mode, kwargs, monkeypatch):  # noqa: F811
    """Trials sized by ``test_exactness.trials``. Top-p 0.6 leaves fewer tokens than the root's 3 children: draws
    that do not exist drop their subtree. BUSHY runs padded into the envelope of larger, deeper trees (padding
    nodes, padded levels and rows must not change the law; the two draws-without-replacement cases share a runner)."""
    target, draft = pair
    assert joint_p(target, draft, lambda: [treespec.ModelDrafter(draft, BUSHY, mode)], f"captured-{mode}-{kwargs}",
                   compile=JOINT_BACKEND, envelope=PADDED, **kwargs) > ALPHA


def test_older_siblings_are_removed_as_the_host_proposals_do():
    """Each without-replacement proposal is verified against ``q`` with its older siblings' tokens removed and
    renormalised: the captured step's tensor form equals the host proposals' (``rule.draw_without_replacement_q``),
    also where the root's token (what a padding entry reads) is an older sibling's token, and the control (``q``
    itself) does not. (A joint-distribution control of this fault was vacuous: at 400 trials of this pair's 216
    cells the G-test pooled everything into one cell, and at 1,500 trials its bias still gives p = 0.1.)"""
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(5, 9, generator=g), -1)  # rows: the proposals of nodes 1..5
    tokens = torch.tensor([7, 7, 2, 5, 1, 8])  # node v's token; the root and node 1 share token 7
    earlier = torch.tensor([[-1, -1], [1, -1], [1, 2], [-1, -1], [4, -1]])  # each proposal's older siblings
    runner = captured_runner.CapturedRunner.__new__(captured_runner.CapturedRunner)
    got = runner._without_older_siblings(q[None], tokens[None], earlier)[0]  # a batch of one row
    for row in range(5):
        exclude = tuple(int(tokens[v]) for v in earlier[row] if v >= 0)
        assert torch.allclose(got[row], rule.draw_without_replacement_q(q[row], exclude))
    assert not torch.allclose(q[1], rule.draw_without_replacement_q(q[1], (7,)))  # the control differs


def test_joint_test_detects_a_captured_step_that_accepts_everything(pair, monkeypatch):  # noqa: F811
    target, draft = pair
    monkeypatch.setattr(rule, "verify_proposals",
                        lambda r, tokens, q, u: (torch.zeros(r.shape[:-1], dtype=torch.long), r))
    captured.RUNNERS.clear()
    p = joint_p(target, draft, lambda: [treespec.ModelDrafter(draft, BUSHY, "topk")], "captured-accept-all",
                temperature=1.0, compile=JOINT_BACKEND, envelope=PADDED)
    captured.RUNNERS.clear()
    assert p < ALPHA


@pytest.mark.parametrize("models,shape", [("qwen2", CHAIN5), ("llama", DEEP)], ids=["qwen2-chain", "llama-tree"],
                         indirect=["models"])
def test_the_confidence_stop_drafts_less_and_walks_the_eager_steps_trees(models, shape):
    """With ``min_confidence`` the captured step stops where ``ModelDrafter`` stops: the same trees step by
    step as the eager step (greedy: the same accepted lengths), HF's output, fewer draft forwards; a stop of
    0 never stops and 1 always stops after the first depth (no recompile between thresholds: the padded envelope's
    one level graph serves every depth)."""
    target, draft = models
    prompt = [1, 5, 7, 9, 3]
    ref = greedy_reference(target, prompt, 40)
    forwards = {}
    plain = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, shape)], max_new_tokens=40)  # no stop
    k = int(np.sum(40 - np.cumsum([0] + plain.stats.step_tokens)[:-1] > max(map(len, shape)) + 1))
    forwards[None] = sum(plain.stats.tree_sizes[:k])
    for stop in (0.0, 0.05, 1.0):
        eager = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, shape, min_confidence=stop)],
                                  max_new_tokens=40)
        with torch._dynamo.config.patch(error_on_recompile=stop != 0.0):  # the first compiles
            out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, shape, min_confidence=stop)],
                                    max_new_tokens=40, compile=BACKEND, envelope=PADDED)
        assert out.stats.step == "captured" and out.new_tokens == eager.new_tokens == ref
        # the eager step shortens the trees near the end to what is left to generate (the captured shape is
        # fixed): compare the steps that start with more than the tree's depth + 1 tokens left
        done = np.cumsum([0] + eager.stats.step_tokens)
        k = int(np.sum(40 - done[:-1] > max(map(len, shape)) + 1))
        assert out.stats.step_tokens[:k] == eager.stats.step_tokens[:k]
        assert out.stats.tree_sizes[:k] == eager.stats.tree_sizes[:k] and k >= 5
        forwards[stop] = sum(out.stats.tree_sizes[:k])
    assert forwards[0.05] < forwards[None] == forwards[0.0]
    assert forwards[1.0] < forwards[0.05]


def test_captured_confidence_stop_keeps_the_joint_law(pair, monkeypatch):  # noqa: F811
    """Draws without replacement at T=1 with a stop of 0.3 (tuned recipes use 0.1 when sampling)."""
    target, draft = pair
    make = lambda: [treespec.ModelDrafter(draft, BUSHY, "sample_without_replacement", min_confidence=0.3)]  # noqa: E731
    assert joint_p(target, draft, make, "captured-stop", compile=JOINT_BACKEND, temperature=1.0,
                   envelope=PADDED) > ALPHA


def test_a_model_changed_in_place_gets_a_new_runner(models):
    """A runner's graphs hold the model as it was (inductor's freezing makes its weights constants; its caches are in
    its dtype): after an in-place ``load_state_dict`` or ``.to(dtype)`` the next compiled call makes a new runner,
    whose output is the model's as it is now (the old one ran the old weights, or failed deep in a trace)."""
    from treespec.core.runners import model_key
    from treespec.models.tiny import tiny_model

    target, _ = models
    changed = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=0)
    prompt = [1, 5, 7, 9, 3]
    before = run(changed, changed, prompt, 12, shape=CHAIN4, compile=STEP_BACKEND)
    key = model_key(changed)
    changed.config.max_position_embeddings *= 2  # the runner's cache clamps positions at the context it was made for
    assert model_key(changed) != key
    changed.config.max_position_embeddings //= 2
    assert model_key(changed) == key
    changed.load_state_dict(perturbed_copy(changed, 0.5).state_dict())
    assert model_key(changed) != key
    after = run(changed, changed, prompt, 12, shape=CHAIN4, compile=STEP_BACKEND)
    assert after.new_tokens == greedy_reference(changed, prompt, 12) != before.new_tokens
    changed.to(torch.bfloat16)
    out = run(changed, changed, prompt, 12, shape=CHAIN4, compile=STEP_BACKEND)
    assert out.stats.step == "captured" and out.new_tokens == greedy_reference(changed, prompt, 12)


@pytest.mark.parametrize("mode, temperature", [("topk", 0.0), ("sample_without_replacement", 1.0)])
def test_a_node_wider_than_the_vocabulary_drafts_what_the_host_step_drafts(mode, temperature):
    """A node with more children than the vocabulary has tokens: the host step drafts the vocabulary's and drops the
    ranks past it; the captured step reused the last rank's token for them (extra, duplicate nodes: more draft and
    verification work, other statistics). Now they do not exist there either: the same trees, tokens and stats."""
    from tree_builders import kary

    target = tiny_model("qwen2", vocab=16, hidden=64, layers=1, scale=4, seed=0)
    draft = perturbed_copy(target, 0.3)
    shape = kary((19, 2))
    runs = [treespec.generate(target, [1, 2, 3], [treespec.ModelDrafter(draft, shape, mode)], max_new_tokens=12,
                              temperature=temperature, seed=3, compile=backend) for backend in (False, STEP_BACKEND)]
    host, capt = (r.stats for r in runs)
    assert capt.step == "captured" and host.step == "eager"
    assert max(capt.tree_sizes) == max(host.tree_sizes) == 1 + 16 * 3  # the root, 16 children, 2 under each
    if temperature == 0:  # (sampled, the two steps draw their numbers otherwise: other paths, other steps)
        assert capt.tree_sizes == host.tree_sizes
        assert runs[0].new_tokens == runs[1].new_tokens == greedy_reference(target, [1, 2, 3], 12)
