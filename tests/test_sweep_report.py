"""The figures of a sweep report carry their spread over prompts; tau is reported two ways.

Hand-built records with known per-prompt values check the interval code (a known answer, paired
speedups, refusals), the two tau definitions on a run whose last step is cut, the predicted
per-depth acceptance of a tree, and the report's prediction section.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from tree_builders import chain, kary

from treespec.bench import intervals
from treespec.core.stats import Stats
R = importlib.import_module("treespec.bench.sweep.report")  # the module (the package exports a function of that name)
F = importlib.import_module("treespec.bench.sweep.figures")
M = importlib.import_module("treespec.bench.sweep.markdown")


def _treespec(tokens, steps, seconds, *, uncut_tokens=None, uncut_steps=None, seed=0, predicted=None,
              tried=(), accepted=(), predicted_depth=None) -> dict:
    params = {"kind": "treespec", "target": "t", "dataset": "d", "eval": [0, len(tokens)], "max_new_tokens": 8,
              "max_prompt_tokens": 0, "temperature": 0.0, "top_p": 1.0, "seed": seed, "device": "cpu",
              "dtype": "float32", "drafters": "model", "builder": "chain", "budget": 4, "max_depth": None}
    result = {"tokens_per_prompt": list(tokens), "steps_per_prompt": list(steps), "complete": True,
              "uncut_tokens_per_prompt": list(uncut_tokens if uncut_tokens is not None else tokens),
              "uncut_steps_per_prompt": list(uncut_steps if uncut_steps is not None else steps),
              "tau": sum(tokens) / sum(steps), "depth_tried": list(tried), "depth_accepted": list(accepted)}
    if predicted is not None:
        result["predicted_tau"] = predicted
    if predicted_depth is not None:
        result["predicted_depth_acceptance"] = list(predicted_depth)
    return {"key": f"k{seed}", "kind": "treespec", "status": "ok", "params": params, "result": result,
            "timing": {"per_prompt_seconds": list(seconds), "wall_seconds": sum(seconds)}}


def _baseline(record: dict, seconds, method: str = "target", tokens=None) -> dict:
    params = {k: record["params"][k] for k in F._SAME_RUN if k in record["params"]}  # batch_size: only above 1
    params.update(kind="baseline", method=method)
    tokens = tokens if tokens is not None else record["result"]["tokens_per_prompt"]
    return {"key": f"b-{method}-{params['seed']}", "kind": "baseline", "status": "ok", "params": params,
            "result": {"tokens_per_prompt": list(tokens), "complete": True},
            "timing": {"per_prompt_seconds": list(seconds), "wall_seconds": sum(seconds)}}


def test_tau_interval_is_the_ratio_of_sums_with_the_bootstrap_interval() -> None:
    rng = np.random.default_rng(1)
    steps = rng.integers(10, 30, size=20)
    tokens = steps * 3 + rng.integers(0, 10, size=20)
    rec = _treespec(tokens, steps, np.ones(20))
    got = F.tau_interval([rec])
    want = intervals.ratio_of_sums(tokens, steps)
    assert got.estimate == pytest.approx(tokens.sum() / steps.sum())
    assert (got.low, got.high) == pytest.approx((want.low, want.high))
    assert got.low < got.estimate < got.high and got.n == 20


def test_a_known_constant_ratio_gives_a_zero_width_interval() -> None:
    rec = _treespec([8, 8, 8, 8], [2, 2, 2, 2], [1.0, 2.0, 0.5, 4.0])
    tau = F.tau_interval([rec])
    assert (tau.estimate, tau.low, tau.high) == (4.0, 4.0, 4.0)
    speed = F.speed_interval([rec])
    assert speed.estimate == pytest.approx(32 / 7.5)
    assert speed.low < speed.estimate < speed.high  # per-prompt speeds differ: a real spread


def test_seeds_are_pooled_prompt_by_prompt() -> None:
    a = _treespec([10, 10], [5, 2], [1, 1], seed=0)
    b = _treespec([10, 10], [2, 5], [1, 1], seed=1)
    tau = F.tau_interval([a, b])
    assert tau.n == 4 and tau.estimate == pytest.approx(40 / 14)


def test_speedup_is_paired_per_prompt() -> None:
    # prompt times vary 8-fold, but the baseline is exactly 2.5x slower on every prompt:
    # the paired interval is the single value 2.5 (unpaired it would be wide)
    seconds = [1.0, 8.0, 2.0, 4.0, 3.0]
    rec = _treespec([8] * 5, [2] * 5, seconds)
    base = _baseline(rec, [2.5 * s for s in seconds])
    got = F.speedup_interval([rec], [base], "target")
    assert (got.estimate, got.low, got.high) == pytest.approx((2.5, 2.5, 2.5))


def test_speedup_is_refused_without_the_same_tokens_or_baseline() -> None:
    rec = _treespec([8, 8], [2, 2], [1.0, 1.0])
    assert F.speedup_interval([rec], [], "target") is None
    short = _baseline(rec, [2.0, 2.0], tokens=[8, 7])
    assert F.speedup_interval([rec], [short], "target") is None
    other_seed = _baseline(_treespec([8, 8], [2, 2], [1.0, 1.0], seed=5), [2.0, 2.0])
    assert F.speedup_interval([rec], [other_seed], "target") is None
    assert F.speedup_interval([rec], [_baseline(rec, [2.0, 2.0], method="assisted")], "target") is None


def test_records_without_per_prompt_figures_give_no_interval() -> None:
    rec = _treespec([8, 8], [2, 2], [1.0, 1.0])
    del rec["result"]["steps_per_prompt"]
    assert F.tau_interval([rec]) is None


def test_the_two_tau_definitions_on_a_run_with_a_cut_last_step() -> None:
    # a run of 10 tokens: two full steps of 4, then a last step cut by max_new_tokens to 2
    s = Stats(steps=3, new_tokens=10, step_tokens=[4, 4, 2], step_cut=[False, False, True])
    assert s.tau == pytest.approx(10 / 3)
    assert s.tau_uncut == pytest.approx(4.0)
    assert s.cut_steps == 1
    # the same run as a sweep record: tau over all steps vs over uncut steps, per prompt
    rec = _treespec([10, 10], [3, 3], [1.0, 1.0], uncut_tokens=[8, 8], uncut_steps=[2, 2], predicted=4.0)
    assert F.tau_interval([rec]).estimate == pytest.approx(10 / 3)
    assert F.tau_interval([rec], uncut=True).estimate == pytest.approx(4.0)
    a = F.agreement(rec)
    assert a["gap"] == pytest.approx(0.0) and a["agrees"]
    assert a["cut_cost"] == pytest.approx((10 / 3) / 4 - 1)


def test_agreement_says_when_the_prediction_is_outside_the_interval() -> None:
    rng = np.random.default_rng(0)
    steps = rng.integers(20, 30, size=20)
    tokens = (steps * rng.uniform(2.8, 3.2, size=20)).round().astype(int)
    inside = F.agreement(_treespec(tokens, steps, np.ones(20), predicted=3.0))
    outside = F.agreement(_treespec(tokens, steps, np.ones(20), predicted=4.0))
    assert inside["agrees"] and not outside["agrees"]
    assert outside["gap"] == pytest.approx(tokens.sum() / steps.sum() / 4.0 - 1)
    assert F.agreement(_treespec(tokens, steps, np.ones(20))) is None  # nothing predicted


def test_one_prompt_leaves_the_agreement_unknown(tmp_path) -> None:
    # one evaluation prompt: no interval, so neither a hit nor a miss, even where predicted and measured agree
    for predicted in (3.0, 4.0):
        rec = _treespec([9], [3], [1.0], predicted=predicted, tried=[3], accepted=[2], predicted_depth=[0.9])
        assert F.agreement(rec)["agrees"] is None
        lines = M._prediction_section([rec], tmp_path)
        row = next(line for line in lines if line.startswith("| d | 0 | chain | 4 |"))
        assert row.split("|")[-3].strip() == "-" and "**no**" not in row
        assert not any(line.startswith("### Per-depth") for line in lines)


def test_predicted_depth_acceptance_of_a_tree() -> None:
    # a chain: every node has one child, accepted with a_1 whatever the depth
    assert chain(3).depth_acceptance([0.8, 0.1]) == pytest.approx([0.8, 0.8, 0.8])
    # k-ary widths (2, 1): the root tries two children (a_1 + a_2 = 0.8); at depth 1 each child has
    # one child, accepted with a_1 = 0.6 whichever was reached
    assert kary([2, 1]).depth_acceptance([0.6, 0.2]) == pytest.approx([0.8, 0.6])
    # a matrix: row d holds the children of depth-d nodes
    assert kary([2, 1]).depth_acceptance([[0.6, 0.2], [0.5, 0.0]]) == pytest.approx([0.8, 0.5])
    # consistent with expected_tokens on a chain: 1 + a + a^2 + a^3
    a = 0.7
    rates = chain(3).depth_acceptance([a])
    assert 1 + sum(math.prod(rates[:d]) for d in range(1, 4)) == pytest.approx(chain(3).expected_tokens([a]))


def test_report_shows_intervals_and_locates_a_missed_prediction(tmp_path) -> None:
    import json

    rng = np.random.default_rng(3)
    steps = [int(x) for x in rng.integers(20, 30, size=12)]
    tokens = [3 * x for x in steps]
    seconds = [float(x) for x in rng.uniform(1, 2, size=12)]
    rec = _treespec(tokens, steps, seconds, predicted=4.2, tried=[100, 80, 40], accepted=[80, 40, 20],
                    predicted_depth=[0.8, 0.75, 0.7])
    rec["result"].update(mean_tree_size=4.0, accepted_hist=[1], tree=None)
    rec["timing"].update(tokens_per_second=1.0, drafting_seconds=1.0, verifying_seconds=1.0, overhead_seconds=0.1)
    base = _baseline(rec, [2 * x for x in seconds])
    base["result"].update(prompts=12, new_tokens=sum(tokens))
    base["timing"]["tokens_per_second"] = 0.5
    rec["speedup"] = {"target": 2.0}
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (base, rec)), encoding="utf-8")
    text = R.report(path).read_text(encoding="utf-8")
    assert "2.00 [2.00, 2.00]" in text  # the paired speedup with its interval
    assert "## Predicted vs measured tau" in text
    row = next(line for line in text.splitlines() if line.startswith("| d | 0 | chain | 4 | 4.20 |"))
    assert "3.00 [3.00, 3.00]" in row and "**no**" in row and "-28.6%" in row
    assert "### Per-depth acceptance where the prediction misses" in text
    assert "| 2 | 80 | 0.500 | 0.750 | -0.250 |" in text
    for png in ("tau_vs_budget.png", "speedup_vs_budget.png", "predicted_vs_measured_tau.png"):
        assert (tmp_path / png).stat().st_size > 0


def test_where_the_gap_is_tells_a_prompt_shift_from_a_gap_that_grows_with_depth() -> None:
    # rows: (depth, steps reaching it, measured rate, predicted rate)
    shift = F.where_the_gap_is([(1, 500, 0.75, 0.62), (2, 300, 0.76, 0.62), (3, 200, 0.74, 0.62)])
    assert "already +0.130 off at depth 1" in shift and "more often" in shift and "grows" not in shift
    grows = F.where_the_gap_is([(1, 500, 0.64, 0.62), (2, 300, 0.75, 0.62), (3, 200, 0.90, 0.62)])
    assert "grows with depth (+0.020 at depth 1, +0.205 on average below)" in grows
    assert "underrates deep trees" in grows and "already" not in grows
    both = F.where_the_gap_is([(1, 500, 0.72, 0.62), (2, 300, 0.85, 0.62)])
    assert "already +0.100 off" in both and "grows with depth" in both
    falls = F.where_the_gap_is([(1, 500, 0.80, 0.80), (2, 300, 0.60, 0.80)])
    assert "opens below depth 1" in falls and "less often than the vector assumes" in falls
    small = F.where_the_gap_is([(1, 900, 0.99, 0.97), (2, 800, 0.98, 0.95)])
    assert "no depth is off by 0.05 or more (largest +0.030 at depth 2)" in small
    assert F.where_the_gap_is([(1, 0, 0.0, 0.5)]) == ""  # nothing reached: nothing to locate


def test_greedy_agreement_is_counted_for_treespec_points_and_speculative_baselines() -> None:
    rec = _treespec([8, 8, 8], [3, 3, 3], [1.0, 1.0, 1.0])
    rec["result"]["output_digests"] = ["a", "b", "c"]
    target = _baseline(rec, [2.0, 2.0, 2.0])
    target["result"]["output_digests"] = ["a", "b", "x"]
    assisted = _baseline(rec, [1.0, 1.0, 1.0], method="assisted")
    assisted["result"]["output_digests"] = ["a", "y", "z"]
    bases = [target, assisted]
    assert F.same_greedy_outputs(rec, bases) == "2/3"
    assert F.same_greedy_outputs(assisted, bases) == "1/3"
    assert F.same_greedy_outputs(target, bases) is None  # the reference itself
    sampled = _treespec([8], [3], [1.0])
    sampled["params"]["temperature"] = 1.0
    assert F.same_greedy_outputs(sampled, bases) is None  # outputs are random at T > 0


def test_cpu_model_tells_two_cpu_generations_apart() -> None:
    from treespec.common.machine import cpu_model

    block = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: {f}\nmodel\t\t: {m}\n"
             "model name\t: AMD EPYC\nstepping\t: 1\n\n")
    zen5 = cpu_model(block.format(n=0, f=26, m=2) + block.format(n=1, f=99, m=9))  # first block only
    zen4 = cpu_model(block.format(n=0, f=25, m=17))
    assert zen5 == "AMD EPYC (family 26, model 2, stepping 1)" and zen4 != zen5


def test_records_name_the_device_and_machine_by_the_shared_rule() -> None:
    """A record's device and machine come from ``treespec.common.machine`` (one home), with the CPU's
    family/model/stepping numbers where /proc/cpuinfo has them."""
    from treespec.bench.sweep.records import meta
    from treespec.common.machine import cpu_model, device_name, machine

    got = meta({"name": "t", "run": {"device": "cpu"}})
    assert got["device_name"] == device_name("cpu") == cpu_model()
    assert got["machine"] == machine("cpu") and got["machine"].startswith(got["device_name"] + ", ")


def test_speedups_pair_only_records_measured_on_the_same_machine() -> None:
    rec = _treespec([8] * 4, [2] * 4, [1.0] * 4)
    base = _baseline(rec, [2.0] * 4)
    assert F.speedup_interval([rec], [base], "target").estimate == pytest.approx(2.0)  # neither recorded
    rec["meta"] = {"machine": "AMD EPYC (family 26, model 2, stepping 1), 2 cores"}
    assert F.speedup_interval([rec], [base], "target") is None  # negative control: another machine
    base["meta"] = dict(rec["meta"])
    assert F.speedup_interval([rec], [base], "target").estimate == pytest.approx(2.0)
    other = _treespec([8] * 4, [2] * 4, [1.0] * 4)
    other["params"]["temperature"] = 1.0
    other["meta"] = {"machine": "AMD EPYC (family 25, model 17, stepping 1), 2 cores"}
    note = M._machine_note([rec, base, other])
    assert note.startswith("**Machines:") and "family 25" in note and "d T=1" in note and "not comparable" in note
    assert M._machine_note([rec, base]).startswith("Machine: AMD EPYC (family 26")


def test_where_the_gap_is_names_a_single_deep_outlier_without_calling_it_small() -> None:
    rows = [(1, 250, 0.98, 0.958), (2, 245, 0.967, 0.956), (3, 200, 0.98, 0.958), (4, 174, 0.983, 0.91)]
    text = F.where_the_gap_is(rows)
    assert "mostly at depth 4 (+0.073)" in text and "no depth is off" not in text


def _point(builder: str, budget: int, seconds, depth: int, size: float, verify: float, draft: float) -> dict:
    rec = _treespec([16, 16, 16, 16], [4, 4, 4, 4], seconds, predicted=4.0 if builder == "chain" else 3.5)
    rec["params"].update(builder=builder, budget=budget)
    rec["key"] = f"{builder}-{budget}"
    rec["result"].update(steps=16, mean_tree_size=size,
                         tree={"depth": depth, "size": size, "paths": [[0] * (i + 1) for i in range(depth)]
                               if builder == "chain" else [[i] for i in range(depth)]},
                         acceptance={"vector": [0.6, 0.2, 0.1], "file": "a.json", "mode": "topk", "beta": 0.6})
    rec["timing"].update(verifying_seconds=16 * verify, drafting_seconds=16 * draft)
    return rec


def test_tree_or_chain_verdict_pairs_the_fastest_tree_with_the_chain() -> None:
    chain8 = _point("chain", 8, [1.0, 2.0, 1.5, 3.0], depth=7, size=8, verify=0.2, draft=0.35)
    kary8 = _point("kary", 8, [1.3, 2.7, 2.0, 3.9], depth=2, size=7, verify=0.25, draft=0.1)  # slower than the chain
    seq8 = _point("sequoia", 8, [1.1, 2.3, 1.6, 3.4], depth=5, size=8, verify=0.2, draft=0.3)  # the fastest tree
    tied = _point("sequoia", 16, [1.0, 2.1, 1.4, 3.1], depth=6, size=16, verify=0.3, draft=0.3)
    chain16 = _point("chain", 16, [1.05, 2.0, 1.5, 3.0], depth=8, size=9, verify=0.2, draft=0.4)
    rows = F.tree_vs_chain([chain8, kary8, seq8, tied, chain16])
    assert [(v["budget"], v["tree"]) for v in rows] == [(8, "sequoia"), (16, "sequoia")]
    first = rows[0]
    assert first["ratio"].estimate == pytest.approx(7.5 / 8.4) and first["winner"] == "chain"  # paired: CI below 1
    assert first["draft_level"]["chain"] == pytest.approx(0.05) and first["siblings"] == pytest.approx(0.3)
    assert rows[1]["winner"].startswith("neither")
    text = "\n".join(M._verdict_section([chain8, kary8, seq8, tied, chain16]))
    assert "## Tree or chain?" in text and "chain: 1 (d T=0 B=8)" in text
    assert F.tree_vs_chain([kary8, seq8]) == []  # no chain: nothing to compare
    for rec in (chain8, seq8):  # a greedy grid of block alone: its points stand for the greedy ones
        rec["params"]["verifier"] = "block"
    assert [(v["budget"], v["tree"]) for v in F.tree_vs_chain([chain8, seq8])] == [(8, "sequoia")]
    for rec in (chain8, seq8):
        rec["params"]["temperature"] = 1.0  # sampled: block's points are not the rrs ones the verdict compares
    assert F.tree_vs_chain([chain8, seq8]) == []
    for rec in (chain8, seq8):
        rec["params"]["temperature"] = 0.0
        del rec["params"]["verifier"]
    seq8["result"]["tree"]["paths"] = chain8["result"]["tree"]["paths"] = [[0], [0, 0]]  # the DP's tree is the chain
    assert F.tree_vs_chain([chain8, seq8])[0]["winner"].startswith("same shape")


def test_step_cost_rows_calibrate_on_one_point_and_predict_the_others() -> None:
    from tree_builders import TreeShape

    from treespec.calibrate.costs import Profile

    prof = Profile({1: 0.1, 4: 0.12, 8: 0.16, 16: 0.24}, {1: 0.02, 2: 0.025, 4: 0.03}, {})
    c4 = _point("chain", 4, [1, 1, 1, 1], depth=3, size=4, verify=0.0, draft=0.0)
    k8 = _point("kary", 8, [1, 1, 1, 1], depth=2, size=7, verify=0.0, draft=0.0)
    c4["result"]["tree"]["paths"] = [[0], [0, 0], [0, 0, 0]]
    k8["result"]["tree"]["paths"] = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]
    for rec, d_factor, v_factor in ((c4, 2.0, 1.5), (k8, 2.0, 1.5 * 1.3)):  # k8 verifies 30% slower than the model
        shape = TreeShape.from_paths([tuple(p) for p in rec["result"]["tree"]["paths"]])
        draft, _ = prof.step_parts(shape)
        verify = float(np.interp(rec["result"]["mean_tree_size"], [1, 4, 8, 16], [0.1, 0.12, 0.16, 0.24]))
        rec["timing"].update(drafting_seconds=16 * d_factor * draft, verifying_seconds=16 * v_factor * verify,
                             overhead_seconds=0.0)
    rows = {v["record"]["params"]["builder"]: v for v in F.step_cost_rows([c4, k8], prof)}
    assert rows["chain"]["calibration"] and rows["chain"]["gap"] == pytest.approx(0.0, abs=1e-12)
    pred_d, meas_d = rows["kary"]["parts"]["drafting"]
    assert pred_d == pytest.approx(meas_d)  # the draft factor carries over to another shape
    pred_v, meas_v = rows["kary"]["parts"]["verifying"]
    assert meas_v / pred_v == pytest.approx(1.3) and rows["kary"]["gap"] < 0


def test_step_cost_rows_cost_each_point_at_its_own_context() -> None:
    """With a context slope, a point at a longer context is predicted dearer by exactly its slope times
    the context difference (after the calibration's factors); without one the context is not read."""
    from tree_builders import TreeShape

    from treespec.calibrate.costs import Profile

    base = Profile({1: 0.1, 4: 0.12, 8: 0.16}, {1: 0.02, 2: 0.025}, {"context": 128})
    slope = {"target": {1: 1e-4, 4: 2e-4, 8: 3e-4}, "draft": {1: 1e-5, 2: 2e-5}}
    sloped = Profile(base.target_latency, base.draft_level_latency, {"context": 128}, 0.0, slope)
    short = _point("chain", 4, [1, 1, 1, 1], depth=3, size=4, verify=0.0, draft=0.0)
    long = _point("sequoia", 4, [1, 1, 1, 1], depth=2, size=4, verify=0.0, draft=0.0)
    short["result"]["tree"]["paths"] = [[0], [0, 0], [0, 0, 0]]
    long["result"]["tree"]["paths"] = [[0], [1], [0, 0]]  # another tree: held out
    for rec, prompt in ((short, 100), (long, 400)):
        rec["result"].update(prompt_tokens=[prompt], tokens_per_prompt=[56])  # mean context: prompt + 28
        parts = sloped.at_context(prompt + 28)
        draft, _ = parts.step_parts(TreeShape.from_paths([tuple(p) for p in rec["result"]["tree"]["paths"]]))
        rec["timing"].update(drafting_seconds=16 * 2.0 * draft, verifying_seconds=16 * parts.target_latency[4],
                             overhead_seconds=0.0)
    rows = {v["record"]["params"]["builder"]: v for v in F.step_cost_rows([short, long], sloped)}
    assert rows["chain"]["calibration"] and not rows["sequoia"]["calibration"]
    assert rows["sequoia"]["gap"] == pytest.approx(0.0, abs=1e-9)
    flat = {v["record"]["params"]["builder"]: v for v in F.step_cost_rows([short, long], base)}
    assert flat["sequoia"]["gap"] < -0.01  # the same steps, costed at one context: the longer one is under-predicted
    del short["result"]["prompt_tokens"], long["result"]["prompt_tokens"]
    assert len(F.step_cost_rows([short, long], base)) == 2  # no slope: the context is never asked for


def test_step_cost_rows_pool_the_calibration_tree_per_temperature() -> None:
    """Every point running the calibration tree at a temperature is a calibration point and their steps
    are pooled (one noisy run no longer sets every factor); each temperature is calibrated on its own
    steps, as the tuner's pilot runs at the run's temperature."""
    from treespec.calibrate.costs import Profile

    prof = Profile({1: 0.1, 4: 0.12, 8: 0.16}, {1: 0.02, 2: 0.025, 4: 0.03}, {})
    chain = [[0], [0, 0], [0, 0, 0]]
    fast = _point("chain", 4, [1, 1, 1, 1], depth=3, size=4, verify=0.10, draft=0.05)
    slow = _point("sequoia", 4, [1, 1, 1, 1], depth=3, size=4, verify=0.14, draft=0.07)  # the same tree, slower run
    kary = _point("kary", 8, [1, 1, 1, 1], depth=2, size=7, verify=0.18, draft=0.06)
    hot = _point("chain", 4, [1, 1, 1, 1], depth=3, size=4, verify=0.30, draft=0.05)  # T=1 verifies dearer
    hot_kary = _point("kary", 8, [1, 1, 1, 1], depth=2, size=7, verify=0.18, draft=0.06)
    fast["result"]["tree"]["paths"] = slow["result"]["tree"]["paths"] = hot["result"]["tree"]["paths"] = chain
    kary["result"]["tree"]["paths"] = hot_kary["result"]["tree"]["paths"] = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]
    for rec in (hot, hot_kary):
        rec["params"]["temperature"] = 1.0
    for rec in (fast, slow, kary, hot, hot_kary):
        rec["timing"]["overhead_seconds"] = 0.0
    rows = {(v["record"]["params"]["temperature"], v["record"]["params"]["builder"]): v
            for v in F.step_cost_rows([fast, slow, kary, hot, hot_kary], prof)}
    assert sorted(k for k, v in rows.items() if v["calibration"]) == [(0.0, "chain"), (0.0, "sequoia"), (1.0, "chain")]
    pooled = rows[0.0, "chain"]["predicted"]
    assert pooled == pytest.approx(rows[0.0, "sequoia"]["predicted"])  # one prediction for the shared tree
    assert pooled == pytest.approx((0.10 + 0.05 + 0.14 + 0.07) / 2)  # ... at the mean of the two runs
    hot_factor = rows[1.0, "kary"]["parts"]["verifying"][0] / rows[0.0, "kary"]["parts"]["verifying"][0]
    assert hot_factor == pytest.approx(0.30 / 0.12)  # T=1's own verify factor (0.30 against the two runs' 0.12)


def test_the_cost_section_reports_how_far_runs_of_one_tree_drifted(tmp_path) -> None:
    """The bound the section states is computed from the records (two runs of one tree, 0.15 and 0.21 s
    per step: 40%); without two runs of one tree it states none."""
    from treespec.calibrate.costs import Profile

    Profile({1: 0.1, 4: 0.12, 8: 0.16}, {1: 0.02, 2: 0.025, 4: 0.03}, {}).save(tmp_path / "profile.json")
    chain = [[0], [0, 0], [0, 0, 0]]
    fast = _point("chain", 4, [1, 1, 1, 1], depth=3, size=4, verify=0.10, draft=0.05)
    slow = _point("sequoia", 4, [1, 1, 1, 1], depth=3, size=4, verify=0.14, draft=0.07)
    kary = _point("kary", 8, [1, 1, 1, 1], depth=2, size=7, verify=0.18, draft=0.06)
    fast["result"]["tree"]["paths"] = slow["result"]["tree"]["paths"] = chain
    kary["result"]["tree"]["paths"] = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]
    for rec in (fast, slow, kary):
        rec["timing"]["overhead_seconds"] = 0.0
    text = "\n".join(M._step_cost_section([fast, slow, kary], tmp_path))
    assert "identical tree on one panel differ by up to 40%" in text
    assert "Timing drift" not in "\n".join(M._step_cost_section([fast, kary], tmp_path))


def test_each_drafter_sets_tree_is_drawn_apart(tmp_path):
    """The tree pictures were keyed by builder, budget and depth alone: beside the n-gram drafter ("both") the
    model's share (here one node) was drawn under the model's name, or the "both" tree never drawn."""
    from treespec.bench.sweep.report import _tree_images

    def rec(drafters, paths):
        return {"params": {"builder": "chain", "budget": 6, "max_depth": None, "drafters": drafters,
                           "dataset": "humaneval", "temperature": 0.0},
                "result": {"tree": {"paths": paths}}}

    drawn = _tree_images([rec("model", [[0], [0, 0], [0, 0, 0]]), rec("both", [[0]])], tmp_path)
    assert [name for _, name in drawn] == ["trees/chain-B6-dnone.png", "trees/chain-B6-dnone-both.png"]
    assert drawn[1][0].endswith("drafters both") and all((tmp_path / name).is_file() for _, name in drawn)


def test_hf_assisted_is_compared_only_with_the_points_own_draft() -> None:
    """Two pairs of a sweep sharing a target (``models.pairs``): each pair's points are over HF assisted with their own
    draft, not the other pair's faster one; each draft's fastest setting is bold and has its own line in the plots;
    a point of the n-gram drafter alone (no draft) takes the fastest of them."""
    rec = _treespec([8] * 2, [2] * 2, [4.0] * 2)
    rec["params"]["draft"] = "draft-a"
    target = _baseline(rec, [10.0] * 2)
    mine, theirs = (_baseline(rec, [s] * 2, method="assisted") for s in (5.0, 2.0))
    mine["params"]["draft"], theirs["params"]["draft"] = "draft-a", "draft-b"
    mine["key"], theirs["key"] = "b-assisted-a", "b-assisted-b"
    bases = [target, mine, theirs]
    assert F.baseline_of(rec, bases, "assisted") is mine  # the other pair's draft is faster: not compared
    assert F.speedup_interval([rec], bases, "assisted").estimate == pytest.approx(5.0 / 4.0)
    assert F.baseline_of(rec, bases, None) is mine  # fastest HF: among the methods this pair's user could run
    assert F.is_fastest(mine, bases) and F.is_fastest(theirs, bases)  # each draft's only setting
    lines = R._base_speedups(F.panel(rec["params"]), bases)
    assert lines == {"HF assisted (draft-a)": pytest.approx(2.0), "HF assisted (draft-b)": pytest.approx(5.0),
                     "target alone": 1.0}
    ngram = _treespec([8] * 2, [2] * 2, [4.0] * 2)
    assert F.baseline_of(ngram, bases, "assisted") is theirs


def test_vs_fastest_hf_without_per_prompt_timings_is_the_stored_figure_over_the_method_it_names() -> None:
    """A record written before per-prompt timings shows its stored speedup over the fastest HF method it is named
    after, not the least of its stored speedups (one over a baseline this report does not hold)."""
    rec = _treespec([8] * 2, [2] * 2, [4.0] * 2)
    target, assisted = _baseline(rec, [10.0] * 2), _baseline(rec, [5.0] * 2, method="assisted")
    for r in (rec, target, assisted):
        del r["timing"]["per_prompt_seconds"]
    rec["result"]["mean_tree_size"] = 4.0
    rec["timing"].update(tokens_per_second=2.0, drafting_seconds=1.0, verifying_seconds=6.0, overhead_seconds=1.0)
    rec["speedup"] = {"target": 1.25, "assisted": 0.625, "prompt_lookup": 0.4}  # no prompt lookup record here
    row = next(line for line in M._treespec_table([rec], [target, assisted]) if line.startswith("| d |"))
    assert "| 2.00 | 0.62 (assisted) | 1.25 | - | 0.62 | - |" in row, row  # tok/s, vs fastest, target, ..
