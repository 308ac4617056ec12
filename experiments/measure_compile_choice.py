"""Whether a compiled step pays on this machine: the measurement behind ``treespec generate``'s default.

Loads the built-in pair as the CLI does (``load_pair``, measured precisions), resolves the default
recipe (tuned Sequoia tree, calibrated), and measures its eager and compiled routes on the built-in
pilot prompts (``treespec.calibrate.choices.resolve_compile`` with ``measure_from_tokens=0``;
``treespec.calibrate.compile_choice``). The measurement is written to ``<out>/compile.json`` in the
cache's own format (a re-run reads it instead of measuring again), and ``<out>/README.md`` gives the
figures and the choice for a few run sizes, the line a compiled run prints (the tuned tree's
prediction costed by its compiled steps, ``Tuned.on_compiled_steps``) and, beside that prediction,
the compiled steps measured on HumanEval 100-102 (64 new tokens each).

    python experiments/measure_compile_choice.py --out experiments/results/compile-choice-cpu

Measure on a quiet machine: the compile and both routes are timed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from treespec.bench import compare
from treespec.calibrate import compile_choice
from treespec.calibrate.compile_choice import RouteTiming
from treespec.bench.datasets import humaneval_prompts
from treespec.calibrate.vectors import acceptance_for_draft
from treespec.common.machine import device_name, machine
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET
from treespec.models.pair import load_pair
from treespec.core.stats import Stats
from treespec.recipes import Recipe, run
from treespec.calibrate.choices import resolve, resolve_compile

#: (prompts, new tokens per prompt) the README reports the choice for
RUNS = ((1, 64), (10, 64), (50, 64), (100, 64), (100, 256), (1000, 128))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/compile-choice-cpu"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.out / "compile.json"

    target, tok, drafts = load_pair(DEFAULT_TARGET, [DEFAULT_DRAFT])
    acceptance, walk = acceptance_for_draft(None, 0.0, drafts[0])  # as the CLI: the draft precision's files
    resolved = resolve(Recipe(tree="sequoia", acceptance=acceptance), target, drafts, tokenizer=tok,
                       max_new_tokens=64, walk=walk)
    resolve_compile(resolved, target, drafts, tok, prompts=1, max_new_tokens=64, cache_file=cache,
                    measure_from_tokens=0)
    here = device_name("cpu")
    (key, saved), = [(k, v) for k, v in json.loads(cache.read_text()).items()
                     if here in k and k.startswith("compile-v5|")]
    timing = RouteTiming(**saved)
    asked = resolve_compile(resolved, target, drafts, tok, prompts=1, max_new_tokens=64, cache_file=cache, asked=True)
    texts = humaneval_prompts(100, 103)
    # untimed: the compiled graphs (the route's measurement above may have been read from the cache, compiling none)
    run(asked.recipe, target, drafts, tok(texts[0])["input_ids"], max_new_tokens=compare.WARMUP_TOKENS, seed=0)
    check = Stats.combined([run(asked.recipe, target, drafts, tok(text)["input_ids"], max_new_tokens=64, seed=0).stats
                            for text in texts])
    measured_step = (check.drafting_seconds + check.verifying_seconds + check.overhead_seconds) / check.steps

    rows = []
    for prompts, tokens in RUNS:
        eager, compiled = timing.run_seconds(prompts, tokens)
        chosen, _ = compile_choice.decide(timing, prompts, tokens)
        rows.append(f"| {prompts} | {tokens} | {eager:.0f} s | {compiled:.0f} s | "
                    f"{'compiled' if chosen else 'eager'} |")
    text = "\n".join([
        "# Does a compiled step pay here?", "",
        f"Machine: {machine('cpu')}. Recipe: {resolved.why}.", "",
        "Command: `python experiments/measure_compile_choice.py --out experiments/results/compile-choice-cpu`", "",
        "Measured on the built-in pilot prompts (`treespec.calibrate.compile_choice.measure`): one eager pass, "
        "two identical compiled passes; compile = the first compiled pass's wall time less the second's.", "",
        "| figure | seconds |", "|---|---|",
        f"| compile | {timing.compile:.1f} |",
        f"| prefill per prompt, eager | {timing.prefill_eager:.3f} |",
        f"| prefill per prompt, compiled | {timing.prefill_compiled:.3f} |",
        f"| steps per new token, eager | {timing.token_eager:.4f} |",
        f"| steps per new token, compiled | {timing.token_compiled:.4f} |",
        f"| seconds per compiled step | {timing.step_compiled:.4f} |", "",
        f"A compiled run prints: {asked.why}.", "",
        f"Beside it, the compiled steps ({check.step}) on HumanEval 100-102, 64 new tokens each: "
        f"{measured_step:.3f} s per step measured against {asked.tuned.prediction.step_seconds:.3f} s predicted "
        f"({asked.tuned.prediction.step_seconds / measured_step - 1:+.0%}); tau {check.tau:.2f} measured against "
        f"{asked.tuned.prediction.tau:.2f} predicted (the printed line's model).", "",
        f"The choice for a run (compiled when predicted {compile_choice.MARGIN:.2f}x faster, compile included):", "",
        "| prompts | new tokens each | eager (predicted) | compiled (predicted) | chosen |", "|---|---|---|---|---|",
        *rows, "", f"Cache key: `{key}`", ""])
    (args.out / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
