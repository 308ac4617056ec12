"""Recipes: one translation from settings to drafters, the same in the CLI, the demo and sweeps."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pytest

import treespec
import treespec.bench.sweep as S
from treespec import NGramDrafter
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.cli import build_parser, recipe_from_args
from treespec.calibrate.tuning import tune
from treespec.calibrate.costs import Profile, choose_tree
from treespec.recipes import NGramSettings, Recipe, build_drafters, draft_mode, plan, shape_for
from treespec.models.tiny import perturbed_copy, tiny_model

ROOT = Path(__file__).resolve().parents[1]
VECTOR = [0.62, 0.12, 0.05, 0.03]


def test_draft_mode_rule() -> None:
    assert draft_mode("sequoia", 0.0) == "topk"
    assert draft_mode("kary", 0.7) == "sample_without_replacement"
    assert draft_mode("chains", 1.0) == "sample" and draft_mode("chains", 0.0) == "topk"
    assert draft_mode("dynamic", 1.0) == "dynamic"
    assert draft_mode("sequoia", 1.0, "sample") == "sample"  # an explicit mode wins
    with pytest.raises(ValueError, match="draft_mode"):
        Recipe(draft_mode="greedy")
    with pytest.raises(ValueError, match="budget"):
        Recipe(budget=0)
    with pytest.raises(ValueError, match="unknown tree builder"):
        Recipe(tree="bush")


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


def test_verified_nodes_never_exceed_the_budget() -> None:
    target = tiny_model("llama", vocab=32, scale=4)
    draft = perturbed_copy(target, 0.3)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    for tree in ("sequoia", "kary", "dynamic"):
        recipe = Recipe(tree=tree, budget=6, ngram=NGramSettings(max_tokens=3), acceptance=VECTOR)
        drafters = build_drafters(recipe, [draft], max_new_tokens=16)
        assert isinstance(drafters[-1], NGramDrafter) and len(drafters) == 2
        out = treespec.generate(target, prompt, drafters=drafters, max_new_tokens=16, budget=recipe.budget)
        assert max(out.stats.tree_sizes) <= 6, tree


def test_depth_is_capped_by_the_tokens_wanted() -> None:
    assert shape_for(Recipe(tree="chain", budget=100_000), max_new_tokens=4).depth == 3
    assert plan(Recipe(tree="dynamic", budget=64), max_new_tokens=3).model["depth"] == 2
    assert build_drafters(Recipe(tree="chain", budget=1), [tiny_model()]) == []  # nothing could be verified


def _sweep_plan(tmp_path: Path, budget: int, depth: int, ngram_tokens: int | None = None) -> tuple:
    """What ``treespec sweep`` drafts for one treespec point of tiny.toml at these settings."""
    cfg = S.load_config(ROOT / "experiments" / "configs" / "tiny.toml")
    cfg["grid"].update(builders=["sequoia"], budgets=[budget], max_depths=[depth], temperatures=[0.0],
                       drafters=["model" if ngram_tokens is None else "both"])
    cfg["ngram"]["max_tokens"] = ngram_tokens or 4
    counts = np.array([[round(100 * a) for a in VECTOR]])

    def measure(*args, **kwargs) -> MeasuredAcceptance:
        return MeasuredAcceptance.from_counts(counts, np.array([100]), beta=0.5)

    state = S.Sweep(cfg, tmp_path, progress=False, measure=measure)
    point = next(pt for pt in S.enumerate_points(cfg) if pt.kind == "treespec")
    drafters, info = state._drafters(point.params)
    recipe = S.point_recipe(point.params, VECTOR)
    assert info["tree"]["paths"] == [list(p) for p in plan(recipe).shape.paths]
    return plan(recipe, max_new_tokens=point.params["max_new_tokens"]).key(), info["cap"], \
        [d.describe() for d in drafters]


def _cli_plan(tmp_path: Path, budget: int, depth: int, ngram: bool = False) -> tuple:
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"vector": VECTOR}))
    args = build_parser().parse_args(["generate", "--prompt", "x", "--tree", "sequoia", "--budget", str(budget),
                                      "--depth", str(depth), "--acceptance", str(acc)] + (["--ngram"] if ngram else []))
    recipe = recipe_from_args(args)
    return plan(recipe, max_new_tokens=args.max_new_tokens).key(), recipe.budget, recipe


def test_cli_demo_and_sweep_draft_the_same_tree(tmp_path: Path) -> None:
    prof = Profile({1: 1.0, 4: 1.02, 16: 1.2}, 0.05)
    target = S.load_model("tiny:llama:seed=0", "cpu", "float32")[0]
    with patch("treespec.calibrate.tuning.cached_profile", return_value=prof):
        tuned = tune(target, target, VECTOR, max_depth=8, min_confidence=None)
    choice, demo = tuned.choice, replace(tuned.recipe, target_dtype=None, draft_dtype=None, max_width=None)
    assert choice.depth >= 2 and choice.budget >= 4  # a real tree, not a chain of one
    assert plan(tuned.recipe).shape.paths == choice.shape.paths  # the demo runs the tree its profile chose
    assert plan(demo).shape.paths == choice.shape.paths
    demo_key = plan(demo, max_new_tokens=64).key()
    cli_key, cli_budget, cli_recipe = _cli_plan(tmp_path, choice.budget, choice.depth)
    sweep_key, sweep_cap, described = _sweep_plan(tmp_path, choice.budget, choice.depth)
    assert demo_key == cli_key == sweep_key and cli_budget == sweep_cap == demo.budget
    assert [d.describe() for d in build_drafters(cli_recipe, [target])][0].split(", ", 1)[1] == \
        described[0].split(", ", 1)[1]  # same mode, size and depth (the model names differ)


def test_cli_and_sweep_share_the_budget_with_the_ngram_alike(tmp_path: Path) -> None:
    cli_key, cli_budget, _ = _cli_plan(tmp_path, 12, 6, ngram=True)
    sweep_key, sweep_cap, described = _sweep_plan(tmp_path, 12, 6, ngram_tokens=4)
    assert cli_key == sweep_key and cli_budget == sweep_cap == 12 and len(described) == 2
