"""experiments/bench_gpu.py runs every phase end to end on CPU with tiny models (--smoke), writing its
results after each phase, and a phase run again replaces only its own entry."""

import json
import runpy
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench_gpu() -> dict:
    """The script's namespace, loaded when a test here runs (its imports reach into inductor's freezing passes:
    seconds that a worker collecting this file but running none of it need not spend)."""
    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_gpu.py"))


def test_bench_gpu_smoke_runs_every_phase_and_resumes(bench_gpu, tmp_path):
    # a CUDA lever first: named as not run here, and the smoke's one lever after it: the draft's down projection
    # as a split-K sum in the level's graph, for phase levels and again for the sweep, which replays its graphs
    lever = "default+matmul+split-k"
    result = bench_gpu["main"](["--smoke", "--out", str(tmp_path), "--levers", "default+gemm-autotune", lever,
                                "--sweep-lever", "best"])
    saved = json.loads((tmp_path / "results.json").read_text())
    ph = saved["phases"]
    assert set(bench_gpu["PHASES"]) <= set(ph)
    assert ph["first"]["ok"]  # the compiled step equals eager and HF greedy
    assert {c["step"] for c in ph["first"]["cases"]} == {"captured"}  # the draft ran on the device too
    assert len({tuple(c["accepted_hist"]) for c in ph["first"]["cases"]}) > 1  # steps of varying acceptance
    # its 40-token prompt compiles the prefill (the smoke's other prompts are short enough to prefill eagerly)
    assert ph["first"]["cases"][1]["prompt_len"] == 40 and ph["first"]["cases"][1]["new_graphs"] > 0
    assert set(ph["hf"]) == {"hf_generate_eager", "hf_generate_static_compiled"}
    # smoke budget 8: captured and eager; all the same prompts and token counts
    assert set(ph["treespec"]) == {"compiled_budget8", "eager_budget8"}
    assert {r["step"] for k, r in ph["treespec"].items() if k.startswith("compiled")} == {"captured"}
    assert all(r["tokens"] == 24 for r in [*ph["hf"].values(), *ph["treespec"].values()])
    captured, eager = ph["treespec"]["compiled_budget8"]["profile"], ph["treespec"]["eager_budget8"]["profile"]
    assert captured["per_step_top_level_aten_ops"] < eager["per_step_top_level_aten_ops"] / 10
    # draft == target in float32: every uncut step accepts the whole 4-token chain, eager and compiled
    assert ph["validate"]["eager"]["ok"] and ph["validate"]["compiled"]["ok"]
    assert ph["validate"]["compiled_equals_eager_greedy"]
    weak = ph["validate"]["weak_draft"]
    assert weak["compiled_equals_eager"] and weak["compiled_equals_hf"]
    assert 1.0 < weak["tau_compiled"] < ph["validate"]["compiled"]["tau"]  # partial acceptance
    assert ph["predict"] and "NOT measured" in (tmp_path / "README.md").read_text()
    # phase levels compiles the sweep's envelope under its lever; phase sweep, under the same lever, runs every tree
    # of the envelope on those graphs: none compiles anything
    levers = ph["levels"]["levers"]
    assert list(levers) == [lever] and levers[lever]["new_graphs"] > 0 and levers[lever]["split_k"]
    assert levers[lever]["split_k_products"] == 0  # the smoke's eager backend runs no inductor pass (test_split_k's)
    assert ph["levels"]["cuda_only"] == ["default+gemm-autotune"]
    assert "Not run (CUDA levers, this run's device is not one): default+gemm-autotune." in (
        tmp_path / "README.md").read_text()
    # one more level: the 8-level chain less the 4-level one (same graphs), beside drafting per forward
    assert {"level_ms", "level_ms_per_forward", "drafting_fixed_ms"} <= set(levers[lever])
    # where the lever's compile went, longest first: phases of a second or more, which a fast host may not have
    # (CI's had none); the readings themselves are tested below on a compile of known phases
    phases = levers[lever]["compile_phases_s"]
    assert list(phases.values()) == sorted(phases.values(), reverse=True) and min(phases.values(), default=1.0) >= 1.0
    assert "one more level" in (tmp_path / "README.md").read_text()
    runs = ph["sweep"]["runs"]
    assert len(runs) >= 3 and {r["step"] for r in runs.values()} == {"captured"} and ph["sweep"]["lever"] == lever
    assert all(r["new_graphs"] == 0 for r in runs.values())
    # every builder sized by the same swept costs: the chain a chain, each k-ary tree of its width; in the report
    sized = ph["sweep"]["device_sized_builders"]
    # (no levels where the smoke's measured costs make drafting lose: a timing the host decides)
    assert set(sized) == {"chain", "kary-2", "kary-4"} and set(sized["chain"]["widths"]) <= {1}
    assert sized["kary-4"]["widths"][:1] in ([], [1], [4]) and "Each builder at its own best size" in (
        tmp_path / "README.md").read_text()
    assert ph["first"]["second_shape_compiled_nothing"]
    before = ph["costs"]
    bench_gpu["main"](["--smoke", "--out", str(tmp_path), "--phase", "predict"])
    again = json.loads((tmp_path / "results.json").read_text())["phases"]
    assert again["costs"] == json.loads(json.dumps(before)) and again["first"]["ok"]  # the rest kept
    assert again["predict"] == json.loads(json.dumps(ph["predict"]))  # the same inputs: the same choice
    assert result["setup"]["smoke"]


def test_compile_phases_between_two_readings_name_where_a_compile_went(bench_gpu):
    import sys

    import torch

    profiling = sys.modules["gpu_protocol.profiling"]
    before = profiling.compile_phase_seconds()  # (no torch._dynamo.reset between readings: it clears them)
    torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="eager")(torch.randn(8))  # a new function: compiles
    after = profiling.compile_phase_seconds()
    grown = profiling.compile_phases_between(before, after, least=0.0)
    assert grown and list(grown.values()) == sorted(grown.values(), reverse=True)
    assert sum(after.values()) > sum(before.values())  # the compile's time was read
    # the threshold keeps the long phases only, and a reading against itself has none
    assert profiling.compile_phases_between({"a": 0.0, "b": 1.0}, {"a": 2.5, "b": 1.5, "c": 1.0}) == {
        "a": 2.5, "c": 1.0}
    assert profiling.compile_phases_between(after, after) == {}


def test_phase_treespec_run_again_adds_its_runs_and_other_phases_replace_theirs(bench_gpu):
    merged = bench_gpu["merged"]
    first = {"compiled_budget8": {"tau": 1.0}, "eager_budget8": {"tau": 1.0}}
    again = merged("treespec", first, {"compiled_budget12": {"tau": 2.0}, "compiled_budget8": {"tau": 3.0}})
    assert again == {"compiled_budget8": {"tau": 3.0}, "eager_budget8": {"tau": 1.0}, "compiled_budget12": {"tau": 2.0}}
    assert merged("treespec", None, {"a": 1}) == {"a": 1}
    assert merged("sweep", {"runs": 1, "envelope": 2}, {"runs": 3}) == {"runs": 3}
    # a second run of phase levels (another device call, the same --out) adds its levers; one timed again replaces
    first_levels = {"shape": "s", "levers": {"default": {"level_ms": 1.5}, "default+math": {"level_ms": 1.4}},
                    "skipped": ["default+flex"]}
    later = {"shape": "s", "levers": {"default+flex": {"level_ms": 1.2}, "default+math": {"level_ms": 1.3}},
             "skipped": ["default+max-autotune"]}
    assert merged("levels", first_levels, later) == {
        "shape": "s", "levers": {"default": {"level_ms": 1.5}, "default+math": {"level_ms": 1.3},
                                 "default+flex": {"level_ms": 1.2}}, "skipped": ["default+max-autotune"]}
    assert merged("levels", {"levers": {}, "skipped": ["a"]}, {"levers": {"b": {}}, "skipped": ["c"]})["skipped"] == [
        "a", "c"]


def test_sweep_lever_best_is_the_fastest_timed_level_and_refuses_without_levels(bench_gpu):
    pick = bench_gpu["sweep_lever"]
    done = {"levels": {"levers": {"baseline": {"level_ms": 2.0}, "freezing": {"level_ms": 1.5},
                                  "sdpa-efficient": {"error": "RuntimeError: no kernel"}}}}
    assert pick("best", done) == ("freezing", bench_gpu["LEVERS"]["freezing"])  # the failed lever is not a candidate
    assert pick("baseline", {})[0] == "baseline" and pick("bucket-256", {})[1].bucket == 256
    with pytest.raises(SystemExit, match="run --phase levels first"):
        pick("best", {})
    with pytest.raises(SystemExit, match="not one of LEVERS"):
        pick("fastest", done)
    # a rehearsal off CUDA whose levers are all CUDA ones: phase levels ran and says why it timed nothing
    with pytest.raises(SystemExit, match=r"timed no lever here \(default\+gemm-autotune run on CUDA only\)"):
        pick("best", {"levels": {"levers": {}, "cuda_only": ["default+gemm-autotune"]}})


def test_sweep_lever_best_compares_one_more_level_only_where_every_lever_has_it(bench_gpu):
    pick = bench_gpu["sweep_lever"]
    new = {"default": {"level_ms": 1.30, "level_ms_per_forward": 1.60},
           "default+math": {"level_ms": 1.35, "level_ms_per_forward": 1.50}}
    assert pick("best", {"levels": {"levers": new}})[0] == "default"  # one more level decides
    old = {**new, "baseline": {"level_ms": 1.55}}  # a record from before: drafting per forward only
    assert pick("best", {"levels": {"levers": old}})[0] == "default+math"


def test_step_costs_fit_one_more_level_and_a_steps_fixed_drafting_past_an_outlier():
    """Drafting = fixed + level * depth, fitted robustly over the shapes: one shape timed through a hiccup does not
    move it; with one depth only, drafting per forward."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from gpu_protocol.sweep import step_costs

    def run(depth: int, drafting: float) -> dict:
        return {"depth": depth, "per_step_seconds": {"drafting": drafting, "verifying": 2.6e-3, "overhead": 3e-4}}

    runs = {f"s{i}": run(d, 0.8e-3 + 1.3e-3 * d) for i, d in enumerate([2, 3, 4, 4, 6, 8, 8])}
    runs["hiccup"] = run(8, 30e-3)
    c = step_costs(runs)
    assert c["level"] == pytest.approx(1.3e-3) and c["drafting_fixed"] == pytest.approx(0.8e-3)
    assert c["level_per_forward"] > 1.4e-3 and c["verify"] == pytest.approx(2.6e-3)
    flat = step_costs({"a": run(4, 6e-3), "b": run(4, 6.4e-3)})
    assert flat["level"] == pytest.approx(1.55e-3) and flat["drafting_fixed"] == 0.0


def test_hf_under_freezing_is_timed_and_the_ratios_take_hfs_fastest(bench_gpu, monkeypatch):
    """Phase hf's third HF run (static cache + compile under inductor's weight freezing: the baselines' own method,
    whose compiled tokens tests/test_freezing.py checks against HF's greedy decoding) warms up on the first prompt,
    then times every prompt; the ratios' base is the fastest of HF's compiled runs."""
    from types import SimpleNamespace

    import torch

    from treespec.bench import compare
    from treespec.models.tiny import tiny_model

    calls = []

    def timed_call(model, ids, n, static_compiled=False, compile_backend="inductor"):  # as the method calls it
        calls.append((list(ids), n, static_compiled, torch._inductor.config.freezing, compile_backend))
        return [0] * n, 0.5

    monkeypatch.setattr(compare, "hf_generate", timed_call)
    model = tiny_model("qwen2", vocab=40, seed=3)
    b = SimpleNamespace(args=SimpleNamespace(new_tokens=4), prompts=[[1, 2, 3], [4, 5, 6, 7]])
    out = bench_gpu["hf_generate_frozen"](b, model)
    frozen = (True, True, "inductor")  # static cache, compiled by inductor under freezing
    assert calls == [([1, 2, 3], 4, *frozen), ([1, 2, 3], 4, *frozen), ([4, 5, 6, 7], 4, *frozen)]
    assert out == {"tokens": 8, "seconds": 1.0, "tok_s": 8.0}  # the warm-up untimed
    assert model.generation_config.eos_token_id is None  # every prompt decodes its whole length
    fastest = bench_gpu["hf_fastest"]
    ph = {"hf": {"hf_generate_eager": {"tok_s": 50.0}, "hf_generate_static_compiled": {"tok_s": 200.0},
                 "hf_generate_static_compiled_frozen": {"tok_s": 230.0}}}
    assert fastest(ph) == 230.0 and fastest({"hf": {"hf_generate_eager": {"tok_s": 50.0}}}) is None


def test_the_math_lever_lowers_attention_to_products_and_restores_sdpas_kernels(bench_gpu):
    """Lever ``default+math`` switches SDPA's fused kernels off for its block (a compiled SDPA call becomes two batched
    products and a softmax in the graph AOT hands inductor; a CPU takes the same switches), and puts them back."""
    import torch
    from torch._functorch.aot_autograd import aot_module_simplified

    def attention_ops() -> list[str]:
        seen: list[str] = []

        def backend(gm, example):
            def forward(graph, _):
                seen.extend(str(n.target) for n in graph.graph.nodes if n.op == "call_function")
                return graph
            return aot_module_simplified(gm, example, fw_compiler=forward)

        q, k, v, mask = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16), torch.zeros(
            1, 1, 8, 32)
        torch._dynamo.reset()
        torch.compile(torch.nn.functional.scaled_dot_product_attention, backend=backend)(q, k, v, attn_mask=mask)
        return [s for s in seen if "attention" in s or "bmm" in s]

    before = bench_gpu["sdpa_backends"]()
    fused = attention_ops()
    assert fused and all("scaled_dot_product" in s for s in fused)  # a fused kernel (CPU: flash for CPU)
    with bench_gpu["lever"](bench_gpu["LEVERS"]["default+math"]):
        assert not any(bench_gpu["sdpa_backends"]().values())
        assert attention_ops() == ["aten.bmm.default", "aten.bmm.default"]
    assert bench_gpu["sdpa_backends"]() == before and attention_ops() == fused
    torch._dynamo.reset()


def test_a_lever_entered_again_gets_its_own_runners_back(bench_gpu):
    """Runners are keyed by models and shapes, not compile settings, so each lever holds its own: entering another
    sets them aside and entering it again restores them (``--sweep-lever best`` then replays the winner's graphs
    whichever lever ran last; they were dropped, and the winner compiled again: minutes on a cold H200)."""
    import sys

    from treespec.core import captured
    from treespec.core.runners import RunnerCache

    levers = sys.modules["gpu_protocol.levers"]
    first, second = bench_gpu["LEVERS"]["default"], bench_gpu["LEVERS"]["baseline"]
    before, kept = (captured.RUNNERS, levers.APPLIED[0]), dict(levers.KEPT)
    captured.RUNNERS, levers.APPLIED[0] = RunnerCache(2), None  # this test's own, the fake runner in none else
    levers.KEPT.clear()
    try:
        with bench_gpu["lever"](first):
            held = captured.RUNNERS
            held.get("a runner", lambda: "compiled graphs")
        with bench_gpu["lever"](second):
            assert captured.RUNNERS is not held and len(captured.RUNNERS) == 0
        with bench_gpu["lever"](first):
            assert captured.RUNNERS is held and held.values() == ["compiled graphs"]
    finally:  # the other tests' runners as they were
        captured.RUNNERS, levers.APPLIED[0] = before
        levers.KEPT.clear()
        levers.KEPT.update(kept)


def test_gemm_autotune_tunes_the_level_graph_alone_and_keeps_freezing(bench_gpu, monkeypatch):
    """A ``gemm_autotune`` lever compiles the draft level's graph with inductor's ``max_autotune_gemm`` on (until a
    call of it compiles nothing) and the runner's other graphs without; a lever cannot claim freezing under a mode
    that compiles unfrozen (``default+...+max-autotune`` levers would have been timed unfrozen while their records
    said frozen: ``compiling.graph_settings`` freezes under reduce-overhead alone). A lever's split-K (decompose_k,
    or the split-K pass over the draft's products, with autotuning off) and programmatic dependent launch apply to
    the level's graph alone, as well."""
    import sys
    import types

    import torch

    from treespec.core import captured_runner, compiling

    levers = sys.modules["gpu_protocol.levers"]
    with pytest.raises(ValueError, match="compiles without freezing"):
        levers.Lever("unfrozen", mode="max-autotune")
    for name, setting in levers.LEVERS.items():  # what each lever claims is what its graphs get
        monkeypatch.setattr(compiling, "CUDA_GRAPHS_FREEZE", setting.freezing)
        assert compiling.graph_settings("inductor", setting.mode or "reduce-overhead")[0] == setting.freezing, name

    with pytest.raises(ValueError, match="set gemm_autotune=True"):
        levers.Lever("split-K without autotuning", decompose_k=5)

    def setting_seen(_runner) -> tuple:
        config = torch._inductor.config
        return (config.max_autotune_gemm, config.triton.decompose_k_threshold, config.triton.enable_pdl,
                getattr(config.post_grad_custom_pre_pass, "splits", None), config.unroll_reductions_threshold)

    default = setting_seen(None)
    assert default[0] is False and default[2] is False and default[3] is None and default[4] == 8
    with pytest.raises(ValueError, match="splits the draft's products: pass the draft"):
        bench_gpu["lever"](levers.LEVERS["default+matmul+split-k"]).__enter__()
    draft = sys.modules["gpu_protocol.models"].build("draft", True, torch.float32, torch.device("cpu"), 1)
    runner = object()
    for name, seen in (("default+matmul+gemm-autotune", (True, *default[1:3], None, 8)),
                       ("default+matmul+gemm-autotune+split-k+pdl", (True, 5, True, None, 8)),
                       # the tiny draft's down projection (64 -> 32), o (32 -> 32) and q/k/v (32 -> 32 + 2 x 16)
                       ("default+matmul+split-k+o+qkv", (False, default[1], False,
                                                         {(64, 32): 8, (32, 32): 8, (32, 64): 8}, 9))):
        monkeypatch.undo()
        with bench_gpu["lever"](levers.LEVERS[name], draft):
            compile_graph = captured_runner.compile_graph
            other = compile_graph(types.MethodType(setting_seen, runner), compiling.UNCOMPILED, None)
            monkeypatch.setattr(captured_runner.CapturedRunner, "_level", setting_seen)  # as if it were the level
            level = compile_graph(types.MethodType(setting_seen, runner), compiling.UNCOMPILED, None)
        assert other() == default, name  # not the level: as compile_graph makes it
        # the level's first call compiles under the settings (uncompiled here: compiles nothing) ...
        assert level() == seen, name
        assert level() == default, name  # ... so the next runs without switching them
        assert captured_runner.compile_graph is compiling.compile_graph
        assert setting_seen(None) == default


def test_the_sweeps_report_says_why_its_ratio_column_is_empty(bench_gpu):
    """A device call that leaves phase hf out (gpu-h200-autotune's, to fit its levers) reports the sweep without HF's
    figure: the report says the column is empty and how to fill it, and fills it when HF's figure is there."""
    import sys

    report = sys.modules["gpu_protocol.report"]
    root = Path(__file__).resolve().parents[1] / "experiments" / "results" / "gpu-h200-autotune" / "2"
    phases = json.loads((root / "results.json").read_text())["phases"]
    assert "hf" not in phases and bench_gpu["hf_fastest"](phases) is None
    without = "\n".join(report.sweep_report(phases["sweep"], None))
    assert "The ratio column is empty: phase hf has not run" in without
    assert "| device-sized | 64 | 7 |" in without and "611 | |" in without
    with_hf = "\n".join(report.sweep_report(phases["sweep"], 247.5))  # HF's fastest on an H200 the day before
    assert "The ratio column is empty" not in with_hf and "611 | 2.47x |" in with_hf
    assert "(3221 kernels and 9993 us of device time per step)" in with_hf
