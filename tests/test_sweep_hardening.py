"""Sweeps safe to share: the output directory's lock and config fingerprint, strict config types,
output names that stay inside the chosen directory, corrupt and unterminated record lines, and
outputs checked writable before the expensive work."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

import treespec.bench.sweep as E
import treespec.cli as cli
import treespec.cli_commands as cli_commands
from treespec.common.files import check_writable
from treespec.bench.sweep.lock import FINGERPRINT, LOCK, OutputDirError, claim, exclusive
from treespec.bench.sweep.records import CorruptRecordError, read_records, repair_tail

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "configs" / "tiny.toml"


def small(**grid) -> dict:
    """The tiny config cut to seconds: one prompt, 4 tokens, the target baseline and one chain point."""
    cfg = E.load_config(TINY)
    cfg["grid"].update({"builders": ["chain"], "budgets": [3], **grid})
    cfg["data"].update(eval="100:101", max_new_tokens=4)
    cfg["baselines"]["methods"] = ["target"]
    return cfg


# -- 1. one writer per output directory -----------------------------------------------------------

def test_second_sweep_into_the_same_directory_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    errors: list[Exception] = []

    def start_another(record: dict) -> None:
        if errors:
            return
        try:
            E.sweep(small(), tmp_path, progress=False, make_report=False)
        except OutputDirError as error:
            errors.append(error)

    results = E.sweep(small(), tmp_path, progress=False, on_point=start_another, make_report=False)
    assert len(errors) == 1
    message = str(errors[0])
    assert "is in use by another sweep" in message and f"pid {os.getpid()} on host" in message
    assert "started 20" in message and "another --out" in message
    assert [r["status"] for r in read_records(results)] == ["ok", "ok"]  # nothing interleaved
    E.sweep(small(), tmp_path, progress=False, make_report=False)  # released on exit: a resume runs


def _hold(path: Path, held) -> None:
    """The other sweep: holds ``path`` until killed."""
    with exclusive(path):
        held.set()
        time.sleep(120)


def test_locked_directory_refused_by_the_cli_and_released_when_the_holder_dies(tmp_path: Path, capsys) -> None:
    """A sweep run while another process holds the directory gets `treespec: error:` naming the holder; a killed
    holder frees the directory. The holder is this process forked (a new interpreter would import treespec for
    seconds first)."""
    fork = multiprocessing.get_context("fork")
    held = fork.Event()
    holder = fork.Process(target=_hold, args=(tmp_path, held), daemon=True)
    holder.start()
    try:
        assert held.wait(60)
        with pytest.raises(OutputDirError, match=f"in use by another sweep \\(pid {holder.pid} on host"):
            with exclusive(tmp_path):
                pass
        assert cli.main(["sweep", "--config", str(TINY), "--out", str(tmp_path), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert f"treespec: error: {tmp_path} is in use by another sweep (pid {holder.pid} on host" in err
    finally:
        holder.kill()
        holder.join()
    with exclusive(tmp_path):  # the kernel dropped the dead holder's lock
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()


# -- 2. one config per output directory -----------------------------------------------------------

def test_changed_config_is_refused_unless_new(tmp_path: Path, capsys) -> None:
    first = E.sweep(small(), tmp_path, progress=False, make_report=False)
    stored = json.loads((tmp_path / FINGERPRINT).read_text())
    assert stored["config"]["grid"]["budgets"] == [3] and "name" not in stored["config"]
    seen: list[dict] = []
    E.sweep(small(), tmp_path, progress=False, make_report=False, on_point=seen.append)  # same config resumes
    assert seen == []
    renamed = small()
    renamed["name"] = "another-name"  # the name does not change results
    E.sweep(renamed, tmp_path, progress=False, make_report=False)
    changed = small(budgets=[3, 4])
    changed["shapes"]["kary_width"] = 3  # a setting that changes what points measure; the grid change alone is fine
    with pytest.raises(OutputDirError,
                       match=r"different config \(shapes.kary_width: 2 -> 3\)\. "
                             r"Re-run with --new.*axes alone.*resumes"):
        E.sweep(changed, tmp_path, progress=False, make_report=False)
    assert len(read_records(first)) == 2  # untouched
    assert E.main(["--config", str(TINY), "--out", str(tmp_path), "--dry-run"]) == 0
    assert "holds the results of a different config" in capsys.readouterr().err
    E.sweep(changed, tmp_path, progress=False, make_report=False, new=True)
    assert len(read_records(first)) == 3  # started over: both budgets and the baseline
    moved = list(tmp_path.glob("replaced-*"))
    assert len(moved) == 1 and len(read_records(moved[0] / "results.jsonl")) == 2
    assert json.loads((moved[0] / FINGERPRINT).read_text())["config"]["grid"]["budgets"] == [3]


def test_the_grid_may_grow_or_lose_unfinished_points_but_keeps_finished_ones(tmp_path: Path, capsys) -> None:
    results = E.sweep(small(), tmp_path, progress=False, make_report=False)  # the baseline and chain B=3
    seen: list[dict] = []
    grown = small(budgets=[3, 4])
    E.sweep(grown, tmp_path, progress=False, make_report=False, on_point=seen.append)
    assert [r["params"]["budget"] for r in seen] == [4]  # only the new point ran
    assert "every finished point is still in it, resuming" in capsys.readouterr().err
    assert json.loads((tmp_path / FINGERPRINT).read_text())["config"]["grid"]["budgets"] == [3, 4]
    with pytest.raises(OutputDirError, match=r"grid.budgets: \[3, 4\] -> \[4\].*drops 1 finished point\(s\) "
                                             r"\(humaneval T=0.0 chain B=3\).*--new"):
        E.sweep(small(budgets=[4]), tmp_path, progress=False, make_report=False)
    assert len(read_records(results)) == 3  # untouched
    grown["grid"]["temperatures"] = [0.0, 1.0]  # points not run yet may come and go
    claim(tmp_path, grown)
    claim(tmp_path, small(budgets=[3, 4]))
    assert len(read_records(results)) == 3 and not list(tmp_path.glob("replaced-*"))


def test_hf_assisted_runs_in_each_setting_by_default_and_its_settings_are_an_axis(tmp_path: Path) -> None:
    """``baselines.assisted`` left out is "fastest": HF assisted generation in each of ``ASSISTED_SETTINGS``, one
    point each; a sweep whose assisted baseline ran in one setting resumes under "fastest" (that setting's point is
    one of its points), and a setting list that drops a finished setting is refused, naming it."""
    from treespec.bench.baselines import ASSISTED_SETTINGS
    from treespec.bench.sweep.lock import refusal

    default = E.load_config({"data": {"datasets": ["humaneval"]}})
    assert default["baselines"]["assisted"] == "fastest"
    assisted = [pt.params["assisted"] for pt in E.enumerate_points(default) if pt.params.get("method") == "assisted"]
    assert assisted == [dict(sorted(s.items())) for s in ASSISTED_SETTINGS.values()]
    one = small()
    one["baselines"].update(methods=["assisted"], assisted={"num_assistant_tokens": 2})
    E.sweep(one, tmp_path, progress=False, make_report=False)
    fastest = small()
    fastest["baselines"].update(methods=["assisted"], assisted=[{"num_assistant_tokens": 2}, {}])
    assert refusal(tmp_path, E.load_config(fastest)) is None
    fastest["baselines"]["assisted"] = "fastest"
    assert refusal(tmp_path, E.load_config(fastest)) is not None  # its setting {num_assistant_tokens: 2} is not in it
    fastest["baselines"]["assisted"] = [{}]
    assert "drops 1 finished point(s) (humaneval T=0.0 assisted (num_assistant_tokens=2))" in refusal(
        tmp_path, E.load_config(fastest))  # named with its setting


def test_prompt_lookup_runs_at_several_lengths_by_default_and_they_are_an_axis(tmp_path: Path) -> None:
    """``baselines.prompt_lookup_num_tokens`` left out is 2, 4 and 10 tokens a step, one point each (comparisons take
    the fastest, as for HF assisted); a single number is a list of one; a sweep whose lookup ran at 4 resumes with
    lengths added and refuses a list without 4."""
    from treespec.bench.sweep.lock import refusal

    default = E.load_config({"data": {"datasets": ["humaneval"]}})
    lookups = [pt for pt in E.enumerate_points(default) if pt.params.get("method") == "prompt_lookup"]
    assert [pt.params["prompt_lookup_num_tokens"] for pt in lookups] == [2, 4, 10]
    assert lookups[1].label == "humaneval T=0.0 prompt_lookup (4 tokens)"
    one = small()
    one["baselines"].update(methods=["prompt_lookup"], prompt_lookup_num_tokens=4)
    E.sweep(E.load_config(one), tmp_path, progress=False, make_report=False)
    more = small()
    more["baselines"].update(methods=["prompt_lookup"], prompt_lookup_num_tokens=[4, 2])
    assert refusal(tmp_path, E.load_config(more)) is None
    more["baselines"]["prompt_lookup_num_tokens"] = [2]
    assert "drops 1 finished point(s) (humaneval T=0.0 prompt_lookup (4 tokens))" in refusal(
        tmp_path, E.load_config(more))


def test_a_whole_number_for_a_fraction_names_the_same_assisted_setting() -> None:
    """``assistant_confidence_threshold = 0`` and ``= 0.0`` are one setting of HF assisted generation: one point and
    one key (two would run it twice and split its records), named as the known setting."""
    from treespec.bench.sweep.config import assisted_settings
    from treespec.bench.sweep.points import baseline_label

    keys, labels = [], []
    for zero in (0, 0.0):
        cfg = small()
        cfg["baselines"].update(methods=["assisted"], assisted=[{
            "num_assistant_tokens": 2, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": zero}])
        cfg = E.load_config(cfg)
        assert assisted_settings(cfg)[0]["assistant_confidence_threshold"] == 0.0
        point = next(pt for pt in E.enumerate_points(cfg) if pt.params.get("method") == "assisted")
        keys.append(point.key)
        labels.append(baseline_label(point.params))
    assert keys[0] == keys[1] and labels == ["assisted (2 drafted tokens)"] * 2


def test_prompt_ranges_are_axes_whose_changes_keep_the_points_they_do_not_touch(tmp_path: Path) -> None:
    """A prompt set added with ranges of its own, or a set's ranges restated at their defaults, was refused as
    "the results of a different config" (data.splits compared as settings), though every point's key holds its
    ranges; such changes now resume, and a range that moves finished points is refused, naming them."""
    import importlib.metadata

    from treespec.bench.sweep.lock import refusal

    E.sweep(small(), tmp_path, progress=False, make_report=False)
    restated = small()
    restated["data"]["splits"] = {"humaneval": {"calib": "0:4"}}
    assert refusal(tmp_path, E.load_config(restated)) is None
    moved = small()
    moved["data"]["splits"] = {"humaneval": {"eval": "101:102"}}
    assert "drops 2 finished point(s)" in refusal(tmp_path, E.load_config(moved))
    if any(d.metadata["Name"] == "gensim" for d in importlib.metadata.distributions()):  # lee-news's package
        added = small()
        added["data"]["datasets"] = ["humaneval", "lee-news"]
        added["data"]["splits"] = {"lee-news": {"calib": "0:4", "eval": "10:11"}}
        assert refusal(tmp_path, E.load_config(added)) is None


def test_directory_from_before_fingerprints_is_adopted(tmp_path: Path, capsys) -> None:
    E.sweep(small(), tmp_path, progress=False, make_report=False)
    (tmp_path / FINGERPRINT).unlink()
    seen: list[dict] = []
    E.sweep(small(), tmp_path, progress=False, make_report=False, on_point=seen.append)
    assert seen == [] and "adopting it" in capsys.readouterr().err and (tmp_path / FINGERPRINT).exists()


def test_cli_help_says_what_new_does(capsys) -> None:
    with pytest.raises(SystemExit):
        E.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "moved (not deleted) into --out/replaced-<UTC time>/" in text and "--skip-corrupt" in text


# -- 3. strict config types -----------------------------------------------------------------------

@pytest.mark.parametrize("given,fragment", [
    ({"baselines": {"prompt_lookup_num_tokens": 0}}, "baselines.prompt_lookup_num_tokens must be an integer >= 1"),
    ({"grid": {"seeds": [1.5]}}, r"grid.seeds\[0\] must be an integer >= 0 .*got 1.5 \(float\)"),
    ({"data": {"max_new_tokens": 2.5}}, "data.max_new_tokens must be an integer >= 1"),
    ({"data": {"max_new_tokens": "8"}}, r"data.max_new_tokens must be an integer >= 1 .*got '8' \(str\)"),
    ({"data": {"max_prompt_tokens": -1}}, "data.max_prompt_tokens must be an integer >= 0"),
    ({"grid": {"budgets": []}}, "grid.budgets is an empty list"),
    ({"grid": {"budgets": [True]}}, r"got True \(bool\)"),
    ({"grid": {"budgets": [1]}}, r"grid.budgets\[0\] must be an integer >= 2"),
    ({"grid": {"budgets": [100000]}}, r"grid.budgets\[0\] must be at most 4096"),
    ({"grid": {"drafters": []}}, "grid.drafters is an empty list"),
    ({"grid": {"builders": []}}, "grid.builders is an empty list"),
    ({"grid": {"max_depths": []}}, "grid.max_depths is an empty list"),
    ({"grid": {"temperatures": []}}, "grid.temperatures is an empty list"),
    ({"grid": {"top_p": []}}, "grid.top_p is an empty list"),
    ({"grid": {"seeds": []}}, "grid.seeds is an empty list"),
    ({"grid": {"verifiers": []}}, "grid.verifiers is an empty list"),
    ({"data": {"datasets": []}}, "data.datasets is an empty list"),
    ({"grid": {"max_depths": [0]}}, 'an integer >= 1 or "none"'),
    ({"grid": {"max_depths": ["3"]}}, 'an integer >= 1 or "none"'),
    ({"grid": {"temperatures": ["0.5"]}}, r"grid.temperatures\[0\] must be a number >= 0"),
    ({"grid": {"temperatures": [float("nan")]}}, r"grid.temperatures\[0\] must be a number >= 0"),
    ({"grid": {"top_p": [0]}}, r"grid.top_p\[0\] must be a number in \(0, 1\]"),
    ({"grid": {"builders": ["bush"]}}, r'grid.builders\[0\] must be one of "sequoia"'),
    ({"grid": {"model_mode": "beam"}}, "grid.model_mode must be one of"),
    ({"grid": {"verifiers": ["x"]}}, r"grid.verifiers\[0\] must be one of"),
    ({"data": {"datasets": ["imagenet"]}}, r"data.datasets\[0\] must be one of"),
    ({"data": {"calib": "1.5:3"}}, 'data.calib must be a prompt range "START:STOP"'),
    ({"data": {"humaneval": {"eval": "a:b"}}}, 'data.humaneval.eval must be a prompt range'),
    ({"acceptance": {"width": 0}}, "acceptance.width must be an integer >= 1"),
    ({"acceptance": {"use": "both"}}, "acceptance.use must be one of"),
    ({"shapes": {"chains": 0}}, "shapes.chains must be an integer >= 1"),
    ({"shapes": {"paths": 3}}, "shapes.paths must be a list of child-rank paths"),
    ({"shapes": {"paths": [[0, 0], [0]]}}, r"shapes.paths: path \(0, 0\) comes before \(0,\)"),
    ({"grid": {"builders": ["paths"]}}, r'grid.builders has "paths": give its static tree as shapes.paths'),
    ({"shapes": {"paths": {"a b": [[0]]}}}, r"shapes.paths.a b must be a tree's name"),
    ({"shapes": {"paths": {"mine": []}}}, r"shapes.paths.mine must be a non-empty list"),
    ({"shapes": {"paths": {"mine": [[1]]}}}, r"shapes.paths.mine: path \(1,\) has rank 1"),
    ({"ngram": {"max_order": 1}}, "ngram.max_order must be an integer >= 2"),
    ({"ngram": {"mode": "lookup"}}, "ngram.mode must be one of"),
    ({"baselines": {"methods": ["beam"]}}, r"baselines.methods\[0\] must be one of"),
    ({"baselines": {"assisted": 3}}, 'baselines.assisted must be "fastest" .*, a table of GenerationConfig options'),
    ({"baselines": {"assisted": "best"}}, 'baselines.assisted must be "fastest"'),
    ({"baselines": {"assisted": []}}, 'baselines.assisted must be "fastest"'),
    ({"baselines": {"assisted": [{}, {"num_assistant_tokens": "2"}]}},
     r"baselines.assisted\[1\].num_assistant_tokens must be an integer"),
    ({"baselines": {"assisted": [{"num_assistant_tokens": 2}, {"num_assistant_tokens": 2}]}},
     "baselines.assisted names a setting twice"),
    ({"baselines": {"assisted": {"assistant_confidence_threshhold": 0.9}}},
     "baselines.assisted.assistant_confidence_threshhold is not a GenerationConfig option; did you mean "
     "assistant_confidence_threshold"),
    ({"baselines": {"assisted": {"num_assistant_tokens": "four"}}},
     "baselines.assisted.num_assistant_tokens must be an integer >= 0 .*got 'four'"),
    ({"baselines": {"assisted": {"num_assistant_tokens": True}}}, "num_assistant_tokens must be an integer"),
    ({"baselines": {"assisted": {"num_assistant_tokens_schedule": "fast"}}}, 'must be one of "heuristic"'),
    ({"baselines": {"assisted": {"assistant_confidence_threshold": "high"}}}, "must be a number"),
    ({"models": {"target": ""}}, "models.target must be a non-empty string"),
    ({"models": {"pairs": [{"target": "a"}]}}, r"models.pairs\[0\] must be a table with exactly the keys"),
    ({"run": {"device": "gpu0"}}, "run.device must be a torch device name"),
    ({"run": {"dtype": "fp32"}}, "run.dtype must be one of"),
    ({"run": {"draft_dtype": "int2"}}, "run.draft_dtype must be one of"),
    ({"run": {"threads": 1.0}}, "run.threads must be an integer >= 0"),
    ({"run": {"warmup_tokens": True}}, "run.warmup_tokens must be an integer >= 0"),
    ({"run": {"compile": 1}}, 'run.compile must be false, true, "auto"'),
    ({"run": {"compile": "banana"}}, 'run.compile must be .*"uncompiled" or a torch.compile backend name'),
])
def test_config_types_are_strict(given: dict, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        E.load_config(given)


def test_the_assisted_options_that_exist_pass_and_data_splits_is_no_file_key(tmp_path: Path) -> None:
    cfg = E.load_config({"data": {"datasets": ["humaneval"]},  # (lee-news ships in gensim, an optional package)
                         "baselines": {"assisted": {"num_assistant_tokens": 4, "assistant_confidence_threshold": 1,
                                                    "num_assistant_tokens_schedule": "constant"}}})
    assert E.load_config(cfg)["baselines"]["assisted"]["num_assistant_tokens"] == 4  # a loaded config loads again
    bad = tmp_path / "splits.toml"
    bad.write_text("[data]\nsplits = 3\n")
    with pytest.raises(ValueError, match=r"data.splits is not a config key: give a prompt set's own ranges as a "
                                         r"table \[data.<set>\]"):
        E.load_config(bad)


def test_every_default_key_has_a_type_check_and_the_defaults_pass() -> None:
    from treespec.bench.sweep.config import DEFAULTS, TYPES, _leaves

    assert set(_leaves(DEFAULTS)) == set(TYPES)
    cfg = E.load_config({"grid": {"budgets": 8, "temperatures": [0, 0.5], "max_depths": ["none", 3]},
                         "data": {"datasets": ["humaneval"]}})  # the default adds lee-news (gensim, below)
    assert cfg["grid"]["budgets"] == [8] and cfg["grid"]["max_depths"] == [None, 3]
    assert E.load_config(cfg) == cfg  # a loaded config loads again unchanged


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[grid\nbudgets = [4]\n")
    with pytest.raises(ValueError, match="broken.toml is not valid TOML"):
        E.load_config(path)
    latin = tmp_path / "latin.toml"
    latin.write_bytes('name = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(ValueError, match="latin.toml is not UTF-8 text, as TOML must be"):
        E.load_config(latin)


# -- 4. output names stay inside the chosen directory ---------------------------------------------

@pytest.mark.parametrize("name", ["", " ", "/tmp/evil", "../up", "a/b", "..", ".", ".hidden", "a\\b", "c:x"])
def test_names_that_would_leave_the_directory_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="config key name must be one plain directory name"):
        E.load_config({"name": name})


def test_name_from_the_toml_stem_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "my sweep-1.toml"
    path.write_text('[data]\ndatasets = ["humaneval"]\n')
    assert E.load_config(path)["name"] == "my sweep-1"


def test_default_prompt_sets_are_code_and_prose() -> None:
    """The defaults are citable: two prompt sets, >= 20 prompts x >= 96 tokens (config.CITABLE). The
    prose set ships in gensim (the models extra): without it the default config says what to install."""
    import importlib.util

    from treespec.bench.datasets import prompt_range
    from treespec.bench.sweep.config import CITABLE, DEFAULTS

    data = DEFAULTS["data"]
    assert data["datasets"] == ["humaneval", "lee-news"] and len(data["datasets"]) >= CITABLE["datasets"]
    assert data["max_new_tokens"] >= CITABLE["tokens"]
    a, b = prompt_range(data["eval"], 164)
    assert b - a >= CITABLE["prompts"]
    if importlib.util.find_spec("gensim") is None:
        with pytest.raises(ImportError, match="pip install gensim"):
            E.load_config({})
    else:
        assert E.load_config({})["data"]["datasets"] == ["humaneval", "lee-news"]


# -- 5. corrupt and unterminated record lines -----------------------------------------------------

def _write(path: Path, lines: list[str], end: str = "\n") -> None:
    path.write_text("\n".join(lines) + end, encoding="utf-8")


# records as a sweep writes them: key, params, status
A, B = '{"key": "a", "params": {}, "status": "ok"}', '{"key": "b", "params": {}, "status": "ok"}'


def test_valid_last_record_without_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    _write(path, [A, B], end="")
    assert [r["key"] for r in read_records(path)] == ["a", "b"]
    repair_tail(path)
    assert path.read_text() == A + "\n" + B + "\n"
    _write(path, [A, '{"key": "b", "sta'], end="")  # torn: dropped
    assert [r["key"] for r in read_records(path)] == ["a"]
    repair_tail(path)
    assert path.read_text() == A + "\n"


def test_a_json_object_that_is_no_sweep_record_is_corrupt(tmp_path: Path, capsys) -> None:
    """A line of valid JSON without a sweep record's key, status and params (another tool's file, a hand edit) ended
    in a KeyError traceback in the report, the dry run and a resume, or an empty report of "0 finished points"."""
    from treespec.cli import main

    path = tmp_path / "results.jsonl"
    _write(path, [A, '{"status": "ok"}', B])
    with pytest.raises(CorruptRecordError, match=r"line 2: a JSON object without key, params"):
        read_records(path)
    assert [r["key"] for r in read_records(path, skip_corrupt=True)] == ["a", "b"]
    _write(path, ['{"method": "hf", "seconds": 1.0}'])  # a compare run's records
    assert main(["sweep", "--report", str(path)]) == 2
    err = capsys.readouterr().err
    assert "line 1: a JSON object without key, status, params" in err and "Traceback" not in err


def test_corrupt_middle_line_is_named_and_skipped_only_on_request(tmp_path: Path, capsys) -> None:
    path = tmp_path / "results.jsonl"
    _write(path, [A, "{garbage", "[1, 2]", B])
    with pytest.raises(CorruptRecordError, match=r"results.jsonl, line 2: not a JSON record.*--skip-corrupt"):
        read_records(path)
    assert [r["key"] for r in read_records(path, skip_corrupt=True)] == ["a", "b"]
    err = capsys.readouterr().err
    assert "line 2: not a JSON record; skipped" in err and "line 3: not a JSON record; skipped" in err


def test_sweep_and_report_stop_at_a_corrupt_line_unless_skip_corrupt(tmp_path: Path, capsys, monkeypatch) -> None:
    from treespec.cli import main

    results = E.sweep(small(), tmp_path, progress=False, make_report=False)
    lines = results.read_text().splitlines()
    _write(results, [lines[0], "{not json", lines[1]])
    monkeypatch.delenv("TREESPEC_DEBUG", raising=False)
    assert main(["sweep", "--report", str(results)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("treespec: error: ") and "results.jsonl, line 2: not a JSON record" in err
    with pytest.raises(CorruptRecordError, match="results.jsonl, line 2: not a JSON record"):
        E.sweep(small(), tmp_path, progress=False, make_report=False)  # resume stops there too
    seen: list[dict] = []
    E.sweep(small(), tmp_path, progress=False, on_point=seen.append, skip_corrupt=True)  # resumes: nothing to do
    assert seen == [] and (tmp_path / "README.md").exists()
    assert main(["sweep", "--report", str(results), "--skip-corrupt"]) == 0
    assert "line 2: not a JSON record; skipped" in capsys.readouterr().err


# -- 6. outputs checked before the work -----------------------------------------------------------

def test_check_writable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="--out .*a-file/acc.json is not writable"):
        check_writable(blocker / "acc.json")
    with pytest.raises(ValueError, match="is a directory; give a file name"):
        check_writable(tmp_path)
    with pytest.raises(ValueError, match="--out .*a-file is not writable"):
        check_writable(blocker, directory=True)
    made = check_writable(tmp_path / "new" / "deeper" / "acc.json")
    assert not made.exists() and made.parent.is_dir()  # nothing left behind but the folder
    assert check_writable(blocker).read_text() == "x"  # an existing file is not truncated


@pytest.mark.parametrize("command", ["accept", "profile", "demo"])
def test_outputs_are_checked_before_models_load(command: str, tmp_path: Path, capsys, monkeypatch) -> None:
    """A bad --out fails at once: the model loader, which would take minutes, is never reached."""

    def never(*args, **kwargs):
        raise AssertionError("models loaded before --out was checked")

    monkeypatch.setattr(cli_commands, "load_models", never)
    monkeypatch.delenv("TREESPEC_DEBUG", raising=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert cli.main([command, "--out", str(blocker / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("treespec: error: --out ") and "is not writable" in err


def test_prompt_ranges_have_one_rule_in_the_cli_and_the_sweep() -> None:
    """``A:B`` ranges are refused past the dataset by the CLI's --calib and a sweep config alike
    (clipping would silently run fewer prompts than asked)."""
    from treespec.bench.datasets import prompt_range

    assert prompt_range("100:", 164) == (100, 164) and prompt_range(":20", 164) == (0, 20)
    assert prompt_range([3, 5], 164) == (3, 5)
    for bad, why in (("100:200", "STOP <= 164"), ("20:0", "START < STOP"), ("x", "START:STOP"), ("5", "START:STOP")):
        with pytest.raises(ValueError, match=why):
            prompt_range(bad, 164, "--calib")
    with pytest.raises(ValueError, match="data.eval of humaneval must have 0 <= START < STOP <= 164"):
        E.load_config({"data": {"datasets": ["humaneval"], "calib": "0:20", "eval": "150:200"}})


@pytest.mark.parametrize("batch", [1, 2])
def test_the_warmup_runs_the_longest_prompt_so_no_timed_call_compiles(batch):
    """The same warm-up for every method: the longest prompt (the caches a compiled step or HF's static cache
    makes for it hold every prompt), then each prompt (or batch) timed once, in order."""
    import torch
    from types import SimpleNamespace

    from treespec.bench.sweep.runner import Sweep

    calls = []
    stub = SimpleNamespace(cfg={"run": {"warmup_tokens": 4}}, warmup_seconds=None)
    prompts = [[1] * 5, [2] * 40, [3] * 12]
    outs, walls = Sweep._timed(stub, lambda ids, n, seed: calls.append((ids, n)) or len(calls), prompts, 8, 0,
                               torch.device("cpu"), batch=batch)
    warm = [2] * 40
    assert calls[0] == ([warm] * batch if batch > 1 else warm, 4)
    timed = [ids for ids, _ in calls[1:]]
    assert timed == (prompts if batch == 1 else [prompts[:2], prompts[2:]]) and len(walls) == len(timed)
    assert stub.warmup_seconds >= 0


# -- 7. models checked before the first point; failed points in the exit status ------------------

def _toml(tmp_path: Path, **replace: str) -> Path:
    """The tiny config as a file, cut to one prompt of 4 tokens, the target baseline and one chain point, with
    ``replace``'s substitutions (old text -> new text) made."""
    text = TINY.read_text().replace('builders = ["sequoia", "chain"]', 'builders = ["chain"]')
    text = text.replace("budgets = [4, 8]", "budgets = [3]").replace('eval = "100:102"', 'eval = "100:101"')
    text = text.replace("max_new_tokens = 12", "max_new_tokens = 4")
    text = text.replace('methods = ["target", "assisted", "prompt_lookup"]', 'methods = ["target"]')
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("draft, fragment", [
    ("nonexistent-model-xyz", "'nonexistent-model-xyz' is not a built-in name.*hf download"),
    ("tiny:lama:seed=0", "family must be one of"),
    ("tiny:llama:sead=0", "unknown tiny model option 'sead'"),
    ("tiny:llama:seed=x", "option 'seed' in 'tiny:llama:seed=x' must be a number, got 'x'"),
    ("./no/such/model", "is not a model directory"),
    ("/no/such/model.gguf", "no such GGUF file"),
])
def test_a_model_no_point_could_load_is_refused_before_any_point_runs(draft, fragment, tmp_path: Path,
                                                                      capsys) -> None:
    """A misspelt draft made every point fail, each after the baselines before it had run, and the sweep exited
    0; now it is refused first (`--dry-run` says so), and the corrected config runs in the same directory."""
    cfg = small()
    cfg["models"]["draft"] = draft
    seen: list[dict] = []
    with pytest.raises((OSError, ValueError), match=fragment):
        E.sweep(cfg, tmp_path / "out", progress=False, make_report=False, on_point=seen.append)
    assert seen == [] and not (tmp_path / "out" / "results.jsonl").exists()
    bad = _toml(tmp_path, **{'draft = "tiny:llama:seed=0:scale=4:noise=0.3"': f'draft = "{draft}"'})
    assert E.main(["--config", str(bad), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    assert "note: a run would be refused: " in capsys.readouterr().err
    assert cli.main(["sweep", "--config", str(bad), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    E.sweep(small(), tmp_path / "out", progress=False, make_report=False, on_point=seen.append)
    assert [r["status"] for r in seen] == ["ok", "ok"]  # the corrected config takes the directory


def test_only_the_models_of_unfinished_points_are_checked(tmp_path: Path, monkeypatch) -> None:
    """A finished sweep re-run (its report rewritten, say) on a machine without its models loads nothing and
    refuses nothing; a point left to run checks its models (control)."""
    from treespec.bench.sweep import loop

    E.sweep(small(), tmp_path, progress=False, make_report=False)
    checked: list[set[str]] = []
    monkeypatch.setattr(loop, "check_specs", checked.append)
    E.sweep(small(), tmp_path, progress=False, make_report=False)
    E.sweep(small(budgets=[3, 4]), tmp_path, progress=False, make_report=False)
    assert checked == [set(), {"tiny:llama:seed=0:scale=4", "tiny:llama:seed=0:scale=4:noise=0.3"}]


def test_a_run_with_failed_points_exits_1_and_a_rerun_retries_them(tmp_path: Path, capsys, monkeypatch) -> None:
    from treespec.bench.sweep.runner import Sweep

    config, out, original = _toml(tmp_path), str(tmp_path / "out"), Sweep.run_point

    def failing(self, point):
        if point.kind == "treespec":
            raise RuntimeError("boom")
        return original(self, point)

    monkeypatch.setattr(Sweep, "run_point", failing)
    assert cli.main(["sweep", "--config", str(config), "--out", out, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "failed: RuntimeError: boom" in err and "1 point failed" in err and "again to retry" in err
    monkeypatch.setattr(Sweep, "run_point", original)
    assert cli.main(["sweep", "--config", str(config), "--out", out, "--no-progress"]) == 0
    statuses = [r["status"] for r in read_records(tmp_path / "out" / "results.jsonl")]
    assert statuses == ["ok", "error", "ok"]  # the baseline once, the point failed, then retried


def test_a_model_or_prompt_set_every_point_would_fail_on_stops_the_sweep_first(tmp_path: Path, capsys,
                                                                               monkeypatch) -> None:
    """A target of a family not admitted, or evaluation prompts that with max_new_tokens outgrow the context, failed
    every point alike, each recorded after the baselines had run, and the CLI said to run again to retry them; the
    sweep now stops at the first point, naming the model or the prompt and what to change, and records nothing."""
    from treespec.bench.sweep.runner import PairError
    from treespec.core import checks

    cfg, seen = small(), []
    cfg["data"]["max_new_tokens"] = 5000
    with pytest.raises(PairError, match="humaneval evaluation prompt 0: the prompt .* exceeds the model's context of "
                                        "4096 positions.*data.max_new_tokens"):
        E.sweep(cfg, tmp_path / "long", progress=False, make_report=False, on_point=seen.append)
    monkeypatch.setattr(checks, "SUPPORTED_FAMILIES", ("qwen2",))
    with pytest.raises(PairError, match="the target 'tiny:llama:seed=0:scale=4' fails every point of its pair: the "
                                        "target model family 'llama' is not supported"):
        E.sweep(small(), tmp_path / "family", progress=False, make_report=False, on_point=seen.append)
    assert seen == [] and not any(p.stat().st_size for p in tmp_path.rglob("results.jsonl"))
    assert cli.main(["sweep", "--config", str(_toml(tmp_path)), "--out", str(tmp_path / "cli"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "treespec: error: the target 'tiny:llama" in err and "retry" not in err and "Traceback" not in err


def test_a_dry_run_says_what_a_run_would_refuse_before_loading_anything(tmp_path: Path, capsys) -> None:
    """A dry run listed a full plan where the run stops at once: a CUDA device this machine lacks, an --out that
    is a file; it now notes the refusal (and creates nothing)."""
    import torch

    a_file = tmp_path / "taken"
    a_file.write_text("x")
    assert E.main(["--config", str(TINY), "--out", str(a_file), "--dry-run"]) == 0
    assert f"note: a run would be refused: --out {a_file} is a file" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert E.main(["--config", str(TINY), "--out", str(tmp_path / "new"), "--dry-run", "--device", "cuda"]) == 0
        assert "note: a run would be refused: device 'cuda': this machine has no CUDA device" in \
            capsys.readouterr().err
    assert not (tmp_path / "new").exists()  # a dry run writes nothing


def test_a_sweep_loads_its_draft_as_a_draft(monkeypatch) -> None:
    """A real draft was loaded with ``load``'s default role, "target": in int8 (the CPU sweep's own config) ``load``
    refuses it as a target ("dtype 'int8' is for drafts only"), and in int4 or auto it became a target's int4 (the
    file's blocks, bfloat16 twins) or was timed among a target's precisions, not the draft ``treespec generate``
    runs. The draft now loads with role "draft", the target with "target", each once."""
    from treespec.bench.sweep import models as sweep_models
    from treespec.bench.sweep.runner import Sweep
    from treespec.models import load
    from treespec.models.tiny import ByteTokenizer, tiny_model

    with pytest.raises(ValueError, match="dtype 'int8' is for drafts only"):
        load("qwen2.5-coder-0.5b-instruct", dtype="int8")  # refused before any weight is read
    calls: list[tuple[str, str, str]] = []

    def fake_load(spec: str, device: str = "cpu", dtype: str = "float32", role: str = "target"):
        calls.append((spec, dtype, role))
        return tiny_model("llama", vocab=16, hidden=16, seed=0), ByteTokenizer(16)

    monkeypatch.setattr(sweep_models, "load", fake_load)
    cfg = E.load_config({"models": {"target": "real-target", "draft": "real-draft"},
                         "data": {"datasets": ["humaneval"]}, "run": {"device": "cpu", "draft_dtype": "int8"}})
    state = Sweep(cfg, Path("unused"), progress=False, measure=None)
    for _ in range(2):
        state.draft_model("real-target", "real-draft")
    assert calls == [("real-draft", "int8", "draft"), ("real-target", "float32", "target")]


def test_an_int4_target_sweeps_on_the_cpu_and_is_refused_elsewhere(tmp_path: Path) -> None:
    """``run.dtype = "int4"``: the target on the int4 kernel (for a GGUF file, its own blocks: the CPU's fastest, the
    precision ``treespec generate`` picks there), its draft "same" in int4 too; greedy treespec equals HF's greedy
    decoding of the same int4 model. int8 and int4 on another device than the CPU are refused, naming the key."""
    cfg = small()
    cfg["run"]["dtype"] = "int4"
    cfg["baselines"]["methods"] = ["target"]
    records = E.read_records(E.sweep(E.load_config(cfg), tmp_path, progress=False, make_report=False))
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(r["params"]["dtype"] == "int4" and "draft_dtype" not in r["params"] for r in records)
    point = next(r for r in records if r["kind"] == "treespec")
    assert point["checks"]["greedy_same_as_target"] == "1/1" and point["result"]["tau"] > 1
    for run, key in (({"device": "cuda", "dtype": "int4"}, "run.dtype = 'int4'"),
                     ({"device": "cuda:1", "draft_dtype": "int8"}, "run.draft_dtype = 'int8'")):
        with pytest.raises(ValueError, match=f"{key} runs on a CPU only .* this sweep's device is 'cuda"):
            E.sweep({"data": {"datasets": ["humaneval"]}, "run": run}, tmp_path / "refused", progress=False)
        assert not (tmp_path / "refused").exists()  # refused before anything is written
    with pytest.raises(ValueError, match="run.dtype must be one of"):
        E.load_config({"data": {"datasets": ["humaneval"]}, "run": {"dtype": "int8"}})


def test_the_command_lines_device_and_dtype_decide_the_cpu_only_precisions(tmp_path: Path, capsys) -> None:
    """int4 is refused on CUDA after ``--device`` / ``--dtype`` replace the config's, not before: a config written
    for a GPU node (cuda, int4 by mistake or for a later CPU run) dry-runs with ``--device cpu`` and with
    ``--dtype bfloat16``, and is refused as it stands, naming the key."""
    config = tmp_path / "gpu-int4.toml"
    text = TINY.read_text()
    config.write_text(text.replace('device = "cpu"', 'device = "cuda"').replace('dtype = "float32"', 'dtype = "int4"'))
    assert 'device = "cuda"\ndtype = "int4"' in config.read_text()
    out = str(tmp_path / "out")
    assert E.main(["--config", str(config), "--out", out, "--dry-run", "--device", "cpu"]) == 0
    assert "runs on a CPU only" not in capsys.readouterr().err
    code = E.main(["--config", str(config), "--out", out, "--dry-run", "--dtype", "bfloat16"])
    assert "runs on a CPU only" not in capsys.readouterr().err and code == 0
    with pytest.raises(ValueError, match="run.dtype = 'int4' runs on a CPU only"):
        E.main(["--config", str(config), "--out", out, "--dry-run"])


def test_settings_the_device_decides_compare_as_the_device_takes_them() -> None:
    """The committed CPU sweep's config says ``run.compile = false`` and has no ``run.envelope`` (both added or made
    "auto" later): on a CPU "auto" compiles nothing and pads nothing, so resuming it is no change; on CUDA "auto"
    compiles, which is one."""
    from treespec.bench.sweep.lock import canonical, changes

    new = canonical(small())
    old = json.loads(json.dumps(new))
    old["run"]["compile"] = False
    del old["run"]["envelope"]
    assert new["run"]["compile"] == "auto" and changes(old, new) == {}
    on_cuda = {**new, "run": {**new["run"], "device": "cuda"}}
    assert set(changes({**old, "run": {**old["run"], "device": "cuda"}}, on_cuda)) == {"run.compile"}
