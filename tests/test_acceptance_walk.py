"""The ``"walk"`` context of the acceptance measurement: a continuation written by the acceptance rule.

A pair of bigram models makes the conditional laws exact. The target draws 0 or 1 with probability
1/2 after every token. The draft proposes 0 surely after a 0 and copies the target after a 1, so a
proposal after a 0 is accepted with probability 1/2 and one after a 1 always: 3/4 at depth 1.
In a real step, a child accepted after a 0 is a 0, so the next position is again the hard one:
given depth 1 was accepted the context ends in 0 with probability 2/3, and depth 2 accepts with
probability 2/3 * 1/2 + 1/3 = 2/3, depth 3 with 5/8. Scoring the target's own continuation instead
(``context="target"``) puts an independent token there and gives 3/4 at every depth.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from treespec.calibrate.acceptance import MeasuredAcceptance, depth_counts, measure, walk_ranks
from treespec.core.engine import generate
from treespec.core.sampling import SamplingParams
from treespec.models.tiny import bigram_model, perturbed_copy, tiny_model

NEVER = -30.0  # a logit whose probability is ~1e-13 next to a logit of 0


def bigram_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    target = torch.full((4, 4), NEVER)
    target[:, :2] = 0.0  # 0 or 1, evenly, after every token (2 and 3 never appear)
    draft = target.clone()
    draft[0, 1] = NEVER  # after a 0 the draft says 0
    return bigram_model(target), bigram_model(draft)


@pytest.fixture(scope="module")
def measured() -> dict[str, MeasuredAcceptance]:
    target, draft = bigram_pair()
    prompts = [[i % 2] for i in range(20)]
    return {c: measure(target, draft, prompts, width=1, mode="sample", temperature=1.0, max_new_tokens=150,
                       max_depth=3, context=c, progress=False) for c in ("walk", "target")}


def test_walk_rows_are_conditional_on_the_accepted_child(measured):
    walk, target = measured["walk"], measured["target"]
    assert walk.meta["context"].endswith("(walk)") and "teacher forced" in target.meta["context"]
    # depth 1 is the same law under both (both continuations are distributed as the target's)
    assert walk.vector[0] == pytest.approx(0.75, abs=0.03) and target.vector[0] == pytest.approx(0.75, abs=0.03)
    # about 2,200 and 1,500 roots reach depths 2 and 3: standard errors ~0.01 and ~0.013
    assert walk.matrix[1, 0] == pytest.approx(2 / 3, abs=0.035) and walk.matrix[2, 0] == pytest.approx(5 / 8, abs=0.04)
    # negative control: the target's own continuation gives the wrong rows
    assert target.matrix[1, 0] == pytest.approx(3 / 4, abs=0.035) and target.matrix[2, 0] == pytest.approx(3 / 4, abs=0.04)


def test_the_walk_writes_the_targets_law():
    """Blocks of 3 written tokens are uniform over {0, 1}^3 (the target's joint law); the draft's own
    samples, written without the rule, fail the same test."""
    target, draft = bigram_pair()
    params = SamplingParams(1.0)
    blocks_walk, blocks_draft = [], []
    for j in range(12):
        gen = torch.Generator().manual_seed(1000 + j)
        _, tokens, _ = walk_ranks(target, draft, [j % 2], 150, params, 1, "sample", gen)
        blocks_walk += [tuple(tokens[i:i + 3]) for i in range(0, 150, 3)]
        own = generate(draft, [j % 2], max_new_tokens=150, temperature=1.0, seed=2000 + j).new_tokens
        blocks_draft += [tuple(own[i:i + 3]) for i in range(0, 150, 3)]

    def p_uniform(blocks: list[tuple[int, ...]]) -> float:
        cells = [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
        assert set(blocks) <= set(cells)
        return float(stats.chisquare([blocks.count(x) for x in cells]).pvalue)

    assert p_uniform(blocks_walk) > 1e-3
    assert p_uniform(blocks_draft) < 1e-6


def test_under_greedy_decoding_the_walk_gives_the_teacher_forced_ranks():
    """Greedy: an accepted child and a correction token are both the target's argmax, so the walk's
    continuation is the target's greedy one. On a random model with attention this checks the walk's
    incremental caches and positions against one teacher-forced forward."""
    target = tiny_model("llama", vocab=256, hidden=64, scale=6, seed=0)
    draft = perturbed_copy(target, 0.3)
    prompts = [np.random.default_rng(i).integers(0, 256, 5).tolist() for i in range(4)]
    runs = {c: measure(target, draft, prompts, width=4, max_new_tokens=24, max_depth=4, context=c, progress=False)
            for c in ("walk", "target", "auto")}
    assert runs["walk"].ranks == runs["target"].ranks == runs["auto"].ranks
    assert np.array_equal(runs["walk"].counts, runs["target"].counts) and 0 < runs["walk"].vector[0] < 1
    assert runs["walk"].beta == pytest.approx(runs["target"].beta)
    assert runs["auto"].meta["context"] == runs["target"].meta["context"]


def test_ranks_are_kept_merged_and_saved(measured, tmp_path):
    walk = measured["walk"]
    assert len(walk.ranks) == 20 and all(len(r) == 150 for r in walk.ranks)
    assert sum(sum(k == 0 for k in r) for r in walk.ranks) == walk.counts[0, 0]
    both = MeasuredAcceptance.merge([walk, measured["target"]])
    assert both.ranks == walk.ranks + measured["target"].ranks
    walk.save(tmp_path / "a.json")
    assert MeasuredAcceptance.load(tmp_path / "a.json").ranks == walk.ranks
    old = walk.to_dict()
    del old["ranks"]  # files written before ranks were kept still load
    assert MeasuredAcceptance.from_dict(old).ranks == []


def test_an_unknown_context_is_refused():
    target, draft = bigram_pair()
    with pytest.raises(ValueError, match="unknown context 'teacher'.*auto, target, walk"):
        measure(target, draft, [[0]], context="teacher", progress=False)


def test_restart_roots_follow_a_missed_rank_zero():
    """Hand-made ranks: only the first position and those after a rank other than 0 are roots."""
    ranks = np.array([0, 1, -1, 0, 0, 2, -1])
    counts, totals = depth_counts(ranks, width=3, max_depth=3, restart=True)
    # roots 0, 2 (after rank 1), 3 (after -1), 6 (after rank 2); root 0 -> 0, 1, -1; root 3 -> 0, 0, 2
    assert totals.tolist() == [4, 2, 2]
    assert counts.tolist() == [[2, 0, 0], [1, 1, 0], [0, 0, 1]]
    assert np.array_equal(depth_counts(ranks, 3, 3)[1], [7, 5, 3])  # every position a root


def test_restarted_recounts_the_kept_ranks(measured):
    walk = measured["walk"]
    again = walk.restarted()
    assert again.meta["roots"] == "restarts" and again.totals[0] < walk.totals[0]
    # after a rejection the bigram walk writes a 1, whose next proposal is always accepted
    assert again.vector[0] > 0.9 > walk.vector[0]
    with pytest.raises(ValueError, match="keeps no per-position ranks"):
        MeasuredAcceptance.from_counts(walk.counts, walk.totals, walk.beta).restarted()
