"""Does inductor's weight freezing pay for treespec's captured step on this CPU?

``treespec generate --compile``'s route (the tuned recipe with ``compile=True``, the draft loaded for
compiled steps) with weight freezing, the default since commit f89c7a7, against the same without freezing,
which is what that route ran before the commit (freezing passed in ``torch.compile``'s options froze
nothing: ``treespec/core/compiling.py``). The real Qwen2.5-Coder pair, HumanEval prompts, greedy.

A third arm, ``frozen-concat``, adds the concatenation of the linears that share an input (q, k, v; gate, up),
which freezing does on CUDA and on a CPU only when asked (``cpp.enable_concat_linear``).

Each arm runs in a process of its own (a frozen runner holds the weights as constants of its graphs; two
compiled pairs do not share a process well in 24 GiB), the unfrozen first, each making a warm-up call (its
compiles, kept apart) before its timed prompts. Records are appended to ``results-<arm>.jsonl`` (a re-run
resumes); the summary pairs the arms per prompt (bootstrap 95% interval).

    python experiments/bench_freezing.py --out experiments/results/freezing-cpu
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout without installing treespec

import torch  # noqa: E402

from treespec.bench import arms  # noqa: E402
from treespec.calibrate.vectors import default_acceptance  # noqa: E402
from treespec.core import captured_runner, compiled, compiling, prefill  # noqa: E402
from treespec.recipes import Recipe  # noqa: E402

ARMS = ("unfrozen", "frozen", "frozen-concat")


def unfrozen_compile_graph(fn, backend: str, mode: str | None, models: tuple = ()):
    """What ``compiling.compile_graph`` did before commit f89c7a7: ``freezing`` in ``torch.compile``'s options (and
    the attention switch traced into the graph, as then: ``models`` unused)."""
    options = {"freezing": True} if backend == "inductor" and mode is None else None
    return torch.compile(fn, fullgraph=True, backend=backend, mode=mode, options=options)


def concat_compile_graph(fn, backend: str, mode: str | None, models: tuple = ()):
    """``compiling.compile_graph`` with the linears that share an input concatenated under freezing (q, k, v;
    gate, up: what freezing does by default on CUDA, on a CPU only with ``cpp.enable_concat_linear``)."""
    frozen = compiling.compile_graph(fn, backend, mode, models)

    def call(*args, **kwargs):
        with torch._inductor.config.patch({"cpp.enable_concat_linear": True}):
            return frozen(*args, **kwargs)

    return call


def run_arm(arm: str, args: argparse.Namespace) -> None:
    """One arm in this process: the warm-up call, then every prompt not yet recorded."""
    patched = {"unfrozen": unfrozen_compile_graph, "frozen-concat": concat_compile_graph}.get(arm)
    if patched is not None:
        for module in (captured_runner, compiled, prefill):
            module.compile_graph = patched
    recipe = Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0), compile=True)
    arms.run_recipe(args, arm, recipe, f"treespec-captured-{arm}", arm == "unfrozen", target_dtype="bfloat16")


def report(args: argparse.Namespace) -> dict:
    return arms.report(args, ARMS, "experiments/bench_freezing.py", "Weight freezing in the captured step",
                       "`treespec generate --compile`'s recipe; each arm in its own process, the unfrozen first",
                       ("treespec-captured-frozen-concat", "treespec-captured-frozen"))


def main(argv: list[str] | None = None) -> dict | None:
    return arms.main(__file__, __doc__, ARMS, "experiments/results/freezing-cpu", "100:106", run_arm, report, argv)


if __name__ == "__main__":
    main()
