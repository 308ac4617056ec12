"""Where the demo's predicted tau misses: the chosen tree replayed over walks of the demo's own evaluation prompts.

The demo predicts tau by replaying its tree over the shipped calibration walk of its draft's precision (HumanEval
prompts drawn from 0-99) with the run's confidence stop over the run's horizon (``Tuned.prediction``). It
evaluates on HumanEval 100 onwards, with the draft in the precision measured fastest here (int4 or int8, converted
from float32 as ``load(dtype="auto")`` converts it). This walks the evaluation prompts themselves, with each draft
precision, and replays the same tree over them: a replay over the run's own prompts and draft is exact for a
chain at T=0 (``tests/test_walk_replay.py``), so what is left between it and the demo's measured tau is the run
itself (bfloat16 ties), and what lies between it and the shipped walk's prediction is the prompts.

    python experiments/demo_prediction_gap.py --prompts 6 --out experiments/results/demo-cpu/prediction-gap.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tree_builders import chain
from treespec.bench.datasets import humaneval_prompts
from treespec.calibrate.acceptance import encode_prompts, measure
from treespec.calibrate.tuning import MIN_CONFIDENCE
from treespec.calibrate.vectors import calibration_walk
from treespec.models.precision import to_precision
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=6, help="HumanEval prompts from 100 on (the demo's)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--depth", type=int, default=8, help="the chain's depth (the demo's tuned tree here)")
    ap.add_argument("--drafts", nargs="+", default=["int4", "int8"])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    shape = chain(args.depth)
    target, tok = load(DEFAULT_TARGET, dtype="bfloat16")
    prompts = encode_prompts(tok, humaneval_prompts(100, 100 + args.prompts))
    n = args.max_new_tokens

    def replayed(walk) -> dict[str, float]:
        """The tree's tau over ``walk``: whole continuations (uncut steps), without and with the stop, and over
        the run's horizon with the stop (every step of an ``n``-token run: the demo's prediction)."""
        return {"no stop": walk.replayed_tau(shape), "stop": walk.replayed_tau(shape, MIN_CONFIDENCE),
                f"stop, a run of {n} tokens": walk.replayed_tau(shape, MIN_CONFIDENCE, n)}

    out = {"tree": f"chain of depth {args.depth}", "min_confidence": MIN_CONFIDENCE,
           "prompts": f"humaneval 100-{99 + args.prompts}"}
    for precision in args.drafts:
        shipped = calibration_walk(None, 0.0, precision)
        out[f"shipped walk, {precision} draft"] = {**replayed(shipped), "prompts": shipped.meta["prompts_label"]}
        # converted from float32 as dtype="auto" converts it (load(dtype="int4") keeps the GGUF's own blocks)
        draft = to_precision(load(DEFAULT_DRAFT, dtype="float32", role="draft")[0], precision)
        walk = measure(target, draft, prompts, width=8, mode="topk", temperature=0.0,
                       max_new_tokens=n, prompts_label=out["prompts"])
        out[f"evaluation walk, {precision} draft"] = replayed(walk)
        print(precision, out[f"evaluation walk, {precision} draft"], flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
