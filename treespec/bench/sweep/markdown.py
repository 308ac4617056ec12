"""The Markdown summary of a sweep report: the machine, load and sample-size notes, the tables of
baselines and treespec points with their 95% intervals, and predicted vs measured tau with the
per-depth acceptance where a prediction misses (``report`` writes it beside the plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..intervals import Interval
from .config import CITABLE
from .figures import (agreement, baseline_of, baseline_speedup, depth_rows, is_fastest, panel, per_depth_prediction,
                      same_greedy_outputs, speed_interval, speedup_interval, step_cost_rows, tau_interval,
                      tree_vs_chain, where_the_gap_is)
from .points import baseline_label, batch_note, batch_size, tree_label, verifier_note
from .records import machine_of


def _fmt(x: Any, digits: int = 2) -> str:
    """A table cell: an interval with its bounds, a float rounded, None as "-"."""
    if x is None:
        return "-"
    if isinstance(x, Interval):
        return x.fmt(digits)
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


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


def _baseline_table(bases: list[dict[str, Any]]) -> list[str]:
    lines = ["## Baselines (HuggingFace generate)", "",
             "| target | dataset | T | top-p | seed | method | prompts | tokens | tok/s [95% CI] | wall s | "
             "vs target [95% CI] | greedy = target |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # the methods that ran in several settings on the same prompts (HF assisted generation, prompt lookup)
    settings = sorted({r["params"]["method"] for r in bases if baseline_of(r, bases, r["params"]["method"])})
    for r in sorted(bases, key=lambda r: (str(panel(r["params"])), r["params"]["seed"], baseline_label(r["params"]))):
        p, res, t = r["params"], r["result"], r["timing"]
        method = baseline_label(p)
        if p["method"] in settings and is_fastest(r, bases):
            method = f"**{method}**"
        lines.append(f"| {p['target']} | {p['dataset']} | {p['temperature']:g} | {p['top_p']:g} | {p['seed']} | "
                     f"{method}{batch_note(batch_size(p))} | {res['prompts']} | {res['new_tokens']}"
                     f"{'' if res['complete'] else ' (short!)'} | "
                     f"{_fmt(speed_interval([r]) or t['tokens_per_second'])} | "
                     f"{t['wall_seconds']:.3g} | {_fmt(baseline_speedup(r, bases))} | "
                     f"{_fmt(same_greedy_outputs(r, bases))} |")
    if settings:
        lines += ["", f"{' and '.join(settings)} ran in several settings on the same prompts (`baselines.assisted`, "
                  "`baselines.prompt_lookup_num_tokens`); in bold the fastest of each, the one every \"vs\" column "
                  "is over (chosen on the prompts it is compared on, which favours HF: a speedup over it is if "
                  "anything understated)."]
    return lines + [""]


def _order(r: dict[str, Any]) -> tuple:
    p = r["params"]
    return (str(panel(p)), p["seed"], p["drafters"], tree_label(p), str(p["max_depth"]), p["budget"],
            p.get("verifier", ""))  # rrs (not recorded) first


def _treespec_table(tres: list[dict[str, Any]], bases: list[dict[str, Any]]) -> list[str]:
    verifier = any("verifier" in r["params"] for r in tres)  # a column where a point is not verified by rrs
    header = ("| dataset | T | top-p | seed | drafters | builder | " + ("verifier | " if verifier else "")
              + "B | depth | tree size | tau | tau (uncut) | predicted tau | replayed tau | tok/s | vs fastest HF | "
              "vs target | vs static+compile | vs assisted | vs prompt lookup | drafting s | verifying s | "
              "overhead s | greedy = target |")
    lines = ["## Treespec points", "",
             "Intervals: 95% bootstrap over prompts (`treespec.bench.intervals`; speedups paired per prompt). "
             "tau counts every step; tau (uncut) only the steps the end of generation (max_new_tokens or "
             "EOS, or the depth cap near it) did not shorten, the quantity the prediction estimates. "
             "predicted tau: the calibration's acceptance rows through the tree (Sequoia's model); "
             "replayed tau: the tree run over the calibration walk's ranks (exact for that calibration's "
             "prompts; '-' where the calibration kept no ranks). vs fastest HF: over the fastest HF method run on "
             "the same prompts and machine (named; HF `generate` eager, with a static cache + `torch.compile`, "
             "assisted generation and prompt lookup, each in its fastest setting: what a user would run instead)."
             + (" greedy = target compares outputs with HF generate's in the same precision; below float32 "
                "a batched tree forward can round a near-tie of the top two logits the other way "
                "(docs/design.md), so a difference there is not a failure of exactness. HF's own "
                "assisted generation verifies a draft chain in one batched forward too: the baselines' "
                "greedy = target column shows how often it differs from the target alone."
                if any(r["params"]["dtype"] != "float32" for r in tres) else "")
             + (" verifier: the exact rule of sampled steps; greedy steps (T=0) accept the target's argmax "
                "whatever the verifier, so a sweep runs a greedy point once (under rrs where the grid has it)."
                if verifier else ""), "",
             header, "|" + "---|" * (header.count(" | ") + 1)]
    for r in sorted(tres, key=_order):
        p, res, t, s = r["params"], r["result"], r["timing"], r.get("speedup", {})
        rule = f"{p.get('verifier', 'rrs')} | " if verifier else ""

        def vs(method: str | None) -> Any:  # the stored figure only for records without per-prompt timings
            if method is None:  # the fastest HF method on these prompts, named
                best = baseline_of(r, bases, None)
                stored = s.get(best["params"]["method"]) if best is not None else None  # over that method
                figure = speedup_interval([r], bases, None) or stored
                return None if figure is None else f"{_fmt(figure)} ({baseline_label(best['params'])})"
            return speedup_interval([r], bases, method) or (
                s.get(method) if baseline_of(r, bases, method) is not None else None)

        lines.append(
            f"| {p['dataset']}{batch_note(batch_size(p))} | {p['temperature']:g} | {p['top_p']:g} | {p['seed']} | "
            f"{p['drafters']} | "
            f"{tree_label(p)} | {rule}{p['budget']} | {_fmt(p['max_depth'])} | {res['mean_tree_size']:.1f} | "
            f"{_fmt(tau_interval([r]) or res['tau'])} | {_fmt(tau_interval([r], uncut=True))} | "
            f"{_fmt(res.get('predicted_tau'))} | {_fmt(res.get('replayed_tau'))} | "
            f"{_fmt(speed_interval([r]) or t['tokens_per_second'])} | "
            f"{_fmt(vs(None))} | {_fmt(vs('target'))} | {_fmt(vs('target_compiled'))} | {_fmt(vs('assisted'))} | "
            f"{_fmt(vs('prompt_lookup'))} | "
            f"{t['drafting_seconds']:.3g} | {t['verifying_seconds']:.3g} | {t['overhead_seconds']:.3g} | "
            f"{_fmt(same_greedy_outputs(r, bases) or r.get('checks', {}).get('greedy_same_as_target'))} |")
    lines.append("")
    refused = [r for r in tres if r.get("speedup_refused")]
    if refused:
        lines += ["Speedups refused (token counts differ):", ""]
        lines += [f"- {r['key']}: {r['speedup_refused']}" for r in refused]
        lines.append("")
    return lines


def _compile_section(tres: list[dict[str, Any]]) -> list[str]:
    """Compiles, once per envelope: the points whose warm-up compiled graphs (their seconds are kept apart from the
    measured ones; every other point of the envelope replays them)."""
    compiled = [r for r in tres if r["result"].get("compile")]
    if not compiled:
        return []
    paying = [r for r in compiled if r["result"]["compile"]["graphs"] > 0]
    envelopes = sorted({r["result"]["compile"]["envelope"] for r in compiled})
    lines = ["## Compiles", "",
             f"{len(compiled)} points ran compiled steps in {len(envelopes)} envelope(s); {len(paying)} of them "
             "compiled graphs in their warm-up call (seconds kept apart from the measured ones; the others replayed "
             "them):", ""]
    for r in paying:
        c = r["result"]["compile"]
        lines.append(f"- envelope {c['envelope']}: {c['graphs']} graphs, {c['seconds']:.1f} s (warm-up of "
                     f"{tree_label(r['params'])} B={r['params']['budget']}, {r['params']['dataset']} "
                     f"T={r['params']['temperature']:g})")
    host: dict[str, list[str]] = {}  # why a compiled point drafted on the host -> its points (records say "step")
    for r in compiled:
        route = r["result"].get("step", "captured")
        if not route.startswith("captured"):
            host.setdefault(route, []).append(f"{r['params']['drafters']}/{tree_label(r['params'])} "
                                              f"B={r['params']['budget']}")
    if host:
        lines += ["", "Not captured: these points drafted on the host, each step's drafting outside the compiled "
                      "graphs (compare their speed with the captured points' knowing that):", ""]
        lines += [f"- {len(pts)} points ({', '.join(sorted(set(pts))[:6])}{', ...' if len(set(pts)) > 6 else ''}): "
                  f"{route}" for route, pts in sorted(host.items())]
    return lines + [""]


def summary(path: Path, records: list[dict[str, Any]], tres: list[dict[str, Any]], bases: list[dict[str, Any]],
            errors: list[dict[str, Any]], images: list[tuple[str, str]], trees: list[tuple[str, str]]) -> str:
    """The report's README.md: notes, the plots ``images`` and ``trees`` (title, file), the tables of the
    finished baselines ``bases`` and treespec points ``tres`` of ``records``, and the ``errors`` (one per point:
    those a re-run retries, those the point's settings refuse, and those of points taken out of the grid since)."""
    configs = sorted({r.get("meta", {}).get("config", "?") for r in records})
    dropped = [r for r in errors if r.get("dropped")]
    retried = [r for r in errors if not r.get("refused") and not r.get("dropped")]
    refused = [r for r in errors if r.get("refused") and not r.get("dropped")]
    devices = sorted({f"{r['params']['device']} ({r.get('meta', {}).get('device_name', '?')}), {r['params']['dtype']}"
                      for r in records})
    lines = [f"# treespec sweep: {', '.join(configs) or path.parent.name}", "",
             f"Results: `{path.name}` ({len(records)} finished points"
             + (f", {len(retried)} errors" if retried else "") + (f", {len(refused)} refused" if refused else "")
             + (f", {len(dropped)} out of the grid" if dropped else "")
             + f"). Device: {'; '.join(devices) or '-'}."
             + _load_note(records), "",
             _citable_note(records), _machine_note(records),
             "tau = tokens committed per target forward (bonus token included); speedup = baseline wall time / "
             "treespec wall time on the same prompts, same token counts (every method generates exactly "
             "max_new_tokens per prompt), same temperature, top-p and seed.", ""]
    for title, name in images:
        lines += [f"![{title}]({name})", ""]
    if bases:
        lines += _baseline_table(bases)
    if tres:
        lines += _treespec_table(tres, bases)
        lines += _compile_section(tres)
        lines += _verdict_section(tres)
        lines += _step_cost_section(tres, path.parent)
        lines += _prediction_section(sorted(tres, key=_order), path.parent)
    if trees:
        lines += ["## Trees", ""] + [f"- [{title}]({name})" for title, name in trees] + [""]
    for title, rs in (("Errors (retried on the next run)", retried),
                      ("Refused (by each point's settings: a re-run refuses it again)", refused),
                      ("Errors and refusals of points the grid no longer holds (not run again)", dropped)):
        if rs:
            lines += [f"## {title}", ""]
            lines += [f"- `{r['key']}` {r['params'].get('builder', r['params'].get('method'))}: {r['error']}"
                      for r in rs]
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
             "steps on the evaluation prompts, 95% CI (*inside CI* '-': no interval, one prompt). *cut cost*: how "
             "far tau over all steps sits from it (the steps shortened by max_new_tokens).", "",
             "| dataset | T | builder | B | predicted | per-depth | measured (uncut) | gap | per-depth gap | "
             "inside CI | cut cost |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, a in rows:
        p, depthwise = r["params"], per_depth_prediction(r, directory)
        depth_gap = "-" if depthwise is None else f"{a['measured'].estimate / depthwise - 1:+.1%}"
        lines.append(f"| {p['dataset']} | {p['temperature']:g} | {tree_label(p)}{verifier_note(p)} | {p['budget']} | "
                     f"{a['predicted']:.2f} | {_fmt(depthwise)} | {a['measured'].fmt()} | {a['gap']:+.1%} | "
                     f"{depth_gap} | {'-' if a['agrees'] is None else 'yes' if a['agrees'] else '**no**'} | "
                     f"{'-' if a['cut_cost'] is None else format(a['cut_cost'], '+.1%')} |")
    lines.append("")
    off = [(r, a) for r, a in rows if a["agrees"] is False and depth_rows(r)]
    if off:
        lines += ["### Per-depth acceptance where the prediction misses", "",
                  "Rate at which a step whose walk reached depth d - 1 (with children to try) accepted a child "
                  "at depth d, measured over uncut steps, next to the rate the calibration vector predicts for "
                  "this tree. The depths where the two part are where the prediction goes wrong (measured below "
                  "predicted: tau lost there; above: the calibration vector underrates the draft).", ""]
        for r, a in off:
            p = r["params"]
            lines += [f"**{p['dataset']} T={p['temperature']:g} {tree_label(p)}{verifier_note(p)} B={p['budget']}** "
                      f"(predicted {a['predicted']:.2f}, measured {a['measured'].fmt()}):", "",
                      "| depth | steps reaching it | measured | predicted | difference |", "|---|---|---|---|---|"]
            for d, tried, rate, pred in depth_rows(r):
                diff = "-" if pred is None else f"{rate - pred:+.3f}"
                lines.append(f"| {d} | {tried} | {rate:.3f} | {_fmt(pred, 3)} | {diff} |")
            lines += ["", where_the_gap_is(depth_rows(r)), ""]
    return lines


def _verdict_section(tres: list[dict[str, Any]]) -> list[str]:
    """Markdown: per panel and budget, the chain against the fastest tree, measured and predicted, and why."""
    rows = tree_vs_chain(tres)
    if not rows:
        return []
    lines = ["## Tree or chain?", "",
             "Per panel and budget: a chain of draft tokens against the tree measured fastest at the same budget "
             "(both drafted by the model, verified by `rrs`, on the same prompts). *tree / chain*: paired speed "
             "ratio over prompts (95% CI; > 1: the tree wins). Predicted: expected tokens per step under the "
             "calibration vector. What decides it: a tree buys the tokens that only siblings can win (*siblings*: "
             "calibration probability that the accepted child is not the draft's first choice) with a wider "
             "verification (*verify s/step*: the target's forward at the two sizes, as the run paid it) and, for "
             "deep chains, more draft levels (*draft s/level*).", "",
             "| dataset | T | B | tree | tree / chain | winner | tau tree / chain (measured) | predicted | "
             "size | verify s/step | draft s/level | siblings |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in rows:
        _, dataset, t, _, batch = v["panel"]
        pt, pc = v["predicted_tau"]["tree"], v["predicted_tau"]["chain"]
        dl = v["draft_level"]
        lines.append(
            f"| {dataset}{batch_note(batch)} | {t:g} | {v['budget']} | {v['tree']} | {_fmt(v['ratio'])} | "
            f"{v['winner'] or '-'} | "
            f"{_fmt(v['tau']['tree'])} / {_fmt(v['tau']['chain'])} | "
            f"{'-' if pt is None or pc is None else f'{pt:.2f} / {pc:.2f}'} | "
            f"{v['size']['tree']:.1f} / {v['size']['chain']:.1f} | "
            f"{v['verify']['tree']:.3f} / {v['verify']['chain']:.3f} | "
            f"{_fmt(dl['tree'], 3)} / {_fmt(dl['chain'], 3)} | {_fmt(v['siblings'], 3)} |")
    wins = {}
    for v in rows:
        wins.setdefault(v["winner"] or "unknown", []).append(f"{v['panel'][1]} T={v['panel'][2]:g} B={v['budget']}")
    lines += ["", "Verdict: " + "; ".join(f"{w}: {len(c)} ({', '.join(c)})" for w, c in sorted(wins.items())) + ".", ""]
    return lines


def _step_cost_section(tres: list[dict[str, Any]], directory: Path) -> list[str]:
    """Markdown: predicted vs measured seconds per step (needs ``profile.json``, the pair's cost profile,
    beside the results; ``figures.step_cost_rows``)."""
    from ...calibrate.costs import Profile

    if not (directory / "profile.json").is_file():
        return []
    profile = Profile.load(directory / "profile.json")
    rows = step_cost_rows(tres, profile)
    if not rows:
        return []
    held = [v for v in rows if not v["calibration"]]
    worst: dict[tuple, float] = {}
    for v in held:
        key = panel(v["record"]["params"])
        worst[key] = max(worst.get(key, 0.0), abs(v["gap"]))
    # runs of one tree on one panel: how far apart their measured steps are bounds what a model can match
    same_tree: dict[tuple, list[float]] = {}
    for v in rows:
        paths = tuple(map(tuple, v["record"]["result"]["tree"]["paths"]))
        same_tree.setdefault((v["machine"], panel(v["record"]["params"]), paths), []).append(v["measured"])
    drift = max((max(ms) / min(ms) - 1.0 for ms in same_tree.values() if len(ms) > 1), default=None)
    m = profile.meta
    lines = ["## Predicted vs measured seconds per step", "",
             f"Predicted from `profile.json` (isolated forwards of the target per tree size and of the draft per "
             f"level width, {m.get('device', '?')}, {m.get('date', '?')[:10]}), calibrated the way `treespec "
             "generate` calibrates its tuned tree: on each machine and temperature, the pooled real steps of the "
             "points that run the smallest chain's tree (marked *calibration*) "
             "scale the draft's curve and the target's curve by measured / predicted; every other point is "
             "then predicted from its own tree (its draft levels at their widths, its mean verified size) and "
             "compared with its measured drafting + verifying + engine seconds per step.", "",
             "Largest gap per panel (held-out points): " + "; ".join(
                 f"{d} T={t:g}" + (f" batch {b}" if b > 1 else "") + f": {g:.0%}"
                 for (_, d, t, _, b), g in sorted(worst.items(), key=str)) + "."
             + ("" if drift is None else
                " Timing drift between runs bounds what any cost model can match here: points that ran an "
                f"identical tree on one panel differ by up to {drift:.0%} in measured seconds per step."), "",
             "| machine | dataset | T | builder | B | predicted s/step (draft + verify) | "
             "measured (draft + verify) | gap |",
             "|---|---|---|---|---|---|---|---|"]
    for v in rows:
        p, parts = v["record"]["params"], v["parts"]
        lines.append(f"| {v['machine']} | {p['dataset']} | {p['temperature']:g} | {tree_label(p)}{verifier_note(p)} | "
                     f"{p['budget']} | "
                     f"{v['predicted']:.3f} ({parts['drafting'][0]:.3f} + {parts['verifying'][0]:.3f}) | "
                     f"{v['measured']:.3f} ({parts['drafting'][1]:.3f} + {parts['verifying'][1]:.3f}) | "
                     + ("*calibration*" if v["calibration"] else f"{v['gap']:+.1%}") + " |")
    lines.append("")
    return lines
