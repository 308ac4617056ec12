"""The report of a sweep: plots (PNG) and a Markdown summary written from its ``results.jsonl``.

Every figure carries its spread over prompts: tau, tok/s and speedups are ratios of per-prompt
sums with 95% bootstrap intervals (``treespec.bench.intervals``; speedups paired per prompt with the
baseline run on the same prompts), shown in the tables and as error bars in the plots. Tau is
given two ways: over all steps, and over the steps not shortened by the end of generation, which
is what the tree's predicted tau estimates; the prediction section says whether the prediction
falls inside the measured interval and, where it does not, shows per-depth acceptance (measured
in the run vs predicted from the calibration vector) to locate the loss.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tree_builders import TreeShape

from ..intervals import Interval
from .config import CITABLE
from .figures import (agreement, baseline_of, baseline_speedup, depth_rows, per_depth_prediction,
                      same_greedy_outputs, speed_interval, speedup_interval, tau_interval, where_the_gap_is)
from .records import machine_of, read_records

# What a baseline shares with the treespec points it is compared with (same prompts, same settings).
def _figure(ncols: int, nrows: int = 1, width: float = 5.0, height: float = 3.8, legend_space: float = 0.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols + legend_space, height * nrows))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(nrows * ncols)]
    return fig, axes


def _panel(p: dict[str, Any]) -> tuple:
    return (p["target"], p["dataset"], p["temperature"], p["top_p"])


def _panel_title(panel: tuple, multi_target: bool) -> str:
    target, dataset, t, top_p = panel
    head = f"{target.split('/')[-1]}\n" if multi_target else ""
    return f"{head}{dataset}, T={t:g}" + (f", top-p={top_p:g}" if top_p < 1 else "")


def _line(p: dict[str, Any], multi_depth: bool) -> str:
    name = "ngram" if p["drafters"] == "ngram" else (p["builder"] if p["drafters"] == "model"
                                                     else f"both/{p['builder']}")
    if multi_depth:
        name += f" d<={p['max_depth'] if p['max_depth'] is not None else 'none'}"
    if "verifier" in p:
        name += f" [{p['verifier']}]"
    return name


_BUILDER_COLOR = {"sequoia": "C0", "kary": "C1", "chains": "C2", "chain": "C3", "dynamic": "C4", "ngram": "C5"}


def _style(line: str) -> dict[str, Any]:
    """Colour by builder, line style by drafter set (solid: model, dashed: both, dotted: n-gram)."""
    name = line.split(" ")[0]
    builder = name.split("/")[-1]
    dash = "--" if name.startswith("both/") else ":" if builder == "ngram" else "-"
    marker = "o" if " d<=" not in line or line.endswith("none") else "s"  # square: a depth limit
    return {"color": _BUILDER_COLOR.get(builder, "k"), "linestyle": dash, "marker": marker, "label": line}


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, Interval):
        return x.fmt(digits)
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def report(results_jsonl: str | os.PathLike, out_dir: str | os.PathLike | None = None,
           skip_corrupt: bool = False) -> Path:
    """Write plots (PNG) and a Markdown summary (``README.md``) beside ``results_jsonl``; returns README.md.

    Plots: tau vs budget and speedup over the target baseline vs budget (one panel per target,
    dataset, temperature and top-p; one line per builder; seeds pooled; 95% CI error bars),
    predicted vs measured (uncut) tau, the acceptance vectors, and every static tree used (``trees/``).
    ``skip_corrupt``: skip (and name) corrupt record lines instead of refusing (``records.read_records``).
    """
    path = Path(results_jsonl)
    out = Path(out_dir) if out_dir is not None else path.parent
    out.mkdir(parents=True, exist_ok=True)
    everything = read_records(path, skip_corrupt)
    records = [r for r in everything if r.get("status") == "ok"]
    finished = {r["key"] for r in records}
    errors = [r for r in everything if r.get("status") == "error" and r["key"] not in finished]
    tres = [r for r in records if r["kind"] == "treespec"]
    bases = [r for r in records if r["kind"] == "baseline"]
    multi_target = len({r["params"]["target"] for r in records}) > 1
    multi_depth = len({r["params"]["max_depth"] for r in tres}) > 1
    panels = sorted({_panel(r["params"]) for r in tres}, key=str)
    images: list[tuple[str, str]] = []

    def curves(value: Callable[[list[dict[str, Any]]], Interval | None]) -> dict[tuple, dict[str, list]]:
        """Per panel and line: (budget, interval) points; the seeds of a point are pooled."""
        acc: dict[tuple, dict[str, dict[int, list[dict[str, Any]]]]] = {}
        for r in tres:
            acc.setdefault(_panel(r["params"]), {}).setdefault(_line(r["params"], multi_depth), {}).setdefault(
                r["params"]["budget"], []).append(r)
        out_curves: dict[tuple, dict[str, list]] = {}
        for pn, lines in acc.items():
            for ln, pts in lines.items():
                vals = [(b, value(rs)) for b, rs in sorted(pts.items())]
                vals = [(b, v) for b, v in vals if v is not None]
                if vals:
                    out_curves.setdefault(pn, {})[ln] = vals
        return out_curves

    def budget_plot(name: str, ylabel: str, data: dict, hlines: Callable[[tuple], dict[str, float]] | None) -> None:
        if not panels:
            return
        fig, axes = _figure(len(panels), legend_space=1.8)
        handles: dict[str, Any] = {}
        for ax, pn in zip(axes, panels):
            for ln, pts in sorted(data.get(pn, {}).items()):
                ys = np.array([v.estimate for _, v in pts])
                lows = np.array([v.low if v.known else v.estimate for _, v in pts])
                highs = np.array([v.high if v.known else v.estimate for _, v in pts])
                h = ax.errorbar([b for b, _ in pts], ys, yerr=np.vstack([ys - lows, highs - ys]), markersize=4,
                                capsize=3, **_style(ln))
                handles.setdefault(ln, h)
            if hlines is not None:
                for i, (label, y) in enumerate(sorted(hlines(pn).items())):
                    handles.setdefault(label, ax.axhline(y, color=("0.1", "0.45", "0.7")[i % 3], linestyle=(0, (4, 2)),
                                                         linewidth=1.2))
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget B (tokens per verification, root included)")
            ax.set_ylabel(ylabel)
            ax.set_title(_panel_title(pn, multi_target), fontsize=9)
            ax.grid(alpha=0.3)
        fig.legend(list(handles.values()), list(handles), loc="center right", fontsize=8)
        fig.tight_layout(rect=(0, 0, 1 - 1.8 / fig.get_figwidth(), 1))
        fig.savefig(out / name, dpi=100)
        images.append((ylabel, name))

    budget_plot("tau_vs_budget.png", "tau (tokens per step, 95% CI over prompts)", curves(tau_interval), None)

    def base_speedups(pn: tuple) -> dict[str, float]:
        lines: dict[str, list[float]] = {}
        for r in bases:
            if _panel(r["params"]) == pn and r["params"]["method"] != "target":
                v = baseline_speedup(r, bases)
                if v is not None:
                    lines.setdefault(f"HF {r['params']['method']}", []).append(v.estimate)
        out_lines = {k: float(np.mean(v)) for k, v in lines.items()}
        out_lines["target alone"] = 1.0
        return out_lines

    budget_plot("speedup_vs_budget.png", "speedup over the target alone (95% CI)",
                curves(lambda rs: speedup_interval(rs, bases, "target")), base_speedups)

    predicted = [r for r in tres if r["result"].get("predicted_tau") is not None]
    if predicted:
        fig, (ax,) = _figure(1, width=5.5, height=5.0)
        builders = sorted({r["params"]["builder"] for r in predicted})
        for b in builders:
            rs = [r for r in predicted if r["params"]["builder"] == b]
            xs = [r["result"]["predicted_tau"] for r in rs]
            ivs = [tau_interval([r], uncut=True) for r in rs]
            ys = np.array([iv.estimate if iv else r["result"]["tau"] for iv, r in zip(ivs, rs)])
            lows = np.array([iv.low if iv and iv.known else y for iv, y in zip(ivs, ys)])
            highs = np.array([iv.high if iv and iv.known else y for iv, y in zip(ivs, ys)])
            ax.errorbar(xs, ys, yerr=np.vstack([ys - lows, highs - ys]), fmt="o", markersize=4, capsize=3, label=b,
                        color=_BUILDER_COLOR.get(b, "k"))
        hi = max(max(r["result"]["predicted_tau"], r["result"]["tau"]) for r in predicted) * 1.05
        ax.plot([1, hi], [1, hi], color="0.5", linestyle="--", linewidth=1, label="measured = predicted")
        ax.set_xlabel("predicted tau (acceptance vector, calibration prompts)")
        ax.set_ylabel("measured tau over uncut steps (evaluation prompts, 95% CI)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "predicted_vs_measured_tau.png", dpi=100)
        images.append(("predicted vs measured tau", "predicted_vs_measured_tau.png"))

    accs: dict[str, dict[str, Any]] = {}
    for r in tres:
        a = r["result"].get("acceptance")
        if a is not None and a["file"] not in accs:
            accs[a["file"]] = {**a, "dataset": r["params"]["dataset"], "temperature": r["params"]["temperature"],
                               "top_p": r["params"]["top_p"], "target": r["params"]["target"]}
    if accs:
        fig, (ax,) = _figure(1, width=7.0, height=4.0)
        n = len(accs)
        for i, a in enumerate(sorted(accs.values(), key=lambda a: (a["dataset"], a["temperature"], a["mode"]))):
            xs = np.arange(len(a["vector"])) + (i - (n - 1) / 2) * 0.8 / n
            ax.bar(xs, a["vector"], width=0.8 / n,
                   label=f"{a['dataset']} T={a['temperature']:g} {a['mode']} (beta {a['beta']:.2f})")
        ax.set_xlabel("child rank k")
        ax.set_ylabel("a_k = P(rank k is the accepted child)")
        ax.set_title("positional acceptance vectors (calibration prompts)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "acceptance.png", dpi=100)
        images.append(("acceptance vectors", "acceptance.png"))

    trees: list[tuple[str, str]] = []
    for r in tres:
        tree = r["result"].get("tree")
        if tree is None:
            continue
        p = r["params"]
        depth = "none" if p["max_depth"] is None else p["max_depth"]
        a = r["result"].get("acceptance")
        tag = f"-{a['file'][len('acceptance-'):-len('.json')]}" if (a and p["builder"] == "sequoia") else ""
        name = f"trees/{p['builder']}-B{p['budget']}-d{depth}{tag}.png"
        if any(name == seen for _, seen in trees):
            continue
        (out / "trees").mkdir(exist_ok=True)
        shape = TreeShape(tuple(x) for x in tree["paths"])
        title = f"{p['builder']} B={p['budget']} depth<={depth}" + (
            f" ({p['dataset']}, T={p['temperature']:g})" if tag else "")
        shape.draw(str(out / name), acceptance=a["vector"] if a else None, title=title)
        trees.append((title, name))

    readme = out / "README.md"
    readme.write_text(_markdown(path, records, tres, bases, errors, images, trees, multi_depth), encoding="utf-8")
    return readme


def _load_note(records: list[dict[str, Any]]) -> str:
    """The range of 1-minute load averages seen when points finished (timings are only as good as that)."""
    metas = [r["meta"] for r in records if (r.get("meta") or {}).get("loadavg")]
    if not metas:
        return ""
    loads = [m["loadavg"][0] for m in metas]
    return (f" 1-minute load average when points finished: {min(loads):.1f} to {max(loads):.1f} on "
            f"{metas[0].get('cpus', '?')} cores, the sweep's own {metas[0].get('threads', '?')} threads included "
            "(CPU timings are only trustworthy when nothing else runs).")


def _machine_note(records: list[dict[str, Any]]) -> str:
    """Which machine measured which panels; said loudly when there were several."""
    panels: dict[str, set[str]] = {}
    later: dict[str, int] = {}
    for r in records:
        m = machine_of(r)
        panels.setdefault(m, set()).add(f"{r['params']['dataset']} T={r['params']['temperature']:g}")
        later[m] = later.get(m, 0) + ((r.get("meta") or {}).get("machine_source") == "backfilled")
    if not panels:
        return ""
    def one(m: str) -> str:
        note = f"; recorded afterwards for {later[m]} points, from the session that ran them" if later[m] else ""
        return f"{m} ({', '.join(sorted(panels[m]))}{note})"
    if len(panels) == 1:
        return f"Machine: {one(next(iter(panels)))}.\n"
    return (f"**Machines: {'; '.join(one(m) for m in sorted(panels))}.** Speedups pair a point only with "
            "baselines measured on the same machine; a point whose baselines ran elsewhere shows none, and "
            "tok/s figures from different machines are not comparable.\n")


def _citable_note(records: list[dict[str, Any]]) -> str:
    """How many prompts, tokens and prompt sets the figures rest on, flagged when below ``CITABLE``."""
    if not records:
        return ""
    prompts = min(len(r["result"]["tokens_per_prompt"]) for r in records)
    tokens = min(r["params"]["max_new_tokens"] for r in records)
    datasets = sorted({r["params"]["dataset"] for r in records})
    splits = sorted({(s["dataset"], tuple(s["calib"]), tuple(s["eval"]))
                     for r in records if (s := r["result"].get("split"))})
    split_text = "; ".join(f"{d}: calibration {c[0]}-{c[1] - 1}, evaluation {e[0]}-{e[1] - 1}" for d, c, e in splits)
    low = (prompts < CITABLE["prompts"] or tokens < CITABLE["tokens"] or len(datasets) < CITABLE["datasets"])
    flag = (f" **Below the citable minimum ({CITABLE['prompts']} prompts x {CITABLE['tokens']} tokens on "
            f"{CITABLE['datasets']} prompt sets): read these figures as indicative.**" if low else "")
    return (f"Each point: {prompts} evaluation prompts x {tokens} new tokens, prompt sets {', '.join(datasets)}"
            + (f" ({split_text})" if split_text else "") + "." + flag + "\n")


def _markdown(path: Path, records: list, tres: list, bases: list, errors: list, images: list, trees: list,
              multi_depth: bool) -> str:
    configs = sorted({r.get("meta", {}).get("config", "?") for r in records})
    devices = sorted({f"{r['params']['device']} ({r.get('meta', {}).get('device_name', '?')}), {r['params']['dtype']}"
                      for r in records})
    lines = [f"# treespec sweep: {', '.join(configs) or path.parent.name}", "",
             f"Results: `{path.name}` ({len(records)} finished points"
             + (f", {len(errors)} errors" if errors else "") + f"). Device: {'; '.join(devices) or '-'}."
             + _load_note(records), "",
             _citable_note(records), _machine_note(records),
             "tau = tokens committed per target forward (bonus token included); speedup = baseline wall time / "
             "treespec wall time on the same prompts, same token counts (every method generates exactly "
             "max_new_tokens per prompt), same temperature, top-p and seed.", ""]
    for title, name in images:
        lines += [f"![{title}]({name})", ""]
    if bases:
        lines += ["## Baselines (HuggingFace generate)", "",
                  "| target | dataset | T | top-p | seed | method | prompts | tokens | tok/s [95% CI] | wall s | "
                  "vs target [95% CI] | greedy = target |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(bases, key=lambda r: (str(_panel(r["params"])), r["params"]["seed"], r["params"]["method"])):
            p, res, t = r["params"], r["result"], r["timing"]
            lines.append(f"| {p['target']} | {p['dataset']} | {p['temperature']:g} | {p['top_p']:g} | {p['seed']} | "
                         f"{p['method']} | {res['prompts']} | {res['new_tokens']}"
                         f"{'' if res['complete'] else ' (short!)'} | "
                         f"{_fmt(speed_interval([r]) or t['tokens_per_second'])} | "
                         f"{t['wall_seconds']:.3g} | {_fmt(baseline_speedup(r, bases))} | "
                         f"{_fmt(same_greedy_outputs(r, bases))} |")
        lines.append("")
    if tres:
        lines += ["## Treespec points", "",
                  "Intervals: 95% bootstrap over prompts (`treespec.bench.intervals`; speedups paired per prompt). "
                  "tau counts every step; tau (uncut) only the steps the end of generation (max_new_tokens or "
                  "EOS, or the depth cap near it) did not shorten, the quantity the prediction estimates."
                  + (" greedy = target compares outputs with HF generate's in the same precision; below float32 "
                     "a batched tree forward can round a near-tie of the top two logits the other way "
                     "(docs/design.md), so a difference there is not a failure of exactness. HF's own "
                     "assisted generation verifies a draft chain in one batched forward too: the baselines' "
                     "greedy = target column shows how often it differs from the target alone."
                     if any(r["params"]["dtype"] != "float32" for r in tres) else ""), "",
                  "| dataset | T | top-p | seed | drafters | builder | B | depth | tree size | tau | tau (uncut) | "
                  "predicted tau | tok/s | vs target | vs assisted | vs prompt lookup | drafting s | verifying s | "
                  "overhead s | greedy = target |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def order(r: dict[str, Any]) -> tuple:
            p = r["params"]
            return (str(_panel(p)), p["seed"], p["drafters"], p["builder"], str(p["max_depth"]), p["budget"])

        for r in sorted(tres, key=order):
            p, res, t, s = r["params"], r["result"], r["timing"], r.get("speedup", {})

            def vs(method: str) -> Any:  # the stored figure only for records without per-prompt timings
                return speedup_interval([r], bases, method) or (
                    s.get(method) if baseline_of(r, bases, method) is not None else None)

            lines.append(
                f"| {p['dataset']} | {p['temperature']:g} | {p['top_p']:g} | {p['seed']} | {p['drafters']} | "
                f"{p['builder']} | {p['budget']} | {_fmt(p['max_depth'])} | {res['mean_tree_size']:.1f} | "
                f"{_fmt(tau_interval([r]) or res['tau'])} | {_fmt(tau_interval([r], uncut=True))} | "
                f"{_fmt(res.get('predicted_tau'))} | {_fmt(speed_interval([r]) or t['tokens_per_second'])} | "
                f"{_fmt(vs('target'))} | {_fmt(vs('assisted'))} | {_fmt(vs('prompt_lookup'))} | "
                f"{t['drafting_seconds']:.3g} | {t['verifying_seconds']:.3g} | {t['overhead_seconds']:.3g} | "
                f"{_fmt(same_greedy_outputs(r, bases) or r.get('checks', {}).get('greedy_same_as_target'))} |")
        lines.append("")
        refused = [r for r in tres if r.get("speedup_refused")]
        if refused:
            lines += ["Speedups refused (token counts differ):", ""]
            lines += [f"- {r['key']}: {r['speedup_refused']}" for r in refused]
            lines.append("")
        lines += _prediction_section(sorted(tres, key=order), path.parent)
    if trees:
        lines += ["## Trees", ""] + [f"- [{title}]({name})" for title, name in trees] + [""]
    if errors:
        lines += ["## Errors (retried on the next run)", ""]
        lines += [f"- `{r['key']}` {r['params'].get('builder', r['params'].get('method'))}: {r['error']}"
                  for r in errors]
        lines.append("")
    return "\n".join(lines)


def _prediction_section(tres: list[dict[str, Any]], directory: Path) -> list[str]:
    """Markdown: predicted vs measured tau per point, then the per-depth table of every point whose
    prediction falls outside the measured interval (where along the tree the tau is lost)."""
    rows = [(r, a) for r in tres if (a := agreement(r)) is not None]
    if not rows:
        return []
    lines = ["## Predicted vs measured tau", "",
             "Predicted: the tree's expected tokens per step under the positional acceptance vector measured on "
             "the calibration prompts; *per-depth*: under that calibration's per-depth matrix (acceptance given "
             "that the walk reached each depth), computed when the report is written. Measured: tau over uncut "
             "steps on the evaluation prompts, 95% CI. *cut cost*: how far tau over all steps sits from it (the "
             "steps shortened by max_new_tokens).", "",
             "| dataset | T | builder | B | predicted | per-depth | measured (uncut) | gap | per-depth gap | inside CI | "
             "cut cost |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, a in rows:
        p, depthwise = r["params"], per_depth_prediction(r, directory)
        depth_gap = "-" if depthwise is None else f"{a['measured'].estimate / depthwise - 1:+.1%}"
        lines.append(f"| {p['dataset']} | {p['temperature']:g} | {p['builder']} | {p['budget']} | {a['predicted']:.2f} | "
                     f"{_fmt(depthwise)} | {a['measured'].fmt()} | {a['gap']:+.1%} | {depth_gap} | "
                     f"{'yes' if a['agrees'] else '**no**'} | "
                     f"{'-' if a['cut_cost'] is None else format(a['cut_cost'], '+.1%')} |")
    lines.append("")
    off = [(r, a) for r, a in rows if not a["agrees"] and depth_rows(r)]
    if off:
        lines += ["### Per-depth acceptance where the prediction misses", "",
                  "Rate at which a step whose walk reached depth d - 1 (with children to try) accepted a child "
                  "at depth d, measured over uncut steps, next to the rate the calibration vector predicts for "
                  "this tree. The depths where the two part are where the prediction goes wrong (measured below "
                  "predicted: tau lost there; above: the calibration vector underrates the draft).", ""]
        for r, a in off:
            p = r["params"]
            lines += [f"**{p['dataset']} T={p['temperature']:g} {p['builder']} B={p['budget']}** "
                      f"(predicted {a['predicted']:.2f}, measured {a['measured'].fmt()}):", "",
                      "| depth | steps reaching it | measured | predicted | difference |", "|---|---|---|---|---|"]
            for d, tried, rate, pred in depth_rows(r):
                diff = "-" if pred is None else f"{rate - pred:+.3f}"
                lines.append(f"| {d} | {tried} | {rate:.3f} | {_fmt(pred, 3)} | {diff} |")
            lines += ["", where_the_gap_is(depth_rows(r)), ""]
    return lines
