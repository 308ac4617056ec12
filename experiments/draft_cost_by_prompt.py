"""Seconds of drafting per draft forward against the prompt's length, on the built-in pair (``dtype="auto"``): the
default depth-8 chain (no confidence stop), 32 new tokens, on two of the pilot's short prompts, HumanEval 100 and the
longest of HumanEval 100-129, ``--rounds`` rounds in alternating order; prints the median per prompt.

Run at b07a502 (the draft fed its prompt inside the first step's drafting: 0.0293 / 0.0271 / 0.0328 / 0.0465 s
after 22 / 23 / 127 / 391 prompt tokens, 4 rounds) and at 6f762d2 (the draft's prompt pass in the prefill,
``Drafter.prefill``: 0.0282 / 0.0273 / 0.0279 / 0.0284, 2 rounds), the Zen 4 host, alone.

    python experiments/draft_cost_by_prompt.py --rounds 4
"""

from __future__ import annotations

import argparse
import statistics

import torch

import treespec
from tree_builders import TreeShape
from treespec.bench.datasets import humaneval_prompts
from treespec.calibrate.pilot import PILOT_PROMPTS
from treespec.drafters.model import ModelDrafter
from treespec.models.loading import DEFAULT_DRAFT, DEFAULT_TARGET, load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(2)
    d, _ = load(DEFAULT_DRAFT, dtype="auto", role="draft")
    t, tok = load(DEFAULT_TARGET, dtype="auto", role="target")
    chain = TreeShape.from_paths([tuple([0] * k) for k in range(1, 9)])
    he = humaneval_prompts(100, 130)
    prompts = {"pilot0": tok(PILOT_PROMPTS[0])["input_ids"], "pilot1": tok(PILOT_PROMPTS[1])["input_ids"],
               "he100": tok(he[0])["input_ids"], "longest": tok(max(he, key=len))["input_ids"]}
    res: dict[str, list[float]] = {k: [] for k in prompts}
    for rnd in range(args.rounds):
        for k, ids in (prompts.items() if rnd % 2 == 0 else list(prompts.items())[::-1]):
            dr = ModelDrafter(d, chain)
            s = treespec.generate(t, ids, [dr], max_new_tokens=32).stats
            res[k].append(s.drafting_seconds / (dr.levels_forwarded + s.steps))  # forwards: the levels and the root
            print(rnd, k, len(ids), f"per forward {res[k][-1]:.4f}", flush=True)
    print({k: (len(prompts[k]), round(statistics.median(v), 4)) for k, v in res.items()})


if __name__ == "__main__":
    main()
