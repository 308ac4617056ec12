"""A tree replayed over a calibration walk with the model drafter's confidence stop
(``treespec.calibrate.walk_replay``): hand-made walks, and a chain's greedy run on tiny models, whose steps the
replay must reproduce one by one (the replay is exact for a chain)."""

import numpy as np
import pytest

import treespec
from tree_builders import chain, kary
from treespec.calibrate.acceptance import measure
from treespec.calibrate.walk_replay import replay_steps, truncated
from treespec.models.tiny import perturbed_copy, tiny_model


def test_a_chain_stops_where_its_path_probability_falls_below_the_threshold():
    shape = chain(4)  # root + 4
    ranks = [[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
    probs = [[[0.9]] * 2 + [[0.5]] + [[0.9]] * 8]  # one rank per position
    plain = replay_steps(ranks, shape)
    assert [(s.tokens, s.drafted_depth) for s in plain] == [(5, 4), (5, 4)]  # 4 accepted + bonus, twice; 1 left: cut
    stopped = replay_steps(ranks, shape, probs, min_confidence=0.5)
    # step 1 at 0: 0.9, 0.81, 0.405 < 0.5 at depth 3: 3 accepted + bonus; step 2 at 4: 0.9^4 = 0.66 >= 0.5, so 4 + 1;
    # step 3 at 9: 0.81, then position 11 is past the walk: cut
    assert [(s.tokens, s.drafted_depth) for s in stopped] == [(4, 3), (5, 4)]
    with pytest.raises(ValueError, match="proposal probabilities"):
        replay_steps(ranks, shape, None, min_confidence=0.5)


def test_a_rejected_path_drafts_on_along_the_next_positions():
    """Rejected at depth 1 with the stop not reached: the levels it drafted after the rejection cost time and are
    counted in its drafted depth (continued along the next positions' rank-0 probabilities)."""
    shape = chain(4)
    ranks = [[-1, 0, 0, 0, 0, 0, 0]]
    probs = [[[0.9], [0.8], [0.5], [0.9], [0.9], [0.9], [0.9]]]
    (first, *_) = replay_steps(ranks, shape, probs, min_confidence=0.3)
    # drafted: depth 1 (0.9), depth 2 (0.72), depth 3 (0.36), depth 4 (0.32): no stop before the tree's depth
    assert (first.tokens, first.drafted_depth) == (1, 4)
    (first, *_) = replay_steps(ranks, shape, probs, min_confidence=0.4)
    assert (first.tokens, first.drafted_depth) == (1, 3)  # 0.36 < 0.4 after drawing depth 3


def test_a_branching_tree_stops_on_its_known_frontier():
    """Two children per node: the stop reads the best of the path's node and its sibling (the known frontier)."""
    shape = kary([2, 2, 2])
    ranks = [[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
    probs = [[[0.5, 0.45], [0.6, 0.3], [0.9, 0.05]] + [[0.9, 0.05]] * 7]
    (first, *_) = replay_steps(ranks, shape, probs, min_confidence=0.3)
    # depth 1: best of 0.5, 0.45 -> on; the path takes rank 1 (0.45); depth 2: its children 0.27, 0.135 < 0.3:
    # stop after depth 2 (a lower bound: the children of the sibling at 0.5 are not known to the walk); the path
    # accepts (1, 0), a leaf now: 2 accepted + the bonus
    assert (first.tokens, first.drafted_depth) == (3, 2)
    assert truncated(shape, 2).depth == 2 and truncated(shape, 2).size == 7


@pytest.mark.parametrize("threshold", [None, 0.6, 0.3])
def test_the_replay_is_a_greedy_chain_runs_steps(threshold):
    """Greedy decoding writes one continuation: the walk's (width 1, top-k) and the run's. The run of a chain with
    the confidence stop takes exactly the replayed steps: the same tokens per step and drafted depths."""
    target = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=0)
    draft = perturbed_copy(target, 0.3)
    prompt, n, shape = [1, 5, 7, 9, 3], 60, chain(5)
    walk = measure(target, draft, [prompt], width=1, mode="topk", temperature=0.0, max_new_tokens=n, max_depth=5,
                   progress=False)
    steps = walk.replay(shape, threshold)
    out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, shape, "topk", min_confidence=threshold)],
                            max_new_tokens=n)
    # the run shortens its last trees to what is left to generate: compare the steps that start with more
    k = int(np.sum(np.cumsum([0] + [s.tokens for s in steps])[:-1] < n - shape.depth - 1))
    assert k >= 8 and out.stats.step_tokens[:k] == [s.tokens for s in steps[:k]]
    assert [size - 1 for size in out.stats.tree_sizes[:k]] == [s.drafted_depth for s in steps[:k]]
    if threshold == 0.3:  # the stop cut some trees, and the replay saw it
        assert any(s.drafted_depth < shape.depth for s in steps[:k])
    tokens, counted = walk.replayed_steps(shape, threshold)
    assert sum(tokens) / sum(counted) == pytest.approx(np.mean([s.tokens for s in steps]))
