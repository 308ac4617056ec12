"""The results every phase writes the moment it ends: ``results.json`` and ``README.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from treespec.common.files import write_json

from .bench import PHASES, hf_fastest


def merged(phase: str, old: dict[str, Any] | None, part: dict[str, Any]) -> dict[str, Any]:
    """A phase's saved entry after ``part``: phase treespec adds its runs to earlier ones (a run with other
    --step-budgets extends it, a run of the same budget replaces that budget's runs), phase levels its levers (a
    device session's second call times more levers into the same --out: ``--sweep-lever best`` picks among all);
    any other phase replaces its entry."""
    if phase == "treespec" and isinstance(old, dict):
        return {**old, **part}
    if phase == "levels" and isinstance(old, dict):
        levers = {**old.get("levers", {}), **part["levers"]}
        skipped = dict.fromkeys(n for n in [*old.get("skipped", []), *part.get("skipped", [])] if n not in levers)
        return {**part, "levers": levers, "skipped": list(skipped)}
    return dict(part)


def save(out: Path, results: dict[str, Any]) -> None:
    """``results.json`` (atomically) and ``README.md`` from whatever phases have finished."""
    write_json(out / "results.json", results, default=float)
    (out / "README.md").write_text(report(results))


def report(r: dict[str, Any]) -> str:
    s, ph = r["setup"], r["phases"]
    lines = [f"# GPU protocol: {s['device']}, {s['dtype']}, torch {s['torch']}"
             + (" (SMOKE: tiny models)" if s["smoke"] else ""), "",
             f"Models: {s['weights']}; {s['prompts']} random prompts of {s['prompt_len']} tokens, {s['new_tokens']} "
             f"new tokens each; treespec budget {s['budget']}; compile backend {s['backend']} mode {s['mode']}. "
             f"Phases done: {', '.join(p for p in PHASES if p in ph) or 'none'}.", ""]
    if "first" in ph:
        lines += [f"First compiled run (tiny float32 model, real backend): ok = {ph['first']['ok']} "
                  f"({json.dumps(ph['first']['cases'])})", ""]
    if "costs" in ph:
        c = ph["costs"]
        t_c = c.get("t_compiled", {})
        lines += ["## Measured costs", "", "| t(n) | eager ms | compiled ms |", "|---|---|---|"]
        lines += [f"| {k} | {v * 1e3:.2f} | {t_c[k] * 1e3:.2f} |" if k in t_c else f"| {k} | {v * 1e3:.2f} | |"
                  for k, v in c["t_eager"].items()]
        level_c = c.get("draft_level_compiled")
        lines += ["", f"Draft level (4 nodes): eager {c['draft_level_eager'] * 1e3:.2f} ms"
                  + (f", compiled {level_c * 1e3:.2f} ms." if level_c else "."), ""]
    if "hf" in ph:
        lines += ["## HF generate (measured)", "", "| run | tok/s | ms per token |", "|---|---|---|"]
        lines += [f"| {k} | {v['tok_s']:.1f} | {1e3 / v['tok_s']:.2f} |" for k, v in ph["hf"].items() if "tok_s" in v]
        if "hf_frozen_error" in ph["hf"]:
            lines.append(f"| hf_generate_static_compiled_frozen | failed: {ph['hf']['hf_frozen_error']} | |")
        lines.append("")
    if ph.get("treespec"):
        hf_c = hf_fastest(ph)
        lines += ["## treespec steps (measured cost; random draft, so tau is about 1)", "",
                  "| run | step | size | depth | first call s | ms per step | drafting / verifying / engine ms | "
                  "launches + graph launches per step | syncs per step | device busy ms per step | predicted tau "
                  "(shipped T=0 rows) | predicted real-pair tok/s | vs HF static+compile (fastest) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for k, v in ph["treespec"].items():
            sec, prof = v["per_step_seconds"], v.get("profile", {})
            calls = prof.get("per_step_runtime_calls", {})
            launches = sum(n for c, n in calls.items() if "Launch" in c)
            syncs = sum(n for c, n in calls.items() if "Synchronize" in c)
            tok_s = v["predicted_tau_t0"] / v["step_seconds"]
            lines.append(f"| {k} | {v['step']} | {v['size']} | {v['depth']} | {v['first_call_seconds']:.0f} | "
                         f"{v['step_seconds'] * 1e3:.2f} | {sec['drafting'] * 1e3:.2f} / "
                         f"{sec['verifying'] * 1e3:.2f} / "
                         f"{sec['overhead'] * 1e3:.2f} | {launches:.0f} | {syncs:.1f} | "
                         f"{prof.get('per_step_device_busy_seconds', float('nan')) * 1e3:.2f} | "
                         f"{v['predicted_tau_t0']:.2f} | {tok_s:.0f} | "
                         + (f"{tok_s / hf_c:.2f}x |" if hf_c else "|"))
        lines += ["", "A step costs the same whatever the draft proposes (no confidence stop on CUDA), so the measured "
                  "seconds per step are the real pair's; predicted real-pair tok/s = the shape's predicted tau from "
                  "the shipped HumanEval T=0 acceptance (per-depth rows) / measured seconds per step "
                  "(PREDICTED, not measured).",
                  ""]
    if "validate" in ph:
        lines += [f"Validation (draft = target, float32): {json.dumps(ph['validate'])}", ""]
    if "predict" in ph and "hf" in ph:
        hf_e, hf_c = ph["hf"]["hf_generate_eager"]["tok_s"], hf_fastest(ph)
        lines += ["## Predicted for the real pair (shipped acceptance, per-depth rows, measured costs; NOT measured)",
                  "",
                  "| acceptance | cost model | budget | depth | tau | speedup vs own decode | tok/s | vs HF eager | "
                  "vs HF static+compile |", "|---|---|---|---|---|---|---|---|---|"]
        for acc, rows in ph["predict"].items():
            for cm, p in rows.items():
                lines.append(f"| {acc} | {cm} | {p['budget']} | {p['depth']} | {p['tau']:.2f} | "
                             f"{p['speedup_vs_own_decode']:.2f} | {p['tok_s']:.1f} | {p['tok_s'] / hf_e:.2f}x | "
                             f"{p['tok_s'] / hf_c:.2f}x |")
        lines += ["", "Predicted tok/s = G(n, d) / (t(n) + draft levels), from this machine's measured costs; the "
                  "engine's own time is not in the prediction (see the measured engine share).", ""]
    if ph.get("levels"):
        lv = ph["levels"]
        lines += [f"## Draft level levers (inside the captured step: a {lv.get('shape', '?')}, {lv['context']} "
                  "cached tokens)", "", "| lever | ms per level (measured: one more level) | drafting ms per "
                  "forward (4-level chain) | verification ms | step ms | kernels per step | device us per step | "
                  "first call s |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {k}: {v.get('what', '')} | {_level_marginal(v)} | {_level_per_forward(v):.3f} | "
                  f"{v['verify_ms']:.3f} | {v['step_ms']:.3f} | {_num(v.get('kernels_per_step'))} | "
                  f"{_num(v.get('device_us_per_step'))} | {v['first_call_seconds']:.0f} |"
                  for k, v in lv["levers"].items() if "level_ms" in v]
        lines += ["", "One more level: an 8-level chain's drafting per step less a 4-level chain's, over 4 (the "
                  "drafting a step does whatever its depth apart); per forward: the 4-level chain's drafting over its "
                  "4 forwards (all this table reported before 2026-11-29's 'one more level' column; '-': not measured "
                  "then)."]
        failed = {k: v["error"] for k, v in lv["levers"].items() if "error" in v}
        if failed:
            lines += ["", "Failed: " + "; ".join(f"{k}: `{e}`" for k, e in failed.items()) + "."]
        if lv.get("skipped"):
            lines += ["", "Not run (the phase's time was spent): " + "; ".join(lv["skipped"]) + "."]
        if lv.get("cuda_only"):
            lines += ["", "Not run (CUDA levers, this run's device is not one): " + "; ".join(lv["cuda_only"]) + "."]
        lines.append("")
    if ph.get("sweep"):
        lines += sweep_report(ph["sweep"], hf_fastest(ph))
    return "\n".join(lines)


def _level_per_forward(v: dict[str, Any]) -> float:
    """A lever's drafting ms per forward of the 4-level chain (records before the marginal level: ``level_ms``)."""
    return v.get("level_ms_per_forward", v["level_ms"])


def _level_marginal(v: dict[str, Any]) -> str:
    """A lever's ms for one more level, or '-' in a record from before it was measured."""
    return f"{v['level_ms']:.3f}" if "level_ms_per_forward" in v else "-"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _sized(name: str, d: dict[str, Any], hf_c: float | None) -> str:
    """One builder's device-sized tree, predicted: its size, tau and seconds per step, and its tok/s over HF's."""
    tau, step = d["predicted_tau_rows"], d["predicted_step_seconds"]
    versus = f", {tau / step / hf_c:.2f}x HF static+compile" if hf_c else ""
    return (f"{name}: budget {d['budget']}, depth {d['depth']}, widths {d['widths']}, tau {tau:.2f} at "
            f"{step * 1e3:.2f} ms per step{versus}")


def sweep_report(sw: dict[str, Any], hf_c: float | None) -> list[str]:
    """The sweep phase's section of README.md."""
    lines = ["## Sweep: tree shapes x budgets on one set of compiled graphs", ""]
    if "lever" in sw:
        lines += [f"Every shape ran with the lever `{sw['lever']}` ({sw['lever_setting']}).", ""]
    if "step_costs" in sw:
        c = sw["step_costs"]
        if "drafting_fixed" in c:
            level = (f"a draft level {c['level'] * 1e3:.2f} ms (one more level: the Theil-Sen slope of drafting over "
                     f"the shapes' depths) and {c['drafting_fixed'] * 1e3:.2f} ms of drafting per step whatever its "
                     f"depth (drafting per forward {c['level_per_forward'] * 1e3:.2f} ms, the median)")
        else:
            level = f"a draft level {c['level'] * 1e3:.2f} ms (drafting per forward, the median over the shapes)"
        lines += [f"Costs read off the swept steps: {level}, a verification {c['verify'] * 1e3:.2f} ms, the engine "
                  f"{c['engine'] * 1e3:.2f} ms per step (medians over the shapes).", ""]
    if "t_compiled" in sw:
        t = {int(k): v for k, v in sw["t_compiled"].items()}
        lv = {int(k): v for k, v in sw["level_compiled"].items()}
        lines += ["Measured compiled costs (one graph each, dynamic token count): target t(n) "
                  + ", ".join(f"t({n}) {v * 1e3:.2f}" for n, v in t.items()) + " ms; draft forward per level of r rows "
                  + ", ".join(f"{r}: {v * 1e3:.2f}" for r, v in lv.items()) + f" ms ({sw['costs_seconds']:.0f} s with "
                  "their compiles).", ""]
    if "device_sized" in sw:
        d = sw["device_sized"]
        lines += ["Device-sized tree (`choose_tree` on the costs above, shipped T=0 per-depth rows): "
                  f"budget {d['budget']}, "
                  f"depth {d['depth']}, widths {d['widths']}; predicted {d['predicted_tau_rows']:.2f} tokens per step "
                  f"(rows) at {d['predicted_step_seconds'] * 1e3:.2f} ms per step (PREDICTED).", ""]
    if "device_sized_builders" in sw:
        lines += ["Each builder at its own best size under the same costs and rows (PREDICTED, not run): "
                  + "; ".join(_sized(name, d, hf_c) for name, d in sw["device_sized_builders"].items()) + ".", ""]
    if "envelope" in sw:
        lines += [f"Envelope of all shapes: {sw['envelope']['describe']}.", ""]
    if sw.get("runs"):
        lines += ["| shape | size | depth | widths | first call s | new graphs | ms per step (measured) | drafting / "
                  "verifying / engine ms | predicted tau (T=0 replay) | predicted real-pair tok/s | "
                  "vs HF static+compile (fastest) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in sw["runs"].items():
            sec = r["per_step_seconds"]
            tok_s = r["predicted_tau_t0"] / r["step_seconds"]
            lines.append(f"| {name} | {r['size']} | {r['depth']} | {r['widths']} | {r['first_call_seconds']:.1f} | "
                         f"{r['new_graphs']} | {r['step_seconds'] * 1e3:.2f} | {sec['drafting'] * 1e3:.2f} / "
                         f"{sec['verifying'] * 1e3:.2f} / {sec['overhead'] * 1e3:.2f} | {r['predicted_tau_t0']:.2f} | "
                         f"{tok_s:.0f} | " + (f"{tok_s / hf_c:.2f}x |" if hf_c else "|"))
        lines += ["", "Seconds per step are measured (a step costs the same whatever a random draft proposes); tau is "
                  "PREDICTED from the shipped HumanEval T=0 acceptance (replay over its ranks), so tok/s and the ratio "
                  "are predictions for the real pair, not measurements."
                  + ("" if hf_c else " The ratio column is empty: phase hf has not run into this --out (run "
                     "--phase hf on the same machine to fill it)."), ""]
    if sw.get("kernel_table"):
        k = sw["kernel_table"]
        lines += [f"Kernel table of the device-sized tree's step ({_num(k['kernels_per_step'])} kernels and "
                  f"{_num(k['device_us_per_step'])} us of device time per step):", "",
                  "| kernel | calls per step | us per step |",
                  "|---|---|---|"]
        lines += [f"| `{r['name']}` | {r['calls_per_step']:.1f} | {r['us_per_step']:.1f} |" for r in k["top"]]
        lines.append("")
    if sw.get("clock"):
        c = sw["clock"]
        lines += [f"The device-sized tree's wall seconds per step (decoding, prefill apart; medians of "
                  f"{len(c['events'])} alternating runs): sections timed by CUDA events "
                  f"{c['events_median_s_per_step'] * 1e3:.2f} ms, by waiting for the device at each section "
                  f"{c['waits_median_s_per_step'] * 1e3:.2f} ms.", ""]
    if sw.get("clock_error"):
        lines += [f"The clock comparison failed: {sw['clock_error']}", ""]
    return lines
