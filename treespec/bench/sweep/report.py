"""The report of a sweep: plots (PNG) and a Markdown summary written from its ``results.jsonl``.

Every figure carries its spread over prompts: tau, tok/s and speedups are ratios of per-prompt
sums with 95% bootstrap intervals (``treespec.bench.intervals``; speedups paired per prompt with the
baseline run on the same prompts), shown in the tables and as error bars in the plots. Tau is
given two ways: over all steps, and over the steps not shortened by the end of generation, which
is what the tree's predicted tau estimates; the prediction section says whether the prediction
falls inside the measured interval and, where it does not, shows per-depth acceptance (measured
in the run vs predicted from the calibration vector) to locate the loss. This module draws the
plots; ``markdown`` writes the summary, ``figures`` computes what both show.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tree_builders import TreeShape

from ..intervals import Interval
from .figures import baseline_speedup, is_fastest, panel, speedup_interval, tau_interval
from .markdown import summary
from .points import batch_size, finished, measure_key, tree_label, verifier_note
from .records import read_records


def _figure(ncols: int, nrows: int = 1, width: float = 5.0, height: float = 3.8,
            legend_space: float = 0.0) -> tuple[Any, list[Any]]:
    """A matplotlib figure (no display needed) of ``nrows x ncols`` panels and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols + legend_space, height * nrows))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(nrows * ncols)]
    return fig, axes


def _save(fig: Any, out: Path, name: str, title: str, images: list[tuple[str, str]], **layout: Any) -> None:
    """Lay out ``fig``, write it as ``out/name`` and list it in ``images`` under ``title``."""
    fig.tight_layout(**layout)
    fig.savefig(out / name, dpi=100)
    images.append((title, name))


def _panel_title(key: tuple, multi_target: bool) -> str:
    target, dataset, t, top_p, *batch = key
    head = f"{target.split('/')[-1]}\n" if multi_target else ""
    return (f"{head}{dataset}, T={t:g}" + (f", top-p={top_p:g}" if top_p < 1 else "")
            + (f", batch {batch[0]}" if batch and batch[0] > 1 else ""))


def _line(p: dict[str, Any], multi_depth: bool) -> str:
    name = "ngram" if p["drafters"] == "ngram" else (tree_label(p) if p["drafters"] == "model"
                                                     else f"both/{tree_label(p)}")
    if multi_depth:
        name += f" d<={p['max_depth'] if p['max_depth'] is not None else 'none'}"
    return name + verifier_note(p)


_BUILDER_COLOR = {"sequoia": "C0", "kary": "C1", "chains": "C2", "chain": "C3", "dynamic": "C4", "ngram": "C5"}


def _style(line: str) -> dict[str, Any]:
    """Colour by builder, line style by drafter set (solid: model, dashed: both, dotted: n-gram), marker by depth
    limit or verifier (:func:`_marker`)."""
    name = line.split(" ")[0]
    builder = name.split("/")[-1]
    dash = "--" if name.startswith("both/") else ":" if builder == "ngram" else "-"
    return {"color": _color(builder), "linestyle": dash, "marker": _marker(line), "label": line}


#: the marker of a line verified by another rule than ``rrs`` (its name ends the line's label: ``chain [block]``)
_VERIFIER_MARKER = {"block": "^", "traversal": "v", "spectr": "D"}


def _marker(line: str) -> str:
    """A line's marker: its verifier's where its label names one, else a circle, or a square for a depth limit."""
    if line.endswith("]"):
        return _VERIFIER_MARKER.get(line[line.rindex("[") + 1 : -1], "x")
    return "o" if " d<=" not in line or " d<=none" in line else "s"


def _color(label: str) -> str:
    """A tree's colour: its builder's, or for a named static tree (``paths:<name>``) one of four more by its name."""
    if label in _BUILDER_COLOR:
        return _BUILDER_COLOR[label]
    return f"C{6 + zlib.crc32(label.encode()) % 4}" if label.startswith("paths:") else "k"


def _grid_keys(out: Path) -> set[str] | None:
    """The points of the config the sweep in ``out`` last ran (its ``config.json``), by :func:`measure_key`; None
    without one (a results file read alone)."""
    from .config import load_config
    from .lock import FINGERPRINT
    from .points import enumerate_points

    stored = out / FINGERPRINT
    if not stored.exists():
        return None
    try:
        cfg = load_config(json.loads(stored.read_text())["config"])
    except (ValueError, KeyError, TypeError):  # a config of another version: the errors as they stand
        return None
    return {measure_key(pt.params) for pt in enumerate_points(cfg)}


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
    done = finished(everything)  # one record per point, a greedy one whatever its verifier
    records = list(done.values())
    errors = [r for r in {r["key"]: r for r in everything if r.get("status") == "error"}.values()
              if measure_key(r["params"]) not in done]  # the latest error of each point without a finished record
    grid = _grid_keys(path.parent)
    if grid is not None:  # a point taken out of the grid since its error is not run again: said so
        errors = [r if measure_key(r["params"]) in grid else {**r, "dropped": True} for r in errors]
    tres = [r for r in records if r["kind"] == "treespec"]
    bases = [r for r in records if r["kind"] == "baseline"]
    images: list[tuple[str, str]] = []
    plots = _BudgetPlots(tres, out, images, multi_target=len({r["params"]["target"] for r in records}) > 1)
    plots.draw("tau_vs_budget.png", "tau (tokens per step, 95% CI over prompts)", plots.curves(tau_interval), None)
    plots.draw("speedup_vs_budget.png", "speedup over the target alone (95% CI)",
               plots.curves(lambda rs: speedup_interval(rs, bases, "target")), lambda pn: _base_speedups(pn, bases))
    _batch_plot(tres, bases, out, images)
    _predicted_plot(tres, out, images)
    _acceptance_plot(tres, out, images)
    trees = _tree_images(tres, out)
    readme = out / "README.md"
    readme.write_text(summary(path, records, tres, bases, errors, images, trees), encoding="utf-8")
    return readme


class _BudgetPlots:
    """Plots against the budget: one panel per target, dataset, temperature and top-p; one line per builder."""

    def __init__(self, tres: list[dict[str, Any]], out: Path, images: list[tuple[str, str]],
                 multi_target: bool) -> None:
        self.tres, self.out, self.images, self.multi_target = tres, out, images, multi_target
        self.multi_depth = len({r["params"]["max_depth"] for r in tres}) > 1
        self.panels = sorted({panel(r["params"]) for r in tres}, key=str)

    def curves(self, value: Callable[[list[dict[str, Any]]], Interval | None]) -> dict[tuple, dict[str, list]]:
        """Per panel and line: (budget, interval) points; the seeds of a point are pooled."""
        acc: dict[tuple, dict[str, dict[int, list[dict[str, Any]]]]] = {}
        for r in self.tres:
            acc.setdefault(panel(r["params"]), {}).setdefault(_line(r["params"], self.multi_depth), {}).setdefault(
                r["params"]["budget"], []).append(r)
        out_curves: dict[tuple, dict[str, list]] = {}
        for pn, lines in acc.items():
            for ln, pts in lines.items():
                vals = [(b, value(rs)) for b, rs in sorted(pts.items())]
                vals = [(b, v) for b, v in vals if v is not None]
                if vals:
                    out_curves.setdefault(pn, {})[ln] = vals
        return out_curves

    def draw(self, name: str, ylabel: str, data: dict, hlines: Callable[[tuple], dict[str, float]] | None) -> None:
        if not self.panels:
            return
        fig, axes = _figure(len(self.panels), legend_space=1.8)
        handles: dict[str, Any] = {}
        for ax, pn in zip(axes, self.panels):
            for ln, pts in sorted(data.get(pn, {}).items()):
                handles.setdefault(ln, _intervals(ax, pts, **_style(ln)))
            if hlines is not None:
                for i, (label, y) in enumerate(sorted(hlines(pn).items())):
                    handles.setdefault(label, ax.axhline(y, color=("0.1", "0.45", "0.7")[i % 3], linestyle=(0, (4, 2)),
                                                         linewidth=1.2))
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget B (tokens per verification, root included)")
            ax.set_ylabel(ylabel)
            ax.set_title(_panel_title(pn, self.multi_target), fontsize=9)
            ax.grid(alpha=0.3)
        fig.legend(list(handles.values()), list(handles), loc="center right", fontsize=8)
        _save(fig, self.out, name, ylabel, self.images, rect=(0, 0, 1 - 1.8 / fig.get_figwidth(), 1))


def _intervals(ax: Any, pts: list[tuple[int, Interval]], **style: Any) -> Any:
    """``(x, interval)`` points drawn on ``ax`` as a line with 95% error bars (an unknown interval: no bar)."""
    ys = np.array([v.estimate for _, v in pts])
    lows = np.array([v.low if v.known else v.estimate for _, v in pts])
    highs = np.array([v.high if v.known else v.estimate for _, v in pts])
    return ax.errorbar([x for x, _ in pts], ys, yerr=np.vstack([ys - lows, highs - ys]), markersize=4, capsize=3,
                       **style)


def _base_speedups(pn: tuple, bases: list[dict[str, Any]]) -> dict[str, float]:
    """The HF baselines' speedups over the target alone in panel ``pn`` (horizontal lines; of HF assisted generation's
    and prompt lookup's settings the fastest, HF assisted a line per draft)."""
    lines: dict[str, list[float]] = {}
    shown = [r for r in bases
             if panel(r["params"]) == pn and r["params"]["method"] != "target" and is_fastest(r, bases)]
    drafts = {r["params"]["draft"] for r in shown if r["params"]["method"] == "assisted"}
    for r in shown:
        v = baseline_speedup(r, bases)
        if v is not None:  # HF assisted: a line per draft where pairs share this panel's target
            draft = f" ({r['params']['draft']})" if r["params"]["method"] == "assisted" and len(drafts) > 1 else ""
            lines.setdefault(f"HF {r['params']['method']}{draft}", []).append(v.estimate)
    out_lines = {k: float(np.mean(v)) for k, v in lines.items()}
    out_lines["target alone"] = 1.0
    return out_lines


def _batch_plot(tres: list[dict[str, Any]], bases: list[dict[str, Any]], out: Path, images: list[tuple[str, str]],
                method: str = "target") -> None:
    """Speedup over HF ``generate`` on the same batches (``method``) against the batch size (``grid.batch_sizes``):
    one panel per target, dataset, temperature and top-p, one line per tree (builder and budget), 95% CI paired
    per batch. Drawn when the records hold more than one batch size."""
    if len({batch_size(r["params"]) for r in tres}) < 2:
        return
    multi_depth = len({r["params"]["max_depth"] for r in tres}) > 1
    groups: dict[tuple, dict[str, dict[int, list[dict[str, Any]]]]] = {}
    for r in tres:
        p = r["params"]
        groups.setdefault(panel(p)[:4], {}).setdefault(f"{_line(p, multi_depth)} b={p['budget']}", {}).setdefault(
            batch_size(p), []).append(r)
    panels = sorted(groups, key=str)
    fig, axes = _figure(len(panels), legend_space=1.8)
    handles: dict[str, Any] = {}
    for ax, pn in zip(axes, panels):
        for ln, by_batch in sorted(groups[pn].items()):
            pts = [(b, v) for b, v in ((b, speedup_interval(rs, bases, method)) for b, rs in sorted(by_batch.items()))
                   if v is not None]
            if pts:
                handles.setdefault(ln, _intervals(ax, pts, marker="o", label=ln))
        handles.setdefault(f"HF {method}", ax.axhline(1.0, color="0.3", linestyle=(0, (4, 2)), linewidth=1.2))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size (prompts decoded at once)")
        ax.set_ylabel(f"speedup over HF {method}, same batches (95% CI)", fontsize=9)
        ax.set_title(_panel_title(pn, len({k[0] for k in panels}) > 1), fontsize=9)
        ax.grid(alpha=0.3)
    fig.legend(list(handles.values()), list(handles), loc="center right", fontsize=8)
    _save(fig, out, "speedup_vs_batch_size.png", "speedup vs batch size (per tree)", images,
          rect=(0, 0, 1 - 1.8 / fig.get_figwidth(), 1))


def _predicted_plot(tres: list[dict[str, Any]], out: Path, images: list[tuple[str, str]]) -> None:
    predicted = [r for r in tres if r["result"].get("predicted_tau") is not None]
    if not predicted:
        return
    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}  # per tree and verifier
    for r in predicted:
        lines.setdefault((tree_label(r["params"]), verifier_note(r["params"])), []).append(r)
    fig, (ax,) = _figure(1, width=5.5, height=5.0)
    for (tree, note), rs in sorted(lines.items()):
        xs = [r["result"]["predicted_tau"] for r in rs]
        ivs = [tau_interval([r], uncut=True) for r in rs]
        ys = np.array([iv.estimate if iv else r["result"]["tau"] for iv, r in zip(ivs, rs)])
        lows = np.array([iv.low if iv and iv.known else y for iv, y in zip(ivs, ys)])
        highs = np.array([iv.high if iv and iv.known else y for iv, y in zip(ivs, ys)])
        ax.errorbar(xs, ys, yerr=np.vstack([ys - lows, highs - ys]), fmt=_marker(tree + note), markersize=4,
                    capsize=3, label=tree + note, color=_color(tree))
    hi = max(max(r["result"]["predicted_tau"], r["result"]["tau"]) for r in predicted) * 1.05
    ax.plot([1, hi], [1, hi], color="0.5", linestyle="--", linewidth=1, label="measured = predicted")
    ax.set_xlabel("predicted tau (acceptance vector, calibration prompts)")
    ax.set_ylabel("measured tau over uncut steps (evaluation prompts, 95% CI)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, out, "predicted_vs_measured_tau.png", "predicted vs measured tau", images)


def _acceptance_plot(tres: list[dict[str, Any]], out: Path, images: list[tuple[str, str]]) -> None:
    accs: dict[str, dict[str, Any]] = {}
    for r in tres:
        a = r["result"].get("acceptance")
        if a is not None and a["file"] not in accs:
            accs[a["file"]] = {**a, "dataset": r["params"]["dataset"], "temperature": r["params"]["temperature"],
                               "top_p": r["params"]["top_p"], "target": r["params"]["target"]}
    if not accs:
        return
    fig, (ax,) = _figure(1, width=7.0, height=4.0)
    n = len(accs)
    for i, a in enumerate(sorted(accs.values(), key=lambda a: (a["dataset"], a["temperature"], a["mode"]))):
        xs = np.arange(len(a["vector"])) + (i - (n - 1) / 2) * 0.8 / n
        ax.bar(xs, a["vector"], width=0.8 / n, label=f"{a['dataset']} T={a['temperature']:g} {a['mode']} "
                                                     f"(beta {a['beta']:.2f})")
    ax.set_xlabel("child rank k")
    ax.set_ylabel("a_k = P(rank k is the accepted child)")
    ax.set_title("positional acceptance vectors (calibration prompts)", fontsize=9)
    ax.legend(fontsize=7)
    _save(fig, out, "acceptance.png", "acceptance vectors", images)


def _tree_images(tres: list[dict[str, Any]], out: Path) -> list[tuple[str, str]]:
    """Every static tree the sweep ran, drawn once under ``trees/``: ``(title, file)``."""
    trees: list[tuple[str, str]] = []
    for r in tres:
        tree = r["result"].get("tree")
        if tree is None:
            continue
        p = r["params"]
        depth = "none" if p["max_depth"] is None else p["max_depth"]
        a = r["result"].get("acceptance")
        tag = f"-{a['file'][len('acceptance-'):-len('.json')]}" if (a and p["builder"] == "sequoia") else ""
        drafters = p.get("drafters", "model")  # beside the n-gram drafter ("both") the model drafts a share
        also = "" if drafters == "model" else f"-{drafters}"
        name = f"trees/{tree_label(p).replace(':', '-')}-B{p['budget']}-d{depth}{also}{tag}.png"
        if any(name == seen for _, seen in trees):
            continue
        (out / "trees").mkdir(exist_ok=True)
        shape = TreeShape(tuple(x) for x in tree["paths"])
        title = f"{tree_label(p)} B={p['budget']} depth<={depth}" + (
            f" ({p['dataset']}, T={p['temperature']:g})" if tag else "") + (f", drafters {drafters}" if also else "")
        shape.draw(str(out / name), acceptance=a["vector"] if a else None, title=title)
        trees.append((title, name))
    return trees
