"""Hardware-aware sizing: latency measurement and the choice of budget and depth."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treespec.testing import tiny_model
from tree_builders import sequoia
from treespec.acceptance import MeasuredAcceptance
from treespec.profile import Profile, choose_tree, draft_level_cost, measure_latency, profile, random_tree

VECTOR = [0.6, 0.15, 0.07, 0.04, 0.025, 0.015, 0.01, 0.008]
CPU = {1: 0.32, 8: 0.67, 32: 1.12, 64: 1.64, 128: 2.74}  # the 1.5B target measured on this kind of CPU
GPU = {1: 0.020, 16: 0.020, 32: 0.021, 64: 0.023, 128: 0.035}  # flat, then the GEMMs start to fill


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_model("llama", vocab=256, hidden=128, seed=3)


def test_latency_is_measured_for_each_size(model):
    lat = measure_latency(model, sizes=(4, 1, 256), context=32, repeats=3)
    assert list(lat) == [1, 4, 256]
    assert all(np.isfinite(v) and v > 0 for v in lat.values())
    assert lat[256] > lat[1]  # 256 tokens through every layer and the LM head cost more than one


def test_random_tree_is_a_tree():
    depth, anc = random_tree(40, torch.Generator().manual_seed(1))
    assert depth[0] == 0 and np.all(depth[1:] >= 1)
    assert np.array_equal(anc.sum(1), depth + 1)  # a node sees itself and each ancestor once
    assert not np.any(np.triu(anc, 1))  # parents precede children
    assert depth.max() < 40 - 1  # bushy, not a chain


def test_profile_round_trip_and_costs(model, tmp_path):
    p = profile(model, model, sizes=(1, 2, 8), context=16, repeats=2)
    assert set(p.target_latency) == {1, 2, 8} and p.draft_level_seconds > 0
    p.save(tmp_path / "profile.json")
    q = Profile.load(tmp_path / "profile.json")
    assert q.target_latency == p.target_latency and q.draft_level_seconds == p.draft_level_seconds and q.meta == p.meta
    assert draft_level_cost(model, tokens=2, context=16, repeats=1) > 0
    alone = profile(model, None, sizes=(1, 2), context=16, repeats=1)
    assert alone.draft_level_seconds is None and alone.choose(VECTOR).c == 0.0


def test_choice_is_the_argmax_of_its_table():
    choice = choose_tree(VECTOR, CPU, draft_cost=0.03, max_depth=10)
    i, j = np.unravel_index(np.argmax(choice.speedups), choice.speedups.shape)
    assert choice.speedup == pytest.approx(choice.speedups.max())
    assert choice.speedups[choice.depths.index(choice.depth), choice.budgets.index(choice.budget)] == choice.speedup
    assert choice.speedups[i, j] == pytest.approx(choice.speedup)
    assert choice.budgets == list(range(1, 129)) and choice.depths == list(range(11))
    # the table is the formula: G(n, d) / (t(n)/t(1) + d c), G from the Sequoia DP
    t = np.interp(choice.budgets, sorted(CPU), [CPU[k] for k in sorted(CPU)]) / CPU[1]
    assert np.allclose(choice.speedups, choice.taus / (t[None, :] + np.arange(11)[:, None] * 0.03 / 0.32))
    assert choice.taus[4, 20] == pytest.approx(sequoia(VECTOR, 21, max_depth=4, max_width=16).expected_tokens(VECTOR))
    # the shape is the one the table scores
    assert choice.shape.size <= choice.budget and choice.shape.depth <= choice.depth
    assert choice.shape.expected_tokens(VECTOR) == pytest.approx(choice.tau)
    assert len(choice.rows()) == 11 * 128 and choice.as_dict()["size"] == choice.shape.size


def test_flat_latency_and_free_drafts_choose_the_largest_budget():
    choice = choose_tree(VECTOR, {1: 1.0, 64: 1.0}, draft_cost=0.0, max_depth=16)
    assert choice.budget == 64 and choice.shape.size == 64


def test_steep_latency_chooses_a_small_tree():
    linear = {n: float(n) for n in (1, 2, 4, 8, 16)}  # every extra token costs a full forward
    assert choose_tree(VECTOR, linear, draft_cost=0.0).budget == 1  # nothing beats plain decoding
    cpu = choose_tree(VECTOR, CPU, draft_cost=0.0)
    gpu = choose_tree(VECTOR, GPU, draft_cost=0.0)
    assert 2 <= cpu.budget <= 16 and gpu.budget >= 32
    assert cpu.speedup > 1.0 and gpu.speedup > cpu.speedup


def test_expensive_drafts_choose_shallower_trees():
    cheap = choose_tree(VECTOR, GPU, draft_cost=0.0)
    dear = choose_tree(VECTOR, GPU, draft_cost=0.01)  # half a target forward per level
    assert dear.depth < cheap.depth and dear.speedup < cheap.speedup


def test_acceptance_objects_and_errors():
    counts = np.array([[60, 15, 7], [70, 10, 5]])
    acc = MeasuredAcceptance.from_counts(counts, np.array([100, 100]), beta=0.6)
    by_vector = choose_tree(acc, GPU, 0.001)
    assert by_vector.tau == pytest.approx(by_vector.shape.expected_tokens(acc.vector))
    by_matrix = choose_tree(acc, GPU, 0.001, per_depth=True)
    assert by_matrix.tau == pytest.approx(by_matrix.shape.expected_tokens(acc.matrix)) and by_matrix.tau > by_vector.tau
    with pytest.raises(ValueError, match="size 1"):
        choose_tree(VECTOR, {2: 1.0, 4: 1.0}, 0.0)
    with pytest.raises(ValueError, match="budgets"):
        choose_tree(VECTOR, CPU, 0.0, budgets=[8, 256])
    with pytest.raises(ValueError, match="sizes"):
        measure_latency(tiny_model("llama", vocab=16, hidden=16), sizes=(0, 4))
