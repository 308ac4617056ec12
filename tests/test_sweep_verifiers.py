"""A sweep over verifiers: greedy points run once (the verifier plays no part at T=0), the report names each point's
verifier, and a verifier not exact for a point's tree is refused as such, before any model loads where the config
alone tells (``--dry-run`` names it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import treespec.bench.sweep as E
import treespec.cli as cli
from treespec.bench.sweep import lock, markdown, points, runner
from treespec.bench.sweep.records import read_records

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "configs" / "tiny.toml"


def _toml(tmp_path: Path, builders: str = '["chain"]', temperatures: str = "[0.0, 1.0]",
          verifiers: str = '["rrs", "block"]', budgets: str = "[3]") -> Path:
    """The tiny config as a file, cut to one prompt of 4 tokens and the target baseline, over these grid axes."""
    text = TINY.read_text().replace('builders = ["sequoia", "chain"]', f"builders = {builders}")
    text = text.replace("budgets = [4, 8]", f"budgets = {budgets}").replace('eval = "100:102"', 'eval = "100:101"')
    text = text.replace("temperatures = [0.0]", f"temperatures = {temperatures}\nverifiers = {verifiers}")
    text = text.replace("max_new_tokens = 12", "max_new_tokens = 4")
    text = text.replace('methods = ["target", "assisted", "prompt_lookup"]', 'methods = ["target"]')
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return path


def _treespec(cfg: dict) -> list[tuple[float, str | None]]:
    return [(pt.params["temperature"], pt.params.get("verifier")) for pt in E.enumerate_points(cfg)
            if pt.kind == "treespec"]


def test_a_greedy_point_runs_once_whatever_the_verifier(tmp_path: Path) -> None:
    cfg = E.load_config(_toml(tmp_path))
    assert _treespec(cfg) == [(0.0, None), (1.0, None), (1.0, "block")]
    greedy_alone = E.load_config(_toml(tmp_path, temperatures="[0.0]", verifiers='["rrs"]'))
    keys = {pt.key for pt in E.enumerate_points(cfg)}
    assert {pt.key for pt in E.enumerate_points(greedy_alone)} <= keys  # the greedy point keeps its key
    cfg = E.load_config(_toml(tmp_path, verifiers='["block", "traversal"]'))  # no rrs: the grid's first
    assert _treespec(cfg) == [(0.0, "block"), (1.0, "block"), (1.0, "traversal")]


def test_a_sweep_over_verifiers_names_them_and_keeps_the_greedy_records_of_before(tmp_path: Path, capsys) -> None:
    config, out = _toml(tmp_path), tmp_path / "out"
    results = E.sweep(config, out, progress=False)
    records = read_records(results)
    assert [r["status"] for r in records] == ["ok"] * 5  # 2 baselines, the greedy point, 2 sampled points
    text = (out / "README.md").read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.startswith("| dataset | T | top-p | seed | drafters"))
    assert "| builder | verifier | B |" in header
    assert len(text.splitlines()[text.splitlines().index(header) + 1].split("|")) == len(header.split("|"))
    rows = [line for line in text.splitlines() if line.startswith("| humaneval | ")]
    assert sum("| chain | rrs | 3 |" in row for row in rows) == 2  # T=0 and T=1
    assert sum("| chain | block | 3 |" in row for row in rows) == 1
    assert sum("| chain [block] | 3 |" in row for row in rows) == 1  # predicted vs measured tau
    tres = [r for r in records if r["kind"] == "treespec"]
    alone = markdown._treespec_table([r for r in tres if "verifier" not in r["params"]], [])
    assert "verifier" not in next(line for line in alone if line.startswith("| dataset"))  # no column for rrs alone

    # a results file of before: the greedy point ran under block too
    greedy = next(r for r in tres if r["params"]["temperature"] == 0)
    params = {**greedy["params"], "verifier": "block"}
    with open(results, "a", encoding="utf-8") as f:
        f.write(json.dumps({**greedy, "key": E.point_key(params), "params": params}) + "\n")
    capsys.readouterr()
    assert E.main(["--config", str(config), "--out", str(out), "--dry-run"]) == 0
    assert "5 points (2 baselines, 3 treespec), 5 finished" in capsys.readouterr().out
    seen: list[dict] = []
    E.sweep(config, out, progress=False, on_point=seen.append)
    assert seen == []  # nothing to run again
    grown = E.load_config(config)
    grown["grid"]["budgets"] = [3, 4]
    assert lock.refusal(out, grown) is None  # growing the grid does not count the old greedy record as dropped
    text = (out / "README.md").read_text(encoding="utf-8")
    greedy = _greedy_rows(text)
    assert len(greedy) == 1 and "| chain | block | 3 |" in greedy[0]  # one row: the latest record of the point


def test_refusal_is_told_from_the_point_where_its_tree_is_fixed(tmp_path: Path) -> None:
    def point(builder: str, verifier: str, temperature: float = 1.0, mode: str = "auto") -> dict:
        cfg = E.load_config(_toml(tmp_path, builders=f'["{builder}"]', temperatures=f"[{temperature}]",
                                  verifiers=f'["{verifier}"]'))
        cfg["grid"]["model_mode"] = mode
        return next(pt.params for pt in E.enumerate_points(cfg) if pt.kind == "treespec")

    refuse = points.verifier_refusal
    assert "verifier 'block' is not exact for this tree" in refuse(point("kary", "block"))
    assert "verifier 'spectr' is not exact" in refuse(point("kary", "spectr"))  # draws without replacement
    assert "verifier 'spectr' is not exact" in refuse(point("chain", "spectr", mode="topk"))  # point masses
    for ok in (point("kary", "rrs"), point("kary", "traversal"), point("chain", "block"), point("chain", "spectr"),
               point("kary", "block", 0.0), point("sequoia", "block")):  # exact, greedy, or told only by a run
        assert refuse(ok) is None


def test_a_point_whose_verifier_is_not_exact_is_refused_and_said_to_be(tmp_path: Path, capsys, monkeypatch) -> None:
    config, out = _toml(tmp_path, builders='["kary"]', temperatures="[1.0]", verifiers='["block"]'), tmp_path / "out"
    assert E.main(["--config", str(config), "--out", str(out), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "(refused: verifier not exact for this tree)" in captured.out and ", 1 refused" in captured.out
    assert "verifier 'block' is not exact for this tree" in captured.err
    assert cli.main(["sweep", "--config", str(config), "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "1 point refused" in err and "a re-run does not change" in err and "again to retry" not in err
    refused = [r for r in read_records(out / "results.jsonl") if r["status"] == "error"]
    assert len(refused) == 1 and refused[0]["refused"] and refused[0]["error"].startswith("NotExactError: ")
    assert "a re-run refuses it again" in (out / "README.md").read_text(encoding="utf-8")

    # the step refuses the same point the same way when the config is not read first
    monkeypatch.setattr(runner, "verifier_refusal", lambda params: None)
    seen: list[dict] = []
    E.sweep(config, out, progress=False, make_report=False, on_point=seen.append)
    assert [r.get("refused") for r in seen] == [True]
    assert seen[0]["error"].startswith("NotExactError: verifier 'block' is not exact for this tree")


def _greedy_rows(text: str) -> list[str]:
    """The treespec table's rows of the greedy points (not the prediction table's)."""
    return [line for line in text.splitlines() if line.startswith("| humaneval | 0 | ") and "| model |" in line]


def test_a_greedy_point_finished_under_another_verifier_is_not_run_again(tmp_path: Path, capsys) -> None:
    config, out = _toml(tmp_path, temperatures="[0.0]", verifiers='["block"]'), tmp_path / "out"
    E.sweep(config, out, progress=False)  # the greedy point runs under block, the grid's only verifier
    config = _toml(tmp_path, temperatures="[0.0]", verifiers='["block", "rrs"]')  # the grid grows: rrs is kept now
    capsys.readouterr()
    assert E.main(["--config", str(config), "--out", str(out), "--dry-run"]) == 0
    assert "2 points (1 baselines, 1 treespec), 2 finished" in capsys.readouterr().out
    seen: list[dict] = []
    E.sweep(config, out, progress=False, on_point=seen.append)
    assert seen == []  # the block record stands for the kept rrs point
    assert len(_greedy_rows((out / "README.md").read_text(encoding="utf-8"))) == 1
    rrs_alone = E.load_config(_toml(tmp_path, temperatures="[0.0]", verifiers='["rrs"]'))
    assert lock.refusal(out, rrs_alone) is None  # nor does a grid without block drop it


def test_refused_points_are_listed_once_and_a_grid_may_drop_them(tmp_path: Path, capsys) -> None:
    config, out = _toml(tmp_path, builders='["kary"]', temperatures="[1.0]"), tmp_path / "out"
    for _ in range(2):  # a refused point is said by each run, and recorded once
        assert cli.main(["sweep", "--config", str(config), "--out", str(out), "--no-progress"]) == 1
    records = read_records(out / "results.jsonl")
    assert [r.get("refused") for r in records if r["status"] == "error"] == [True]
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "(2 finished points, 1 refused)" in text and "## Errors" not in text
    listed = [line for line in text[text.index("## Refused"):].splitlines() if line.startswith("- `")]
    assert len(listed) == 1 and "NotExactError: verifier 'block'" in listed[0]

    # the sweep's advice (take the verifier out of the grid) is followed: its refused records drop no finished point
    trimmed = E.load_config(_toml(tmp_path, builders='["kary"]', temperatures="[1.0]", verifiers='["rrs"]'))
    assert lock.refusal(out, trimmed) is None
    block_alone = E.load_config(_toml(tmp_path, builders='["kary"]', temperatures="[1.0]", verifiers='["block"]'))
    assert "drops 1 finished point(s) (humaneval T=1.0 kary B=3)" in lock.refusal(out, block_alone)
    # the trimmed grid runs: its report says the block point is out of it
    E.sweep(_toml(tmp_path, builders='["kary"]', temperatures="[1.0]", verifiers='["rrs"]'), out, progress=False)
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "## Refused" not in text and "1 out of the grid" in text
    gone = text[text.index("## Errors and refusals of points the grid no longer holds"):].splitlines()
    assert any("NotExactError: verifier 'block'" in line for line in gone)


def test_a_verifier_that_runs_on_the_host_only_is_refused_under_compile(tmp_path: Path, capsys) -> None:
    config, out = _toml(tmp_path, temperatures="[1.0]", verifiers='["spectr"]'), tmp_path / "out"
    config.write_text(config.read_text().replace("threads = 1", 'threads = 1\ncompile = "uncompiled"'))
    cfg = E.load_config(config)
    spectr = next(pt.params for pt in E.enumerate_points(cfg) if pt.kind == "treespec")
    assert "verifier='spectr' runs on the host only" in points.compile_refusal(spectr)
    assert points.verifier_refusal(spectr) is None  # exact for a chain: only the compiled step refuses it
    for ok in ({**spectr, "temperature": 0.0}, {k: v for k, v in spectr.items() if k != "compile"},
               {**spectr, "verifier": "block"}):
        assert points.compile_refusal(ok) is None
    assert E.main(["--config", str(config), "--out", str(out), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "(refused: verifier runs on the host only, not compiled)" in captured.out
    assert ", 1 refused" in captured.out and "spectr" not in captured.out.split("compile plan")[1]  # nothing planned
    assert "verifier='spectr' runs on the host only" in captured.err
    assert cli.main(["sweep", "--config", str(config), "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "1 point refused" in err and "again to retry" not in err
    refused = [r for r in read_records(out / "results.jsonl") if r["status"] == "error"]
    assert len(refused) == 1 and refused[0]["refused"] and refused[0]["error"].startswith("Refused: compile=")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
