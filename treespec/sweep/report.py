"""The report of a sweep: plots (PNG) and a Markdown summary written from its ``results.jsonl``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tree_builders import TreeShape

from .points import point_key
from .records import read_records


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


def _baseline_speedup(r: dict[str, Any], bases: list[dict[str, Any]]) -> float | None:
    """Speedup of baseline record ``r`` over the target-alone record of the same prompts and settings."""
    if not r["result"]["complete"]:
        return None
    p = {k: v for k, v in r["params"].items()
         if k not in ("draft", "assisted", "prompt_lookup_num_tokens", "max_matching_ngram_size")}
    key = point_key(dict(p, method="target"))
    ref = next((b for b in bases if b["key"] == key and b["result"]["complete"]), None)
    if ref is None or ref["result"]["tokens_per_prompt"] != r["result"]["tokens_per_prompt"]:
        return None
    return ref["timing"]["wall_seconds"] / r["timing"]["wall_seconds"]


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def report(results_jsonl: str | os.PathLike, out_dir: str | os.PathLike | None = None,
           skip_corrupt: bool = False) -> Path:
    """Write plots (PNG) and a Markdown summary (``README.md``) beside ``results_jsonl``; returns README.md.

    Plots: tau vs budget and speedup over the target baseline vs budget (one panel per target,
    dataset, temperature and top-p; one line per builder; seeds averaged), predicted vs measured
    tau, the acceptance vectors, and every static tree used (``trees/``). ``skip_corrupt``: skip
    (and name) corrupt record lines instead of refusing (``records.read_records``).
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

    def curves(value: Callable[[dict[str, Any]], float | None]) -> dict[tuple, dict[str, list[tuple[int, float]]]]:
        acc: dict[tuple, dict[str, dict[int, list[float]]]] = {}
        for r in tres:
            v = value(r)
            if v is None:
                continue
            acc.setdefault(_panel(r["params"]), {}).setdefault(_line(r["params"], multi_depth), {}).setdefault(
                r["params"]["budget"], []).append(v)
        return {pn: {ln: sorted((b, float(np.mean(vs))) for b, vs in pts.items()) for ln, pts in lines.items()}
                for pn, lines in acc.items()}

    def budget_plot(name: str, ylabel: str, data: dict, hlines: Callable[[tuple], dict[str, float]] | None) -> None:
        if not panels:
            return
        fig, axes = _figure(len(panels), legend_space=1.8)
        handles: dict[str, Any] = {}
        for ax, pn in zip(axes, panels):
            for ln, pts in sorted(data.get(pn, {}).items()):
                (h,) = ax.plot([b for b, _ in pts], [v for _, v in pts], markersize=4, **_style(ln))
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

    budget_plot("tau_vs_budget.png", "tau (tokens per step)", curves(lambda r: r["result"]["tau"]), None)

    def base_speedups(pn: tuple) -> dict[str, float]:
        lines: dict[str, list[float]] = {}
        for r in bases:
            if _panel(r["params"]) == pn and r["params"]["method"] != "target":
                v = _baseline_speedup(r, bases)
                if v is not None:
                    lines.setdefault(f"HF {r['params']['method']}", []).append(v)
        out_lines = {k: float(np.mean(v)) for k, v in lines.items()}
        out_lines["target alone"] = 1.0
        return out_lines

    budget_plot("speedup_vs_budget.png", "speedup over the target alone",
                curves(lambda r: r.get("speedup", {}).get("target")), base_speedups)

    predicted = [r for r in tres if r["result"].get("predicted_tau") is not None]
    if predicted:
        fig, (ax,) = _figure(1, width=5.5, height=5.0)
        builders = sorted({r["params"]["builder"] for r in predicted})
        for i, b in enumerate(builders):
            rs = [r for r in predicted if r["params"]["builder"] == b]
            ax.scatter([r["result"]["predicted_tau"] for r in rs], [r["result"]["tau"] for r in rs], label=b,
                       color=f"C{i}", s=22)
        hi = max(max(r["result"]["predicted_tau"], r["result"]["tau"]) for r in predicted) * 1.05
        ax.plot([1, hi], [1, hi], color="0.5", linestyle="--", linewidth=1, label="measured = predicted")
        ax.set_xlabel("predicted tau (acceptance vector, calibration prompts)")
        ax.set_ylabel("measured tau (evaluation prompts)")
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


def _markdown(path: Path, records: list, tres: list, bases: list, errors: list, images: list, trees: list,
              multi_depth: bool) -> str:
    configs = sorted({r.get("meta", {}).get("config", "?") for r in records})
    devices = sorted({f"{r['params']['device']} ({r.get('meta', {}).get('device_name', '?')}), {r['params']['dtype']}"
                      for r in records})
    lines = [f"# treespec sweep: {', '.join(configs) or path.parent.name}", "",
             f"Results: `{path.name}` ({len(records)} finished points"
             + (f", {len(errors)} errors" if errors else "") + f"). Device: {'; '.join(devices) or '-'}."
             + _load_note(records), "",
             "tau = tokens committed per target forward (bonus token included); speedup = baseline wall time / "
             "treespec wall time on the same prompts, same token counts (every method generates exactly "
             "max_new_tokens per prompt), same temperature, top-p and seed.", ""]
    for title, name in images:
        lines += [f"![{title}]({name})", ""]
    if bases:
        lines += ["## Baselines (HuggingFace generate)", "",
                  "| target | dataset | T | top-p | seed | method | prompts | tokens | tok/s | wall s | vs target |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(bases, key=lambda r: (str(_panel(r["params"])), r["params"]["seed"], r["params"]["method"])):
            p, res, t = r["params"], r["result"], r["timing"]
            lines.append(f"| {p['target']} | {p['dataset']} | {p['temperature']:g} | {p['top_p']:g} | {p['seed']} | "
                         f"{p['method']} | {res['prompts']} | {res['new_tokens']}"
                         f"{'' if res['complete'] else ' (short!)'} | {t['tokens_per_second']:.2f} | "
                         f"{t['wall_seconds']:.3g} | {_fmt(_baseline_speedup(r, bases))} |")
        lines.append("")
    if tres:
        lines += ["## Treespec points", "",
                  "| dataset | T | top-p | seed | drafters | builder | B | depth | tree size | tau | predicted tau | "
                  "tok/s | vs target | vs assisted | vs prompt lookup | drafting s | verifying s | overhead s | "
                  "greedy = target |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        def order(r: dict[str, Any]) -> tuple:
            p = r["params"]
            return (str(_panel(p)), p["seed"], p["drafters"], p["builder"], str(p["max_depth"]), p["budget"])

        for r in sorted(tres, key=order):
            p, res, t, s = r["params"], r["result"], r["timing"], r.get("speedup", {})
            lines.append(
                f"| {p['dataset']} | {p['temperature']:g} | {p['top_p']:g} | {p['seed']} | {p['drafters']} | "
                f"{p['builder']} | {p['budget']} | {_fmt(p['max_depth'])} | {res['mean_tree_size']:.1f} | "
                f"{res['tau']:.2f} | {_fmt(res.get('predicted_tau'))} | {t['tokens_per_second']:.2f} | "
                f"{_fmt(s.get('target'))} | {_fmt(s.get('assisted'))} | {_fmt(s.get('prompt_lookup'))} | "
                f"{t['drafting_seconds']:.3g} | {t['verifying_seconds']:.3g} | {t['overhead_seconds']:.3g} | "
                f"{r.get('checks', {}).get('greedy_same_as_target', '-')} |")
        lines.append("")
        refused = [r for r in tres if r.get("speedup_refused")]
        if refused:
            lines += ["Speedups refused (token counts differ):", ""]
            lines += [f"- {r['key']}: {r['speedup_refused']}" for r in refused]
            lines.append("")
    if trees:
        lines += ["## Trees", ""] + [f"- [{title}]({name})" for title, name in trees] + [""]
    if errors:
        lines += ["## Errors (retried on the next run)", ""]
        lines += [f"- `{r['key']}` {r['params'].get('builder', r['params'].get('method'))}: {r['error']}"
                  for r in errors]
        lines.append("")
    return "\n".join(lines)

