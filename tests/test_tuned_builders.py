"""A chain or a k-ary tree without a budget is sized by the tuner, by the same cost model and acceptance rows as the
Sequoia tree (``step_cost.Builder``, ``options.TUNED_TREES``), and the run drafts exactly the tree it sized."""

from __future__ import annotations

import itertools
import json
import runpy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tree_builders import TreeShape, for_budget
from treespec.calibrate import tuning
from treespec.calibrate.choices import resolve, tunable
from treespec.calibrate.costs import Profile
from treespec.calibrate.step_cost import Builder
from treespec.calibrate.vectors import default_acceptance
from treespec.models.tiny import ByteTokenizer, greedy_reference, perturbed_copy, tiny_model
from treespec.recipes import NGramSettings, Recipe, run, shape_for

from test_cli import tiny_dirs  # noqa: F401  (a fixture: tiny local model directories with a tokenizer)

#: a CPU-like profile (t(n) grows with n, the draft's level with its width) and a GPU-like one (width nearly free)
CPU = Profile({1: 0.10, 2: 0.11, 4: 0.13, 8: 0.18, 16: 0.30, 32: 0.55}, {1: 0.02, 2: 0.025, 4: 0.03, 16: 0.06}, {})
GPU = Profile({1: 0.10, 2: 0.1005, 4: 0.101, 8: 0.102, 16: 0.104, 32: 0.11}, {1: 0.02, 4: 0.0201, 16: 0.0205}, {})


@pytest.fixture(scope="module")
def rows():
    return default_acceptance(None, 0.0)


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=0)
    return target, perturbed_copy(target, 0.3), ByteTokenizer(64)


@pytest.mark.parametrize("prof", [CPU, GPU], ids=["cpu", "gpu"])
@pytest.mark.parametrize("builder", [Builder("chain"), Builder("kary", 2), Builder("kary", 3)],
                         ids=["chain", "kary2", "kary3"])
def test_a_builders_tree_is_the_fastest_of_its_trees_under_the_profile(rows, prof, builder):
    """Every (budget, depth) tree of the builder costed by hand (its expected tokens under the rows over the profile's
    seconds for it): the choice is the fastest of them, and the recipe it gives builds that very tree."""
    choice = prof.choose(rows, max_depth=8, builder=builder)
    best = max((for_budget(builder.name, b, None, d, kary_width=builder.kary_width)
                for b, d in itertools.product(range(2, 33), range(1, 9))),
               key=lambda s: s.expected_tokens(rows) / prof.step_seconds(s))
    assert choice.shape == best
    assert choice.tau == pytest.approx(best.expected_tokens(rows))
    assert choice.step_seconds == pytest.approx(prof.step_seconds(best))
    settings = tuning.Tuned(choice, prof, builder=builder).settings()
    assert settings["max_width"] is None  # a Sequoia option only
    recipe = Recipe(tree=builder.name, kary_width=builder.kary_width,
                    **{k: v for k, v in settings.items() if k != "min_confidence"})
    assert shape_for(recipe) == choice.shape


def test_the_sequoia_tree_is_never_predicted_slower_than_the_best_chain(rows):
    """A chain is the Sequoia DP's tree under a width limit of 1, which the DP's search holds: so the Sequoia choice
    is at least as fast (a check that both are costed alike); where width is nearly free (the GPU-like profile) the
    k-ary and Sequoia trees grow wide, where it costs (the CPU-like one) they stay small."""
    for prof in (CPU, GPU):
        sequoia, chain = prof.choose(rows, max_depth=8), prof.choose(rows, max_depth=8, builder=Builder("chain"))
        assert sequoia.speedup >= chain.speedup - 1e-12 and chain.shape.max_width == 1
    for builder in (None, Builder("kary", 2)):
        wide, narrow = GPU.choose(rows, max_depth=8, builder=builder), CPU.choose(rows, max_depth=8, builder=builder)
        assert wide.shape.size >= 3 * narrow.shape.size and max(wide.shape.widths) > max(narrow.shape.widths)


def test_which_recipes_are_tuned(pair, rows):
    target, draft, _ = pair
    for tree in ("sequoia", "chain", "kary"):
        assert tunable(Recipe(tree=tree, acceptance=rows), [draft])
        assert not tunable(Recipe(tree=tree, acceptance=rows, budget=4), [draft])  # a budget given
        assert not tunable(Recipe(tree=tree, acceptance=rows, ngram=NGramSettings()), [draft])  # a pilot's
        assert not tunable(Recipe(tree=tree), [draft])  # no acceptance to size it from
    for tree in ("chains", "dynamic"):
        assert not tunable(Recipe(tree=tree, acceptance=rows), [draft])
    assert not tunable(Recipe(tree="paths", paths=[[0], [1]], acceptance=rows), [draft])  # runs as given


@pytest.mark.parametrize("tree, width", [("chain", 2), ("kary", 2), ("kary", 3)])
def test_resolve_tunes_a_chain_or_a_kary_tree_and_the_run_is_exact(pair, rows, tree, width):
    """``resolve`` hands the recipe's builder to the tuner; the resolved recipe drafts the tuned tree, its why-line
    names the builder, and the run is the target's own greedy decoding."""
    target, draft, tok = pair
    asked = []

    def tuner(*args, builder=None, **kwargs):
        asked.append(builder)
        return tuning.Tuned(GPU.choose(rows, max_depth=8, builder=builder), GPU, builder=builder)

    resolved = resolve(Recipe(tree=tree, kary_width=width, acceptance=rows), target, [draft], tuner=tuner)
    assert asked == [Builder(tree, width)] and resolved.tuned.builder == Builder(tree, width)
    shape = resolved.tuned.choice.shape
    assert resolved.recipe.tree == tree and shape_for(resolved.recipe) == shape and shape.depth >= 1
    named = "chain" if tree == "chain" else f"k-ary tree (width {width})"
    assert f"{named} of budget {shape.size}, depth {shape.depth}:" in resolved.why and "Sequoia" not in resolved.why
    prompt = tok("x = 1")["input_ids"]
    assert run(resolved.recipe, target, [draft], prompt, max_new_tokens=12).new_tokens == greedy_reference(
        target, prompt, 12)


@pytest.mark.parametrize("tokens", [3, 4, 6])
def test_a_short_run_is_tuned_at_the_depth_its_plan_drafts(pair, rows, tokens):
    """The run's plan caps the tree's depth at ``max_new_tokens - 1``; the tuner sizes the tree under that cap, so
    the tree tuned, predicted and printed is the tree drafted (a depth-8 tree was tuned and a shallower one ran)."""
    target, draft, _ = pair

    def tuner(*args, max_depth, builder=None, **kwargs):
        return tuning.Tuned(GPU.choose(rows, max_depth=max_depth, builder=builder), GPU, builder=builder)

    resolved = resolve(Recipe(acceptance=rows), target, [draft], tuner=tuner, max_new_tokens=tokens)
    shape = resolved.tuned.choice.shape
    assert shape.depth == tokens - 1 and shape_for(resolved.recipe, max_new_tokens=tokens) == shape
    with pytest.raises(ValueError, match="max_new_tokens"):
        resolve(Recipe(acceptance=rows), target, [draft], tuner=tuner, max_new_tokens=0)


@pytest.mark.parametrize("builder", [Builder("chain"), Builder("kary", 2)], ids=["chain", "kary"])
def test_a_tuned_builders_tree_calibrated_by_real_steps_stays_that_builders(rows, builder):
    """The pilot's correction (drafting 4x dearer than the profile said) makes the choice again among the same
    builder's trees, shallower, never a Sequoia tree; and so does the batch's (``for_batch``)."""
    from test_pilot import make_pilot

    tuned = tuning.Tuned(GPU.choose(rows, max_depth=8, builder=builder), GPU, builder=builder)
    shape = tuned.choice.shape
    draft, verify = GPU.step_parts(shape)
    measured = make_pilot(depth=shape.depth, chain=False, draft_per_step=4 * draft, verify_per_step=verify,
                          engine_per_step=0.0, plain_verify_per_token=0.10, mean_tree_size=shape.size)
    again = tuning.calibrate(tuned, measured, rows, max_depth=8)
    assert again.builder == builder and again.choice.shape.depth < shape.depth
    assert again.choice.shape == builder.shape(again.choice.budget, again.choice.depth)
    batched = tuned.for_batch(4, rows, max_depth=8)
    assert batched.builder == builder and batched.choice.shape == builder.shape(batched.choice.budget,
                                                                                batched.choice.depth)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_a_builders_choice_is_the_fastest_of_its_trees_under_random_costs(data):
    """Over random cost curves (a target forward growing with its tokens, a draft level with its width, an engine
    overhead) and random acceptance vectors: the builder's choice is as fast as the fastest of its trees costed one by
    one, and the recipe it gives builds the chosen tree."""
    growth = data.draw(st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5))
    latency = {1: data.draw(st.floats(0.01, 0.2))}
    for n, g in zip((2, 4, 8, 16, 32), growth):
        latency[n] = latency[max(latency)] * (1 + g)
    level = data.draw(st.floats(0.0, 0.1))
    draft = {1: level, 4: level * (1 + data.draw(st.floats(0.0, 2.0))), 16: level * (1 + data.draw(st.floats(0, 8)))}
    weights = data.draw(st.lists(st.floats(0.01, 1.0), min_size=4, max_size=4))
    mass = data.draw(st.floats(0.05, 0.99))
    vector = sorted((w / sum(weights) * mass for w in weights), reverse=True)
    builder = data.draw(st.sampled_from([Builder("chain"), Builder("kary", 2), Builder("kary", 3)]))
    prof = Profile(latency, draft, {}, step_overhead_seconds=data.draw(st.floats(0.0, 0.01)))
    choice = prof.choose(vector, max_depth=6, builder=builder)
    trees = [builder.shape(b, d) for b, d in itertools.product(range(2, 33), range(1, 7))]
    best = max(s.expected_tokens(vector) / prof.step_seconds(s) for s in trees)
    plain = 1.0 / prof.step_seconds(TreeShape())
    assert choice.tau / choice.step_seconds == pytest.approx(max(best, plain), rel=1e-9)
    if choice.depth:
        recipe = Recipe(tree=builder.name, kary_width=builder.kary_width, budget=choice.budget, depth=choice.depth)
        assert shape_for(recipe) == choice.shape


def test_the_shapes_benchmark_runs_a_pair_and_prompts_of_ones_own_and_resumes(tiny_dirs, tmp_path):  # noqa: F811
    """``experiments/bench_tuned_shapes.py`` on a local pair and a JSONL of prompts: each shape tuned and run beside HF
    eager, every greedy output HF's (float32), the report written; run again, it measures nothing new."""
    main = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_tuned_shapes.py"))["main"]
    (tmp_path / "p.jsonl").write_text('{"prompt": "w1 w2 w3 w1 w2"}\n{"prompt": "w4 w5"}\n')
    out = tmp_path / "shapes"
    argv = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--target-dtype", "float32",
            "--prompts-jsonl", str(tmp_path / "p.jsonl"), "--max-new-tokens", "6", "--shapes", "sequoia", "chain",
            "kary2", "--quick", "--out", str(out)]
    main(argv)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"hf-float32", "treespec-sequoia", "treespec-chain", "treespec-kary2"}
    assert summary["prompts"] == [0, 1]
    assert all(a["identical"] == 2 for a in summary["agreement"].values())
    shapes = json.loads((out / "shapes.json").read_text())
    assert {s["recipe"]["tree"] for s in shapes.values()} == {"sequoia", "chain", "kary"}
    assert "treespec-chain vs treespec-sequoia" in (out / "README.md").read_text()
    lines = (out / "results.jsonl").read_text().count("\n")
    main(argv)
    assert (out / "results.jsonl").read_text().count("\n") == lines == 8
