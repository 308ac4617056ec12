"""The sweep harness (treespec.bench.sweep) on in-process tiny models: records, resume, report, CLI."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
from pathlib import Path

import pytest

import tree_builders

import treespec.bench.sweep as E
from treespec.bench import datasets
from treespec.bench.sweep.report import report
from treespec.models import tiny as testing
from treespec.recipes import Recipe, shape_for

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "experiments" / "configs" / "tiny.toml"


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _comparable(path: Path) -> list[dict]:
    return sorted((E.comparable(r) for r in E.read_records(path)), key=lambda r: r["key"])


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """The tiny 2x2 sweep (sequoia/chain x budgets 4/8, plus 3 baselines, HF assisted in 2 settings), run once
    without interruption."""
    out = tmp_path_factory.mktemp("full")
    return E.sweep(TINY, out, progress=False)


def test_sweep_writes_the_expected_records(full: Path) -> None:
    records = E.read_records(full)
    assert [r["status"] for r in records] == ["ok"] * 8
    bases = {r["params"]["method"]: r for r in records if r["kind"] == "baseline"}
    assert set(bases) == {"target", "assisted", "prompt_lookup"}
    assisted = [r for r in records if r["params"].get("method") == "assisted"]  # baselines.assisted: 2 settings
    assert [r["params"]["assisted"] for r in assisted] == [{}, {
        "assistant_confidence_threshold": 0.0, "num_assistant_tokens": 2, "num_assistant_tokens_schedule": "constant"}]
    faster = min(r["timing"]["wall_seconds"] for r in assisted)
    tres = [r for r in records if r["kind"] == "treespec"]
    assert sorted((r["params"]["builder"], r["params"]["budget"]) for r in tres) == [
        ("chain", 4), ("chain", 8), ("sequoia", 4), ("sequoia", 8)]
    for r in records:
        assert r["result"]["tokens_per_prompt"] == [12, 12] and r["result"]["complete"]
        assert r["timing"]["wall_seconds"] > 0 and r["timing"]["tokens_per_second"] > 0
    for r in tres:
        res, p = r["result"], r["params"]
        assert res["tau"] >= 1 and res["steps"] == sum(res["accepted_hist"])
        assert res["tree"]["size"] <= p["budget"] and res["mean_tree_size"] <= p["budget"]
        assert res["predicted_tau"] >= 1 and res["replayed_tau"] >= 1  # the calibration keeps its walk's ranks
        assert set(r["speedup"]) == {"target", "assisted", "prompt_lookup"}
        assert all(isinstance(v, float) and v > 0 for v in r["speedup"].values())
        assert r["speedup"]["assisted"] == pytest.approx(faster / r["timing"]["wall_seconds"])  # the faster setting
        assert r["checks"]["greedy_same_as_target"] == "2/2"  # greedy treespec == HF greedy, token for token
        assert res["output_digests"] == bases["target"]["result"]["output_digests"]
        assert {"drafting_seconds", "verifying_seconds", "overhead_seconds"} <= set(r["timing"])
        assert (full.parent / res["acceptance"]["file"]).exists()
    chain8 = next(r for r in tres if r["params"]["builder"] == "chain" and r["params"]["budget"] == 8)
    assert chain8["result"]["tree"]["widths"] == [1] * 7


def test_rerun_adds_nothing(full: Path, tmp_path: Path) -> None:
    shutil.copytree(full.parent, tmp_path / "again")
    before = (tmp_path / "again" / "results.jsonl").read_bytes()
    seen: list[dict] = []
    E.sweep(TINY, tmp_path / "again", progress=False, on_point=seen.append, make_report=False)
    assert seen == []
    assert (tmp_path / "again" / "results.jsonl").read_bytes() == before


def test_baselines_from_another_machine_are_not_paired(full: Path, tmp_path: Path, capsys) -> None:
    records = E.read_records(full)
    here = records[0]["meta"]["machine"]
    assert here == E.records.machine("cpu") and "cores" in here
    kept = [r for r in records if r["kind"] == "baseline"]
    for r in kept:  # as if the baselines had been measured on another machine
        r["meta"]["machine"] = "another CPU (family 1, model 1, stepping 1), 2 cores"
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    E.sweep(TINY, tmp_path, progress=False, make_report=False)
    assert "holds points measured on other machines (another CPU" in capsys.readouterr().err
    fresh = [r for r in E.read_records(tmp_path / "results.jsonl") if r["kind"] == "treespec"]
    assert len(fresh) == 4 and all(r["speedup"] == {} and r["meta"]["machine"] == here for r in fresh)


def test_interrupted_run_resumes_to_the_same_records(full: Path, tmp_path: Path) -> None:
    done: list[dict] = []

    def stop_after_three(record: dict) -> None:
        done.append(record)
        if len(done) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        E.sweep(TINY, tmp_path, progress=False, on_point=stop_after_three)
    results = tmp_path / "results.jsonl"
    assert len(_lines(results)) == 3
    with open(results, "a", encoding="utf-8") as f:  # a crash in the middle of writing a record
        f.write('{"key": "torn", "status": "o')
    E.sweep(TINY, tmp_path, progress=False)
    assert len(_lines(results)) == 8
    assert _comparable(results) == _comparable(full)


def test_report_writes_plots_and_table(full: Path, tmp_path: Path) -> None:
    readme = report(full, tmp_path)
    for name in ("tau_vs_budget.png", "speedup_vs_budget.png", "predicted_vs_measured_tau.png", "acceptance.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    trees = sorted(p.name for p in (tmp_path / "trees").glob("*.png"))
    assert len(trees) == 4 and any(t.startswith("sequoia-B8") for t in trees)
    text = readme.read_text(encoding="utf-8")
    assert "## Baselines" in text and "## Treespec points" in text
    assert text.count("| humaneval | 0 | 1 | 0 | model |") == 4
    # HF assisted's two settings named, the faster in bold (the one each "vs assisted" is over)
    rows = {line.split(" | ")[5]: float(line.split(" | ")[9]) for line in text.splitlines()
            if "assisted (" in line and line.startswith("| ")}
    assert len(rows) == 2 and sum(name.startswith("**") for name in rows) == 1
    bold = next(name for name in rows if name.startswith("**"))
    assert rows[bold] == min(rows.values()) and "assisted ran in several settings" in text
    assert "](tau_vs_budget.png)" in text and "[" in text.split("| model |")[1]  # intervals in the table
    header = next(line for line in text.splitlines() if line.startswith("| dataset | T | top-p | seed | drafters"))
    column = header.split(" | ").index("replayed tau")
    replayed = {line.split(" | ")[column] for line in text.splitlines()
                if line.startswith("| humaneval | 0 | 1 | 0 | model |")}
    assert replayed and "-" not in replayed  # every static point's replay, from the walk's ranks
    # vs fastest HF: the least of the per-method speedups, naming that method
    columns = header.split(" | ")
    for line in text.splitlines():
        if line.startswith("| humaneval | 0 | 1 | 0 | model |"):
            cells = dict(zip(columns, line.split(" | ")))
            each = {m: float(cells[m].split()[0]) for m in ("vs target", "vs assisted", "vs prompt lookup")}
            assert cells["vs static+compile"] == "-"  # not run by this config
            assert float(cells["vs fastest HF"].split()[0]) == min(each.values())
            method = min(each, key=each.get).removeprefix("vs ").replace(" ", "_")
            assert f"] ({method}" in cells["vs fastest HF"]


def test_ngram_both_and_the_other_builders(tmp_path: Path) -> None:
    cfg = E.load_config(TINY)
    cfg["grid"].update(drafters=["ngram", "both"], builders=["kary", "chains", "dynamic", "paths"], budgets=[8],
                       temperatures=[1.0])
    cfg["shapes"]["paths"] = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0]]  # a static tree, priority order
    cfg["ngram"]["max_tokens"] = 2
    cfg["data"].update(eval="100:101", max_new_tokens=8)
    cfg["baselines"]["methods"] = ["target"]
    results = E.sweep(cfg, tmp_path, progress=False, make_report=False)
    records = E.read_records(results)
    assert [r["status"] for r in records] == ["ok"] * 6, [r.get("error") for r in records]
    tres = {(r["params"]["drafters"], r["params"]["builder"]): r for r in records if r["kind"] == "treespec"}
    assert set(tres) == {("ngram", "ngram"), ("both", "kary"), ("both", "chains"), ("both", "dynamic"),
                         ("both", "paths")}
    for (drafters, builder), r in tres.items():
        assert r["result"]["tokens_per_prompt"] == [8]
        # the n-gram reserves 2 of the 8 nodes in "both"; the model's tree is sized for the other 6
        assert r["result"]["cap"] == 8 and r["result"]["mean_tree_size"] <= 8
        if builder in ("kary", "chains", "paths"):
            assert r["result"]["tree"]["size"] <= 6
        assert len(r["result"]["drafters"]) == (1 if drafters == "ngram" else 2)
        assert r["speedup"]["target"] > 0 and "greedy_same_as_target" not in r["checks"]
    assert tres[("both", "kary")]["result"]["tree"]["widths"] == [2, 2]  # nodes per level of kary((2, 1))
    assert tres[("both", "chains")]["result"]["tree"]["widths"] == [4]
    assert tres[("both", "paths")]["result"]["tree"]["paths"] == [[0], [1], [2], [0, 0], [0, 1]]  # its first 5
    assert tres[("both", "kary")]["params"]["mode"] == "sample_without_replacement"
    assert tres[("both", "chains")]["params"]["mode"] == "sample"  # SpecInfer's independent chains
    assert tres[("both", "dynamic")]["params"]["mode"] == "dynamic"
    assert not list(tmp_path.glob("acceptance-*.json"))  # nothing here needs an acceptance vector


def test_named_static_trees_are_points_of_their_own(tmp_path: Path) -> None:
    """``[shapes.paths]`` as a table of named static trees: builder "paths" runs each tree at each budget (cut to its
    first B - 1 paths), and the report names each (``paths:<name>``) in its tables, lines and pictures, never
    pooling two trees; a single unnamed tree's points hold no name (their keys as before)."""
    cfg = E.load_config(TINY)
    cfg["grid"].update(builders=["paths"], budgets=[4, 8])
    cfg["shapes"]["paths"] = {"wide": [[0], [1], [2], [0, 0], [1, 0]], "deep": [[0], [0, 0], [0, 0, 0], [1]]}
    cfg["data"].update(eval="100:101", max_new_tokens=8)
    cfg["baselines"]["methods"] = ["target"]
    results = E.sweep(cfg, tmp_path, progress=False)
    tres = {(r["params"]["paths_name"], r["params"]["budget"]): r["result"]["tree"]["paths"]
            for r in E.read_records(results) if r["kind"] == "treespec"}
    assert tres == {("wide", 4): [[0], [1], [2]], ("wide", 8): [[0], [1], [2], [0, 0], [1, 0]],
                    ("deep", 4): [[0], [0, 0], [0, 0, 0]], ("deep", 8): [[0], [1], [0, 0], [0, 0, 0]]}
    readme = (results.parent / "README.md").read_text()
    assert readme.count("| model | paths:wide |") == 2 and readme.count("| model | paths:deep |") == 2
    assert {p.name for p in (tmp_path / "trees").glob("paths-*.png")} == {
        "paths-wide-B4-dnone.png", "paths-wide-B8-dnone.png", "paths-deep-B4-dnone.png", "paths-deep-B8-dnone.png"}
    single = E.load_config(TINY)
    single["grid"].update(builders=["paths"])
    single["shapes"]["paths"] = [[0], [1]]
    (point,) = [p for p in E.enumerate_points(single) if p.kind == "treespec" and p.params["budget"] == 8]
    assert point.params["paths"] == [[0], [1]] and "paths_name" not in point.params and "model/paths B=8" in point.label


def test_shape_rules() -> None:
    assert [tree_builders.kary_widths(b, 2) for b in (2, 4, 6, 8, 16, 32)] == [
        (1,), (2,), (2, 1), (2, 2), (2, 2, 2), (2, 2, 2, 2)]
    assert tree_builders.kary_widths(32, 2, max_depth=2) == (2, 2)
    assert shape_for(Recipe(tree="chain", budget=8, depth=3)).widths == (1, 1, 1)
    assert shape_for(Recipe(tree="chain", budget=8), max_new_tokens=4).widths == (1, 1, 1)  # depth <= tokens - 1
    assert shape_for(Recipe(tree="chains", budget=9, chains=4)).widths == (4, 4)
    assert shape_for(Recipe(tree="chains", budget=3, chains=4)).widths == (2,)
    seq = shape_for(Recipe(tree="sequoia", budget=16, depth=4, acceptance=[0.6, 0.2, 0.1]))
    assert seq.size <= 16 and seq.depth <= 4
    with pytest.raises(ValueError):
        shape_for(Recipe(tree="sequoia", budget=16))


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="overlap"):
        E.load_config({"data": {"calib": "0:10", "eval": "5:20"}})
    with pytest.raises(ValueError, match="unknown config key"):
        E.load_config({"grid": {"budget": [4]}})
    with pytest.raises(ValueError, match="budgets"):
        E.load_config({"grid": {"budgets": [1]}})
    with pytest.raises(ValueError, match="batch_sizes"):
        E.load_config({"grid": {"batch_sizes": [0]}})
    cfg = E.load_config({"data": {"datasets": ["humaneval"], "humaneval": {"calib": "0:50", "eval": "50:60"}}})
    assert E.split_ranges(cfg, "humaneval") == ((0, 50), (50, 60))


def test_a_config_without_baselines_or_device_runs_what_a_user_of_the_machine_would(monkeypatch) -> None:
    """``run.device`` left out is the commands' default (CUDA where there is one); ``baselines.methods`` left out is
    eager HF, HF with a static cache + ``torch.compile`` (HF's fastest plain decoding on a GPU, and on a CPU in
    bfloat16), assisted and prompt lookup on every device; a listed set stays as listed."""
    from treespec.bench.sweep.config import baseline_methods

    import torch

    bare = {"data": {"datasets": ["humaneval"]}}  # the rest of the defaults
    cfg = E.load_config(bare)
    assert cfg["run"]["device"] == "cpu"
    assert baseline_methods(cfg) == ["target", "target_compiled", "assisted", "prompt_lookup"]
    assert baseline_methods({**cfg, "run": {**cfg["run"], "device": "cuda"}}) == baseline_methods(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert E.load_config(bare)["run"]["device"] == "cuda"
    listed = E.load_config({**bare, "baselines": {"methods": ["target"]}, "run": {"device": "cpu"}})
    assert baseline_methods({**listed, "run": {**listed["run"], "device": "cuda"}}) == ["target"]
    with pytest.raises(ValueError, match="baselines.methods"):
        E.load_config({**bare, "baselines": {"methods": ["target", "eager"]}})


def test_speedup_is_refused_when_token_counts_differ() -> None:
    cfg = E.load_config(TINY)
    cfg["baselines"]["methods"] = ["target"]
    state = E.Sweep(cfg, Path("."), progress=False, measure=None)
    point = next(pt for pt in E.enumerate_points(cfg) if pt.kind == "treespec")
    base = next(pt for pt in E.enumerate_points(cfg) if pt.kind == "baseline")
    state.records[base.key] = {"status": "ok", "result": {"complete": False, "tokens_per_prompt": [12, 7],
                                                          "output_digests": ["a", "b"]},
                               "timing": {"wall_seconds": 1.0}, "meta": {"machine": state.machine}}
    record = {"result": {"complete": True, "tokens_per_prompt": [12, 12], "output_digests": ["a", "b"]},
              "timing": {"wall_seconds": 0.5}, "meta": {"machine": state.machine}}
    state.compare(point.params, record)
    assert record["speedup"] == {"target": None}
    assert "token counts differ" in record["speedup_refused"]["target"]


def test_cli(full: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        E.main(["--help"])
    assert exit_info.value.code == 0
    assert "--config" in capsys.readouterr().out
    assert E.main(["--config", str(TINY), "--out", str(full.parent), "--dry-run"]) == 0
    assert "8 points (4 baselines, 4 treespec), 8 finished" in capsys.readouterr().out
    assert E.main(["--report", str(full)]) == 0
    assert capsys.readouterr().out.strip().endswith("README.md")


def test_tiny_model_specs() -> None:
    target = testing.tiny_from_spec("tiny:qwen2:seed=3:vocab=80:hidden=16:layers=1")
    assert target.config.vocab_size == 80 and target.config.model_type == "qwen2"
    same = testing.tiny_from_spec("tiny:qwen2:seed=3:vocab=80:hidden=16:layers=1")
    noisy = testing.tiny_from_spec("tiny:qwen2:seed=3:vocab=80:hidden=16:layers=1:noise=0.5")
    w = target.lm_head.weight
    assert (same.lm_head.weight == w).all() and not (noisy.lm_head.weight == w).all()
    with pytest.raises(ValueError, match="unknown tiny model option"):
        testing.tiny_from_spec("tiny:llama:sed=0")


@pytest.mark.skipif(not any(d.metadata["Name"] == "gensim" for d in importlib.metadata.distributions()),
                    reason="the lee-news prompts ship in the gensim package")
def test_lee_news_prompts_are_disjoint_text() -> None:
    prompts = datasets.dataset_prompts("lee-news")
    assert len(prompts) == len(set(prompts)) == 290 and all(len(p.split()) >= 30 for p in prompts)
    cfg = E.load_config({"data": {"datasets": ["lee-news"], "calib": "0:100", "eval": "100:"}})  # to the end
    calib, evals = E.calib_eval_prompts(cfg, "lee-news")
    assert len(calib) == 100 and len(evals) == 190 and not set(calib) & set(evals)
    assert json.dumps(prompts[0]).startswith('"Hundreds of people')


def test_calibration_length_follows_the_evaluation_by_default() -> None:
    """The default calibration continues prompts as far as the evaluation does and sizes trees by the
    per-depth matrix; an explicit length is kept, and a wrong value says what is accepted."""
    from treespec.bench.sweep.points import acceptance_params

    cfg = E.load_config({"data": {"datasets": ["humaneval"], "max_new_tokens": 72}})
    assert cfg["acceptance"]["use"] == "matrix"
    params = acceptance_params(cfg, "t", "d", "humaneval", "topk", 0.0, 1.0)
    assert params["max_new_tokens"] == 72
    cfg = E.load_config({"data": {"datasets": ["humaneval"], "max_new_tokens": 72},
                         "acceptance": {"max_new_tokens": 40}})
    assert acceptance_params(cfg, "t", "d", "humaneval", "topk", 0.0, 1.0)["max_new_tokens"] == 40
    with pytest.raises(ValueError, match='or "eval"'):
        E.load_config({"acceptance": {"max_new_tokens": "all"}})


def test_a_compiled_sweep_pays_its_compiles_once_per_envelope(tmp_path: Path, capsys) -> None:
    """Compiled steps in one padded envelope (run.envelope): the first treespec point's warm-up compiles the
    graphs (its seconds kept apart from the measured ones), the other three trees replay them; the report
    states the compile once, for the envelope. The dry run states the compile plan first. HF's static cache +
    torch.compile baseline runs beside the others, with the backend the run names."""
    cfg = E.load_config(TINY)
    cfg["run"].update(compile="eager", envelope="padded")  # what is counted is dynamo's graphs: its eager backend
    cfg["baselines"]["methods"] = ["target", "target_compiled"]
    from treespec.bench.sweep.cli import main as sweep_main

    config = tmp_path / "compiled.toml"
    config.write_text(TINY.read_text().replace('threads = 1', 'threads = 1\ncompile = "eager"\nenvelope = "padded"')
                      .replace('methods = ["target", "assisted", "prompt_lookup"]',
                               'methods = ["target", "target_compiled"]'))
    assert sweep_main(["--config", str(config), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "compile plan: 4 compiled points" in plan and "ONE padded envelope" in plan
    assert "its longest prompt, whose runner serves every shorter one" in plan
    assert "1 HF static cache + torch.compile baseline point(s) (backend eager): each compiles" in plan
    eager = tmp_path / "eager.toml"  # treespec eager (a CPU's default), HF's compiled baseline still compiles
    eager.write_text(config.read_text().replace('compile = "eager"\nenvelope = "padded"', ""))
    assert sweep_main(["--config", str(eager), "--out", str(tmp_path / "eager"), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "compile plan: no treespec point compiles (run.compile is off" in plan
    assert "1 HF static cache + torch.compile baseline point(s) (backend inductor)" in plan
    results = E.sweep(config, tmp_path / "out", progress=False)
    records = E.read_records(results)
    tres = [r for r in records if r["kind"] == "treespec"]
    assert len(tres) == 4 and all(r["status"] == "ok" for r in records)
    compiles = [r["result"]["compile"] for r in tres]
    assert len({c["envelope"] for c in compiles}) == 1
    assert [c["graphs"] > 0 for c in compiles] == [True, False, False, False]  # once per envelope, not per point
    assert compiles[0]["seconds"] == tres[0]["timing"]["warmup_seconds"] > 0
    assert all(r["checks"]["greedy_same_as_target"] == "2/2" for r in tres)
    assert {r["params"]["method"] for r in records if r["kind"] == "baseline"} == {"target", "target_compiled"}
    assert [r["params"]["backend"] for r in records if "backend" in r["params"]] == ["eager"]
    readme = (results.parent / "README.md").read_text()
    assert readme.count("graphs, ") == 1 and "## Compiles" in readme and "1 envelope(s)" in readme
    assert all(r["result"]["step"] == "captured" for r in tres) and "Not captured" not in readme


def test_the_dry_run_counts_an_exact_envelopes_level_graphs(tmp_path: Path, capsys) -> None:
    """Each tree in its own envelope compiles one draft level per distinct row count of its levels (a chain's two:
    level 0 holds the pending row too), not one per drafting setting as a padded envelope does (the plan said one)."""
    from treespec.bench.sweep.cli import main as sweep_main

    config = tmp_path / "exact.toml"
    config.write_text(TINY.read_text().replace('threads = 1', 'threads = 1\ncompile = "eager"\nenvelope = "exact"'))
    assert sweep_main(["--config", str(config), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    plan = capsys.readouterr().out
    assert "each in its own envelope" in plan and "1 draft level per distinct row count of the tree's levels" in plan


def test_the_report_names_compiled_points_that_drafted_on_the_host() -> None:
    """A record keeps the route its steps took (``result.step``); the compile section names the compiled points
    that were not captured and why, so a GPU sweep's dynamic trees are not read as captured ones."""
    from treespec.bench.sweep.markdown import _compile_section

    def record(builder: str, step: str, graphs: int) -> dict:
        return {"params": {"builder": builder, "budget": 8, "drafters": "model", "dataset": "humaneval",
                           "temperature": 0.0},
                "result": {"step": step, "compile": {"graphs": graphs, "seconds": 1.0, "envelope": "e"}}}

    why = "compiled, drafted on the host: draft mode 'dynamic' drafts on the host"
    lines = _compile_section([record("chain", "captured", 3), record("dynamic", why, 1), record("kary", "captured", 0)])
    text = "\n".join(lines)
    assert "Not captured" in text and f"- 1 points (model/dynamic B=8): {why}" in text and "kary" not in text
    assert "Not captured" not in "\n".join(_compile_section([record("chain", "captured", 3)]))


def test_a_batch_size_axis_runs_batched_points_and_plots_speedup_against_batch_size(tmp_path: Path) -> None:
    """``grid.batch_sizes``: a point of batch size 2 decodes its prompts two at a time (treespec's batched step, HF
    ``generate`` on the same batches; HF assisted takes one prompt, so it has no such point); its greedy rows are
    each prompt's alone; its figures are per batch (paired with the baseline's batches) and each prompt's latency
    is when its row finished; the report plots speedup against batch size."""
    cfg = E.load_config(TINY)
    cfg["grid"].update(builders=["chain"], budgets=[4], batch_sizes=[1, 2])
    cfg["data"]["eval"] = "100:104"
    cfg["baselines"]["methods"] = ["target", "assisted"]
    path = E.sweep(cfg, tmp_path, progress=False)
    records = E.read_records(path)
    assert [r["status"] for r in records] == ["ok"] * 6  # HF assisted in tiny.toml's 2 settings
    by = {(r["params"].get("batch_size", 1), r["params"].get("method", "treespec")): r for r in records}
    assert set(by) == {(1, "target"), (1, "assisted"), (1, "treespec"), (2, "target"), (2, "treespec")}
    one, two = by[1, "treespec"], by[2, "treespec"]
    n = cfg["data"]["max_new_tokens"]
    for r in (two, by[2, "target"]):
        assert r["result"]["tokens_per_batch"] == [2 * n, 2 * n] and len(r["timing"]["per_batch_seconds"]) == 2
        rows = r["timing"]["per_prompt_seconds"]
        assert len(rows) == 4 and all(0 < s <= max(r["timing"]["per_batch_seconds"]) + 1e-9 for s in rows)
        assert r["result"]["output_digests"] == by[1, "target"]["result"]["output_digests"]  # rows = prompts alone
    assert "compile" not in two["params"] and set(two["speedup"]) == {"target"}
    assert two["checks"]["greedy_same_as_target"] == "4/4" and set(one["speedup"]) == {"target", "assisted"}
    readme = report(path)
    assert (tmp_path / "speedup_vs_batch_size.png").exists() and "(batch 2)" in readme.read_text()
