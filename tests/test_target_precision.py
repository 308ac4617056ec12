"""A GGUF target's precision chosen by its tuned tree's predicted speed (``treespec.calibrate.target_precision``), on
a tiny Qwen2 written to GGUF with Q4_0 Linear weights (``test_models.write_gguf``)."""

from __future__ import annotations

import json

import gguf
import pytest
from test_models import tiny_qwen2, write_gguf

from treespec import cli
from treespec.calibrate import target_precision
from treespec.calibrate.target_precision import Candidate, applies, load_pair_tuned
from treespec.common.options import FLOATS
from treespec.models.precision import precision_of


@pytest.fixture
def q4_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))  # the decisions of this test only
    model = tiny_qwen2(seed=4)
    model.config.max_position_embeddings = 512  # the pilot's prompts (116 tokens here) and their steps fit
    return str(write_gguf(model, tmp_path / "m.gguf", gguf.GGMLQuantizationType.Q4_0))


def rates(int4_seconds: float, calls: list[str]):
    """A stand-in for the tuner's prediction: 0.1 s per token for a float target, ``int4_seconds`` for int4."""
    def rate(target, draft, tokenizer, temperature, chat=False, tree=None):
        precision = precision_of(target)
        calls.append(precision + (" chat" if chat else "") + ("" if tree is None else f" {tree.tree}"))
        return Candidate(precision, int4_seconds if precision == "int4" else 0.1, f"tree of {precision}")
    return rate


@pytest.mark.parametrize("int4_seconds, int4_kept", [(0.05, True), (0.2, False)])
def test_the_target_runs_in_the_precision_whose_tuned_tree_is_faster_and_the_choice_is_cached(q4_file, int4_seconds,
                                                                                             int4_kept):
    """Both renderings of the file are rated and the faster kept (int4 on the file's own blocks, or the floating
    ``auto`` choice, float32 or bfloat16 for a model this small); a second load reads the decision and rates
    nothing."""
    calls: list[str] = []
    target, tok, drafts = load_pair_tuned(q4_file, q4_file, rate=rates(int4_seconds, calls))
    floating = calls[0]
    assert floating in FLOATS and calls == [floating, "int4"]
    kept = "int4" if int4_kept else floating
    record = target.treespec_precision["tuned_choice"]
    assert precision_of(target) == record["precision"] == kept and not record["cached"]
    assert record["candidates"]["int4"]["seconds_per_token"] == int4_seconds
    if int4_kept:
        assert target.treespec_precision["file_blocks"] == {"exact": 14, "int8": 1}
    again, _, _ = load_pair_tuned(q4_file, q4_file, rate=rates(int4_seconds, calls))
    assert len(calls) == 2 and precision_of(again) == kept and again.treespec_precision["tuned_choice"]["cached"]
    other, _, _ = load_pair_tuned(q4_file, q4_file, temperature=1.0, rate=rates(int4_seconds, calls))
    assert len(calls) == 4 and precision_of(other) == kept  # another temperature: decided apart
    chat, _, _ = load_pair_tuned(q4_file, q4_file, chat=True, rate=rates(int4_seconds, calls))
    assert calls[4:] == [f"{floating} chat", "int4 chat"] and precision_of(chat) == kept  # chat prompts: apart, too


def test_a_chain_or_kary_tree_is_rated_by_its_own_tuned_tree_and_decided_apart(q4_file, monkeypatch):
    """A chain or k-ary tree without a budget is tuned as the Sequoia tree is: each rendering is rated for that
    builder's tree (``tree`` reaches the rating), and the decision is cached apart from the Sequoia tree's and from
    another builder's; the CLI routes ``--tree chain`` and ``--tree kary`` there with the recipe."""
    from treespec.recipes import Recipe

    calls: list[str] = []
    load_pair_tuned(q4_file, q4_file, rate=rates(0.05, calls))
    load_pair_tuned(q4_file, q4_file, tree=Recipe(tree="chain"), rate=rates(0.05, calls))
    load_pair_tuned(q4_file, q4_file, tree=Recipe(tree="chain"), rate=rates(0.05, calls))  # cached
    load_pair_tuned(q4_file, q4_file, tree=Recipe(tree="kary", kary_width=3), rate=rates(0.05, calls))
    load_pair_tuned(q4_file, q4_file, tree=Recipe(depth=3), rate=rates(0.05, calls))  # Sequoia under a depth limit
    load_pair_tuned(q4_file, q4_file, tree=Recipe(), rate=rates(0.05, calls))  # the default Sequoia tree: cached
    floating = calls[0]
    assert calls == [floating, "int4", f"{floating} chain", "int4 chain", f"{floating} kary", "int4 kary",
                     f"{floating} sequoia", "int4 sequoia"]
    routed: list[tuple[str, int]] = []

    def tuned(target, draft, *, tree=None, **kwargs):
        routed.append((tree.tree, tree.kary_width))
        raise SystemExit(0)

    monkeypatch.setattr(target_precision, "load_pair_tuned", tuned)
    for argv in (["--tree", "chain"], ["--tree", "kary"]):
        with pytest.raises(SystemExit):
            cli.main(["generate", "--target", q4_file, "--draft", q4_file, *argv, "--prompt", "ab c"])
    assert routed == [("chain", 2), ("kary", 2)]


def test_a_gguf_without_4bit_blocks_keeps_its_floating_precision(tmp_path, monkeypatch):
    """A file whose Linear weights hold no 4-bit type: its int4 load keeps no block of the file, so only the floating
    precision is rated (an int4 re-quantisation would be another model than the file's)."""
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    path = str(write_gguf(tiny_qwen2(seed=4), tmp_path / "f.gguf"))  # F32 tensors only
    calls: list[str] = []
    target, _, _ = load_pair_tuned(path, path, rate=rates(0.01, calls))
    assert len(calls) == 1 and calls[0] in FLOATS and precision_of(target) == calls[0]


def test_the_choice_applies_to_auto_gguf_targets_on_a_cpu_with_one_draft_or_none(q4_file):
    assert applies(q4_file, [q4_file], "cpu", None) and applies(q4_file, [q4_file], "cpu", "auto")
    assert not applies(q4_file, [q4_file], "cpu", "bfloat16")  # a precision asked for is kept
    assert not applies(q4_file, [q4_file], "cuda", None)
    assert applies(q4_file, [], "cpu", None)  # the n-gram drafter alone
    assert not applies(q4_file, [q4_file, q4_file], "cpu", None)
    assert not applies("some/safetensors-dir", [q4_file], "cpu", None)  # no file blocks: int4 would re-quantise


def test_the_tuners_prediction_rates_each_precision_and_the_cli_runs_the_choice(q4_file, capsys):
    """The real rating (the default recipe resolved: profile and pilot of each precision, on this tiny pair) gives a
    positive prediction per precision, ``treespec generate`` without ``--dtype`` runs the precision kept, and its
    record says so."""
    assert cli.main(["generate", "--target", q4_file, "--draft", q4_file, "--prompt", "ab c", "--max-new-tokens", "6",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    target, _, _ = load_pair_tuned(q4_file, q4_file)  # the cached decision
    record = target.treespec_precision["tuned_choice"]
    assert record["cached"] and len(record["candidates"]) == 2 and "int4" in record["candidates"]
    assert all(c["seconds_per_token"] > 0 for c in record["candidates"].values())
    assert out["recipe"]["target_dtype"] == record["precision"] == precision_of(target)
    assert out["configuration"].startswith(f"target {record['precision']}")
    assert "tree predicted fastest" in target_precision.describe(record)


@pytest.mark.parametrize("int4_seconds, int4_kept", [(0.05, True), (0.2, False)])
def test_a_set_tree_size_keeps_the_rendering_that_forwards_it_faster(q4_file, int4_seconds, int4_kept):
    """A run whose tree size is set (``--budget``; 1: plain decoding) has no tree to tune: each rendering's forward
    over that many tokens is timed, the faster kept (the draft's part of a step is the same either way), and the
    decision cached per size: a second load times nothing, another size is decided apart."""
    timed: list[tuple[str, int]] = []

    def timer(model, tokens):
        timed.append((precision_of(model), tokens))
        return int4_seconds if precision_of(model) == "int4" else 0.1

    target, _, drafts = target_precision.load_pair_sized(q4_file, q4_file, tree_size=1, timer=timer)
    floating = timed[0][0]
    assert floating in FLOATS and timed == [(floating, 1), ("int4", 1)] and len(drafts) == 1
    record = target.treespec_precision["tuned_choice"]
    assert precision_of(target) == record["precision"] == ("int4" if int4_kept else floating)
    said = target_precision.describe(record)
    assert said.startswith(f"{record['precision']}, the faster one forward over 1 tokens here (measured now; ")
    assert f"int4 {int4_seconds * 1e3:.0f} ms" in said
    again, _, _ = target_precision.load_pair_sized(q4_file, q4_file, tree_size=1, timer=timer)
    assert len(timed) == 2 and precision_of(again) == precision_of(target)
    target_precision.load_pair_sized(q4_file, q4_file, tree_size=8, timer=timer)
    assert timed[2:] == [(floating, 8), ("int4", 8)]


def test_the_cli_sizes_the_target_for_its_budget_or_static_tree(q4_file, monkeypatch, capsys):
    """``--budget N`` and ``--paths`` give the run's tree size to the sized choice (not the tuned one, which has no
    tree to tune there); the run goes on with the rendering kept and says it in its configuration."""
    sizes: list[int] = []
    real = target_precision.load_pair_sized

    def refuse(*args, **kwargs):
        raise AssertionError("the tuned choice ran for a run with its own budget")

    monkeypatch.setattr(target_precision, "load_pair_tuned", refuse)
    monkeypatch.setattr(target_precision, "load_pair_sized", lambda *a, **k: sizes.append(k["tree_size"]) or real(
        *a, **{**k, "timer": lambda model, n: 0.01 if precision_of(model) == "int4" else 0.1}))
    for extra in (["--budget", "1"], ["--tree", "paths", "--paths", "[[0], [1], [0, 0]]"]):
        assert cli.main(["generate", "--target", q4_file, "--draft", q4_file, *extra, "--prompt", "ab c",
                         "--max-new-tokens", "4", "--json"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["configuration"].startswith("target int4")
    assert sizes == [1, 4]
    # the n-gram drafter alone verifies its own largest tree under its budget: a 4-deep chain (5 tokens) of 16; 3 of 3
    for extra in (["--budget", "16"], ["--budget", "3"]):
        assert cli.main(["generate", "--target", q4_file, "--ngram", *extra, "--prompt", "ab c ab c",
                         "--max-new-tokens", "4", "--json"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["configuration"].startswith("target int4")
    assert sizes == [1, 4, 5, 3]


@pytest.mark.parametrize("int4_seconds, int4_kept", [(0.05, True), (0.2, False)])
def test_a_tree_a_pilot_sizes_keeps_the_rendering_whose_pilot_choice_is_faster(q4_file, int4_seconds, int4_kept):
    """A recipe without a budget that the tuner does not size (the n-gram drafter, alone or beside a chain): each
    rendering's pilot choice is rated (its predicted seconds per token, plain decoding included), the faster kept and
    the decision cached per recipe: a second load rates nothing, another recipe is decided apart."""
    from treespec.recipes import NGramSettings, Recipe

    rated: list[tuple[str, str]] = []

    def rate(model, drafts, tok, recipe):
        rated.append((precision_of(model), recipe.tree))
        assert drafts == []  # the n-gram drafter alone: no draft model loaded
        return Candidate(precision_of(model), int4_seconds if precision_of(model) == "int4" else 0.1, "plain decoding")

    ngram = Recipe(tree="sequoia", ngram=NGramSettings())
    target, _, _ = target_precision.load_pair_piloted(q4_file, None, ngram, rate=rate)
    floating = rated[0][0]
    assert floating in FLOATS and [p for p, _ in rated] == [floating, "int4"]
    record = target.treespec_precision["tuned_choice"]
    assert precision_of(target) == record["precision"] == ("int4" if int4_kept else floating)
    assert target_precision.describe(record).startswith(f"{record['precision']}, its pilot's choice predicted fastest")
    target_precision.load_pair_piloted(q4_file, None, ngram, rate=rate)
    assert len(rated) == 2  # cached
    target_precision.load_pair_piloted(q4_file, None, Recipe(tree="chain", ngram=NGramSettings()), rate=rate)
    assert rated[2:] == [(floating, "chain"), ("int4", "chain")]


def test_the_cli_pilots_each_rendering_where_a_pilot_sizes_the_tree(q4_file, monkeypatch, capsys):
    """``--ngram`` without a draft or a budget, and independent chains without a budget, go to the piloted choice (not
    the tuned one, nor the sized one); the real rating (each rendering's pilot, on this tiny model) gives a positive
    figure per rendering and the run says which it kept."""
    def refuse(*args, **kwargs):
        raise AssertionError("the tuned or the sized choice ran for a tree a pilot sizes")

    monkeypatch.setattr(target_precision, "load_pair_tuned", refuse)
    monkeypatch.setattr(target_precision, "load_pair_sized", refuse)
    for argv in (["--ngram"], ["--draft", q4_file, "--tree", "chains"]):
        assert cli.main(["generate", "--target", q4_file, *argv, "--prompt", "ab c ab c", "--max-new-tokens", "4",
                         "--json"]) == 0
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert out["configuration"].startswith("target ")
    decisions = json.loads((target_precision.cache_root() / "precision.json").read_text())
    piloted = [r for k, r in decisions.items() if k.startswith("piloted-target")]
    assert len(piloted) == 2 and all(len(r["candidates"]) == 2 for r in piloted)
    assert all(c["seconds_per_token"] > 0 for r in piloted for c in r["candidates"].values())


@pytest.mark.parametrize("record", [{"precision": "int4", "candidates": {"int4": {"tree": "x"}}},
                                    {"precision": "int4", "candidates": {"int4": 0.05}},
                                    {"precision": "int3", "candidates": {"int3": {"seconds_per_token": 0.1,
                                                                                  "tree": "x"}}},
                                    {"precision": "int4", "candidates": {}}],
                         ids=["no-seconds", "number", "unknown-precision", "not-a-candidate"])
def test_a_damaged_cached_decision_is_made_again(tmp_path, monkeypatch, record):
    """A precision decision in the cache that does not read as one (a hand edit) counts as none: decided again,
    not loaded and then a traceback where it is described."""
    from treespec.common.files import write_json
    from treespec.models.loading import PRECISION_DECISIONS

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path))
    key = target_precision._key("t", "d", None, 0.0, False)
    write_json(tmp_path / PRECISION_DECISIONS, {key: {**record, "key": key}})
    assert target_precision.cached_choice("t", "d") is None
    good = {"precision": "int4", "key": key, "candidates": {"int4": {"seconds_per_token": 0.05, "tree": "x"}}}
    write_json(tmp_path / PRECISION_DECISIONS, {key: good})
    assert target_precision.cached_choice("t", "d") == good


def test_a_decision_is_made_again_when_the_shipped_walks_change(q4_file, monkeypatch):
    """The tuned decision rests on predictions replayed over the shipped walks: walks made again (another digest of
    their contents) make it again; the same walks read it back."""
    from treespec.calibrate import vectors

    calls: list[str] = []
    load_pair_tuned(q4_file, q4_file, rate=rates(0.05, calls))
    load_pair_tuned(q4_file, q4_file, rate=rates(0.05, calls))
    assert len(calls) == 2
    assert len(vectors.shipped_digest()) == 12 and vectors.shipped_digest() == vectors.shipped_digest.__wrapped__()
    monkeypatch.setattr(target_precision, "shipped_digest", lambda: "0" * 12)
    again, _, _ = load_pair_tuned(q4_file, q4_file, rate=rates(0.05, calls))
    assert len(calls) == 4 and not again.treespec_precision["tuned_choice"]["cached"]
