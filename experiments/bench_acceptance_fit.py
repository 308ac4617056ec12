"""Why the acceptance prediction misses: calibration length, prompt set, or the model itself?

The CPU sweep (``experiments/results/cpu-qwen-coder``) predicts tau from acceptance measured on 10
calibration prompts x 48 tokens and evaluates on 20 other prompts x 96 tokens. On Lee news at T=0 the
prediction underrates deep trees by 20-47%, even under the per-depth matrix. This script measures the
same draft against the same target (bfloat16 target, int8 draft, width 8, 8 depths, each panel's own
drafting mode and temperature; ``treespec.calibrate.acceptance.measure``) under calibrations that
change one thing at a time, then predicts every static-tree point of the sweep again (a report-time
computation: the points' trees, measured tau and intervals come from the sweep's records; nothing is
re-run):

* ``sweep``: the sweep's own calibration files (prompts 0-9, 48 tokens);
* ``long``: prompts 0-9, 96 tokens (the evaluation's length; Lee news T=0 only);
* ``more``: prompts 0-19, 96 tokens (twice the prompts, the evaluation's length; every panel);
* ``oracle``: the evaluation prompts themselves, 100-119, 96 tokens (Lee news T=0 only). A
  diagnostic, not a prediction (it sees the prompts it predicts): what is left of the gap there is
  the acceptance model's own.

Writes ``acceptance-<dataset>-T<t>-<mode>-<variant>.json`` and ``README.md`` (vector and per-depth
predictions against the measured tau over uncut steps, per panel) to ``--out``; a re-run reuses the
measured files.

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

SWEEP = Path(__file__).resolve().parent / "results" / "cpu-qwen-coder"
VARIANTS = {"long": (0, 10, 96), "more": (0, 20, 96), "oracle": (100, 120, 96)}
#: (dataset, temperature) -> the variants measured there (each panel pays for "more"; the rest is a diagnosis)
PANELS = {("lee-news", 0.0): ("long", "more", "oracle"), ("humaneval", 0.0): ("more",),
          ("lee-news", 1.0): ("more",), ("humaneval", 1.0): ("more",)}


def name(dataset: str, t: float, mode: str, variant: str) -> str:
    return f"acceptance-{dataset}-T{t:g}-{mode}-{variant}.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    points = [r for r in map(json.loads, (SWEEP / "results.jsonl").read_text().splitlines())
              if r["kind"] == "treespec" and r["result"].get("tree") and r["result"].get("acceptance")
              and (r["params"]["dataset"], r["params"]["temperature"]) in PANELS]
    needed = sorted({(r["params"]["dataset"], r["params"]["temperature"], r["result"]["acceptance"]["mode"], v)
                     for r in points for v in PANELS[r["params"]["dataset"], r["params"]["temperature"]]})
    missing = [n for n in needed if not (args.out / name(*n)).exists()]
    if missing:
        from treespec.models import DEFAULT_DRAFT, DEFAULT_TARGET, load

        target, tok = load(DEFAULT_TARGET, dtype="bfloat16")
        draft, _ = load(DEFAULT_DRAFT, dtype="int8", role="draft")
        for dataset, t, mode, v in missing:
            a, b, n = VARIANTS[v]
            acc = measure(target, draft, encode_prompts(tok, dataset_prompts(dataset)[a:b]), width=8, mode=mode,
                          temperature=t, max_new_tokens=n, max_depth=8, prompts_label=f"{dataset}[{a}:{b}]")
            acc.save(args.out / name(dataset, t, mode, v))  # after each: a re-run keeps what finished

    lines = [f"# Acceptance predictions against the CPU sweep's measured tau ({machine('cpu')})", "",
             __doc__.split("\n\n")[1].replace("\n", " "), "",
             "Cells: predicted tau under the vector / under the per-depth matrix (measured over predicted - 1).", ""]
    summary = []
    for (dataset, t), variants in PANELS.items():
        mine = sorted((r for r in points if (r["params"]["dataset"], r["params"]["temperature"]) == (dataset, t)),
                      key=lambda r: (r["params"]["builder"], r["params"]["budget"]))
        if not mine:
            continue
        columns = ("sweep", *variants)
        lines += [f"## {dataset}, T={t:g}", "", f"| builder | B | mode | measured tau (uncut) | {' | '.join(columns)} |",
                  "|---|---|---|---|" + "---|" * len(columns)]
        worst = {v: [0.0, 0.0] for v in columns}
        for r in mine:
            mode = r["result"]["acceptance"]["mode"]
            files = {"sweep": SWEEP / r["result"]["acceptance"]["file"],
                     **{v: args.out / name(dataset, t, mode, v) for v in variants}}
            shape = TreeShape.from_paths([tuple(x) for x in r["result"]["tree"]["paths"]])
            measured = tau_interval([r], uncut=True)
            cells = []
            for v in columns:
                acc = MeasuredAcceptance.load(files[v])
                vec, mat = shape.expected_tokens(acc.vector.tolist()), shape.expected_tokens(acc.matrix.tolist())
                gv, gm = measured.estimate / vec - 1, measured.estimate / mat - 1
                worst[v] = [max(worst[v][0], abs(gv)), max(worst[v][1], abs(gm))]
                cells.append(f"{vec:.2f} / {mat:.2f} ({gv:+.0%} / {gm:+.0%})")
            lines.append(f"| {r['params']['builder']} | {r['params']['budget']} | {mode} | {measured.fmt()} | "
                         f"{' | '.join(cells)} |")
        worst_text = "; ".join(f"{v}: {w[0]:.0%} / {w[1]:.0%}" for v, w in worst.items())
        lines += ["", f"Largest gap, vector / per-depth: {worst_text}.", ""]
        summary.append(f"| {dataset} | {t:g} | " + " | ".join(
            f"{worst[v][0]:.0%} / {worst[v][1]:.0%}" if v in worst else "-" for v in ("sweep", *VARIANTS)) + " |")
    lines[6:6] = ["Largest gap per panel (vector / per-depth), over its static points:", "",
                  "| dataset | T | sweep | long | more | oracle |", "|---|---|---|---|---|---|", *summary, ""]
    lines += [f"Command: `python experiments/bench_acceptance_fit.py --out {args.out}`.", ""]
    (args.out / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
