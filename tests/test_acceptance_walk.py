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

import treespec
from tree_builders import TreeShape
from treespec.calibrate.acceptance import MeasuredAcceptance, measure, measure_each
from treespec.calibrate.ranks import walk_ranks
from treespec.core.engine import generate
from treespec.core.sampling import SamplingParams
from treespec.models.tiny import bigram_model, perturbed_copy, tiny_model

#: one worker runs this file: its tests share the walks of the module's ``measured`` fixture
pytestmark = pytest.mark.xdist_group("acceptance_walk")

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
                       max_depth=3, context=c, progress=False, batch_size=20) for c in ("walk", "target")}


def test_walk_rows_are_conditional_on_the_accepted_child(measured):
    walk, target = measured["walk"], measured["target"]
    assert walk.meta["context"].endswith("(walk)") and "teacher forced" in target.meta["context"]
    # depth 1 is the same law under both (both continuations are distributed as the target's)
    assert walk.vector[0] == pytest.approx(0.75, abs=0.03) and target.vector[0] == pytest.approx(0.75, abs=0.03)
    # about 2,200 and 1,500 roots reach depths 2 and 3: standard errors ~0.01 and ~0.013
    assert walk.matrix[1, 0] == pytest.approx(2 / 3, abs=0.035) and walk.matrix[2, 0] == pytest.approx(5 / 8, abs=0.04)
    # negative control: the target's own continuation gives the wrong rows
    assert (target.matrix[1, 0] == pytest.approx(3 / 4, abs=0.035)
            and target.matrix[2, 0] == pytest.approx(3 / 4, abs=0.04))


def test_the_walk_writes_the_targets_law():
    """Blocks of 3 written tokens are uniform over {0, 1}^3 (the target's joint law); the draft's own
    samples, written without the rule, fail the same test."""
    target, draft = bigram_pair()
    params = SamplingParams(1.0)
    prompts = [[j % 2] for j in range(12)]
    walks = walk_ranks(target, draft, prompts, 150, params, 1, "sample",
                       [torch.Generator().manual_seed(1000 + j) for j in range(12)])
    own = generate(draft, prompts, max_new_tokens=150, temperature=1.0, seed=2000).rows  # a batch: each row alone
    blocks_walk = [tuple(w.tokens[i:i + 3]) for w in walks for i in range(0, 150, 3)]
    blocks_draft = [tuple(row.new_tokens[i:i + 3]) for row in own for i in range(0, 150, 3)]

    def p_uniform(blocks: list[tuple[int, ...]]) -> float:
        cells = [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
        assert set(blocks) <= set(cells)
        return float(stats.chisquare([blocks.count(x) for x in cells]).pvalue)

    assert p_uniform(blocks_walk) > 1e-3
    assert p_uniform(blocks_draft) < 1e-6


def test_under_greedy_decoding_the_walk_gives_the_teacher_forced_ranks():
    """Greedy, float32: an accepted child and a correction token are both the target's argmax, so the
    walk's continuation is the target's greedy one. On a random model with attention this checks the
    walk's incremental caches and positions against one teacher-forced forward."""
    target = tiny_model("llama", vocab=256, hidden=64, scale=6, seed=0)
    draft = perturbed_copy(target, 0.3)
    prompts = [np.random.default_rng(i).integers(0, 256, 5).tolist() for i in range(4)]
    runs = {c: measure(target, draft, prompts, width=4, max_new_tokens=24, max_depth=4, context=c, progress=False)
            for c in ("walk", "target")}
    assert runs["walk"].ranks == runs["target"].ranks
    assert np.array_equal(runs["walk"].counts, runs["target"].counts) and 0 < runs["walk"].vector[0] < 1
    assert runs["walk"].beta == pytest.approx(runs["target"].beta)
    assert runs["walk"].meta["context"] != runs["target"].meta["context"]


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
    with pytest.raises(ValueError, match="unknown context 'teacher'.*walk, target"):
        measure(target, draft, [[0]], context="teacher", progress=False)


def test_replay_decodes_the_ranks_like_a_run_of_the_tree(measured):
    """Hand-made ranks through a 2-token chain: steps end at a missed rank or after a leaf."""
    chain = TreeShape.from_paths([(0,), (0, 0)])
    a = MeasuredAcceptance.from_counts(np.zeros((2, 3)), np.zeros(2), 0.5, ranks=[[0, 1, -1, 0, 0, 2, -1, 0]])
    # steps: [0 accepted, 1 ends] 2 tokens; [-1] 1; [0, 0 accepted, leaf: 2 is the bonus] 3; then at position 6 a
    # tree of depth 2 does not fit before the end (8): cut whatever it accepts (its -1 too), as a run cuts it
    assert a.replayed_tau(chain) == pytest.approx(6 / 3)
    wide = TreeShape.from_paths([(0,), (1,), (0, 0)])  # rank 1 at the root is a child now
    b = MeasuredAcceptance.from_counts(np.zeros((2, 3)), np.zeros(2), 0.5, ranks=[[1, 2, 0, 0, -1]])
    assert b.replayed_tau(chain) == pytest.approx((1 + 1 + 3) / 3)  # [1] [2] [0, 0, leaf: -1 is the bonus]
    assert b.replayed_tau(wide) == pytest.approx((2 + 3) / 2)  # [1, leaf: 2 is the bonus] [0, 0, leaf]
    with pytest.raises(ValueError, match="keeps no per-position ranks"):
        MeasuredAcceptance.from_counts(np.zeros((2, 3)), np.zeros(2), 0.5).replayed_tau(chain)
    with pytest.raises(ValueError, match="drew 1 proposals per position; measure with --width 2"):
        measured["walk"].replayed_tau(wide)


def test_replay_predicts_the_engine_where_the_rows_cannot(measured):
    """A 3-token chain run by the engine on the bigram pair: a step that ends in a rejection leaves a 1
    (the residual after the draft's sure 0), so steps start at the easy context more often than a
    random position does; the replay of the walk's ranks sees that, the rows (every position a root)
    do not."""
    target, draft = bigram_pair()
    chain = TreeShape.from_paths([(0,), (0, 0), (0, 0, 0)])
    tokens, steps = [], []
    batch = treespec.generate(target, [[i % 2] for i in range(20)], drafters=[treespec.ModelDrafter(draft, chain,
                              "sample")], max_new_tokens=150, temperature=1.0, seed=4000)  # each row as alone
    for out in batch.rows:
        full = [n for n, cut in zip(out.stats.step_tokens, out.stats.step_cut) if not cut]
        tokens.append(sum(full))
        steps.append(len(full))
    tokens_a, steps_a = np.array(tokens, float), np.array(steps, float)
    tau = tokens_a.sum() / steps_a.sum()
    se = float(np.sqrt(((tokens_a - tau * steps_a) ** 2).sum() / (20 * 19)) / steps_a.mean())  # clustered by prompt
    replayed, rows = measured["walk"].replayed_tau(chain), chain.expected_tokens(measured["walk"].matrix.tolist())
    assert abs(replayed - tau) < 4 * se + 0.02, (replayed, tau, se)
    assert abs(rows - tau) > 4 * se + 0.02, (rows, tau, se)  # negative control


def test_replayed_steps_are_the_replay_per_prompt():
    """Per prompt, the replay's tokens and steps; their sums give replayed_tau (what a bootstrap over the
    calibration prompts resamples)."""
    chain = TreeShape.from_paths([(0,), (0, 0)])
    a = MeasuredAcceptance.from_counts(np.zeros((2, 3)), np.zeros(2), 0.5,
                                       ranks=[[0, 1, -1, 0, 0, 2, -1, 0], [1, 2, 0, 0, -1], [0]])
    tokens, steps = a.replayed_steps(chain)
    assert tokens == [6, 5, 0] and steps == [3, 3, 0]  # the last prompt's only step is cut
    assert a.replayed_tau(chain) == pytest.approx(11 / 6)


@pytest.mark.parametrize("mode,temperature", [("sample_without_replacement", 1.0), ("topk", 0.0)])
def test_prompts_walked_together_are_each_walked_as_alone(mode, temperature):
    """``batch_size`` prompts of different lengths are the rows of one forward per position, each drawing from its
    own generator: each prompt's ranks, confidences and overlap equal its walk alone (an EOS ends one row early,
    and an empty prompt gives no measurement), whatever the batch size; another seed changes them (the control)."""
    target = tiny_model("llama", vocab=64, hidden=64, scale=2, seed=0)
    draft = perturbed_copy(target, 0.5)
    prompts = [[5, 9, 11, 2, 7], [3], [], [8, 1, 4], [60, 2, 33, 12, 9, 1, 17]]
    kw = dict(width=3, mode=mode, temperature=temperature, max_new_tokens=20, max_depth=4, progress=False,
              eos_token_id=13)
    together = measure_each(target, draft, prompts, batch_size=4, **kw)
    alone = [m for j, p in enumerate(prompts) if p
             for m in measure_each(target, draft, [[]] * j + [p], batch_size=1, **kw)]  # prompt j keeps its seed
    assert len(together) == len(alone) == 4
    assert [m.ranks for m in together] == [m.ranks for m in alone]
    assert [m.confidence for m in together] == [m.confidence for m in alone]
    assert [m.beta for m in together] == pytest.approx([m.beta for m in alone])
    if temperature:
        other = measure_each(target, draft, prompts, batch_size=4, seed=1, **kw)
        assert [m.ranks for m in other] != [m.ranks for m in together]
    merged = measure(target, draft, prompts, batch_size=2, **kw)
    assert merged.ranks == [r for m in together for r in m.ranks] and merged.meta["prompts"] == len(prompts)


def test_a_dynamic_int8_draft_is_walked_one_prompt_at_a_time(monkeypatch):
    """int8 activations share one quantisation scale per forward, so a row's draft logits depend on its batch
    mates (the control: the rows walked together, as a float model is, measure other ranks); ``measure`` walks
    such a pair one prompt at a time whatever ``batch_size`` asks, and gets each prompt's walk alone."""
    from treespec.calibrate import acceptance
    from treespec.models.precision import to_precision

    target = tiny_model("llama", vocab=64, hidden=64, scale=2, seed=0)
    draft = to_precision(perturbed_copy(target, 0.5), "int8")
    prompts = [[5, 9, 11, 2, 7], [3, 1], [8, 1, 4], [60, 2, 33, 12, 9, 1, 17], [7], [40, 41]]
    kw = dict(width=3, mode="sample_without_replacement", temperature=1.0, max_new_tokens=24, progress=False)
    asked = measure_each(target, draft, prompts, batch_size=6, **kw)
    alone = measure_each(target, draft, prompts, batch_size=1, **kw)
    assert [m.ranks for m in asked] == [m.ranks for m in alone]
    monkeypatch.setattr(acceptance.checks, "has_dynamic_int8", lambda model: False)  # walked together anyway
    together = measure_each(target, draft, prompts, batch_size=6, **kw)
    assert [m.confidence for m in together] != [m.confidence for m in alone]
