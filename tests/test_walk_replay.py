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
    # over the run's horizon the replay is every step of the run, the last ones (capped depths) included
    whole = walk.replay(shape, threshold, horizon=n)
    assert [s.tokens for s in whole] == out.stats.step_tokens
    assert [s.drafted_depth for s in whole] == [size - 1 for size in out.stats.tree_sizes]


def test_a_horizon_caps_the_last_steps_as_the_engine_does():
    """A run of 7 tokens with a 4-deep chain: 4 accepted + bonus, then 2 left: one level drafted, accepted, the
    bonus; the walk's positions past the horizon are not read (the same steps with a rejection there)."""
    shape = chain(4)
    for tail in ([0, 0, 0], [-1, -1, -1]):
        ranks = [[0] * 7 + tail]
        assert [(s.tokens, s.drafted_depth) for s in replay_steps(ranks, shape, horizon=7)] == [(5, 4), (2, 1)]
    assert [s.tokens for s in replay_steps([[0] * 10], shape, horizon=6)] == [5, 1]  # the last token: no draft
    assert replay_steps([[0] * 9], shape, horizon=12) == replay_steps([[0] * 9], shape)  # shorter: replayed whole


def test_a_tuned_run_is_predicted_over_its_own_horizon():
    """``Tuned.prediction`` replays the chosen tree over the run's first ``max_new_tokens`` positions of the
    shipped walk (every step, the capped last ones too): a 16-token run predicts 16 tokens per continuation (one
    that ends first, at the target's end of text, is replayed whole: its steps that the end cuts left out), and
    fewer per step than the whole walk, whose later positions accept more (code goes on as it began)."""
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.tuning import MIN_CONFIDENCE, Tuned
    from treespec.calibrate.vectors import calibration_walk, default_acceptance

    acceptance, walk = default_acceptance(None, 0.0), calibration_walk(None, 0.0)
    prof = Profile({1: 0.1, 8: 0.12, 16: 0.15}, {1: 0.03, 2: 0.045, 4: 0.07, 8: 0.12}, {}, 0.002)
    tuned = Tuned(prof.choose(acceptance, max_depth=8), prof, MIN_CONFIDENCE)
    short, whole = tuned.with_walk(walk, 16).prediction, tuned.with_walk(walk).prediction
    steps = walk.replay(tuned.choice.shape, MIN_CONFIDENCE, 16)
    long = {c for c, r in enumerate(walk.ranks) if len(r) >= 16}
    assert sum(s.tokens for s in steps if s.continuation in long) == 16 * len(long) and len(long) < len(walk.ranks)
    for c in set(range(len(walk.ranks))) - long:
        assert sum(s.tokens for s in steps if s.continuation == c) <= len(walk.ranks[c])
    assert short.tau == pytest.approx(sum(s.tokens for s in steps) / len(steps)) and short.model == "replay"
    assert short.tau < whole.tau == pytest.approx(walk.replayed_tau(tuned.choice.shape, MIN_CONFIDENCE))
    low, high = short.tau_range(1)  # single calibration prompts spread around the pooled figure, printed with it
    assert low < short.tau < high and f"90% of single prompts {low:.2f}-{high:.2f}" in tuned.with_walk(walk, 16).why
    # the why-line names the prompts the walk ran (a tree sized from code's acceptance is sized for code)
    assert "replayed over the calibration walk on humaneval (40 prompts) with" in tuned.with_walk(walk, 16).why
    walk.meta["prompts_label"] = "chat.jsonl (12 prompts) in the chat template"  # a user's own: named as written
    assert "walk on chat.jsonl (12 prompts) in the chat template with" in tuned.with_walk(walk, 16).why
    walk.meta.update(prompts_label="sharegpt[0:40] in the chat template", prompts=40)  # accept --dataset sharegpt
    assert "walk on sharegpt (40 prompts) in the chat template with" in tuned.with_walk(walk, 16).why


@pytest.mark.parametrize("cut", ["positions", "prompts", "ranks-per-position", "a-string"])
def test_an_acceptance_file_whose_confidence_does_not_cover_its_ranks_is_refused_by_name(tmp_path, cut):
    """The replay reads each walked position's proposal probabilities; a file whose "confidence" misses some (a hand
    edit, another writer) is refused, named (an IndexError at the prediction before)."""
    import json

    from treespec.calibrate.vectors import acceptance_for_draft, calibration_walk, shipped_file
    from importlib import resources

    saved = json.loads(resources.files("treespec").joinpath(shipped_file(0.0, "int4")).read_text())
    assert calibration_walk(None, 0.0, "int4") is not None  # the shipped file: covered
    if cut == "positions":
        saved["confidence"] = [probs[:5] for probs in saved["confidence"]]
    elif cut == "prompts":
        saved["confidence"] = saved["confidence"][:3]
    elif cut == "ranks-per-position":
        saved["confidence"] = [[row[:1] for row in probs] for probs in saved["confidence"]]
    else:  # a hand edit: the replay's product raised a TypeError traceback
        saved["confidence"][0][0][0] = "x"
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"acc\.json: its \"confidence\" does not cover its \"ranks\""):
        acceptance_for_draft(path, 0.0, None)
    with pytest.raises(ValueError, match="does not cover"):
        calibration_walk(path, 0.0)


def test_the_replay_without_a_horizon_is_the_runs_tau_uncut():
    """``replayed_tau`` leaves out the steps a run marks cut: those whose whole tree does not fit before the end,
    decided before their outcome (it kept such a step when it failed early and dropped it when it accepted far:
    1.421 against a run's 1.442 here). Greedy tiny models: the walk and the runs write the same tokens."""
    target = tiny_model("llama", vocab=64, hidden=64, scale=3, seed=0)
    draft = perturbed_copy(target, 0.5)
    prompts = [np.random.default_rng(100 + i).integers(0, 64, 6).tolist() for i in range(12)]
    walk = measure(target, draft, prompts, width=4, mode="topk", max_new_tokens=30, max_depth=6, progress=False)
    for shape in (chain(4), kary([2, 2, 2])):
        tokens = steps = 0
        for row in treespec.generate(target, prompts, [treespec.ModelDrafter(draft, shape, "topk")],
                                     max_new_tokens=30).rows:  # each row: its prompt's run alone
            s = row.stats
            tokens += sum(t for t, cut in zip(s.step_tokens, s.step_cut) if not cut)
            steps += s.step_cut.count(False)
        assert walk.replayed_tau(shape) == pytest.approx(tokens / steps, rel=1e-12)


def test_a_continuation_ended_at_the_end_of_text_keeps_its_last_steps_as_a_run_does():
    """A run stops at the target's end of text inside a whole tree (not a cut step): the replay keeps a walk's last
    steps where its continuation wrote the end of text, so it equals the runs' tau_uncut, and over a horizon the
    runs' every step (it left them out before and predicted more tokens per step than these runs took)."""
    target = tiny_model("llama", vocab=64, hidden=64, scale=3, seed=0)
    draft = perturbed_copy(target, 0.5)
    prompts = [np.random.default_rng(100 + i).integers(0, 64, 6).tolist() for i in range(12)]
    seen = [row.new_tokens for row in treespec.generate(target, prompts, [], max_new_tokens=30).rows]
    # a token that most runs write first a few tokens in: they end there, after several steps
    eos = max(range(64), key=lambda t: sum(s.index(t) >= 3 for s in seen if t in s))
    walk = measure(target, draft, prompts, width=4, mode="topk", max_new_tokens=30, max_depth=6, progress=False,
                   eos_token_id=eos)
    assert sum(len(r) > 3 and len(r) < 30 for r in walk.ranks) >= 3 and any(len(r) == 30 for r in walk.ranks)
    for shape in (chain(4), kary([2, 2, 2])):
        uncut = [0, 0]
        every = [0, 0]
        for row in treespec.generate(target, prompts, [treespec.ModelDrafter(draft, shape, "topk")], max_new_tokens=30,
                                     eos_token_id=eos).rows:
            s = row.stats
            uncut[0] += sum(t for t, cut in zip(s.step_tokens, s.step_cut) if not cut)
            uncut[1] += s.step_cut.count(False)
            every[0] += sum(s.step_tokens)
            every[1] += len(s.step_tokens)
        assert walk.replayed_tau(shape) == pytest.approx(uncut[0] / uncut[1], rel=1e-12)
        assert walk.replayed_tau(shape, horizon=30) == pytest.approx(every[0] / every[1], rel=1e-12)


@pytest.mark.parametrize("stop", [0.05, 0.3])
def test_the_replay_with_the_stop_is_a_chains_tau_uncut(stop):
    """A run marks a step cut where the tree it drafted reaches past the tokens left; with the confidence stop that is
    the stopped tree, not the shape: the replay left out every step whose shape reached the end (the last two of
    21 uncut ones in a run whose stop ended each tree at depth 1), and is now the chain's runs' tau_uncut exactly."""
    target = tiny_model("llama", vocab=64, hidden=64, scale=3, seed=0)
    draft = perturbed_copy(target, 0.5)
    prompts = [np.random.default_rng(100 + i).integers(0, 64, 1 + i).tolist() for i in range(10)]
    walk = measure(target, draft, prompts, width=4, mode="topk", max_new_tokens=30, max_depth=6, progress=False)
    tokens = steps = 0
    for row in treespec.generate(target, prompts, [treespec.ModelDrafter(draft, chain(4), "topk", min_confidence=stop)],
                                 max_new_tokens=30).rows:
        s = row.stats
        tokens += sum(t for t, cut in zip(s.step_tokens, s.step_cut) if not cut)
        steps += s.step_cut.count(False)
    assert walk.replayed_tau(chain(4), stop) == pytest.approx(tokens / steps, rel=1e-12)


def test_an_acceptance_file_whose_length_is_not_a_count_is_refused_by_name(tmp_path):
    """The replay reads a walk's ``meta.max_new_tokens`` (a continuation shorter than it ended at the end of text): a
    hand-edited one that is no count is refused with the file named (int()'s words before)."""
    import json
    from importlib import resources

    from treespec.calibrate.vectors import calibration_walk, shipped_file

    saved = json.loads(resources.files("treespec").joinpath(shipped_file(0.0, "int4")).read_text())
    saved["meta"]["max_new_tokens"] = "abc"
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"acc\.json: its meta \"max_new_tokens\" is 'abc', not a count"):
        calibration_walk(path, 0.0)


def test_resolve_run_sizes_from_the_drafts_acceptance_and_predicts_by_its_walk(tmp_path, monkeypatch):
    """``choices.resolve_run`` (what ``treespec generate``, the demo and the benchmarks run) replaces the recipe's
    rows by the shipped ones of the draft's precision and predicts tau by replaying their calibration walk; a bare
    ``resolve`` with the rows alone (what the benchmarks ran, printing a tau 37% above the measured one on code)
    predicts by the rows' expectation. The same tuned costs in both."""
    from treespec.calibrate import choices, tuning
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.vectors import acceptance_for_draft
    from treespec.models.tiny import ByteTokenizer
    from treespec.recipes import Recipe

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    prof = Profile({1: 0.10, 2: 0.11, 4: 0.13, 8: 0.18, 16: 0.30}, {1: 0.02, 4: 0.03, 16: 0.06}, {}, 0.004,
                   plain_decode_seconds=0.1)
    sized: list[list] = []

    def tuner(target, draft, acceptance, *, builder=None, **kwargs):
        sized.append(acceptance)
        return tuning.Tuned(prof.choose(acceptance, max_depth=8, builder=builder), prof, builder=builder)

    real = choices.resolve
    monkeypatch.setattr(choices, "resolve", lambda *a, **k: real(*a, **{**k, "tuner": tuner}))
    monkeypatch.setattr(choices, "_measured", lambda *a, **k: None)  # no pilot: the costs stay the profile's
    monkeypatch.setattr(choices, "calibrate", lambda tuned, *a, **k: tuned)
    target = tiny_model("llama", vocab=128, hidden=64, scale=6)
    draft = perturbed_copy(target, 0.2)
    tok, rows = ByteTokenizer(128, max_tokens=48), [[0.9], [0.1]]
    run = choices.resolve_run(Recipe(tree="sequoia", acceptance=rows), target, [draft], tok, prompts=[[5] * 8],
                              max_new_tokens=16, compile=False)
    shipped = acceptance_for_draft(None, 0.0, draft)[0]
    assert sized[-1] == shipped != rows and [list(r) for r in run.recipe.acceptance] == shipped
    assert run.tuned.prediction.model == "replay" and run.recipe.compile is False, run.why
    bare = choices.resolve(Recipe(tree="sequoia", acceptance=shipped), target, [draft], tokenizer=tok,
                           max_new_tokens=16)
    assert bare.tuned.prediction.model == "rows"  # control: no walk given, the rows' expectation
    with pytest.raises(ValueError, match="needs the run's prompts"):
        choices.resolve_run(Recipe(tree="sequoia", acceptance=rows), target, [draft], tok, prompts=[])
