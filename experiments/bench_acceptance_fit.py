"""Why the acceptance prediction misses on prose: calibration length, prompt set, or the model itself?

The CPU sweep (``experiments/results/cpu-qwen-coder``) predicts tau from acceptance measured on 10
calibration prompts x 48 tokens and evaluates on 20 other prompts x 96 tokens. On Lee news at T=0 the
prediction underrates deep trees by 20-47%, even under the per-depth matrix. This script measures the
same draft against the same target (bfloat16 target, int8 draft, greedy top-k proposals, width 8,
8 depths; ``treespec.calibrate.acceptance.measure``) under calibrations that change one thing at a
time, then predicts every static-tree point of that panel again (a report-time computation: the
points' trees, measured tau and intervals come from the sweep's records; nothing is re-run):

* ``sweep``: the sweep's own calibration file (prompts 0-9, 48 tokens);
* ``long``: prompts 0-9, 96 tokens (the evaluation's length);
* ``more``: prompts 0-19, 96 tokens (twice the prompts);
* ``oracle``: the evaluation prompts themselves, 100-119, 96 tokens. A diagnostic, not a prediction
  (it sees the prompts it predicts): what is left of the gap here is the acceptance model's own.

Writes ``acceptance-<variant>.json`` and ``README.md`` (vector and per-depth predictions against the
measured tau over uncut steps) to ``--out``; a re-run reuses the measured files.

    python experiments/bench_acceptance_fit.py --out experiments/results/acceptance-fit
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tree_builders import TreeShape

from treespec.bench.datasets import dataset_prompts
from treespec.bench.sweep.figures import tau_interval
from treespec.calibrate.acceptance import MeasuredAcceptance, encode_prompts, measure
from treespec.common.machine import machine
from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load

SWEEP = Path(__file__).resolve().parent / "results" / "cpu-qwen-coder"
VARIANTS = {"long": (0, 10, 96), "more": (0, 20, 96), "oracle": (100, 120, 96)}


def sweep_acceptance(dataset: str, temperature: float) -> Path:
    for r in map(json.loads, (SWEEP / "results.jsonl").read_text().splitlines()):
        p = r["params"]
        if (p.get("dataset"), p.get("temperature"), p.get("builder")) == (dataset, temperature, "sequoia"):
            return SWEEP / r["result"]["acceptance"]["file"]
    raise SystemExit(f"no sequoia point for {dataset} T={temperature} in {SWEEP}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dataset", default="lee-news")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    accs = {"sweep": MeasuredAcceptance.load(sweep_acceptance(args.dataset, 0.0))}
    missing = [v for v in VARIANTS if not (args.out / f"acceptance-{v}.json").exists()]
    if missing:
        target, tok = load(DEFAULT_TARGET, dtype="bfloat16")
        draft, _ = load(DEFAULT_DRAFT, dtype="int8", role="draft")
        texts = dataset_prompts(args.dataset)
        for v in missing:
            a, b, n = VARIANTS[v]
            acc = measure(target, draft, encode_prompts(tok, texts[a:b]), width=8, mode="topk", temperature=0.0,
                          max_new_tokens=n, max_depth=8, prompts_label=f"{args.dataset}[{a}:{b}]")
            acc.save(args.out / f"acceptance-{v}.json")
    for v in VARIANTS:
        accs[v] = MeasuredAcceptance.load(args.out / f"acceptance-{v}.json")

    points = [r for r in map(json.loads, (SWEEP / "results.jsonl").read_text().splitlines())
              if r["kind"] == "treespec" and r["params"]["dataset"] == args.dataset
              and r["params"]["temperature"] == 0.0 and r["result"].get("tree")]
    head = " | ".join(f"{v} (vector / per-depth)" for v in accs)
    lines = [f"# Acceptance prediction on {args.dataset}, T=0: what closes the gap ({machine('cpu')})", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             "Depth-1 acceptance (rank 0) and the per-depth rate at depths 4 and 8, per calibration: " + "; ".join(
                 f"{v}: {a.matrix[0][0]:.3f} / {a.matrix[3][0]:.3f} / {a.matrix[7][0]:.3f} "
                 f"({a.positions} positions)" for v, a in accs.items()) + ".", "",
             f"| builder | B | measured tau (uncut) | {head} |", "|---|---|---|" + "---|" * len(accs)]
    worst = {v: [0.0, 0.0] for v in accs}
    for r in sorted(points, key=lambda r: (r["params"]["builder"], r["params"]["budget"])):
        shape = TreeShape.from_paths([tuple(x) for x in r["result"]["tree"]["paths"]])
        measured = tau_interval([r], uncut=True)
        cells = []
        for v, a in accs.items():
            vec, mat = shape.expected_tokens(a.vector.tolist()), shape.expected_tokens(a.matrix.tolist())
            gv, gm = measured.estimate / vec - 1, measured.estimate / mat - 1
            worst[v] = [max(worst[v][0], abs(gv)), max(worst[v][1], abs(gm))]
            cells.append(f"{vec:.2f} / {mat:.2f} ({gv:+.0%} / {gm:+.0%})")
        lines.append(f"| {r['params']['builder']} | {r['params']['budget']} | {measured.fmt()} | {' | '.join(cells)} |")
    lines += ["", "Largest gap (measured over predicted), vector / per-depth: " + "; ".join(
        f"{v}: {w[0]:.0%} / {w[1]:.0%}" for v, w in worst.items()) + ".", "",
        "Command: `python experiments/bench_acceptance_fit.py --out " + str(args.out) + "`.", ""]
    (args.out / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
