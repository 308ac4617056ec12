"""experiments/bench_gpu.py runs every phase end to end on CPU with tiny models (--smoke), writing its
results after each phase, and a phase run again replaces only its own entry."""

import json
import runpy
from pathlib import Path

bench_gpu = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_gpu.py"))


def test_bench_gpu_smoke_runs_every_phase_and_resumes(tmp_path):
    result = bench_gpu["main"](["--smoke", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    ph = saved["phases"]
    assert set(bench_gpu["PHASES"]) <= set(ph)
    assert ph["first"]["ok"]  # the compiled step equals eager and HF greedy
    runs = {**ph["hf"], **ph["treespec"]}
    assert {"hf_generate_eager", "hf_generate_static_compiled", "treespec_eager_weak_draft",
            "treespec_compiled_weak_draft", "treespec_compiled_random_draft"} <= set(runs)
    assert all(r["tokens"] == 24 for r in runs.values())  # same prompts and token counts everywhere
    # draft == target in float32: every uncut step accepts the whole 4-token chain, eager and compiled
    assert ph["validate"]["eager"]["ok"] and ph["validate"]["compiled"]["ok"]
    assert ph["validate"]["compiled_equals_eager_greedy"]
    # the weak draft (the target's first layer) is accepted less often than draft = target
    assert runs["treespec_eager_weak_draft"]["tau"] < ph["validate"]["eager"]["tau"]
    assert ph["predict"] and "NOT measured" in (tmp_path / "README.md").read_text()
    before = ph["costs"]
    bench_gpu["main"](["--smoke", "--out", str(tmp_path), "--phase", "first"])
    again = json.loads((tmp_path / "results.json").read_text())["phases"]
    assert again["costs"] == json.loads(json.dumps(before)) and again["first"]["ok"]  # the rest kept
    assert result["setup"]["smoke"]
