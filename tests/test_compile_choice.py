"""Whether a compiled step pays: the run-length rule, the measurement, its cache, and the CLI's default."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from treespec import cli, cli_commands
from treespec.calibrate import compile_choice
from treespec.calibrate.compile_choice import RouteTiming, decide
from treespec.core.stats import GenerateOutput, Stats
from treespec.models.tiny import ByteTokenizer, greedy_reference, perturbed_copy, tiny_model
from treespec.recipes import Recipe, run
from treespec.calibrate.choices import compile_batch, resolve, resolve_compile
from treespec.core.compiling import UNCOMPILED

# compile 100 s, then 80 ms per token against 125 ms eager; prefill 1.0 s compiled, 1.5 s eager
TIMING = RouteTiming(compile=100.0, prefill_eager=1.5, token_eager=0.125, prefill_compiled=1.0, token_compiled=0.08)


def test_a_short_run_stays_eager_and_a_long_run_compiles() -> None:
    eager, compiled = TIMING.run_seconds(prompts=3, tokens=64)
    assert eager == pytest.approx(3 * (1.5 + 64 * 0.125)) and compiled == pytest.approx(100 + 3 * (1.0 + 64 * 0.08))
    assert decide(TIMING, prompts=3, tokens=64)[0] is False
    chosen, why = decide(TIMING, prompts=50, tokens=128)
    assert chosen and why.startswith("compiled steps") and "compile 100 s" in why
    # the break-even: compile / (saving per prompt) = 100 / (0.5 + 64 * 0.045) prompts of 64 tokens
    prompts = 100 / (0.5 + 64 * 0.045)
    assert not decide(TIMING, int(prompts), 64, margin=1.0)[0] and decide(TIMING, int(prompts) + 1, 64, margin=1.0)[0]


def test_a_compiled_route_that_is_slower_never_compiles() -> None:
    slower = RouteTiming(compile=0.0, prefill_eager=1.0, token_eager=0.1, prefill_compiled=1.0, token_compiled=0.11)
    assert not decide(slower, prompts=1000, tokens=1000)[0]


def test_without_a_measurement_the_run_stays_eager_and_says_how_to_measure() -> None:
    chosen, why = decide(None, prompts=1000, tokens=1000)
    assert not chosen and str(compile_choice.MEASURE_FROM_TOKENS) in why and "--compile" in why


def _fake(seconds_per_token: float, prefill: float, sleep_first: float = 0.0):
    calls = []

    def generate(ids: list[int], n: int) -> GenerateOutput:
        calls.append(n)
        if sleep_first and len(calls) == 2:
            time.sleep(sleep_first)  # a graph compiled when a step first reaches it, in the second prompt
        stats = Stats(steps=n, new_tokens=n, prefill_seconds=prefill, verifying_seconds=n * seconds_per_token)
        return GenerateOutput(sequences=None, new_tokens=[0] * n, stats=stats)

    return generate, calls


def test_measure_times_both_routes_and_the_compile() -> None:
    eager, eager_calls = _fake(0.1, 0.5)
    compiled, compiled_calls = _fake(0.05, 0.2, sleep_first=0.3)
    timing = compile_choice.measure(eager, compiled, [[1, 2], [3, 4]], tokens=8, progress=False)
    assert eager_calls == [compile_choice.WARMUP_TOKENS, 8, 8]  # an untimed warm-up, then each prompt
    assert compiled_calls == [8, 8, 8, 8]  # two passes
    assert timing.token_eager == pytest.approx(0.1) and timing.token_compiled == pytest.approx(0.05)
    assert timing.prefill_eager == pytest.approx(0.5) and timing.prefill_compiled == pytest.approx(0.2)
    assert timing.step_compiled == pytest.approx(0.05)  # one token per fake step
    assert 0.3 - 0.02 < timing.compile < 0.3 + 0.1  # the first pass's wall time less the second's
    with pytest.raises(ValueError, match="at least one prompt"):
        compile_choice.measure(eager, compiled, [])


def test_the_measurement_is_cached(tmp_path) -> None:
    cache = tmp_path / "compile.json"
    assert compile_choice.cached("k", cache, None) is None and not cache.exists()
    assert compile_choice.cached("k", cache, lambda: TIMING) == TIMING
    assert compile_choice.cached("k", cache, lambda: pytest.fail("measured again despite the cache")) == TIMING
    cache.write_text('{"k": {"compile": 1.0}}')  # an older layout is measured again
    assert compile_choice.cached("k", cache, lambda: TIMING) == TIMING


@pytest.fixture
def pair():
    target = tiny_model("llama", vocab=64, hidden=64, layers=1, scale=6, seed=0)
    return target, perturbed_copy(target, 0.1), ByteTokenizer(64)


def test_resolve_compile_measures_long_runs_only_and_the_choice_is_exact(pair, tmp_path) -> None:
    """A short run without a measurement stays eager and measures nothing; a long one measures both
    routes on the tiny pair (uncompiled: the choice of route is checked here, not a compiler),
    caches them, and whichever route it picks gives HF's greedy output."""
    target, draft, tok = pair
    cache = tmp_path / "compile.json"
    resolved = resolve(Recipe(tree="chain", budget=4), target, [draft])
    short = resolve_compile(resolved, target, [draft], tok, prompts=1, max_new_tokens=8, cache_file=cache,
                            backend=UNCOMPILED)
    assert short.recipe.compile is False and "eager steps" in short.why and not cache.exists()
    long = resolve_compile(resolved, target, [draft], tok, prompts=10, max_new_tokens=100, cache_file=cache,
                           backend=UNCOMPILED, measure_from_tokens=1000)
    assert cache.exists() and "measured here" in long.why
    assert long.recipe.compile in (False, UNCOMPILED)
    again = resolve_compile(resolved, target, [draft], tok, prompts=10, max_new_tokens=100, cache_file=cache,
                            backend=UNCOMPILED, measure_from_tokens=1000)
    assert again.recipe == long.recipe  # read from the cache (a new measurement could decide otherwise)
    prompt = tok("def f(x):")["input_ids"]
    for recipe in (long.recipe, short.recipe):
        assert (run(recipe, target, [draft], prompt, max_new_tokens=10).new_tokens
                == greedy_reference(target, prompt, 10))


def test_plain_decoding_stays_eager(pair, tmp_path) -> None:
    target, draft, tok = pair
    plain = resolve(Recipe(tree="chain", budget=1), target, [draft])
    out = resolve_compile(plain, target, [draft], tok, prompts=100, max_new_tokens=100, cache_file=tmp_path / "c.json",
                          measure_from_tokens=0)
    assert out.recipe.compile is False and "plain decoding" in out.why


@pytest.mark.parametrize("argv, expect", [([], None), (["--compile"], True), (["--compile", "aot_eager"], "aot_eager"),
                                          (["--no-compile"], False)])
def test_the_cli_compiles_by_measurement_unless_told(argv, expect) -> None:
    args = cli.build_parser().parse_args(["generate", "--prompt", "x", *argv])
    assert args.compile == expect
    assert cli_commands.recipe_from_args(args).compile == (expect or False)


def _tuned(vector):
    from treespec.calibrate import tuning
    from treespec.calibrate.costs import Profile

    prof = Profile({1: 0.10, 2: 0.101, 4: 0.103, 8: 0.11, 16: 0.13}, {1: 0.004, 4: 0.005, 16: 0.008}, {})
    return tuning.Tuned(prof.choose(vector, max_depth=8), prof)


def test_a_tuned_prediction_recosted_by_compiled_steps_keeps_its_tree() -> None:
    tuned = _tuned([0.8, 0.1, 0.05])
    compiled = tuned.on_compiled_steps(0.5 * tuned.choice.step_seconds)
    assert compiled.choice.shape == tuned.choice.shape and compiled.choice.tau == tuned.choice.tau
    assert compiled.choice.step_seconds == pytest.approx(0.5 * tuned.choice.step_seconds)
    assert compiled.choice.speedup == pytest.approx(2 * tuned.choice.speedup)  # plain decoding's cost is kept
    assert "per compiled step" in compiled.why and "per compiled step" not in tuned.why
    with pytest.raises(ValueError, match="> 0 seconds"):
        tuned.on_compiled_steps(0.0)


def test_a_compiled_run_prints_the_compiled_steps_prediction(pair, tmp_path) -> None:
    """Measured once (cached); a run that compiles as asked reads the measurement and its why-line
    costs the tuned tree by its compiled steps; without a measurement the eager prediction stays."""
    from treespec.calibrate.choices import Resolved

    target, draft, tok = pair
    tuned = _tuned([0.8, 0.1, 0.05])
    resolved = Resolved(Recipe(tree="sequoia", acceptance=[0.8, 0.1, 0.05], **tuned.settings()), tuned.why, tuned)
    cache = tmp_path / "compile.json"
    bare = resolve_compile(resolved, target, [draft], tok, prompts=1, max_new_tokens=8, cache_file=cache,
                           backend=UNCOMPILED, asked=True)
    assert bare.recipe.compile == UNCOMPILED and bare.tuned is tuned and not cache.exists()
    assert bare.why.endswith("compiled steps (as asked)")
    resolve_compile(resolved, target, [draft], tok, prompts=1, max_new_tokens=8, cache_file=cache,
                    backend=UNCOMPILED, measure_from_tokens=0)  # measures both routes and caches them
    (timing,) = [RouteTiming(**v) for v in __import__("json").loads(cache.read_text()).values()]
    assert timing.step_compiled > 0
    asked = resolve_compile(resolved, target, [draft], tok, prompts=1, max_new_tokens=8, cache_file=cache,
                            backend=UNCOMPILED, asked=True)
    assert asked.recipe.compile == UNCOMPILED and asked.tuned.choice.shape == tuned.choice.shape
    assert asked.tuned.choice.step_seconds == pytest.approx(timing.step_compiled)
    assert "per compiled step" in asked.why and "(as asked; measured here: compile" in asked.why


def test_off_a_cpu_a_compiled_tuned_run_drops_its_confidence_stop(pair, tmp_path) -> None:
    """The captured step reads the draft's confidence only on a CPU (elsewhere a read is a device sync), so a tuned
    tree with the stop would draft on the host, level by level uncompiled, while the device's profile costs
    captured levels. Compiled off a CPU (a meta device stands in for a GPU here) the tuned recipe drops its stop,
    says so, and predicts the tree with every level drafted; on the CPU the stop stays, and a stop the user set
    (no tuning) stays anywhere."""
    from treespec.calibrate.choices import Resolved

    target, draft, tok = pair
    tuned = replace(_tuned([0.8, 0.1, 0.05]), min_confidence=0.3)
    resolved = Resolved(Recipe(tree="sequoia", acceptance=[0.8, 0.1, 0.05], **tuned.settings()), tuned.why, tuned)
    assert resolved.recipe.min_confidence == 0.3
    kwargs = dict(prompts=1, max_new_tokens=8, cache_file=tmp_path / "c.json", backend=UNCOMPILED)
    on_cpu = resolve_compile(resolved, target, [draft], tok, asked=True, **kwargs)
    assert on_cpu.recipe.min_confidence == 0.3 and on_cpu.tuned.min_confidence == 0.3
    target, draft = target.to("meta"), draft.to("meta")  # (in place)
    elsewhere = resolve_compile(resolved, target, [draft], tok, asked=True, **kwargs)
    assert elsewhere.recipe.min_confidence is None and elsewhere.tuned.min_confidence is None
    assert elsewhere.recipe.budget == resolved.recipe.budget and "no confidence stop on meta" in elsewhere.why
    eager = resolve_compile(resolved, target, [draft], tok, **kwargs)  # nothing measured: stays eager, with its stop
    assert eager.recipe.compile is False and eager.recipe.min_confidence == 0.3
    users = Resolved(resolved.recipe, "as given")
    assert resolve_compile(users, target, [draft], tok, asked=True, **kwargs).recipe.min_confidence == 0.3
    because = resolve_compile(resolved, target, [draft], tok, asked="the demo compiles on CUDA", **kwargs)
    assert because.recipe.compile == UNCOMPILED and "compiled steps (the demo compiles on CUDA)" in because.why
    batch = compile_batch(resolved, target, UNCOMPILED)  # a batch compiles as asked, nothing measured
    assert batch.recipe.compile == UNCOMPILED and batch.recipe.min_confidence is None and "no confidence" in batch.why
