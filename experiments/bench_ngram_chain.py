"""Does the n-gram chain in the captured step pay on this CPU?

``treespec generate --compile`` (the tuned recipe, the draft model alone: captured) against ``--compile --ngram``
run two ways: the n-gram's chain hung under the root of the captured tree as given tokens (``chain``: what
``--ngram --compile`` runs since the chain was captured), and the same drafters through the compiled step drafted
on the host (``host``: what it ran before, forced here by refusing the captured route). The real Qwen2.5-Coder pair,
HumanEval prompts, greedy: every arm's tokens are the target's own.

Each arm runs in a process of its own (frozen compiled runners hold their weights as constants), making a warm-up
call (its compiles, kept apart) before its timed prompts; records are appended to ``results-<arm>.jsonl`` (a
re-run resumes); the summary pairs the arms per prompt (bootstrap 95% interval), each against ``model``.

    python experiments/bench_ngram_chain.py --out experiments/results/ngram-chain-cpu
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout without installing treespec

from treespec.bench import arms  # noqa: E402
from treespec.calibrate.vectors import default_acceptance  # noqa: E402
from treespec.core import captured  # noqa: E402
from treespec.recipes import NGramSettings, Recipe  # noqa: E402

ARMS = ("model", "chain", "host")


def run_arm(arm: str, args: argparse.Namespace) -> None:
    """One arm in this process: the warm-up call, then every prompt not yet recorded."""
    if arm == "host":
        real = captured.capturable
        captured.capturable = lambda req: "forced onto the host" if len(req.drafters) == 2 else real(req)
    recipe = Recipe(tree="sequoia", acceptance=default_acceptance(None, 0.0), compile=True,
                    ngram=None if arm == "model" else NGramSettings())
    arms.run_recipe(args, arm, recipe, f"treespec-{arm}", arm == "model")  # speedups over the draft model alone


def report(args: argparse.Namespace) -> dict:
    return arms.report(args, ARMS, "experiments/bench_ngram_chain.py", "The n-gram chain in the captured step",
                       "the `--compile` recipe, `--ngram` for chain and host; each arm in its own process",
                       ("treespec-chain", "treespec-host"), step=True)


def main(argv: list[str] | None = None) -> dict | None:
    return arms.main(__file__, __doc__, ARMS, "experiments/results/ngram-chain-cpu", "100:104", run_arm, report, argv)


if __name__ == "__main__":
    main()
