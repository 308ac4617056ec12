"""The acceptance shipped for the built-in pair is a walked measurement with per-depth rows and ranks, and
``default_acceptance`` gives the rows (what the tuner's Sequoia DP sizes trees with) or, asked, the vector."""

import json
import runpy
from pathlib import Path

import numpy as np
import pytest

from tree_builders import TreeShape, acceptance_rows
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.calibrate.vectors import default_acceptance
from treespec.cli_commands import recipe_from_args
from treespec.cli_parser import build_parser

CALIBRATE = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "calibrate_default.py"))


@pytest.mark.parametrize("temperature,mode", [(0.0, "topk"), (1.0, "sample_without_replacement")])
def test_the_shipped_files_are_walked_with_rows_and_ranks(temperature, mode):
    rows = np.asarray(default_acceptance(None, temperature))
    vector = np.asarray(default_acceptance(None, temperature, per_depth=False))
    assert rows.shape == (8, 8) and vector.shape == (8,)
    np.testing.assert_allclose(rows[0], vector)  # row 0 is the vector (every position a step root)
    assert not np.allclose(rows[-1], vector)  # the control: deeper rows differ (acceptance given the depth)
    acceptance_rows(rows)
    from importlib import resources
    saved = MeasuredAcceptance.from_dict(json.loads(resources.files("treespec").joinpath(
        f"data/acceptance-qwen2.5-coder-t{int(temperature)}.json").read_text()))
    assert saved.meta["context"].endswith("(walk)") and saved.meta["mode"] == mode
    # 40 prompts drawn at random from HumanEval 0-99 (experiments/calibrate_default.py): none is an evaluation prompt
    ids = CALIBRATE["calibration_prompts"](40, 0)
    assert saved.meta["prompts_label"].startswith(f"humaneval{ids} (random, seed 0") and len(saved.ranks) == 40
    assert max(ids) < 100 and len(set(ids)) == 40
    chain = TreeShape.from_paths([(0,) * d for d in range(1, 8)])
    assert 1.0 < saved.replayed_tau(chain) <= 8.0
    # each file keeps each proposal's draft probability: the confidence stop is replayed too
    assert len(saved.confidence) == 40 and len(saved.confidence[0][0]) == 8
    assert 1.0 < saved.replayed_tau(chain, 0.3) < saved.replayed_tau(chain)  # the stop cuts some paths


@pytest.mark.parametrize("name", ["t0", "t1", "t0-int4", "t1-int4", "chat-t0", "chat-t1", "chat-t0-int4",
                                  "chat-t1-int4"])
def test_each_shipped_walk_ends_its_continuations_where_a_run_stops(name):
    """Each continuation of a shipped walk ends at the target's end of text, where `generate` stops (the walks
    shipped before 2026-11-29 went on through 96 tokens past `<|im_end|>` and `<|endoftext|>`, into text no run
    reaches: 365 of the 3,840 positions of code's T=0 int4 walk, 1,249 of chat's); the rest run the 96 tokens."""
    from importlib import resources
    walk = MeasuredAcceptance.from_dict(json.loads(resources.files("treespec").joinpath(
        f"data/acceptance-qwen2.5-coder-{name}.json").read_text()))
    lengths = [len(r) for r in walk.ranks]
    assert len(lengths) == 40 and max(lengths) == 96 and min(lengths) < 96
    assert walk.positions == sum(lengths)


def test_a_file_without_rows_gives_its_vector(tmp_path):
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"vector": [0.5, 0.2]}))
    assert default_acceptance(path, 0.0) == [0.5, 0.2]
    path.write_text(json.dumps({"vector": [0.5, 0.2], "matrix": [[0.5, 0.2], [0.7, 0.1]]}))
    assert default_acceptance(path, 0.0) == [[0.5, 0.2], [0.7, 0.1]]
    assert default_acceptance(path, 0.0, per_depth=False) == [0.5, 0.2]
    path.write_text(json.dumps({"vector": [0.5, 0.2], "matrix": [[0.5, 0.2], [0.9, 0.3]]}))
    with pytest.raises(ValueError, match="sum"):  # every row is checked
        default_acceptance(path, 0.0)


def test_the_cli_sizes_trees_from_the_rows_unless_asked_for_the_vector():
    parser = build_parser()
    rows = recipe_from_args(parser.parse_args(["generate", "--prompt", "x"])).acceptance
    vector = recipe_from_args(parser.parse_args(["generate", "--prompt", "x", "--positional-acceptance"])).acceptance
    assert len(rows) == 8 and all(len(r) == 8 for r in rows)
    assert np.allclose(vector, default_acceptance(None, 0.0, per_depth=False))


def test_a_draft_precision_with_a_walk_of_its_own_is_predicted_with_it():
    """The draft's precision changes what it proposes: a run drafting in int4 is sized and predicted with the int4
    draft's walk where one is shipped (T=0; T=1, which serves every sampled temperature); the int8 draft, no
    precision, or a precision without such a walk fall back to the int8 draft's files."""
    from treespec.calibrate.vectors import calibration_walk, shipped_file

    assert shipped_file(0.0) == shipped_file(0.0, "int8") == "data/acceptance-qwen2.5-coder-t0.json"
    assert shipped_file(1.0, "int4") == shipped_file(0.7, "int4") == "data/acceptance-qwen2.5-coder-t1-int4.json"
    sampled = calibration_walk(None, 1.0, "int4")
    assert sampled.meta["draft_precision"] == "int4" and sampled.meta["mode"] == "sample_without_replacement"
    assert shipped_file(0.0, "bfloat16") == "data/acceptance-qwen2.5-coder-t0.json"
    own = shipped_file(0.0, "int4")
    assert own == "data/acceptance-qwen2.5-coder-t0-int4.json"
    walk = calibration_walk(None, 0.0, "int4")
    assert walk.meta["draft_precision"] == "int4" and walk.meta["context"].endswith("(walk)") and len(walk.ranks) == 40
    rows = np.asarray(default_acceptance(None, 0.0, draft_precision="int4"))
    assert np.allclose(rows, walk.matrix) and not np.allclose(rows, default_acceptance(None, 0.0))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("precision", ["int4", "int8"])
def test_chat_runs_are_sized_from_a_walk_over_chat_turns(temperature, precision):
    """Prompts in the chat template (``--chat``) are sized and predicted with the walk shipped for them: 40 ShareGPT
    first turns from 1000-1099 (no benchmark's turn) in the chat template, in the draft's precision as for code. Chat
    accepts less than code, the reason it ships: code's rows sized chat runs that then lost to the target alone."""
    from treespec.calibrate.vectors import calibration_walk, shipped_file

    suffix = "" if precision == "int8" else "-int4"
    assert shipped_file(temperature, precision, chat=True) == (
        f"data/acceptance-qwen2.5-coder-chat-t{int(temperature)}{suffix}.json")
    walk = calibration_walk(None, temperature, precision, chat=True)
    code = calibration_walk(None, temperature, precision)
    ids = CALIBRATE["calibration_prompts"](40, 0, 1000)
    assert walk.meta["prompts_label"] == f"sharegpt{ids} (random, seed 0, from 1000-1099) in the chat template"
    assert walk.meta["draft_precision"] == precision and walk.meta["mode"] == code.meta["mode"]
    assert walk.meta["context"].endswith("(walk)") and len(walk.ranks) == 40 and len(walk.confidence) == 40
    assert walk.vector[0] < code.vector[0] - 0.05  # the draft's first choice: accepted less often in chat
    rows = np.asarray(default_acceptance(None, temperature, draft_precision=precision, chat=True))
    assert np.allclose(rows, walk.matrix)
    assert shipped_file(temperature, "bfloat16", chat=True) == shipped_file(temperature, chat=True)  # int8's
    args = ["generate", "--prompt", "x", "--temperature", str(temperature)]
    chat = recipe_from_args(build_parser().parse_args([*args, "--chat"])).acceptance
    assert np.allclose(chat, default_acceptance(None, temperature, chat=True))  # the CLI's --chat sizes with them
    assert not np.allclose(chat, recipe_from_args(build_parser().parse_args(args)).acceptance)  # code's otherwise


def test_a_stopped_calibration_resumes_from_its_kept_parts(tmp_path, monkeypatch):
    """``calibrate_default.py`` keeps each prompt's part as it is measured: a run stopped at T=1 and run again
    measures T=1's missing prompts only and writes T=0 from its parts; the parts go once both files are written; a
    parts file of other settings is refused. (Models and the walk stubbed: the resume is what is tested.)"""
    from treespec.models.tiny import tiny_model

    script = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "calibrate_default.py"))
    main, glob = script["main"], script["main"].__globals__
    model = tiny_model()
    monkeypatch.setitem(glob, "DATA", tmp_path)
    monkeypatch.setitem(glob, "load", lambda *a, **k: (model, None))
    monkeypatch.setitem(glob, "to_precision", lambda m, p: m)
    monkeypatch.setitem(glob, "encode_prompts", lambda tok, texts: [[1, 2, 3] for _ in texts])
    monkeypatch.setitem(glob, "dataset_prompts", lambda name: [f"prompt {i}" for i in range(100)])
    measured, stop_after = [], [None]

    def measure_each(target, draft, prompts, *, temperature, done, on_prompt, **kwargs):
        for j in range(len(prompts)):
            if j in done:
                continue
            if stop_after[0] is not None and len(measured) == stop_after[0]:
                raise KeyboardInterrupt
            measured.append((temperature, j))
            on_prompt(j, MeasuredAcceptance.from_counts(np.ones((2, 2), dtype=np.int64), np.full(2, 4), 0.5,
                                                        {"prompts": 1}, [[0, 1]], [[[0.6, 0.3], [0.5, 0.4]]]))

    monkeypatch.setitem(glob, "measure_each", measure_each)
    argv = ["--prompts", "3", "--temperatures", "0", "1", "--max-new-tokens", "4"]
    stop_after[0] = 4  # T=0's three prompts, then one of T=1's
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    assert (tmp_path / "acceptance-qwen2.5-coder-t0.json").exists()
    stop_after[0] = None
    main(argv)
    assert measured == [(0.0, 0), (0.0, 1), (0.0, 2), (1.0, 0), (1.0, 1), (1.0, 2)]  # each prompt once
    assert not list(tmp_path.glob("*.parts.jsonl"))
    assert MeasuredAcceptance.from_dict(json.loads((tmp_path / "acceptance-qwen2.5-coder-t1.json").read_text())
                                        ).meta["prompts"] == 3
    measured.clear()
    stop_after[0] = 1  # a stop that leaves T=0's first part, then a run of another --max-new-tokens
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    with pytest.raises(SystemExit, match="other settings"):
        main([*argv[:-1], "8"])
