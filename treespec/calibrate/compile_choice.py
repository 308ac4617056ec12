"""Whether a compiled step pays for a run on this machine: what ``treespec generate`` does by default.

A compiled step (``treespec.core.compiled``; ``treespec.core.captured`` when one draft model's static
tree is drafted on the device too) costs less per token than the eager step, but its graphs are
compiled before the first token: on this project's 2-core CPU 148 s the first time
(``experiments/results/cpu-fastest-zen4``), less once inductor's on-disk cache holds some of the graphs
(``experiments/results/compile-choice-cpu``). Whether that pays depends on the run's length. For ``P``
prompts of ``N`` new tokens::

    eager    = P (prefill_e + N token_e)
    compiled = compile + P (prefill_c + N token_c)

and the run compiles when ``eager >= MARGIN * compiled``. The five figures are measured once per
machine, models and recipe (cached): the eager recipe (after an untimed warm-up) and the compiled
recipe (twice) generate :data:`TOKENS` tokens from each built-in pilot prompt
(``treespec.calibrate.pilot.PILOT_PROMPTS``), timed by the engine's own ``Stats`` (``token_*``: the
seconds of the steps per new token; ``prefill_*``: per prompt). ``compile`` is the wall time of the
first compiled pass less the second's (:func:`measure`). Measuring costs a compile, which the run then
reuses (the compiled graphs are cached in the process), so it is only done for a run of at least
:data:`MEASURE_FROM_TOKENS` new tokens, where the compile is paid back when the compiled step is a
little faster; a shorter run without a measurement stays eager and says so. The compiled pass's
seconds per step (``step_compiled``) also cost the tuned tree's printed prediction when the run
compiles (``treespec.calibrate.choices.resolve_compile``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from ..common.files import cached_entry
from ..core.stats import GenerateOutput, Stats

#: new tokens per pilot prompt and route
TOKENS = 32
#: tokens of the eager route's untimed warm-up
WARMUP_TOKENS = 4
#: a run this long (prompts x new tokens) measures the routes when no measurement is cached: on this
#: project's CPU the eager default made 7.8-8.3 tokens/s on HumanEval (``experiments/results/cpu-fastest-zen4``),
#: so about 8-9 minutes of eager generation, against a first compile of 148 s there
MEASURE_FROM_TOKENS = 4096
#: the compiled route is chosen when it is predicted at least this much faster for the whole run
MARGIN = 1.05

Generate = Callable[[list[int], int], GenerateOutput]


@dataclass(frozen=True)
class RouteTiming:
    """Seconds measured for the eager and the compiled route of one recipe (module docstring)."""

    compile: float
    prefill_eager: float
    token_eager: float
    prefill_compiled: float
    token_compiled: float
    #: seconds per step of the compiled pass (drafting, verifying and engine; what a tuned tree's
    #: prediction is re-costed with when the run compiles); 0.0: not recorded
    step_compiled: float = 0.0

    def run_seconds(self, prompts: int, tokens: int) -> tuple[float, float]:
        """Predicted seconds of ``prompts`` prompts of ``tokens`` new tokens: (eager, compiled)."""
        eager = prompts * (self.prefill_eager + tokens * self.token_eager)
        compiled = self.compile + prompts * (self.prefill_compiled + tokens * self.token_compiled)
        return eager, compiled


def _per_token_prefill_and_step(parts: Sequence[Stats]) -> tuple[float, float, float]:
    """(seconds of the steps per new token, prefill seconds per prompt, seconds per step) over ``parts``."""
    total = Stats.combined(list(parts))
    steps = total.drafting_seconds + total.verifying_seconds + total.overhead_seconds
    return (steps / max(total.new_tokens, 1), total.prefill_seconds / max(len(parts), 1),
            steps / max(total.steps, 1))


def _timed_pass(generate: Generate, prompts: Sequence[list[int]], tokens: int, desc: str, progress: bool
                ) -> tuple[float, list[Stats]]:
    """Wall seconds of generating ``tokens`` from each of ``prompts``, and each generation's ``Stats``."""
    start, parts = time.perf_counter(), []
    for ids in tqdm(prompts, desc=desc, disable=not progress, leave=False):
        parts.append(generate(list(ids), tokens).stats)
    return time.perf_counter() - start, parts


def measure(generate_eager: Generate, generate_compiled: Generate, prompts: Sequence[list[int]], *,
            tokens: int = TOKENS, progress: bool = True) -> RouteTiming:
    """Time the eager and the compiled route on ``prompts``: an untimed warm-up of the eager route, one
    eager pass, and two identical compiled passes (seeded: the same steps). The first compiled pass
    compiles every graph the run needs (a graph is compiled when a step first reaches it, so a short
    warm-up would leave some to the timed prompts); ``compile`` is its wall time less the second's, and
    the second pass gives ``prefill_compiled``, ``token_compiled`` and ``step_compiled``."""
    if not prompts:
        raise ValueError("measuring the routes needs at least one prompt")
    generate_eager(list(prompts[0]), WARMUP_TOKENS)  # untimed
    _, eager = _timed_pass(generate_eager, prompts, tokens, "does compiling pay here: eager", progress)
    first_wall, _ = _timed_pass(generate_compiled, prompts, tokens, "does compiling pay here: compiling", progress)
    second_wall, compiled = _timed_pass(generate_compiled, prompts, tokens, "does compiling pay here: compiled",
                                        progress)
    token_e, prefill_e, _ = _per_token_prefill_and_step(eager)
    token_c, prefill_c, step_c = _per_token_prefill_and_step(compiled)
    return RouteTiming(compile=max(first_wall - second_wall, 0.0), prefill_eager=prefill_e, token_eager=token_e,
                       prefill_compiled=prefill_c, token_compiled=token_c, step_compiled=step_c)


def cached(key: str, cache_file: Path | None, measure_now: Callable[[], RouteTiming] | None) -> RouteTiming | None:
    """The timing cached under ``key`` in ``cache_file``; else ``measure_now()`` (cached), or None when
    ``measure_now`` is None."""
    return cached_entry(cache_file, key, measure_now, lambda saved: RouteTiming(**saved), asdict)


def decide(timing: RouteTiming | None, prompts: int, tokens: int, margin: float = MARGIN) -> tuple[bool, str]:
    """Whether ``prompts`` prompts of ``tokens`` new tokens run compiled, and a line saying why."""
    if timing is None:
        return False, (f"eager steps: whether compiling pays is measured here for runs of {MEASURE_FROM_TOKENS}+ "
                       "new tokens (pass --compile to compile anyway)")
    eager, compiled = timing.run_seconds(prompts, tokens)
    if eager >= margin * compiled:
        return True, f"compiled steps ({figures(timing, prompts, tokens)})"
    return False, f"eager steps ({figures(timing, prompts, tokens)})"


def figures(timing: RouteTiming, prompts: int, tokens: int) -> str:
    """The measured figures behind a decision, and the run's predicted seconds on each route."""
    eager, compiled = timing.run_seconds(prompts, tokens)
    return (f"measured here: compile {timing.compile:.0f} s, then {timing.token_compiled * 1e3:.0f} ms per token "
            f"against {timing.token_eager * 1e3:.0f} ms eager; this run predicted {compiled:.0f} s compiled, "
            f"{eager:.0f} s eager")
