"""Recipes: one translation from settings to drafters, and one route to the engine (``treespec.recipes.run``)
that the CLI, the demo, the sweep and Python callers all take."""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import treespec
import treespec.bench.sweep as S
from treespec import NGramDrafter, recipes
from treespec.bench import demo
from treespec.calibrate import tuning
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.calibrate.costs import Profile
from treespec.calibrate.vectors import default_acceptance
from treespec.cli import main
from treespec.drafters.model import ModelDrafter
from treespec.models.tiny import ByteTokenizer, perturbed_copy, tiny_model
from treespec.recipes import NGramSettings, Recipe, build_drafters, draft_mode, plan, run, shape_for
from treespec.calibrate.choices import resolve

from test_cli import tiny_dirs  # noqa: F401  (a fixture: tiny local model directories for the CLI)

ROOT = Path(__file__).resolve().parents[1]
VECTOR = [0.62, 0.12, 0.05, 0.03]


def test_draft_mode_rule() -> None:
    assert draft_mode("sequoia", 0.0) == "topk"
    assert draft_mode("kary", 0.7) == "sample_without_replacement"
    assert draft_mode("chains", 1.0) == "sample" and draft_mode("chains", 0.0) == "topk"
    assert draft_mode("dynamic", 1.0) == "dynamic"
    assert draft_mode("sequoia", 1.0, "sample") == "sample"  # an explicit mode wins


@pytest.mark.parametrize("kwargs,fragment", [
    ({"draft_mode": "greedy"}, "draft_mode"), ({"budget": 0}, "budget"), ({"tree": "bush"}, "unknown tree builder"),
    ({"budget": 2.0}, "budget"), ({"depth": 0}, "depth"), ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"), ({"top_k": -1}, "top_k"), ({"verifier": "vote"}, "unknown verifier"),
    ({"compile": 3}, "compile"), ({"compile": "banana"}, "names no torch.compile backend"),
    ({"target_dtype": "int8"}, "for drafts only"), ({"kary_width": 0}, "kary_width"),
    ({"acceptance": [0.9, 0.8]}, "sum"), ({"tree": "paths"}, "needs paths"),
    ({"tree": "paths", "paths": []}, "at least"),
    ({"tree": "paths", "paths": [[0, 0], [0]]}, "comes before"), ({"tree": "chain", "paths": [[0]]}, "tree='paths'"),
    ({"ngram": {"max_tokens": 3}}, "NGramSettings"), ({"ngram": True}, "NGramSettings"),  # a traceback at run time
    ({"verifier": ["rrs"]}, "one name"),  # was a TypeError
])
def test_every_setting_is_checked_where_the_recipe_is_made(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Recipe(**kwargs)
    with pytest.raises(ValueError, match="n-gram order"):
        NGramSettings(max_order=1)  # the n-gram drafter's own rule


def test_a_dynamic_tree_stops_on_the_recipes_confidence_and_a_budget_keeps_its_most_confident_nodes() -> None:
    """``Recipe(tree="dynamic", min_confidence=...)`` drafts with the stop (it was dropped), and a dynamic tree's
    proposals come most confident first, so a budget that cuts them keeps EAGLE-2's top nodes (the first ones in
    level order were kept: tau 2.86 against 3.74 on a tiny pair)."""
    from treespec.core.drafting import ROOT
    from treespec.core.sampling import SamplingParams

    target = tiny_model("llama", vocab=64, hidden=64, layers=1, scale=20, seed=0)
    draft = perturbed_copy(target, 0.1)
    (built,) = build_drafters(Recipe(tree="dynamic", budget=8, min_confidence=0.3), [draft])
    assert built.mode == "dynamic" and built.min_confidence == 0.3

    def paths(drafter: ModelDrafter) -> list[tuple[int, ...]]:
        drafter.reset([5, 9, 14, 3], sampling=SamplingParams(1.0), seed=0)
        props, out = drafter.propose([5, 9, 14, 3]), []
        for t, parent in zip(props.tokens, props.parents):
            out.append((t,) if parent == ROOT else out[parent] + (t,))
        return out

    wide = paths(ModelDrafter(draft, mode="dynamic", depth=4, topk=4, nodes=32))
    assert set(wide[:9]) == set(paths(ModelDrafter(draft, mode="dynamic", depth=4, topk=4, nodes=9)))


def test_a_target_may_run_in_int4() -> None:
    assert Recipe(target_dtype="int4").target_dtype == "int4"  # e.g. a GGUF file's own 4-bit blocks (models.load)


def test_ngram_shares_the_budget() -> None:
    both = plan(Recipe(tree="chain", budget=8, ngram=NGramSettings(max_tokens=3)))
    assert both.shape.size == 5 and both.ngram["max_nodes"] == 3 and both.ngram["max_tokens"] == 3
    assert both.budget == 8
    full = plan(Recipe(tree="chain", budget=4, ngram=NGramSettings(max_tokens=6)))
    assert full.shape.size == 2 and full.ngram["max_nodes"] == 2  # at least one node left for the model
    assert plan(Recipe(tree="chain", budget=2, ngram=NGramSettings())).ngram is None  # no room left
    alone = plan(Recipe(tree="chain", budget=8, depth=3, ngram=NGramSettings(max_tokens=6)), with_model=False)
    assert alone.model is None and alone.ngram["max_nodes"] == 7 and alone.ngram["max_tokens"] == 3
    dyn = plan(Recipe(tree="dynamic", budget=10, ngram=NGramSettings(max_tokens=4)))
    assert dyn.model == {"mode": "dynamic", "depth": 5, "topk": 8, "nodes": 5}


def test_verified_tokens_are_the_budget_or_what_the_ngram_drafter_alone_can_propose() -> None:
    """What a run's target rendering is sized for (``treespec generate`` on a GGUF target): the budget (the default
    one where tuning would set it), or the n-gram drafter's largest tree where it drafts alone; checked against the
    trees a run verifies."""
    assert recipes.verified_tokens(Recipe(tree="chain", budget=6), with_model=True) == 6
    assert recipes.verified_tokens(Recipe(tree="paths", paths=[[0], [1], [0, 0]]), with_model=True) == 4
    assert recipes.verified_tokens(Recipe(tree="chain", ngram=NGramSettings()), with_model=False) == 5  # of 16
    assert recipes.verified_tokens(Recipe(tree="chain", budget=3, ngram=NGramSettings()), with_model=False) == 3
    assert recipes.verified_tokens(Recipe(tree="chain", budget=1, ngram=NGramSettings()), with_model=False) == 1
    wide = Recipe(tree="chain", budget=12, ngram=NGramSettings(width=2, max_tokens=3))
    assert recipes.verified_tokens(wide, with_model=False) == 12  # 2 + 4 + 8 nodes, capped at the budget's 11
    narrow = Recipe(tree="chain", budget=12, ngram=NGramSettings(width=2, max_tokens=2, max_order=2))
    assert recipes.verified_tokens(narrow, with_model=False) == 7
    target = tiny_model("llama", vocab=8, scale=4)
    out = run(narrow, target, [], [1, 2, 1, 3, 2, 1, 2, 3, 3, 1, 3, 2, 2, 2, 1, 1], max_new_tokens=24)
    assert max(out.stats.tree_sizes) == 7  # every bigram seen twice or more: the tree fills
    lookup = Recipe(tree="chain", budget=12, ngram=NGramSettings(width=2, max_tokens=3, mode="prompt_lookup"))
    assert recipes.verified_tokens(lookup, with_model=False) == 7  # two chains of 3 (counted 2 + 4 + 8 before)
    out = run(lookup, target, [], [1, 2, 3, 4, 1, 2, 5, 6, 7, 1, 2], max_new_tokens=24)
    assert max(out.stats.tree_sizes) <= 7


def test_verified_nodes_never_exceed_the_budget() -> None:
    target = tiny_model("llama", vocab=32, scale=4)
    draft = perturbed_copy(target, 0.3)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    for tree in ("sequoia", "kary", "dynamic"):
        recipe = Recipe(tree=tree, budget=6, ngram=NGramSettings(max_tokens=3), acceptance=VECTOR)
        drafters = build_drafters(recipe, [draft], max_new_tokens=16)
        assert isinstance(drafters[-1], NGramDrafter) and len(drafters) == 2
        out = run(recipe, target, [draft], prompt, max_new_tokens=16)
        assert max(out.stats.tree_sizes) <= 6, tree


def test_depth_is_capped_by_the_tokens_wanted() -> None:
    assert shape_for(Recipe(tree="chain", budget=100_000), max_new_tokens=4).depth == 3
    assert plan(Recipe(tree="dynamic", budget=64), max_new_tokens=3).model["depth"] == 2
    assert build_drafters(Recipe(tree="chain", budget=1), [tiny_model()]) == []  # nothing could be verified


# -- one route ------------------------------------------------------------------------------------


def _drafter_key(d: Any) -> tuple:
    """What a drafter will propose, whatever model it drives: mode, static shape or dynamic settings."""
    if isinstance(d, ModelDrafter):
        tree = (d.depth, d.topk, d.nodes) if d.mode == "dynamic" else tuple(d.layout.shape.paths)
        return "model", d.mode, tree, d.min_confidence
    return type(d).__name__, d.describe()


@pytest.fixture
def engine_calls(monkeypatch) -> list[dict[str, Any]]:
    """Every call ``treespec.recipes.run`` makes to the engine: its drafters, cap and sampling."""
    calls: list[dict[str, Any]] = []
    real = recipes.generate

    def spy(target, input_ids, drafters, **kw):
        calls.append({"drafters": [_drafter_key(d) for d in drafters],
                      **{k: kw[k] for k in ("max_new_tokens", "budget", "temperature", "top_k", "top_p", "verifier",
                                            "compile")}})
        return real(target, input_ids, drafters, **kw)

    monkeypatch.setattr(recipes, "generate", spy)
    return calls


def _at(calls: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The call that generated ``n`` tokens (warm-up calls generate fewer), all such calls being alike."""
    hits = [c for c in calls if c["max_new_tokens"] == n]
    assert hits and all(c == hits[0] for c in hits), hits
    return hits[0]


def test_cli_demo_and_python_run_the_same_tuned_recipe(tmp_path: Path, monkeypatch, engine_calls, tiny_dirs) -> None:  # noqa: F811
    """No budget given: every route tunes the same Sequoia tree (same costs, same real-step calibration)
    and runs it under the same cap."""
    from treespec.calibrate import pilot

    prof = Profile.from_dict({"target_latency": {"1": 1.0, "4": 1.02, "16": 1.2}, "draft_level_latency": {"1": 0.05}})
    monkeypatch.setattr(tuning, "cached_profile", lambda *a, **k: prof)
    steps = pilot.Pilot(depth=8, chain=False, steps=50, uncut_steps=50, tau=4.0, survival=[0.9] * 8,
                        draft_per_step=0.8, verify_per_step=1.3, engine_per_step=0.01, prefill_per_prompt=0.0,
                        plain_per_token=1.0, plain_verify_per_token=1.0, plain_prefill_per_prompt=0.0,
                        latency={1: 1.0, 9: 1.1}, mean_tree_size=12.0)
    monkeypatch.setattr(pilot, "run_pilot", lambda *a, **k: steps)  # the real steps, the same on every route
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    target = tiny_model("llama", vocab=128, hidden=64, scale=6)
    draft = perturbed_copy(target, 0.2)
    shipped = default_acceptance(None, 0.0)

    resolved = resolve(Recipe(tree="sequoia", acceptance=shipped), target, [draft], tokenizer=ByteTokenizer(128),
                       max_new_tokens=16)
    assert "real steps" in resolved.why
    run(resolved.recipe, target, [draft], [5, 6, 7], max_new_tokens=16)
    python = _at(engine_calls, 16)
    engine_calls.clear()
    assert main(["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--dtype", "float32",
                 "--draft-dtype", "float32", "--prompt", "w1 w2 w3", "--max-new-tokens", "16"]) == 0
    cli = _at(engine_calls, 16)
    engine_calls.clear()
    # --quick: the HF baselines (the full run's compiled one: tests/test_freezing.py) are not what this test is about
    args = argparse.Namespace(out=tmp_path / "demo", prompts=1, max_new_tokens=16, device="cpu", target="unused",
                              quick=True)
    demo.run_demo(args, target, ByteTokenizer(128, max_tokens=48), draft)
    from_demo = _at(engine_calls, 16)

    tuned = tuning.calibrate(tuning.Tuned(prof.choose(shipped, max_depth=8), prof, tuning.MIN_CONFIDENCE), steps,
                             shipped)
    assert python == cli == from_demo
    assert python["budget"] == tuned.settings()["budget"] >= 4 and python["temperature"] == 0.0
    assert python["drafters"] == [("model", "topk", tuple(tuned.choice.shape.paths), tuning.MIN_CONFIDENCE)]


def test_cli_sweep_and_python_run_the_same_explicit_recipe(tmp_path: Path, engine_calls, tiny_dirs) -> None:  # noqa: F811
    """An explicit budget, depth and sampling: the CLI's flags, a sweep point and a Recipe give one engine call."""
    recipe = Recipe(tree="sequoia", budget=8, depth=4, temperature=0.7, top_p=0.9, acceptance=VECTOR)
    target = tiny_model("llama", vocab=64, scale=4)
    run(recipe, target, [perturbed_copy(target, 0.3)], [1, 2, 3], max_new_tokens=16, seed=1)
    python = _at(engine_calls, 16)
    engine_calls.clear()

    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"vector": VECTOR}))
    assert main(["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--dtype", "float32",
                 "--draft-dtype", "float32", "--prompt", "w1 w2", "--max-new-tokens", "16", "--tree", "sequoia",
                 "--budget", "8", "--depth", "4", "--temperature", "0.7", "--top-p", "0.9", "--acceptance", str(acc),
                 "--seed", "1"]) == 0
    cli = _at(engine_calls, 16)
    engine_calls.clear()

    cfg = S.load_config(ROOT / "experiments" / "configs" / "tiny.toml")
    cfg["grid"].update(builders=["sequoia"], budgets=[8], max_depths=[4], temperatures=[0.7], top_p=[0.9])
    cfg["data"].update(eval="100:101", max_new_tokens=16)
    counts = np.array([[round(100 * a) for a in VECTOR]])
    (tmp_path / "sweep").mkdir()
    state = S.Sweep(cfg, tmp_path / "sweep", progress=False,
                    measure=lambda *a, **k: MeasuredAcceptance.from_counts(counts, np.array([100]), beta=0.5))
    state.run_point(next(p for p in S.enumerate_points(cfg) if p.kind == "treespec"))
    sweep = _at(engine_calls, 16)

    assert python == cli == sweep
    assert python["budget"] == 8 and (python["temperature"], python["top_p"]) == (0.7, 0.9)
    assert python["drafters"][0][:2] == ("model", "sample_without_replacement")


def test_the_documented_route_sizes_and_caps_with_one_budget(engine_calls) -> None:
    """``run`` takes no budget of its own: the tree is sized and capped from ``recipe.budget``; a recipe
    whose budget is left to tuning cannot be turned into drafters before it is resolved."""
    assert "budget" not in inspect.signature(run).parameters
    target = tiny_model("llama", vocab=32, scale=4)
    draft = perturbed_copy(target, 0.3)
    with pytest.raises(ValueError, match="resolve it first"):
        build_drafters(Recipe(tree="kary"), [draft])
    out = run(Recipe(tree="kary", budget=6), target, [draft], [1, 2, 3], max_new_tokens=12)
    (call,) = engine_calls
    assert call["budget"] == 6 and call["drafters"][0][2] == tuple(plan(Recipe(tree="kary", budget=6)).shape.paths)
    assert max(out.stats.tree_sizes) <= 6
    resolved = resolve(Recipe(tree="kary", ngram=NGramSettings()), target, [draft])  # not tunable: the default
    assert resolved.recipe.budget == recipes.DEFAULT_BUDGET and "default" in resolved.why


def test_the_recipe_carries_sampling_verifier_and_compile(engine_calls) -> None:
    target = tiny_model("llama", vocab=32, scale=4)
    recipe = Recipe(tree="chain", budget=4, temperature=0.8, top_k=5, top_p=0.95, verifier="spectr",
                    compile="aot_eager")
    with pytest.raises(ValueError, match="verifier='spectr' runs on the host only"):
        run(recipe, target, [perturbed_copy(target, 0.3)], [1, 2], max_new_tokens=6)
    out = run(Recipe(tree="chain", budget=4, temperature=0.8, top_k=5, verifier="block"), target,
              [perturbed_copy(target, 0.3)], [1, 2], max_new_tokens=6, seed=0)
    assert out.stats.verifier == "block"
    assert engine_calls[-1]["top_k"] == 5 and engine_calls[-1]["temperature"] == 0.8
    # treespec.run is recipes.run after resolving a budget left to tuning (here given: the same engine call)
    calls = len(engine_calls)
    treespec.run(Recipe(tree="chain", budget=4, temperature=0.8, top_k=5, verifier="block"), target,
                 [perturbed_copy(target, 0.3)], [1, 2], max_new_tokens=6, seed=0)
    assert engine_calls[calls:] == engine_calls[calls - 1 : calls]


STATIC = [[0], [0, 0], [1], [0, 1], [0, 0, 0]]  # a static tree in priority order (Medusa style)


def test_cli_sweep_and_python_run_the_same_static_tree(tmp_path: Path, engine_calls, tiny_dirs) -> None:  # noqa: F811
    """``tree="paths"``: ``--paths``, the sweep's ``shapes.paths`` and a Recipe draft the same static tree, cut to
    the budget (its first B - 1 paths), and greedy output is the target's own."""
    recipe = Recipe(tree="paths", paths=STATIC, budget=5)
    assert shape_for(recipe).paths == ((0,), (1,), (0, 0), (0, 1))
    assert Recipe(tree="paths", paths=STATIC).mode == "topk"
    assert Recipe(tree="paths", paths=STATIC, temperature=1).mode == "sample_without_replacement"
    target = tiny_model("llama", vocab=64, scale=4)
    out = run(recipe, target, [perturbed_copy(target, 0.3)], [1, 2, 3], max_new_tokens=16, seed=1)
    assert out.new_tokens == treespec.models.tiny.greedy_reference(target, [1, 2, 3], 16)
    python = _at(engine_calls, 16)
    engine_calls.clear()

    tree = tmp_path / "tree.json"
    tree.write_text(json.dumps(STATIC))
    assert main(["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--dtype", "float32",
                 "--draft-dtype", "float32", "--prompt", "w1 w2", "--max-new-tokens", "16", "--tree", "paths",
                 "--paths", str(tree), "--budget", "5", "--seed", "1", "--no-compile"]) == 0
    cli = _at(engine_calls, 16)
    engine_calls.clear()

    cfg = S.load_config(ROOT / "experiments" / "configs" / "tiny.toml")
    cfg["grid"].update(builders=["paths"], budgets=[5])
    cfg["shapes"]["paths"] = STATIC
    cfg["data"].update(eval="100:101", max_new_tokens=16)
    (tmp_path / "sweep").mkdir()
    state = S.Sweep(cfg, tmp_path / "sweep", progress=False, measure=None)
    state.run_point(next(p for p in S.enumerate_points(cfg) if p.kind == "treespec"))
    sweep = _at(engine_calls, 16)

    assert python == cli == sweep
    assert python["drafters"][0] == ("model", "topk", ((0,), (1,), (0, 0), (0, 1)), None)


def test_a_static_tree_left_to_measurement_keeps_its_own_size() -> None:
    """Without a budget (and no tokenizer for a pilot) a static tree runs whole: its own size, not DEFAULT_BUDGET."""
    target = tiny_model("llama", vocab=64, scale=4)
    resolved = resolve(Recipe(tree="paths", paths=STATIC), target, [perturbed_copy(target, 0.3)])
    assert resolved.recipe.budget == len(STATIC) + 1 and "budget 6" in resolved.why
