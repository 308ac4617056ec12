"""experiments/predict_sweep.py: the CPU sweep's static points predicted again from the committed
calibration and cost files (a report-time computation), each figure the one its model gives."""

import json
import runpy
from pathlib import Path

import pytest

from tree_builders import TreeShape

from treespec.bench.sweep.figures import tau_interval
from treespec.bench.sweep.points import point_key
from treespec.calibrate.acceptance import MeasuredAcceptance

ROOT = Path(__file__).resolve().parents[1]
script = runpy.run_path(str(ROOT / "experiments" / "predict_sweep.py"))
SWEEP = ROOT / "experiments" / "results" / "cpu-qwen-coder"
CALIBRATION = ROOT / "experiments" / "results" / "acceptance-fit"


def test_every_point_is_predicted_by_its_models(tmp_path):
    script["main"](["--out", str(tmp_path)])
    rows = [json.loads(x) for x in (tmp_path / "points.jsonl").read_text().splitlines()]
    records = {point_key(r["params"]): r for r in map(json.loads, (SWEEP / "results.jsonl").read_text().splitlines())}
    assert len(rows) == 48  # 4 panels x 4 static builders x 3 budgets
    predicted = [r for r in rows if "replayed_tau" in r]
    assert len(predicted) >= 12  # at least one panel's calibration is committed
    for row in predicted:
        record = records[row["key"]]
        shape = TreeShape.from_paths([tuple(p) for p in record["result"]["tree"]["paths"]])
        p = record["params"]
        acc = MeasuredAcceptance.load(CALIBRATION / f"acceptance-{p['dataset']}-T{p['temperature']:g}-"
                                      f"{record['result']['acceptance']['mode']}-random-walk.json")
        assert acc.meta["prompts"] == 40 and "random" in acc.meta["prompts_label"]  # disjoint from 100-119
        assert row["replayed_tau"]["estimate"] == pytest.approx(acc.replayed_tau(shape))
        assert row["rows_tau"] == pytest.approx(shape.expected_tokens(acc.matrix.tolist()))
        assert row["measured_tau"]["estimate"] == pytest.approx(tau_interval([record], uncut=True).estimate)
        assert row["tau_gap"] == pytest.approx(row["measured_tau"]["estimate"] / row["replayed_tau"]["estimate"] - 1)
        assert row["tau_gap_low"] <= row["tau_gap"] <= row["tau_gap_high"]
        if "measured_speed" in row:
            assert row["predicted_speed"] == pytest.approx(row["replayed_tau"]["estimate"]
                                                           / row["predicted_step_seconds"])
    readme = (tmp_path / "README.md").read_text()
    for panel in ("## humaneval, T=0", "## humaneval, T=1", "## lee-news, T=0", "## lee-news, T=1"):
        assert panel in readme
    assert (tmp_path / "predicted_vs_measured.png").stat().st_size > 0


def test_a_missing_calibration_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        script["main"](["--out", str(tmp_path), "--variant", "no-such-variant"])
    assert "no 'no-such-variant' calibration file" in capsys.readouterr().err
