"""Hardware-aware sizing: latency measurement and the choice of budget and depth."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from treespec.models.tiny import tiny_model
from tree_builders import sequoia
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.calibrate.costs import Profile, draft_level_cost, measure_latency, profile, random_tree
from treespec.calibrate.step_cost import choose_tree

VECTOR = [0.6, 0.15, 0.07, 0.04, 0.025, 0.015, 0.01, 0.008]
CPU = {1: 0.32, 8: 0.67, 32: 1.12, 64: 1.64, 128: 2.74}  # the 1.5B target measured on this kind of CPU
GPU = {1: 0.020, 16: 0.020, 32: 0.021, 64: 0.023, 128: 0.035}  # flat, then the GEMMs start to fill


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_model("llama", vocab=256, hidden=128, seed=3)


def test_latency_is_measured_for_each_size(model):
    lat = measure_latency(model, sizes=(4, 1, 256), context=32, repeats=3)
    assert list(lat) == [1, 4, 256]
    assert all(np.isfinite(v) and v > 0 for v in lat.values())
    assert lat[256] > lat[1]  # 256 tokens through every layer and the LM head cost more than one


def test_sizes_are_measured_in_alternating_rounds(model, monkeypatch):
    """Every size warms up, then each round times every size once, every other round in reverse: a
    slowdown while measuring falls on all sizes alike instead of bending the curve."""
    from treespec.models import timing

    widths = []
    monkeypatch.setattr(timing, "forward_masked", lambda m, cache, ids, *a, **k: widths.append(len(ids)))
    monkeypatch.setattr(timing.TreeCache, "keep", lambda self, *a: None)
    lat = measure_latency(model, sizes=(8, 1, 4), context=32, repeats=3, warmup=1)
    assert widths == [32, 1, 4, 8, 1, 4, 8, 8, 4, 1, 1, 4, 8]  # the context, the warm-up, three rounds
    assert list(lat) == [1, 4, 8]


def test_random_tree_is_a_tree():
    depth, anc = random_tree(40, torch.Generator().manual_seed(1))
    assert depth[0] == 0 and np.all(depth[1:] >= 1)
    assert np.array_equal(anc.sum(1), depth + 1)  # a node sees itself and each ancestor once
    assert not np.any(np.triu(anc, 1))  # parents precede children
    assert depth.max() < 40 - 1  # bushy, not a chain


def test_profile_round_trip_and_costs(model, tmp_path):
    p = profile(model, model, sizes=(1, 2, 8), context=16, repeats=2)
    assert set(p.target_latency) == {1, 2, 8} and min(p.draft_level_latency.values()) > 0
    p.save(tmp_path / "profile.json")
    q = Profile.load(tmp_path / "profile.json")
    assert q.target_latency == p.target_latency and q.draft_level_latency == p.draft_level_latency and q.meta == p.meta
    assert draft_level_cost(model, tokens=2, context=16, repeats=1) > 0
    alone = profile(model, None, sizes=(1, 2), context=16, repeats=1)
    assert alone.draft_level_latency is None and alone.choose(VECTOR).c == 0.0


def test_choice_is_the_argmax_of_its_table():
    choice = choose_tree(VECTOR, CPU, draft_cost=0.03, max_depth=10)
    i, j = np.unravel_index(np.argmax(choice.speedups), choice.speedups.shape)
    assert choice.speedup == pytest.approx(choice.speedups.max())
    assert choice.speedups[choice.depths.index(choice.depth), choice.budgets.index(choice.budget)] == choice.speedup
    assert choice.speedups[i, j] == pytest.approx(choice.speedup)
    assert choice.budgets == list(range(1, 129)) and choice.depths == list(range(11))
    # the table is the formula: G(n, d) t(1) / (t(|T|) + depth(T) c), T the DP's smallest best shape
    t = lambda n: np.interp(n, sorted(CPU), [CPU[k] for k in sorted(CPU)])  # noqa: E731
    assert np.allclose(choice.speedups[0], 1.0)  # depth 0: the root alone, plain decoding's one-token forward
    for d, n in [(1, 2), (2, 9), (4, 21), (10, 128), (3, 64)]:
        shape = sequoia(VECTOR, n, max_depth=d, max_width=16)
        i, j = choice.depths.index(d), choice.budgets.index(n)
        assert choice.taus[i, j] == pytest.approx(shape.expected_tokens(VECTOR))
        assert choice.speedups[i, j] == pytest.approx(choice.taus[i, j] * CPU[1] / (t(shape.size) + shape.depth * 0.03))
    assert choice.taus[4, 20] == pytest.approx(sequoia(VECTOR, 21, max_depth=4, max_width=16).expected_tokens(VECTOR))
    # the shape is the one the table scores
    assert choice.shape.size <= choice.budget and choice.shape.depth <= choice.depth
    assert choice.shape.expected_tokens(VECTOR) == pytest.approx(choice.tau)
    assert len(choice.rows()) == 11 * 128 and choice.as_dict()["size"] == choice.shape.size


def test_flat_latency_and_free_drafts_choose_the_largest_budget():
    choice = choose_tree(VECTOR, {1: 1.0, 64: 1.0}, draft_cost=0.0, max_depth=16)
    assert choice.budget == 64 and choice.shape.size == 64


def test_steep_latency_chooses_a_small_tree():
    linear = {n: float(n) for n in (1, 2, 4, 8, 16)}  # every extra token costs a full forward
    assert choose_tree(VECTOR, linear, draft_cost=0.0).budget == 1  # nothing beats plain decoding
    cpu = choose_tree(VECTOR, CPU, draft_cost=0.0)
    gpu = choose_tree(VECTOR, GPU, draft_cost=0.0)
    assert 2 <= cpu.budget <= 16 and gpu.budget >= 32
    assert cpu.speedup > 1.0 and gpu.speedup > cpu.speedup


def test_expensive_drafts_choose_shallower_trees():
    cheap = choose_tree(VECTOR, GPU, draft_cost=0.0)
    dear = choose_tree(VECTOR, GPU, draft_cost=0.01)  # half a target forward per level
    assert dear.depth < cheap.depth and dear.speedup < cheap.speedup


def test_acceptance_objects_and_errors():
    counts = np.array([[60, 15, 7], [70, 10, 5]])
    acc = MeasuredAcceptance.from_counts(counts, np.array([100, 100]), beta=0.6)
    by_vector = choose_tree(acc, GPU, 0.001)
    assert by_vector.tau == pytest.approx(by_vector.shape.expected_tokens(acc.vector))
    by_matrix = choose_tree(acc, GPU, 0.001, per_depth=True)
    assert by_matrix.tau == pytest.approx(by_matrix.shape.expected_tokens(acc.matrix)) and by_matrix.tau > by_vector.tau
    with pytest.raises(ValueError, match="size 1"):
        choose_tree(VECTOR, {2: 1.0, 4: 1.0}, 0.0)
    with pytest.raises(ValueError, match="budgets"):
        choose_tree(VECTOR, CPU, 0.0, budgets=[8, 256])
    with pytest.raises(ValueError, match="sizes"):
        measure_latency(tiny_model("llama", vocab=16, hidden=16), sizes=(0, 4))


# --- the cost curve: target t(n) up to 64 tokens, the draft's cost per level width -------------

FLAT = {1: 0.40, 16: 0.41, 32: 0.45, 64: 0.60}  # bf16 on wide bf16 units: 16 tokens cost about one
STEEP = {1: 0.05, 64: 0.05 * (1 + 0.4 * 63)}  # each extra token costs 40% of the first
TOP1 = [0.85, 0.08, 0.03, 0.02]  # a draft whose first guess is usually right
# the measurements (1.5B target, 0.5B draft, 2 cores, forward_masked after 200 tokens)
TARGET_FP32 = {1: 0.378, 4: 0.852, 8: 1.168, 16: 0.817, 32: 1.101, 64: 1.689}
TARGET_BF16 = {1: 0.417, 4: 0.410, 8: 0.406, 16: 0.448, 32: 0.588, 64: 0.875}
DRAFT_FP32 = {1: 0.142, 4: 0.281, 8: 0.362, 16: 0.404}
DRAFT_INT8 = {1: 0.083, 4: 0.097, 8: 0.106, 16: 0.154}
CHEAP_LEVELS = {1: 0.02, 16: 0.02}  # draft levels cost the same at any width
WIDE_LEVELS = {1: 0.02, 2: 0.04, 4: 0.08, 8: 0.16, 16: 0.32}  # a draft level costs its width


def max_forwarded_width(shape):
    from treespec.calibrate.step_cost import forwarded_widths

    return max(forwarded_widths(shape), default=0)


def test_flat_target_picks_a_wide_shallow_tree():
    choice = choose_tree(VECTOR, FLAT, CHEAP_LEVELS, max_depth=12)
    assert choice.shape.widths[0] >= 4 and max(choice.shape.widths) >= 8
    assert choice.shape.size >= 16 and choice.shape.depth < choice.shape.size - 1


def test_steep_target_picks_a_chain():
    choice = choose_tree(TOP1, STEEP, {1: 0.002, 16: 0.002}, max_depth=12)
    assert choice.shape.depth >= 2 and set(choice.shape.widths) == {1}  # one node per level
    wide = choose_tree(TOP1, FLAT, {1: 0.002, 16: 0.002}, max_depth=12)  # the same draft, a flat target
    assert max(wide.shape.widths) > 1


def test_draft_cost_growing_with_width_picks_narrower_levels():
    cheap = choose_tree(VECTOR, FLAT, CHEAP_LEVELS, max_depth=12)
    dear = choose_tree(VECTOR, FLAT, WIDE_LEVELS, max_depth=12)
    assert max_forwarded_width(dear.shape) < max_forwarded_width(cheap.shape)
    assert dear.width < cheap.width or dear.width == 1
    # the predicted step time is the formula: t(|T|) + t_q(1) + sum of t_q(forwarded widths)
    from treespec.calibrate.step_cost import forwarded_widths

    levels = sum(np.interp(w, sorted(WIDE_LEVELS), [WIDE_LEVELS[k] for k in sorted(WIDE_LEVELS)])
                 for w in forwarded_widths(dear.shape))
    t = np.interp(dear.shape.size, sorted(FLAT), [FLAT[k] for k in sorted(FLAT)])
    assert dear.step_seconds == pytest.approx(t + 0.02 + levels)
    assert dear.tokens_per_second == pytest.approx(dear.tau / dear.step_seconds)


def test_overhead_is_charged_per_step():
    free = choose_tree(VECTOR, STEEP, None, max_depth=6)
    heavy = choose_tree(VECTOR, STEEP, None, max_depth=6, overhead=0.5)
    assert heavy.step_seconds == pytest.approx(np.interp(heavy.shape.size, sorted(STEEP), list(STEEP.values())) + 0.5)
    assert heavy.tokens_per_second < free.tokens_per_second


def test_a_cheaper_configuration_is_predicted_faster():
    """Profiles of two precision pairs: the one with cheaper costs predicts more tokens per second,
    unless its draft is accepted much less often (what ``auto`` precision trades off)."""
    fp32 = Profile(TARGET_FP32, DRAFT_FP32).choose(VECTOR, max_depth=8)
    fast = Profile(TARGET_BF16, DRAFT_INT8).choose(VECTOR, max_depth=8)
    assert fast.tokens_per_second > fp32.tokens_per_second
    assert Profile(TARGET_BF16, DRAFT_INT8).choose([0.01], max_depth=8).tokens_per_second < fp32.tokens_per_second


def test_profile_curve_round_trip(model, tmp_path):
    p = profile(model, model, sizes=(1, 4), context=16, repeats=1, draft_widths=(1, 2, 8))
    assert sorted(p.draft_level_latency) == [1, 2, 4, 8]
    assert p.meta["target_precision"] == "float32" and p.meta["draft_precision"] == "float32"
    p.save(tmp_path / "p.json")
    q = Profile.load(tmp_path / "p.json")
    assert q == p and q.draft_cost == p.draft_level_latency
    old = {"target_latency": {"1": 0.1, "4": 0.2}, "draft_level_seconds": 0.01, "meta": {}}  # written before the curve
    assert Profile.from_dict(old).draft_cost == {4: 0.01} and Profile.from_dict(old).choose(VECTOR).budget >= 1


def test_a_context_slope_moves_every_point_and_survives_calibration_and_json(model, tmp_path):
    prof = profile(model, model, sizes=(1, 4), draft_widths=(1, 2), context=16, second_context=64, repeats=1)
    assert set(prof.context_slope) == {"target", "draft"} and set(prof.context_slope["target"]) == {1, 4}
    assert prof.meta["second_context"] == 64
    prof.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == prof
    fixed = Profile({1: 0.1, 4: 0.2}, {1: 0.01}, {"context": 100}, 0.0,
                    {"target": {1: 1e-3, 4: 2e-3}, "draft": {1: 1e-4}})
    far = fixed.at_context(150)
    assert (far.target_latency == pytest.approx({1: 0.15, 4: 0.3})
            and far.draft_level_latency == pytest.approx({1: 0.015}))
    assert far.meta["context"] == 150 and far.at_context(100).target_latency == pytest.approx(fixed.target_latency)
    assert fixed.at_context(-10_000).target_latency[1] == pytest.approx(0.01)  # floored at a tenth, never negative
    assert Profile({1: 0.1}).at_context(10_000) == Profile({1: 0.1})  # no slope: the context changes nothing
    from tree_builders import TreeShape

    chain = TreeShape.from_paths([(0,)])
    cal = fixed.calibrated(chain, drafting=2 * fixed.step_parts(chain)[0], verifying=3 * 0.1, overhead=0.0, steps=10,
                           size=1)
    assert (cal.context_slope["target"][4] == pytest.approx(3 * 2e-3)
            and cal.context_slope["draft"][1] == pytest.approx(2e-4))
    with pytest.raises(ValueError, match="second_context must differ"):
        profile(model, None, sizes=(1,), context=16, second_context=16)


def test_a_batch_step_costs_the_tokens_of_all_its_rows_and_shrinks_the_tree():
    """``Profile.for_batch``: a tree of ``n`` nodes in a step of ``B`` rows costs ``t(B n)``, a draft level of
    width ``w`` costs ``t_q(B w)``, the engine's seconds are per row; sizes past the measured ones are dropped.
    Where ``t`` grows with the tokens, the tree shrinks with the batch down to plain decoding."""
    target = {1: 0.10, 2: 0.11, 4: 0.13, 8: 0.18, 16: 0.30, 32: 0.55, 64: 1.05}  # flat, then linear in the tokens
    prof = Profile(target, {1: 0.01, 2: 0.012, 4: 0.016, 8: 0.025, 16: 0.045}, {"x": 1}, 0.002,
                   {"target": {1: 1e-4, 64: 5e-4}, "draft": {1: 1e-5, 16: 2e-5}})
    assert prof.for_batch(1) is prof
    four = prof.for_batch(4)
    assert four.target_latency == {1: 0.13, 2: 0.18, 4: 0.30, 8: 0.55, 16: 1.05}  # t(4 n) at the measured 4 n
    assert four.draft_level_latency[2] == pytest.approx(0.025) and four.draft_level_latency[4] == pytest.approx(0.045)
    assert four.draft_level_latency[16] == pytest.approx(0.045 + 48 * (0.02 / 8))  # past the widest: its slope
    assert four.step_overhead_seconds == pytest.approx(0.008) and four.meta == {"x": 1, "batch_rows": 4}
    assert set(four.context_slope["target"]) == set(four.target_latency)
    assert four.context_slope["target"][16] == pytest.approx(5e-4)
    chosen = {rows: prof.for_batch(rows).choose(VECTOR, max_depth=8) for rows in (1, 2, 4, 8)}
    sizes = [chosen[r].shape.size for r in (1, 2, 4, 8)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 1  # never larger with more rows
    # a target whose forward costs its tokens from the start: no batch of 8 pays for a tree
    linear = Profile({n: 0.01 * n for n in (1, 2, 4, 8, 16, 32, 64)}, {1: 0.001, 16: 0.016})
    assert linear.for_batch(8).choose(VECTOR, max_depth=8).depth == 0
    with pytest.raises(ValueError, match="profile larger sizes"):
        prof.for_batch(65)
    with pytest.raises(ValueError, match=">= 1 rows"):
        prof.for_batch(0)


def test_plain_decoding_is_timed_on_hfs_own_decoding_steps(model, monkeypatch):
    """``measure_plain_decode`` times HF ``generate``'s decoding steps, not its prefill: a forward made to take 0.4 s
    over the prompt and 0.03 s per decoded token reads 0.03 s (a timer of whole calls would read 0.06 s or more)."""
    import time

    from treespec.models.timing import measure_plain_decode

    real = model.forward

    def slowed(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        time.sleep(0.4 if ids.shape[-1] > 1 else 0.03)
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", slowed)
    seconds = measure_plain_decode(model, context=16, tokens=5)
    assert 0.03 <= seconds < 0.06
    with pytest.raises(ValueError, match="tokens >= 3"):
        measure_plain_decode(model, tokens=2)


def test_speedups_are_relative_to_the_timed_plain_decoding(model, tmp_path):
    """A profile's timed plain decoding (``plain_decode_seconds``) is what speedups are relative to; the choice
    itself does not move. It survives JSON and calibration, moves with the context as a one-token forward, and a
    batch's profile drops it (batched plain decoding is costed from ``t(rows)``)."""
    prof = profile(model, model, sizes=(1, 4), draft_widths=(1, 2), context=16, repeats=1)
    assert prof.plain_decode_seconds > 0  # eager: HF's decoding timed beside the forwards
    prof.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == prof
    target, draft = {1: 0.10, 4: 0.12, 8: 0.16, 16: 0.24}, {1: 0.02, 2: 0.025, 4: 0.03}
    untimed = Profile(target, draft, {"context": 100}, 0.004, {"target": {1: 1e-3}})
    timed = Profile(target, draft, {"context": 100}, 0.004, {"target": {1: 1e-3}}, 0.052)
    a, b = untimed.choose(VECTOR, max_depth=6), timed.choose(VECTOR, max_depth=6)
    assert a.shape == b.shape and a.plain_seconds == pytest.approx(0.104) and b.plain_seconds == 0.052
    assert b.speedup == pytest.approx(a.speedup / 2)  # half the plain seconds: half the speedup
    assert timed.at_context(150).plain_decode_seconds == pytest.approx(0.052 + 50e-3)
    cal = timed.calibrated(a.shape, drafting=0.1, verifying=0.3, overhead=0.01, steps=5)
    assert cal.plain_decode_seconds == 0.052 and cal.target_latency[1] != target[1]  # HF's loop is not rescaled
    assert timed.for_batch(2).plain_decode_seconds is None
    for bad in (0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="plain decoding takes a finite number > 0"):
            timed.choose(VECTOR, plain=bad)


def test_the_drafts_prefill_is_timed_at_prompt_lengths_and_kept_through_json_calibration_and_batches(model, tmp_path):
    from treespec.models.timing import PREFILL_LENGTHS

    p = profile(model, model, sizes=(1, 4), context=16, repeats=1, draft_widths=(1, 2))
    assert sorted(p.draft_prefill_latency) == list(PREFILL_LENGTHS) and min(p.draft_prefill_latency.values()) > 0
    p.save(tmp_path / "p.json")
    assert Profile.load(tmp_path / "p.json") == p
    shape = sequoia(VECTOR, 4, max_depth=2)
    assert p.calibrated(shape, 0.01, 0.02, 0.001, 5).draft_prefill_latency == p.draft_prefill_latency
    assert p.for_batch(2).draft_prefill_latency == p.draft_prefill_latency  # per prompt: Tuned charges each row
    assert profile(model, None, sizes=(1,), context=16, repeats=1).draft_prefill_latency is None


def test_prefill_lengths_are_timed_in_alternating_rounds_after_a_warm_up(model, monkeypatch):
    from treespec.models import timing

    lengths = []
    monkeypatch.setattr(timing, "forward_prompt", lambda m, cache, ids, *a, **k: lengths.append(len(ids)))
    assert list(timing.measure_prefill(model, (64, 8), repeats=3)) == [8, 64]
    assert lengths == [8, 64, 8, 64, 64, 8, 8, 64]
    with pytest.raises(ValueError, match="lengths must be ints >= 1"):
        timing.measure_prefill(model, (0, 8))


def test_the_drafts_prefill_between_and_beyond_the_timed_lengths():
    """Interpolated between timed lengths, scaled down below the shortest, and past the longest the larger of the
    last slope and a quadratic fit's growth (attention's square term): 1, 3, 6 s at 100, 200, 300 tokens is
    ``x^2 / 20000 + x / 200 + 0.5``, 10 s at 400 where the last slope gives 9."""
    p = Profile({1: 0.1}, {1: 0.01}, {}, draft_prefill_latency={100: 1.0, 200: 3.0, 300: 6.0})
    assert p.draft_prefill_seconds(150) == pytest.approx(2.0) and p.draft_prefill_seconds(50) == pytest.approx(0.5)
    assert p.draft_prefill_seconds(400) == pytest.approx(10.0)
    concave = Profile({1: 0.1}, {1: 0.01}, {}, draft_prefill_latency={100: 1.0, 200: 3.0, 300: 4.0})
    assert concave.draft_prefill_seconds(400) == pytest.approx(5.0)  # the last slope: the fit would bend down
    two = Profile({1: 0.1}, {1: 0.01}, {}, draft_prefill_latency={100: 1.0, 200: 3.0})
    assert two.draft_prefill_seconds(300) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="no draft prefill curve"):
        Profile({1: 0.1}, {1: 0.01}, {}).draft_prefill_seconds(10)


def test_a_cached_profile_from_before_the_prefill_curve_gets_it_measured_once(model, tmp_path, monkeypatch):
    from treespec.calibrate import tuning
    from treespec.common.files import read_json_dict, write_json

    cache = tmp_path / "profiles.json"
    old = Profile({1: 0.1, 4: 0.2}, {1: 0.01}, {"made": "before"})
    write_json(cache, {tuning._key(model, model): old.to_dict()})
    timed = []
    monkeypatch.setattr(tuning, "measure_prefill", lambda m: timed.append(m) or {32: 0.01, 128: 0.03})
    first = tuning.cached_profile(model, model, cache)
    assert timed == [model] and first.draft_prefill_latency == {32: 0.01, 128: 0.03}
    assert first.target_latency == old.target_latency and first.meta == old.meta  # nothing else measured again
    assert Profile.from_dict(read_json_dict(cache)[tuning._key(model, model)]) == first
    assert tuning.cached_profile(model, model, cache) == first and timed == [model]  # read back, not timed again


@pytest.mark.parametrize("entry", [{}, [1, 2], None, {"target_latency": [0.1, 0.2]},
                                   {"target_latency": {"1": "fast"}}, {"target_latency": {"1": float("nan")}}],
                         ids=["empty", "list", "null", "latency-list", "latency-string", "latency-nan"])
def test_a_damaged_cached_profile_is_measured_again(model, tmp_path, monkeypatch, entry):
    """A profiles.json entry under the right key that is no profile (a hand edit, a file cut short) is measured
    again, as a damaged file is, not a traceback in the tuner."""
    from treespec.calibrate import tuning
    from treespec.common.files import write_json

    cache = tmp_path / "profiles.json"
    write_json(cache, {tuning._key(model, model): entry})
    fresh = Profile({1: 0.1, 4: 0.2}, {1: 0.01}, {"made": "now"}, draft_prefill_latency={32: 0.01})
    monkeypatch.setattr(tuning, "profile", lambda *a, **k: fresh)
    assert tuning.cached_profile(model, model, cache) == fresh


@pytest.mark.parametrize("costs", [dict(target_latency={1: float("nan"), 4: 0.2}),
                                   dict(target_latency={1: 0.1}, overhead=float("nan")),
                                   dict(target_latency={1: 0.1}, draft_cost=float("nan"))],
                         ids=["latency", "overhead", "draft"])
def test_costs_that_are_not_numbers_are_refused_by_name(costs):
    """NaN costs are refused, named (an IndexError, or a silent "no tree", before)."""
    with pytest.raises(ValueError, match="finite"):
        choose_tree(VECTOR, **{"draft_cost": 0.01, "overhead": 0.0, **costs})


def test_a_profile_of_other_sizes_is_cached_apart_from_the_default(model, tmp_path, monkeypatch):
    """``tune(..., sizes=[1, 2])`` measures a profile of its own sizes; the default profile a later run reads is not
    that one (both were cached under one key)."""
    from treespec.calibrate import tuning

    made = []
    monkeypatch.setattr(tuning, "profile", lambda *a, **k: made.append(k) or Profile(
        {s: 0.1 * s for s in k["sizes"]}, {1: 0.01}, {}, draft_prefill_latency={32: 0.01}))
    cache = tmp_path / "profiles.json"
    few = tuning.cached_profile(model, model, cache, sizes=[1, 2])
    default = tuning.cached_profile(model, model, cache)
    assert sorted(few.target_latency) == [1, 2] and sorted(default.target_latency) == sorted(tuning.PROFILE_SIZES)
    assert tuning.cached_profile(model, model, cache, sizes=[1, 2]) == few and len(made) == 2  # each read back


def test_plain_decoding_costs_one_token_whatever_the_budget():
    """Depth 0 is the root alone: one forward of one token at every budget. Costed at the budget's ``t(n)`` it was
    predicted faster than itself where a larger forward timed faster (noise, or a curve that falls): all-zero
    acceptance chose budget 8 and plain decoding "5.00x" over plain decoding, and a tree paying 1.005x lost to a
    depth-0 cell at t(1) / t(2) = 1.01."""
    falling = {1: 0.01, 4: 0.005, 8: 0.002}
    c = choose_tree([0.0, 0.0, 0.0], falling, 0.0)
    assert (c.budget, c.depth, c.speedup) == (1, 0, 1.0) and np.allclose(c.speedups[0], 1.0)
    noisy = {1: 0.0100, 2: 0.0099, 4: 0.0101}
    c = choose_tree([0.0, 0.0, 0.0], noisy, 0.0)
    assert (c.budget, c.depth, c.speedup) == (1, 0, 1.0)
    # a one-node chain: tau 1.5025 in t(2) + one draft forward = 0.0099 + 0.00505 s, 1.005x: it pays, and runs
    pays = choose_tree([0.5025], noisy, 0.00505, max_depth=1, budgets=[1, 2])
    assert (pays.budget, pays.depth) == (2, 1) and pays.speedup == pytest.approx(1.005, abs=1e-4)


@pytest.mark.parametrize("kwargs, match", [
    ({"budgets": [4.5]}, "a budget must be an int"),
    ({"max_depth": True}, "max_depth must be an int"),
    ({"target_latency": {"1": 0.01, "4": 0.02}}, "a target_latency size must be an int"),
    ({"target_latency": {1: 0.01, 4.5: 0.02}}, "a target_latency size must be an int"),
    ({"draft_cost": float("inf")}, "draft_cost must be finite"),
])
def test_choose_tree_refuses_inputs_it_would_coerce(kwargs, match):
    """A fractional budget was truncated, ``True`` taken as depth 1, JSON's string sizes said to lack size 1, a
    fractional size a KeyError, an infinite draft cost plain decoding in silence: each is now named."""
    args = {"target_latency": {1: 0.01, 8: 0.014}, "draft_cost": 0.001, **kwargs}
    with pytest.raises(ValueError, match=match):
        choose_tree([0.6, 0.2, 0.1], args.pop("target_latency"), args.pop("draft_cost"), **args)


def test_models_built_in_process_are_measured_apart():
    """A model without a path was named by its family alone in the measurement caches: a 6-layer target read the
    profile a 1-layer one of the same family had cached. Now its config and a sample of its weights name it: two
    sizes or two weightings of one family are two models; the same model, or a copy, is one."""
    import copy

    from treespec.calibrate.tuning import _key
    from treespec.common.machine import measured_name

    small, large = tiny_model("llama", hidden=64, layers=1, seed=0), tiny_model("llama", hidden=64, layers=2, seed=0)
    other = tiny_model("llama", hidden=64, layers=1, seed=1)
    assert measured_name(small) == measured_name(copy.deepcopy(small)) == measured_name(small)
    assert len({measured_name(small), measured_name(large), measured_name(other)}) == 3
    assert measured_name(small).startswith("llama@")
    assert _key(small, other) != _key(large, other)


@pytest.mark.parametrize("damage", [{"plain_decode_seconds": -1.0}, {"plain_decode_seconds": float("nan")},
                                    {"draft_prefill_latency": {"32": float("nan")}},
                                    {"draft_prefill_latency": {"32": -0.5}}, {"draft_level_latency": None},
                                    {"draft_level_latency": {}}, {"target_latency": {"1": 0.1}}],
                         ids=["plain-negative", "plain-nan", "prefill-nan", "prefill-negative", "no-draft-levels",
                              "empty-draft-levels", "one-size"])
def test_a_cached_profile_missing_a_part_of_its_costs_is_measured_again(model, tmp_path, monkeypatch, damage):
    """Entries that read as a profile but whose costs are not a pair's: plain decoding's seconds negative or NaN (every
    run failed, naming no file), a NaN or negative draft prefill (a "nanx" margin; every tree declined), no draft
    levels (drafting free: budget 32 at 3.13x where plain decoding pays), one target size (plain decoding always):
    each is measured again."""
    from treespec.calibrate import tuning
    from treespec.common.files import write_json

    good = Profile({1: 0.1, 4: 0.2}, {1: 0.01}, {"made": "before"}, plain_decode_seconds=0.1,
                   draft_prefill_latency={32: 0.01})
    cache = tmp_path / "profiles.json"
    write_json(cache, {tuning._key(model, model): {**good.to_dict(), **damage}})
    assert tuning._decoded(good.to_dict()) == good
    fresh = Profile({1: 0.1, 4: 0.2}, {1: 0.01}, {"made": "now"}, draft_prefill_latency={32: 0.01})
    monkeypatch.setattr(tuning, "profile", lambda *a, **k: fresh)
    assert tuning.cached_profile(model, model, cache) == fresh


@pytest.mark.parametrize("damage", [{"draft_per_step": -0.003}, {"verify_per_step": float("nan")},
                                    {"steps": "12"}, {"survival": [1.5]}, {"latency": {}}])
def test_a_damaged_cached_pilot_is_measured_again(tmp_path, damage):
    """A pilots.json record with negative or NaN seconds, counts that are not whole numbers or a survival outside
    [0, 1] failed every run after it, naming no file (``latencies must be finite``, ``invalid literal for int()``):
    it is measured again."""
    from treespec.calibrate.pilot import Pilot, cached_pilot
    from treespec.common.files import write_json

    good = Pilot(depth=2, chain=True, steps=10, uncut_steps=9, tau=1.8, survival=[0.6, 0.3], draft_per_step=0.01,
                 verify_per_step=0.02, engine_per_step=0.001, prefill_per_prompt=0.05, plain_per_token=0.02,
                 plain_verify_per_token=0.02, plain_prefill_per_prompt=0.04, latency={1: 0.02, 2: 0.021, 3: 0.022})
    assert Pilot.from_dict(good.to_dict()) == good
    cache = tmp_path / "pilots.json"
    write_json(cache, {"k": {**good.to_dict(), **damage}})
    fresh = Pilot(**{**good.__dict__, "tau": 1.7})
    assert cached_pilot("k", cache, lambda: fresh) == fresh


def test_plain_decoding_chosen_or_declined_is_predicted_as_the_target_alone():
    """Plain decoding is the target alone at 1.00x whichever way the tuner gets there: chosen (no tree pays) it was
    predicted at HF's timed decoding over the engine's one-token step (1.26x on the tiny pair), declined (a tree under
    the margin) at 1.00x."""
    from treespec.calibrate.tuning import Tuned

    prof = Profile({1: 0.1, 4: 0.12, 8: 0.16}, {1: 0.03, 2: 0.04}, {}, 0.004, plain_decode_seconds=0.13)
    chosen = Tuned(prof.choose([0.0, 0.0], max_depth=4), prof, None)
    assert chosen.choice.depth == 0 and chosen.prediction.plain
    assert chosen.prediction.speedup == chosen.prediction.run_speedup(64, 0.5) == 1.0
    declined = Tuned(prof.choose([0.3, 0.1], max_depth=4), prof, None).plain_unless(margin=100.0)
    assert declined.choice.depth == 0 and declined.prediction.speedup == pytest.approx(1.0)


def test_a_prediction_from_the_rows_alone_says_so():
    """Without a walk to replay (a file of rows only) the why-line names the rows' expectation, as defaults.md says it
    does (it read as the ordinary line)."""
    from treespec.calibrate.tuning import Tuned

    prof = Profile({1: 0.1, 4: 0.12, 8: 0.16}, {1: 0.01, 2: 0.012}, {}, 0.004)
    tuned = Tuned(prof.choose([0.8, 0.1], max_depth=4), prof, None)
    assert tuned.choice.depth > 0 and tuned.prediction.model == "rows"
    assert "(the acceptance rows' expectation, every level drafted: no calibration walk" in tuned.why
