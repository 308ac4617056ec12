"""An n-gram drafter's chain in the captured step (``buffers.with_chain``): its tokens hang under the root as
given tokens beside the model drafter's tree, drafted on the host for free and verified in the same target
forward. Exact (greedy = HF greedy, and the eager step's accepted lengths step by step: the eager step merges the
chain into its trie, which holds the same token paths; sampled joint law = the target's under both rules), one
graph per call whatever the chain holds, and the chain's layout in the tree's buffers."""

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

import treespec
from conftest import tiny_pair
from stats import ALPHA
from test_exactness import BUSHY, joint_p, pair  # noqa: F401 (pair is a fixture)
from treespec.core.buffers import Envelope, tree_buffers, with_chain
from treespec.core.compiling import UNCOMPILED
from treespec.drafters.model import _Layout, as_shape
from treespec.models.tiny import greedy_reference

#: one worker runs this file in order: its greedy tests' runners (compiled graphs) serve the later tests
pytestmark = pytest.mark.xdist_group("captured-chain")

BACKEND = "aot_eager"
#: as tests/test_captured.py: the tests of the step's behaviour and the joint tests run the step's functions
#: uncompiled, tied to the compiled graphs token for token: greedy and HF's tokens (test_no_recompile_whatever_the_
#: chain_holds), sampled in a batch with the same seed (test_sampled_chains_in_the_graphs_equal_the_steps_code)
STEP_BACKEND = UNCOMPILED
JOINT_BACKEND = UNCOMPILED
KARY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
REPEAT = [1, 2, 3, 1, 2, 3, 1, 2]  # test_exactness's prompt on which n-gram guesses overlap the model's draws


def drafters(draft, shape=KARY, mode="topk", tokens=4, **kwargs):
    return [treespec.ModelDrafter(draft, shape, mode, **kwargs), treespec.NGramDrafter(max_tokens=tokens)]


def repetitive_prompt(target, n: int = 40) -> list[int]:
    """A prompt that holds the target's own greedy continuation: the n-gram tables predict much of what follows. The
    compiled tests take ``n = 12``: a prompt of 15 tokens prefills eagerly (``prefill.CHUNKED_MIN``), so their
    runners compile the step's graphs alone (the prefill's graphs: tests/test_prefill.py)."""
    return [5, 9, 11] + greedy_reference(target, [5, 9, 11], n)


def test_a_chain_keeps_bfs_order_and_level_zero_forwards_it():
    layout = _Layout.of(as_shape(KARY))  # root 0; 1, 2; 3, 4 under 1; 5, 6 under 2
    parent, rank, given = with_chain(layout.parent, layout.rank, 3)
    # the chain: the root's youngest child (node 3), then the last node of depths 2 and 3
    assert parent.tolist() == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 8]
    assert given.tolist() == [-1, -1, -1, 0, -1, -1, -1, -1, 1, 2]
    assert rank.tolist() == [0, 0, 1, 2, 0, 1, 0, 1, 0, 0]
    buf = tree_buffers(parent, rank, given=given)
    # level 0: the pending token (id 10), the root and the chain's nodes with children; level 1 the drafted ones
    assert buf.envelope == Envelope(10, (4, 2), 3, chain=3)
    assert [lv.nodes.tolist() for lv in buf.levels] == [[10, 0, 3, 8], [1, 2]]
    assert buf.levels[0].slot_depth.tolist() == [-1, 0, 1, 2]
    assert buf.levels[0].block[3].tolist() == [True, True, True, True, False, False]  # node 8: pending, 0, 3, self
    assert buf.chosen_at.tolist() == [-1, 0, 0, -1, 1, 1, 1, 1, -1, -1]  # no level chooses a given token
    assert buf.depth_of_shape == 2  # the chain adds no draft level
    assert buf.earlier_siblings[3].tolist() == [1, 2]
    assert Envelope(10, (4, 2), 3, chain=3).covers(buf.envelope)
    assert not Envelope(10, (4, 2), 3).covers(buf.envelope)


@pytest.mark.parametrize("family,mode,stop", [("llama", "topk", None), ("qwen2", "sample_without_replacement", 1.0)])
def test_greedy_with_a_chain_equals_hf_and_the_eager_steps_walk(family, mode, stop):
    """A stop of 1 drafts one depth of the model's tree; the chain is forwarded at level 0 all the same."""
    target, draft = tiny_pair(family)
    prompt = repetitive_prompt(target)
    ref = greedy_reference(target, prompt, 30)
    eager = treespec.generate(target, prompt, drafters(draft, mode=mode, min_confidence=stop), max_new_tokens=30)
    out = treespec.generate(target, prompt, drafters(draft, mode=mode, min_confidence=stop), max_new_tokens=30,
                            compile=STEP_BACKEND)
    alone = treespec.generate(target, prompt, drafters(draft, mode=mode, min_confidence=stop)[:1], max_new_tokens=30)
    assert out.stats.step == "captured" and out.new_tokens == eager.new_tokens == ref
    assert out.stats.steps < alone.stats.steps  # the chain was accepted where the model's tree was not
    if mode == "topk":  # the same token paths in both trees (top-k: deterministic): the same accepted lengths
        # until the eager step's trees shorten near the end (the captured shape is fixed)
        done = np.cumsum([0] + eager.stats.step_tokens)
        k = int(np.sum(30 - done[:-1] > 5))
        assert out.stats.step_tokens[:k] == eager.stats.step_tokens[:k] and k >= 5


def test_a_batch_with_chains_decodes_each_prompt_as_alone():
    target, draft = tiny_pair("llama")
    prompts = [repetitive_prompt(target), REPEAT]
    out = treespec.generate(target, prompts, drafters(draft), max_new_tokens=24, compile=STEP_BACKEND)
    assert out.stats.step.startswith("captured")
    for prompt, row in zip(prompts, out.rows):
        alone = treespec.generate(target, prompt, drafters(draft), max_new_tokens=24, compile=STEP_BACKEND)
        assert row.new_tokens == alone.new_tokens == greedy_reference(target, prompt, 24)
        assert row.stats.step_tokens == alone.stats.step_tokens


def test_no_recompile_whatever_the_chain_holds():
    target, draft = tiny_pair("llama")
    prompt = repetitive_prompt(target, 12)
    treespec.generate(target, [7, 1, 3] * 5, drafters(draft), max_new_tokens=8, compile=BACKEND)  # compiles
    graphs = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = treespec.generate(target, prompt, drafters(draft), max_new_tokens=60, compile=BACKEND)
    assert counters["stats"]["unique_graphs"] == graphs and not counters["graph_break"]
    assert out.stats.steps >= 10
    # the graphs are the step's code (what the greedy tests run uncompiled), and give HF's tokens
    plain = treespec.generate(target, prompt, drafters(draft), max_new_tokens=60, compile=STEP_BACKEND)
    assert out.new_tokens == plain.new_tokens == greedy_reference(target, prompt, 60)
    assert out.stats.step_tokens == plain.stats.step_tokens


def test_sampled_chains_in_the_graphs_equal_the_steps_code():
    """A batch of two rows sampled through dynamo's graphs gives the tokens the step's functions give uncompiled
    with the same seed (what the joint tests run): the chain's point-mass proposals beside the model's draws
    without replacement under ``rrs`` (traversal's walk: tests/test_compiled_traversal.py)."""
    target, draft = tiny_pair("llama")
    prompts = [repetitive_prompt(target, 12), REPEAT]
    kw = dict(max_new_tokens=24, temperature=1.0, seed=5)
    mode = "sample_without_replacement"
    out = treespec.generate(target, prompts, drafters(draft, mode=mode), compile="eager", **kw)
    plain = treespec.generate(target, prompts, drafters(draft, mode=mode), compile=UNCOMPILED, **kw)
    assert out.stats.step == plain.stats.step == "captured, batched"
    assert [r.new_tokens for r in out.rows] == [r.new_tokens for r in plain.rows]
    assert [r.stats.step_tokens for r in out.rows] == [r.stats.step_tokens for r in plain.rows]


@pytest.mark.parametrize("mode,verifier", [("sample_without_replacement", "rrs"), ("topk", "traversal")])
def test_joint_law_with_a_chain_is_the_targets(pair, mode, verifier):  # noqa: F811
    """Trials sized by ``test_exactness.trials`` on its repetitive prompt, where the chain's guesses often repeat
    a token the model drew beside them (two siblings of one token, not merged as the host's trie merges them)."""
    target, draft = pair
    assert joint_p(target, draft, lambda: drafters(draft, BUSHY, mode, tokens=3), f"chain-{mode}-{verifier}",
                   prompt=REPEAT, compile=JOINT_BACKEND, temperature=1.0, verifier=verifier) > ALPHA


def test_the_joint_test_detects_a_chain_verified_against_the_models_q(pair, monkeypatch):  # noqa: F811
    """Negative control: the chain's tokens verified as if the model had drawn them (its level's ``q``, not a
    point mass) must fail the same test."""
    from treespec.core import captured, captured_runner

    target, draft = pair
    real = captured_runner.CapturedRunner._proposal_q
    monkeypatch.setattr(captured_runner.CapturedRunner, "_proposal_q", lambda self, qs, tokens, tree, vocab: real(
        self, qs, tokens, tree._replace(given=torch.full_like(tree.given, -1)), vocab))
    captured.RUNNERS.clear()
    p = joint_p(target, draft, lambda: drafters(draft, BUSHY, "sample_without_replacement", tokens=3), "chain-wrong-q",
                prompt=REPEAT, compile=JOINT_BACKEND, temperature=1.0)
    captured.RUNNERS.clear()
    assert p < ALPHA
