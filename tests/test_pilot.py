"""The pilot: a default recipe the tuner cannot size is measured, and plain decoding wins when nothing pays."""

from __future__ import annotations

from dataclasses import replace

import pytest

from treespec import recipes
from treespec.calibrate import pilot
from treespec.calibrate.pilot import Pilot, choose, predict
from treespec.core.stats import Stats
from treespec.models.tiny import ByteTokenizer, greedy_reference, perturbed_copy, tiny_model
from treespec.recipes import NGramSettings, Recipe, run
from treespec.calibrate.choices import resolve
from treespec.calibrate.step_cost import run_speedup
from treespec.calibrate.tuning import Prediction


def make_pilot(**kw) -> Pilot:
    base = dict(depth=6, chain=True, steps=100, uncut_steps=100, tau=2.0, survival=[0.6, 0.4, 0.25, 0.15, 0.1, 0.05],
                draft_per_step=0.07, verify_per_step=0.12, engine_per_step=0.001, prefill_per_prompt=0.0,
                plain_per_token=0.1, plain_verify_per_token=0.099, plain_prefill_per_prompt=0.0,
                latency={1: 1.0, 4: 1.2, 7: 1.6})
    return Pilot(**{**base, **kw})


def test_chain_depths_follow_the_formula_and_the_best_is_chosen() -> None:
    p = make_pilot()
    table = {c.depth: c for c in predict(p, tokens=100)}
    assert set(table) == set(range(7))
    d = 3
    tau = 1 + 0.6 + 0.4 + 0.25
    step = 0.07 * (d + 1) / 7 + 0.099 * 1.2 / 1.0 + 0.001  # t(4) / t(1) = 1.2 on the curve
    assert table[d].tau == pytest.approx(tau) and table[d].step_seconds == pytest.approx(step)
    assert table[d].speedup == pytest.approx(0.1 * 99 / (100 * step / tau))  # plain: its prefill gives token 1
    chosen, _ = choose(p, tokens=100)
    assert chosen.depth == max(range(1, 7), key=lambda k: table[k].speedup) and chosen.speedup >= pilot.MARGIN


def test_a_weak_draft_gives_plain_decoding() -> None:
    """Nothing accepted and drafting costs time: every depth loses, so the choice is the target alone."""
    p = make_pilot(survival=[0.0] * 6, tau=1.0)
    chosen, table = choose(p, tokens=100)
    assert chosen.depth == 0 and all(c.speedup < 1 for c in table[1:])
    # the margin: a configuration predicted only 2% faster is not worth the risk of losing
    close = make_pilot(chain=False, tau=1.02 * (0.07 + 0.12 + 0.001) / 0.1)
    assert choose(close, tokens=100)[0].depth == 0 and choose(close, tokens=100, margin=1.0)[0].depth == 6


def test_prefill_is_charged_to_both_sides() -> None:
    """A draft's own prefill makes a short run lose what a long run wins."""
    p = make_pilot(prefill_per_prompt=3.0, plain_prefill_per_prompt=0.5)
    assert choose(p, tokens=4)[0].depth == 0
    assert choose(p, tokens=2000)[0].depth > 0


def test_the_drafters_prefill_scales_with_the_runs_prompts() -> None:
    """The recipe's prefill less the target alone's is the drafters' pass over the prompt: a run's prompts ``s``
    times the pilot's cost ``s`` times that (the target's, on both sides, as measured). 0.3 s of it on the pilot
    prompts is paid back by 64 tokens; ten times longer prompts decline the same recipe."""
    p = make_pilot(prefill_per_prompt=0.8, plain_prefill_per_prompt=0.5)
    d = 3
    tau, step = next((c.tau, c.step_seconds) for c in predict(p, 64) if c.depth == d)
    for scale in (1.0, 10.0):
        got = next(c.speedup for c in predict(p, 64, scale) if c.depth == d)
        assert got == pytest.approx((0.5 + 63 * 0.1) / (0.5 + 0.3 * scale + 64 * step / tau))
    assert choose(p, 64)[0].depth > 0 and choose(p, 64, prompt_scale=10.0)[0].depth == 0
    assert "after prompts 10.0x the pilot's" in pilot.why(p, *choose(p, 64, prompt_scale=10.0), 64, 10.0)


def test_non_chain_recipes_are_predicted_at_their_own_depth_only() -> None:
    p = make_pilot(chain=False, tau=3.0)
    assert [c.depth for c in predict(p, 50)] == [0, 6]


def test_survival_counts_uncut_steps_only() -> None:
    s = Stats(step_tokens=[1, 3, 2, 5], step_cut=[False, False, False, True])
    assert pilot._survival(s, 3) == ([2 / 3, 1 / 3, 0.0], 3)


@pytest.fixture
def pair():
    target = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=0)
    return target, perturbed_copy(target, 0.3), ByteTokenizer(64)


def test_resolve_measures_once_and_caches(pair, tmp_path, monkeypatch) -> None:
    """An n-gram-only recipe (not tunable) is piloted on the built-in prompts; a second resolve
    reads the cache; the chosen recipe is still exact."""
    target, _, tok = pair
    cache = tmp_path / "pilots.json"
    recipe = Recipe(tree="sequoia", ngram=NGramSettings())
    first = resolve(recipe, target, [], tokenizer=tok, max_new_tokens=32, pilot_cache=cache)
    assert "pilot (" in first.why and cache.exists()
    assert first.recipe.budget in (1, recipes.DEFAULT_BUDGET)
    monkeypatch.setattr(pilot, "run_pilot", lambda *a, **k: pytest.fail("measured again despite the cache"))
    again = resolve(recipe, target, [], tokenizer=tok, max_new_tokens=32, pilot_cache=cache)
    assert again.recipe == first.recipe
    prompt = tok("def f(x):")["input_ids"]
    out = run(again.recipe, target, [], prompt, max_new_tokens=12)
    assert out.new_tokens == greedy_reference(target, prompt, 12)


@pytest.mark.parametrize("survival, expect_plain", [([0.0] * 4, True), ([0.95, 0.9, 0.85, 0.8], False)])
def test_the_resolved_recipe_is_what_the_pilot_chose(pair, tmp_path, monkeypatch, survival, expect_plain) -> None:
    target, _, tok = pair
    measured = make_pilot(depth=4, survival=survival, draft_per_step=0.0, latency={1: 1.0, 5: 1.0})
    monkeypatch.setattr(pilot, "run_pilot", lambda *a, **k: measured)
    resolved = resolve(Recipe(tree="sequoia", ngram=NGramSettings()), target, [], tokenizer=tok,
                       pilot_cache=tmp_path / "p.json")
    if expect_plain:
        assert resolved.recipe.budget == 1 and "plain decoding" in resolved.why
        assert recipes.build_drafters(resolved.recipe, []) == []
    else:
        chosen = choose(measured, 128)[0]
        assert chosen.depth == 4 and resolved.recipe.budget == recipes.DEFAULT_BUDGET
        assert recipes.plan_depth(resolved.recipe, False) == 4 and "chose depth 4" in resolved.why
        # the run's prompts reach the pilot's prediction: ten times the pilot prompts' mean length
        mean = sum(len(tok(t)["input_ids"]) for t in pilot.PILOT_PROMPTS) / len(pilot.PILOT_PROMPTS)
        longer = resolve(Recipe(tree="sequoia", ngram=NGramSettings()), target, [], tokenizer=tok,
                         pilot_cache=tmp_path / "p.json", prompt_tokens=10 * mean)
        assert "after prompts 10.0x the pilot's" in longer.why


def test_a_chain_depth_cap_is_applied(pair, tmp_path, monkeypatch) -> None:
    """A cross-tokenizer-like chain drafter piloted deep, best predicted shallow: the recipe is capped there."""
    target, draft, tok = pair
    measured = make_pilot(depth=4, survival=[0.9, 0.1, 0.05, 0.0], draft_per_step=0.1, latency={1: 1.0, 5: 1.4})
    monkeypatch.setattr(pilot, "run_pilot", lambda *a, **k: measured)
    best = choose(measured, 128)[0]
    assert 0 < best.depth < 4
    resolved = resolve(Recipe(tree="chain", depth=4), target, [draft], tokenizer=tok, pilot_cache=tmp_path / "p.json")
    assert resolved.recipe.depth == best.depth and recipes.plan_depth(resolved.recipe, True) == best.depth


def test_a_short_run_chooses_among_the_depths_its_plan_drafts(pair, tmp_path, monkeypatch) -> None:
    """A chain piloted 4 deep whose best depth is 4: a run of 3 new tokens (its plan caps the depth at 2) chooses
    among depths 1 and 2 only, not the pilot's depth 4 that it would never draft."""
    target, draft, tok = pair
    measured = make_pilot(depth=4, survival=[0.95, 0.9, 0.85, 0.8], draft_per_step=0.0, latency={1: 1.0, 5: 1.0})
    monkeypatch.setattr(pilot, "run_pilot", lambda *a, **k: measured)
    assert choose(measured, 3)[0].depth == 4
    resolved = resolve(Recipe(tree="chain", depth=4), target, [draft], tokenizer=tok, max_new_tokens=3,
                       pilot_cache=tmp_path / "p.json")
    assert recipes.plan_depth(resolved.recipe, True) == 2 and "chose depth 2" in resolved.why, resolved.why


def test_two_trees_of_one_size_and_depth_are_two_measurements(pair) -> None:
    """A pilot, calibration or compile timing is cached under a key naming the tree's shape, not its size and depth
    alone: two trees of 4 nodes, depth 2 (the root's two children; one child with two) are measured apart."""
    from treespec.calibrate.choices import _measurement_key, _pilot_prompts

    target, draft, tok = pair
    prompts = _pilot_prompts(tok)
    keys = {_measurement_key("pilot-v5", Recipe(tree="paths", paths=paths, budget=4), target, [draft], prompts)
            for paths in ([[0], [1], [0, 0]], [[0], [0, 0], [0, 1]], [[0], [1], [0, 0]])}
    assert len(keys) == 2


def test_without_a_tokenizer_the_default_budget_stays(pair) -> None:
    target, draft, _ = pair
    resolved = resolve(Recipe(tree="kary"), target, [draft])
    assert resolved.recipe.budget == recipes.DEFAULT_BUDGET and "pilot measures" in resolved.why
    assert replace(resolved.recipe, budget=None) == Recipe(tree="kary")


def test_a_profile_calibrated_by_real_steps_predicts_those_steps() -> None:
    from tree_builders import chain, kary

    from treespec.calibrate.costs import Profile

    prof = Profile({1: 0.10, 4: 0.12, 8: 0.16, 16: 0.24}, {1: 0.02, 2: 0.025, 4: 0.03}, {})
    shape = kary([2, 2, 2])
    draft, verify = prof.step_parts(shape)
    cal = prof.calibrated(shape, 2.5 * draft, 1.5 * verify, 0.004, steps=40)
    assert cal.step_parts(shape) == pytest.approx((2.5 * draft, 1.5 * verify))
    assert cal.target_latency[1] == pytest.approx(0.15) and cal.step_overhead_seconds == 0.004
    assert cal.meta["calibration"]["draft_factor"] == pytest.approx(2.5)
    # other shapes get the same factors
    other = chain(5)
    assert cal.step_parts(other)[0] == pytest.approx(2.5 * prof.step_parts(other)[0])


def test_calibration_with_costly_drafting_never_chooses_a_deeper_tree() -> None:
    from treespec.calibrate import tuning
    from treespec.calibrate.costs import Profile

    prof = Profile({1: 0.10, 2: 0.101, 4: 0.103, 8: 0.11, 16: 0.13, 32: 0.17}, {1: 0.004, 4: 0.005, 16: 0.008}, {})
    vector = [0.8, 0.1, 0.05]
    tuned = tuning.Tuned(prof.choose(vector, max_depth=8), prof)
    draft, verify = prof.step_parts(tuned.choice.shape)
    measured = make_pilot(depth=tuned.choice.shape.depth, chain=False, draft_per_step=6 * draft,
                          verify_per_step=verify, engine_per_step=0.0, plain_verify_per_token=0.10,
                          mean_tree_size=tuned.choice.shape.size)
    again = tuning.calibrate(tuned, measured, vector, max_depth=8)
    assert again.choice.shape.depth < tuned.choice.shape.depth  # drafting 6x dearer: a shallower tree pays more
    assert again.choice.speedup < tuned.choice.speedup
    assert "calibrated on 100 real steps (drafting x6.00" in again.why


def test_resolve_calibrates_a_tuned_recipe_with_real_steps(pair, tmp_path) -> None:
    from treespec.calibrate.vectors import default_acceptance

    from treespec.calibrate import tuning
    from treespec.calibrate.costs import Profile

    target, draft, tok = pair
    vector = default_acceptance(None, 0.0)
    prof = Profile({1: 0.10, 2: 0.101, 4: 0.103, 8: 0.11, 16: 0.13}, {1: 0.004, 4: 0.005, 16: 0.008}, {})
    # a profile on which a tree pays (the tiny models' own would choose plain decoding)
    fake = lambda *a, **k: tuning.Tuned(prof.choose(vector, max_depth=8), prof)  # noqa: E731
    recipe = Recipe(tree="sequoia", acceptance=vector)
    resolved = resolve(recipe, target, [draft], tokenizer=tok, max_new_tokens=16, tuner=fake,
                       pilot_cache=tmp_path / "pilots.json")
    cal = resolved.tuned.calibration
    assert cal is not None and cal["steps"] > 0 and "real steps" in resolved.why
    assert (tmp_path / "pilots.json").exists()
    prompt = tok("x = 1")["input_ids"]
    out = run(resolved.recipe, target, [draft], prompt, max_new_tokens=10)
    assert out.new_tokens == greedy_reference(target, prompt, 10)


def test_a_compiled_run_keeps_a_compiled_profile_uncalibrated_by_eager_steps(pair, tmp_path, monkeypatch) -> None:
    """On CUDA the profile times compiled forwards; the calibration pilot runs eager steps (launch-bound there), so
    a run that compiles keeps the profile's costs and says they are uncalibrated; an eager run, or a profile of
    eager forwards (a CPU's), is calibrated as before."""
    from treespec.calibrate import choices, tuning
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.vectors import default_acceptance

    target, draft, tok = pair
    vector = default_acceptance(None, 0.0)
    curves = ({1: 0.10, 2: 0.101, 4: 0.103, 8: 0.11, 16: 0.13}, {1: 0.004, 4: 0.005, 16: 0.008})
    on_gpu = Profile(*curves, {"compiled": True})
    pilots: list[int] = []
    real = choices._measured
    monkeypatch.setattr(choices, "_measured", lambda *a, **k: pilots.append(1) or real(*a, **k))
    fake = lambda prof: lambda *a, **k: tuning.Tuned(prof.choose(vector, max_depth=8), prof)  # noqa: E731
    kwargs = dict(tokenizer=tok, max_new_tokens=16, pilot_cache=tmp_path / "pilots.json")
    recipe = Recipe(tree="sequoia", acceptance=vector)
    compiled = resolve(recipe, target, [draft], tuner=fake(on_gpu), compiled=True, **kwargs)
    assert pilots == [] and compiled.tuned.calibration is None
    assert "costs of compiled forwards timed alone (not calibrated on real steps)" in compiled.why
    eager = resolve(recipe, target, [draft], tuner=fake(on_gpu), **kwargs)
    assert pilots == [1] and eager.tuned.calibration is not None and "real steps (drafting" in eager.why
    on_cpu = resolve(recipe, target, [draft], tuner=fake(Profile(*curves, {})), compiled=True, **kwargs)
    assert pilots == [1, 1] and on_cpu.tuned.calibration is not None


def test_a_tuned_tree_is_sized_for_the_batch_it_runs(pair, monkeypatch) -> None:
    """``resolve(batch_size=B)`` chooses under ``Profile.for_batch(B)`` (a step verifies B trees in one forward),
    and ``treespec.run`` on a list of prompts resolves for that many rows; the batch's rows stay exact."""
    from treespec.calibrate import choices, tuning
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.vectors import default_acceptance

    target, draft, _ = pair
    vector = default_acceptance(None, 0.0)
    prof = Profile({1: 0.10, 2: 0.11, 4: 0.13, 8: 0.18, 16: 0.30, 32: 0.55, 64: 1.05},
                   {1: 0.004, 4: 0.006, 16: 0.02}, {})
    fake = lambda *a, **k: tuning.Tuned(prof.choose(vector, max_depth=8), prof)  # noqa: E731
    recipe = Recipe(tree="sequoia", acceptance=vector)
    one = resolve(recipe, target, [draft], tuner=fake)
    eight = resolve(recipe, target, [draft], tuner=fake, batch_size=8)
    assert eight.recipe.budget == prof.for_batch(8).choose(vector, max_depth=8).budget < one.recipe.budget
    assert "for steps of 8 prompts at once" in eight.why and "plain batched decoding" in eight.why
    assert "prompts at once" not in one.why
    asked = []
    real = choices.resolve
    monkeypatch.setattr(choices, "resolve", lambda *a, **k: asked.append(k.get("batch_size")) or real(
        *a, **{**k, "tuner": fake}))
    prompts = [[1, 2, 3], [4, 5], [6]]
    out = choices.run(recipe, target, [draft], prompts, max_new_tokens=6)
    assert asked == [3] and [r.new_tokens for r in out.rows] == [greedy_reference(target, p, 6) for p in prompts]


@pytest.mark.parametrize("predicted, kept", [(1.03, False), (1.08, True)])
def test_a_tuned_tree_predicted_under_the_margin_runs_as_plain_decoding(pair, predicted, kept) -> None:
    """A tuned tree predicted to gain less than ``pilot.MARGIN`` over the target alone (the prediction's error: on
    prompts unlike the calibration's, chat sized with code's rows, it ran 0.88-1.01x where 1.28x was predicted) runs
    as plain decoding, the declined tree named in the why-line; a tree predicted above the margin is kept (control).
    The same profile's plain decoding, timed slower or faster, moves the prediction across the margin (the tree the
    DP picks does not depend on it)."""
    from treespec.calibrate import tuning
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.pilot import MARGIN
    from treespec.calibrate.vectors import default_acceptance

    target, draft, tok = pair
    vector = default_acceptance(None, 0.0)
    base = Profile({1: 0.10, 2: 0.101, 4: 0.103, 8: 0.11, 16: 0.13}, {1: 0.004, 4: 0.005, 16: 0.008}, {})
    speedup = tuning.Tuned(base.choose(vector, max_depth=8), base).prediction.speedup
    prof = replace(base, plain_decode_seconds=base.choose(vector, max_depth=8).plain_seconds * predicted / speedup)
    tree = prof.choose(vector, max_depth=8)
    assert MARGIN == 1.05 and tree.depth > 0 and tree.speedup == pytest.approx(predicted)
    resolved = resolve(Recipe(tree="sequoia", acceptance=vector), target, [draft],
                       tuner=lambda *a, **k: tuning.Tuned(tree, prof))
    if kept:
        assert resolved.recipe.budget == tree.budget > 1 and "plain decoding runs" not in resolved.why
        return
    assert resolved.recipe.budget == 1 and resolved.tuned.prediction.speedup == 1.0
    assert resolved.tuned.prediction.tau == 1.0 and resolved.tuned.declined.choice is tree
    # the run's figure: 128 tokens (resolve's default), plain decoding's first from its prefill: 1.03 * 127 / 128
    assert (f"Sequoia tree of budget {tree.shape.size}, depth {tree.shape.depth}" in resolved.why
            and f"predicted {predicted:.2f}x over the target alone" in resolved.why
            and "so plain decoding runs (the target alone: 1.02x is under the 1.05x" in resolved.why)
    prompt = tok("x = 1")["input_ids"]
    assert run(resolved.recipe, target, [draft], prompt, max_new_tokens=6).new_tokens == greedy_reference(
        target, prompt, 6)


def test_the_run_speedup_charges_the_drafts_prefill_to_the_tree_alone() -> None:
    # 16 tokens, steps of 0.2 s committing 4, plain 0.07 s a token, 0.5 s of prefill of which 0.1 s the draft's:
    # plain 0.4 + 15 * 0.07 = 1.45 s against 0.5 + 16 * 0.05 = 1.3 s
    assert run_speedup(16, 0.2, 4.0, 0.07, 0.5, 0.1) == pytest.approx(1.45 / 1.3)
    # no prefill and a long run: the decoding's own speedup, tau * plain / step
    assert run_speedup(1e9, 0.2, 4.0, 0.07) == pytest.approx(4.0 * 0.07 / 0.2)
    # the pilot's predictions and the tuner's say the same for the same figures
    assert Prediction(4.0, 0.2, 0.07, "rows").run_speedup(16, 0.5, 0.1) == pytest.approx(1.45 / 1.3)


def test_a_tuned_tree_that_cannot_earn_back_the_drafts_prefill_runs_as_plain_decoding(pair) -> None:
    """The draft prefills the run's prompt before the first step, which plain decoding does not: a tree predicted
    1.20x in its decoding is kept for 128 tokens after a 32-token prompt (the draft's 0.1 s prefill charged) and
    declined for 16 tokens after a 512-token one (1.6 s): the why-line says the run's figure either way, and the
    run without a prompt length decides by the decoding alone (control)."""
    from treespec.calibrate import tuning
    from treespec.calibrate.costs import Profile
    from treespec.calibrate.vectors import default_acceptance

    target, draft, _ = pair
    vector = default_acceptance(None, 0.0)
    base = Profile({1: 0.10, 2: 0.101, 4: 0.103, 8: 0.11, 16: 0.13}, {1: 0.004, 4: 0.005, 16: 0.008}, {},
                   draft_prefill_latency={32: 0.1, 128: 0.4, 512: 1.6})
    speedup = tuning.Tuned(base.choose(vector, max_depth=8), base).prediction.speedup
    prof = replace(base, plain_decode_seconds=base.choose(vector, max_depth=8).plain_seconds * 1.2 / speedup)
    tree = prof.choose(vector, max_depth=8)
    recipe, tuner = Recipe(tree="sequoia", acceptance=vector), lambda *a, **k: tuning.Tuned(tree, prof)
    kept = resolve(recipe, target, [draft], tuner=tuner, max_new_tokens=128, prompt_tokens=32)
    p = kept.tuned.prediction
    run = (127 * p.plain_seconds) / (0.1 + 128 / p.tau * p.step_seconds)  # the target's prefill on both sides
    assert kept.recipe.budget == tree.budget > 1 and kept.tuned.run_speedup == pytest.approx(run) and run < 1.2
    assert (f"{run:.2f}x for this run's 128 tokens with the draft's prefill of its 32-token prompt (0.10 s) charged"
            in kept.why)
    short = resolve(recipe, target, [draft], tuner=tuner, max_new_tokens=16, prompt_tokens=512)
    assert short.recipe.budget == 1 and short.tuned.declined.choice is tree
    assert short.tuned.prediction.run_speedup(16, 0.5) == 1.0  # plain decoding's run: the target alone's
    figure = short.tuned.declined.run_speedup
    assert figure < 1.05 and (f"so plain decoding runs (the target alone: {figure:.2f}x is under the 1.05x"
                              in short.why) and "its 512-token prompt (1.60 s)" in short.why
    batch = resolve(recipe, target, [draft], tuner=tuner, max_new_tokens=128, prompt_tokens=32, batch_size=2)
    assert "the draft's prefill of 2 prompts of 32 tokens (0.20 s) charged" in batch.why  # one prefill per row
    unknown = resolve(recipe, target, [draft], tuner=tuner, max_new_tokens=16)
    assert unknown.recipe.budget == tree.budget and "prefill of its" not in unknown.why


@pytest.mark.parametrize("depth, expected", [(15, [1, 2, 3, 4, 5, 6, 7, 8, 11, 14, 16]), (4, [1, 2, 3, 4, 5]),
                                             (1, [1, 2])])
def test_the_pilots_latency_curve_is_timed_at_every_small_size(monkeypatch, depth, expected) -> None:
    """A chain is most likely cut to a shallow depth, and a kernel's cost can jump between neighbouring sizes (the
    int4 target here: 107 ms for 4 tokens, 200 ms for 5): every size up to ``DENSE_SIZES`` is timed, the rest sparser,
    the deepest tree's always (a line from 2 to 5 tokens put t(4) at 171 ms)."""
    from treespec.core.stats import GenerateOutput

    timed = []
    monkeypatch.setattr(pilot, "measure_latency", lambda target, sizes, repeats: timed.append(sizes) or {
        n: 0.1 * n for n in sizes})

    def generate(ids, n):
        return GenerateOutput(sequences=None, new_tokens=[0] * n,
                              stats=Stats(steps=n, new_tokens=n, step_tokens=[1] * n, step_cut=[False] * n))

    measured = pilot.run_pilot(generate, generate, None, [[1, 2]], depth=depth, chain=True, tokens=4, progress=False)
    assert timed == [expected] and sorted(measured.latency) == expected


def test_the_pilot_keeps_its_prompts_within_a_short_context(monkeypatch) -> None:
    """A target of a short context gets the ends of the pilot's prompts, as many tokens as fit beside the pilot's
    own; one too short for those refuses, saying to give the tree a size."""
    from types import SimpleNamespace

    from treespec.core.stats import GenerateOutput

    monkeypatch.setattr(pilot, "measure_latency", lambda target, sizes, repeats: {n: 0.1 * n for n in sizes})
    seen = []

    def generate(ids, n):
        seen.append(len(ids))
        return GenerateOutput(sequences=None, new_tokens=[0] * n,
                              stats=Stats(steps=n, new_tokens=n, step_tokens=[1] * n, step_cut=[False] * n))

    target = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=40))
    pilot.run_pilot(generate, generate, target, [list(range(100)), [1, 2]], depth=2, chain=True, tokens=4,
                    progress=False)
    assert set(seen) == {36, 2}
    with pytest.raises(ValueError, match=r"context \(4 positions\) leaves no room for the pilot's 4 tokens"):
        pilot.run_pilot(generate, generate, SimpleNamespace(config=SimpleNamespace(max_position_embeddings=4)),
                        [[1, 2]], depth=2, chain=True, tokens=4, progress=False)
