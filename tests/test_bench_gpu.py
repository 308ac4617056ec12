"""experiments/bench_gpu.py runs end to end on CPU with tiny models (--smoke) and writes its results."""

import json
import runpy
from pathlib import Path

bench_gpu = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_gpu.py"))


def test_bench_gpu_smoke(tmp_path):
    result = bench_gpu["main"](["--smoke", "--out", str(tmp_path), "--device", "cpu"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved) == {"predicted", "measured", "validation", "setup"}
    runs = saved["measured"]["runs"]
    assert {"hf_generate_eager", "hf_generate_static_compiled", "treespec_eager_random_draft",
            "treespec_compiled_random_draft", "treespec_compiled_draft_equals_target"} <= set(runs)
    assert all(r["tokens"] == 24 for r in runs.values())  # same prompts and token counts everywhere
    # draft == target: every step accepts the whole 4-token chain, eager and compiled
    assert result["validation"]["eager"]["ok"] and result["validation"]["compiled"]["ok"]
    assert result["validation"]["compiled_equals_eager_greedy"]
    assert saved["predicted"] and "NOT measured" in (tmp_path / "README.md").read_text()
