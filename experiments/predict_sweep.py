"""Do the predictions hold? The CPU sweep's static trees predicted again from the acceptance and cost
models, beside what was measured (a report-time computation: nothing here runs a model).

For every static-tree point of the committed CPU sweep (``experiments/results/cpu-qwen-coder``: sequoia,
chain, k-ary and independent chains at budgets 4, 8 and 16; HumanEval and Lee news at T=0 and T=1;
tau measured over 20 evaluation prompts x 96 tokens, prompts 100-119):

* **tau** is predicted from a calibration disjoint from the evaluation: 40 prompts drawn at random
  (seed 0) from the rest of each set, 96 tokens each, measured along the verification walk
  (``treespec accept``'s default; the ``random-walk`` files of ``experiments/results/acceptance-fit``).
  Two predictions: the point's tree *replayed* over the walk's accepted ranks
  (``MeasuredAcceptance.replayed_tau``: steps start where a run of that tree starts them, a path keeps
  its correlations) and the per-depth *rows* the DP sizes trees with (``TreeShape.expected_tokens``
  of the depth-conditional matrix). The replay carries the spread of its 40 calibration prompts and
  the measured tau the spread of its 20 evaluation prompts: the gap's 95% interval resamples both
  (``treespec.bench.intervals.ratio_of_ratios``), so a gap whose interval holds 0 cannot be told from
  prompt sampling.
* **seconds per step** are predicted the way ``treespec generate`` predicts them: this machine's
  profile of isolated forwards at each point's mean context (``Profile.at_context``), calibrated per
  temperature by the pooled real steps of the points running one tree, the budget-4 chain, on code and
  prose (``treespec.bench.sweep.figures.step_cost_rows``), and set beside the steps
  ``experiments/retime_sweep.py`` timed again on a quiet machine (the sweep's own timings ran under
  load on two hosts: identical trees differ there by up to 18% in seconds per step).
* **speed** (tokens per second) is predicted tau / predicted seconds per step, and measured as the
  sweep's tau / the re-timed seconds per step. Per panel: whether the tree predicted fastest is the
  one measured fastest, and what choosing by prediction loses.

Writes ``README.md``, ``points.jsonl`` (one line per point, machine-readable) and ``predicted_vs_measured.png``.

    python experiments/predict_sweep.py --out experiments/results/predictions-cpu
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import numpy as np  # noqa: E402

from tree_builders import TreeShape  # noqa: E402

from treespec.bench.intervals import ratio_of_ratios, ratio_of_sums  # noqa: E402
from treespec.bench.sweep.figures import panel, step_cost_rows  # noqa: E402
from treespec.bench.sweep.points import point_key  # noqa: E402
from treespec.calibrate.acceptance import MeasuredAcceptance  # noqa: E402
from treespec.calibrate.costs import Profile  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TAU_TOLERANCE, STEP_TOLERANCE = 0.05, 0.10  # the bars the predictions are held to


def calibration_file(directory: Path, record: dict, variant: str) -> Path:
    p = record["params"]
    return directory / (f"acceptance-{p['dataset']}-T{p['temperature']:g}-"
                        f"{record['result']['acceptance']['mode']}-{variant}.json")


def tau_rows(points: list[dict], directory: Path, variant: str) -> dict[str, dict]:
    """Per point key: measured tau (uncut, with its per-prompt counts), the replay and rows predictions
    from the ``variant`` calibration, and the gap's two-sample interval. Points without that
    calibration file (the i.i.d. chains at T=1, whose ``sample`` mode was not walked) are left out."""
    out = {}
    for r in points:
        f = calibration_file(directory, r, variant)
        if not f.exists():
            continue
        acc = MeasuredAcceptance.load(f)
        shape = TreeShape.from_paths([tuple(x) for x in r["result"]["tree"]["paths"]])
        tokens, steps = r["result"]["uncut_tokens_per_prompt"], r["result"]["uncut_steps_per_prompt"]
        cal_tokens, cal_steps = acc.replayed_steps(shape)
        measured = ratio_of_sums(tokens, steps)
        replay = ratio_of_sums(cal_tokens, cal_steps)
        gap = ratio_of_ratios(tokens, steps, cal_tokens, cal_steps)  # measured / replayed
        rows = float(shape.expected_tokens(acc.matrix.tolist()))
        out[point_key(r["params"])] = {"measured": measured, "replay": replay, "gap": gap, "rows": rows,
                                       "rows_gap": measured.estimate / rows - 1, "calibration": f.name,
                                       "calibration_prompts": acc.meta.get("prompts")}
    return out


def cost_rows(points: list[dict], retimed: Path) -> tuple[dict[str, dict], Profile | None]:
    """Per point key: predicted and measured seconds per step (``retime_sweep``'s files), and the profile."""
    if not (retimed / "steps.jsonl").exists() or not (retimed / "profile.json").exists():
        return {}, None
    from retime_sweep import retimed_records  # noqa: E402  (experiments/ is on sys.path when run as a script)

    profile = Profile.load(retimed / "profile.json")
    rows = step_cost_rows(retimed_records(points, retimed), profile)
    return {point_key(v["record"]["params"]): v for v in rows}, profile


def percent(x: float) -> str:
    return f"{x:+.1%}"


def interval_percent(iv) -> str:
    """A ratio's interval as the gap's: ``+3.1% [-2.0%, +8.4%]``."""
    return f"{iv.estimate - 1:+.1%} [{iv.low - 1:+.1%}, {iv.high - 1:+.1%}]" if iv.known else percent(iv.estimate - 1)


def point_record(r: dict, taus: dict, costs: dict) -> dict:
    """One point's predictions and measurements (what ``points.jsonl`` holds); every gap is measured
    over predicted - 1."""
    key, p = point_key(r["params"]), r["params"]
    t, c = taus.get(key), costs.get(key)
    row = {"key": key, "dataset": p["dataset"], "temperature": p["temperature"], "builder": p["builder"],
           "budget": p["budget"], "tree_size": r["result"]["tree"]["size"], "depth": r["result"]["tree"]["depth"],
           "tree": r["result"]["tree"]["paths"]}
    if t:
        row.update(measured_tau=t["measured"].as_dict(), replayed_tau=t["replay"].as_dict(),
                   tau_gap=t["gap"].estimate - 1, tau_gap_low=t["gap"].low - 1, tau_gap_high=t["gap"].high - 1,
                   rows_tau=t["rows"], rows_gap=t["rows_gap"])
    if c:
        row.update(predicted_step_seconds=c["predicted"], measured_step_seconds=c["measured"],
                   step_gap=c["measured"] / c["predicted"] - 1, cost_calibration_point=c["calibration"])
    if t and c:
        row.update(predicted_speed=t["replay"].estimate / c["predicted"],
                   measured_speed=t["measured"].estimate / c["measured"])
    return row


def table_row(row: dict, taus: dict) -> str:
    cells = [row["builder"], str(row["budget"]), str(row["tree_size"])]
    if "measured_tau" in row:
        m, rp, g = (taus[row["key"]][k] for k in ("measured", "replay", "gap"))
        cells += [m.fmt(), rp.fmt(), interval_percent(g), f"{row['rows_tau']:.2f}", percent(row["rows_gap"])]
    else:
        cells += ["-"] * 5
    if "measured_step_seconds" in row:
        cells += [f"{row['predicted_step_seconds']:.3f}", f"{row['measured_step_seconds']:.3f}",
                  "*calibration*" if row["cost_calibration_point"] else percent(row["step_gap"])]
    else:
        cells += ["-"] * 3
    cells += ([f"{row['predicted_speed']:.2f}", f"{row['measured_speed']:.2f}"] if "measured_speed" in row
              else ["-", "-"])
    return "| " + " | ".join(cells) + " |"


def panel_summary(rows: list[dict]) -> tuple[str, str]:
    """A panel's line of the summary table (largest gaps, how many within the bars, the tree chosen by
    predicted speed and what that choice measured against the fastest) and its sentence under the table."""
    with_tau = [x for x in rows if "measured_tau" in x]
    steps = [x["step_gap"] for x in rows if "step_gap" in x and not x["cost_calibration_point"]]
    worst = lambda values: max((abs(v) for v in values), default=float("nan"))  # noqa: E731
    within_tau = sum(abs(x["tau_gap"]) <= TAU_TOLERANCE for x in with_tau)
    told_apart = [x for x in with_tau if not x["tau_gap_low"] <= 0 <= x["tau_gap_high"]]
    fast = [x for x in rows if "measured_speed" in x]
    choice = "-"
    if fast:
        best = max(fast, key=lambda x: x["measured_speed"])
        picked = max(fast, key=lambda x: x["predicted_speed"])
        twin = picked is not best and picked["tree"] == best["tree"]  # two builders' identical trees: timing spread
        choice = (f"{picked['builder']} B={picked['budget']}"
                  + ("" if picked is best else f" (measured fastest: {best['builder']} B={best['budget']}"
                     + (", the same tree" if twin else "") + ")")
                  + f": {picked['measured_speed'] / best['measured_speed']:.2f}x of the fastest")
    x = rows[0]
    line = (f"| {x['dataset']} | {x['temperature']:g} | {worst(v['tau_gap'] for v in with_tau):.1%} "
            f"({within_tau}/{len(with_tau)}) | {len(told_apart)} | {worst(v['rows_gap'] for v in with_tau):.1%} | "
            f"{worst(steps):.1%} ({sum(abs(g) <= STEP_TOLERANCE for g in steps)}/{len(steps)}) | {choice} |")
    sentence = (f"Gaps are measured over predicted - 1. Replay within {TAU_TOLERANCE:.0%}: {within_tau} of "
                f"{len(with_tau)}; gap told apart from prompt sampling (its interval excludes 0): "
                + (", ".join(f"{v['builder']} B={v['budget']}" for v in told_apart) or "none") + ".")
    return line, sentence


def report(points: list[dict], taus: dict, costs: dict, profile: Profile | None, variant: str,
           command: str) -> tuple[str, list[dict]]:
    """The README's text and the points' records."""
    machine = next(iter(costs.values()))["machine"] if costs else "not re-timed"
    paragraphs = __doc__.split("\n\n")
    bullets = ["* " + " ".join(b.split()) for b in paragraphs[2].removeprefix("* ").split("\n* ")]
    panels: dict[tuple, list[dict]] = {}
    for r in sorted(points, key=lambda r: (r["params"]["builder"], r["params"]["budget"])):
        panels.setdefault(panel(r["params"]), []).append(point_record(r, taus, costs))
    summary, body, records = [], [], []
    for pn in sorted(panels, key=lambda k: (k[1], k[2])):
        rows = panels[pn]
        records += rows
        line, sentence = panel_summary(rows)
        summary.append(line)
        body += [f"## {pn[1]}, T={pn[2]:g}", "",
                 "| builder | B | size | measured tau (uncut) | replayed tau | gap [95%] | rows tau | gap | "
                 "predicted s/step | measured s/step | gap | predicted tok/s | measured tok/s |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
                 *(table_row(row, taus) for row in rows), "", sentence, ""]
    where = ("none" if profile is None else f"`profile.json` of `{profile.meta.get('date', '?')[:10]}`, measured at "
             f"{profile.meta.get('context')} and {profile.meta.get('second_context')} cached tokens")
    lines = [f"# Predicted vs measured: the CPU sweep's static trees (costs: {machine})", "",
             " ".join(paragraphs[1].split()), "", *bullets, "",
             f"Calibration: the `{variant}` acceptance files (one per panel and drafting mode). Profile: {where}.", "",
             "| dataset | T | tau: largest replay gap (within 5%) | gaps told apart from sampling | "
             "tau: largest rows gap | "
             "s/step: largest gap (within 10%) | tree chosen by predicted speed |",
             "|---|---|---|---|---|---|---|", *summary, "", *body, f"Command: `{command}`.", ""]
    return "\n".join(lines), records


def plot(records: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"sequoia": "C0", "kary": "C1", "chains": "C2", "chain": "C3"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, (pred, meas, label, tol) in zip(axes, (
            ("replayed_tau", "measured_tau", "tau (tokens per step)", TAU_TOLERANCE),
            ("predicted_step_seconds", "measured_step_seconds", "seconds per step", STEP_TOLERANCE))):
        xs_all = []
        for b, color in colors.items():
            mine = [r for r in records if r["builder"] == b and pred in r and meas in r]
            if not mine:
                continue
            x = np.array([r[pred]["estimate"] if isinstance(r[pred], dict) else r[pred] for r in mine])
            y = np.array([r[meas]["estimate"] if isinstance(r[meas], dict) else r[meas] for r in mine])
            xs_all += [*x, *y]
            marker = ["o" if r["dataset"] == "humaneval" else "s" for r in mine]
            for xi, yi, mk, r in zip(x, y, marker, mine):
                ax.scatter(xi, yi, color=color, marker=mk, facecolors=color if r["temperature"] == 0 else "none",
                           s=28, label=None, zorder=3)
                if isinstance(r[meas], dict):  # the measured figure's 95% interval over prompts
                    ax.plot([xi, xi], [r[meas]["low"], r[meas]["high"]], color=color, linewidth=0.8, zorder=2)
            ax.scatter([], [], color=color, label=b)
        if not xs_all:
            continue
        lo, hi = min(xs_all) * 0.95, max(xs_all) * 1.05
        grid = np.array([lo, hi])
        ax.plot(grid, grid, color="0.4", linewidth=1, label="measured = predicted", zorder=1)
        ax.fill_between(grid, grid * (1 - tol), grid * (1 + tol), color="0.88", label=f"within {tol:.0%}", zorder=0)
        ax.set_xlabel(f"predicted {label}")
        ax.set_ylabel(f"measured {label}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="o HumanEval, s Lee news; filled T=0", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "predicted_vs_measured.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for README.md, points.jsonl and the plot")
    ap.add_argument("--sweep", type=Path, default=RESULTS / "cpu-qwen-coder",
                    help="the sweep whose points are predicted")
    ap.add_argument("--acceptance", type=Path, default=RESULTS / "acceptance-fit",
                    help="directory of the calibration files (bench_acceptance_fit.py's)")
    ap.add_argument("--variant", default="random-walk", help="which calibration of --acceptance predicts tau")
    ap.add_argument("--retimed", type=Path, default=RESULTS / "cpu-qwen-coder-retimed",
                    help="retime_sweep.py's directory (steps.jsonl, profile.json)")
    args = ap.parse_args(argv)
    if not (args.sweep / "results.jsonl").exists():
        ap.error(f"{args.sweep / 'results.jsonl'} does not exist: give the sweep's directory with --sweep")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from retime_sweep import static_points

    points = static_points() if args.sweep == RESULTS / "cpu-qwen-coder" else None
    if points is None:
        from treespec.bench.sweep.records import read_records

        points = [r for r in read_records(args.sweep / "results.jsonl")
                  if r["kind"] == "treespec" and r["result"].get("tree") and r["result"]["steps"]]
    taus = tau_rows(points, args.acceptance, args.variant)
    if not taus:
        ap.error(f"no {args.variant!r} calibration file in {args.acceptance}; measure them with "
                 "experiments/bench_acceptance_fit.py")
    costs, profile = cost_rows(points, args.retimed)
    command = "python experiments/predict_sweep.py --out " + str(args.out)
    text, records = report(points, taus, costs, profile, args.variant, command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "README.md").write_text(text)
    (args.out / "points.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    plot(records, args.out)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
