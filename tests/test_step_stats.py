"""Per-step statistics by one rule whichever step ran them: a step is *cut* (``Stats.step_cut``, left out of
``tau_uncut``) when the end of the generation capped its tree (``treespec.core.step.end_capped``) or cut its
committed tokens. The captured step drafts its fixed shape whole where the host-drafted steps cap its depth at
the tokens still wanted; it used to mark such a step cut only when the step then accepted past the end, so its
``tau_uncut`` kept the capped steps that accepted little (a bias down) and disagreed with the eager step's on the
same tokens. Time spent in the caller's ``on_tokens`` is the engine's, not drafting's."""

import time

import pytest

import treespec
from treespec.core.compiling import UNCOMPILED
from treespec.models.tiny import perturbed_copy, tiny_model

#: one worker runs the captured tests (tests/test_captured.py)
pytestmark = pytest.mark.xdist_group("captured")

CHAIN3 = [(0,), (0, 0), (0, 0, 0)]  # 3 drafted tokens + the bonus
PROMPTS = [[1, 2, 3], [4], [9, 8, 7, 6]]


@pytest.fixture(scope="module")
def pair():
    # the bug hunt's case (a peaky one-layer target, a draft that often disagrees with it)
    target = tiny_model("llama", vocab=64, hidden=64, layers=1, scale=12.0)
    return target, perturbed_copy(target, 0.3)


def capped_by_the_end(step_tokens: list[int], n: int, depth: int) -> list[bool]:
    """The rule for a chain of ``depth`` drafted levels, no EOS: a step with ``r`` tokens still wanted is capped when
    ``r - 1`` (the deepest drafted token it can emit) is below the chain's depth, whatever it then accepts."""
    cut, done = [], 0
    for k in step_tokens:
        cut.append(n - done - 1 < depth)
        done += k
    return cut


def same_statistics(eager: treespec.Stats, captured: treespec.Stats, n: int) -> None:
    assert eager.step_tokens == captured.step_tokens  # the same run, step for step
    assert eager.step_cut == captured.step_cut == capped_by_the_end(eager.step_tokens, n, len(CHAIN3))
    assert eager.tau_uncut == captured.tau_uncut and eager.cut_steps == captured.cut_steps
    # per-depth acceptance is over uncut steps only, whose trees (never capped) are the same in both
    assert (eager.depth_tried, eager.depth_accepted) == (captured.depth_tried, captured.depth_accepted)
    # and the cut steps count alike: the captured step's nodes past the cap are left out of its tree, an accepted
    # path is cut there and its next token is the extra one (it was counted as an accepted drafted token, and its
    # deeper nodes as proposals: another histogram and drafter acceptance for the same tokens)
    assert eager.accepted_hist == captured.accepted_hist and eager.tree_sizes == captured.tree_sizes
    assert eager.drafters == captured.drafters


@pytest.mark.parametrize("n", [1, 4, 7, 12])
def test_eager_and_captured_steps_mark_the_same_steps_cut(pair, n):
    target, draft = pair
    outs = {c: treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(draft, CHAIN3)],
                                 max_new_tokens=n, compile=c) for c in (False, UNCOMPILED)}
    eager, captured = outs[False], outs[UNCOMPILED]
    assert (eager.stats.step, captured.stats.step) == ("eager", "captured")
    assert eager.new_tokens == captured.new_tokens and len(eager.new_tokens) == n
    same_statistics(eager.stats, captured.stats, n)


def test_batched_eager_and_captured_steps_mark_the_same_steps_cut(pair):
    """The batched steps too (``treespec.core.batch``: the eager batch's ``draft_tree``, the captured batch's
    ``BatchCapturedStep``), row by row."""
    target, draft = pair
    n = 12
    outs = {c: treespec.generate(target, PROMPTS, [treespec.ModelDrafter(draft, CHAIN3)], max_new_tokens=n,
                                 compile=c) for c in (False, UNCOMPILED)}
    eager, captured = outs[False], outs[UNCOMPILED]
    assert eager.stats.step.startswith("eager, batched") and captured.stats.step == "captured, batched"
    for e, c in zip(eager.rows, captured.rows):
        assert e.new_tokens == c.new_tokens and len(e.new_tokens) == n
        same_statistics(e.stats, c.stats, n)
    assert eager.stats.step_cut == captured.stats.step_cut  # the batch's pooled figures


def test_the_callers_on_tokens_is_charged_to_the_engine_not_to_drafting(pair):
    """``on_tokens`` runs between steps; its seconds were charged to the next step's drafting (whatever drafts: the
    CLI's streaming printed into drafting seconds, and the tuner's calibration read them)."""
    target, draft = pair
    out = treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(draft, CHAIN3)], max_new_tokens=8,
                            on_tokens=lambda tokens: time.sleep(0.03))
    calls = out.stats.steps
    assert out.stats.overhead_seconds >= 0.9 * 0.03 * calls and out.stats.drafting_seconds < 0.03 * calls / 2


def test_a_batchs_merges_are_the_engines_seconds(pair, monkeypatch):
    """Each row's merge of its proposals into its tree is the engine's work; in a batch the next row's drafting
    charge counted the previous row's merge as drafting. Each merge sleeps 30 ms, well above the rows' real drafting
    (13 merges of 10 ms let a loaded machine's drafting, 69 ms, pass the half of them it may take: a false alarm)."""
    from treespec.core.tree import TokenTree

    target, draft = pair
    merge = TokenTree.merge

    def slow(self, *args, **kwargs):
        time.sleep(0.03)
        return merge(self, *args, **kwargs)

    monkeypatch.setattr(TokenTree, "merge", slow)
    out = treespec.generate(target, PROMPTS, drafters=[treespec.ModelDrafter(draft, CHAIN3)], max_new_tokens=6)
    merges = sum(r.stats.steps for r in out.rows)
    assert out.stats.overhead_seconds >= 0.9 * 0.03 * merges and out.stats.drafting_seconds < 0.03 * merges / 2


def test_a_sampled_run_records_its_seed_and_that_seed_repeats_it(pair):
    """A sampled run without a seed drew one it never reported (its output could not be repeated, nor its
    ``--out`` record); ``stats.seed`` holds it, the one given too, and None at T=0 (no sampling)."""
    target, draft = pair
    drafter = treespec.ModelDrafter(draft, CHAIN3, "sample")
    first = treespec.generate(target, PROMPTS[0], [drafter], max_new_tokens=12, temperature=1.0)
    assert isinstance(first.stats.seed, int) and first.stats.record()["seed"] == first.stats.seed
    again = treespec.generate(target, PROMPTS[0], [drafter], max_new_tokens=12, temperature=1.0,
                              seed=first.stats.seed)
    assert again.new_tokens == first.new_tokens and again.stats.seed == first.stats.seed
    batch = treespec.generate(target, PROMPTS, [drafter], max_new_tokens=4, temperature=1.0, seed=[5, 6, 7])
    assert [row.stats.seed for row in batch.rows] == [5, 6, 7]
    assert treespec.generate(target, PROMPTS[0], [drafter], max_new_tokens=4).stats.seed is None
