"""Phase sweep: tree shapes x budgets on one set of compiled graphs, a tree sized by the device's costs, and the
chrome traces of its steps."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import scipy.stats

import treespec
from treespec.common.device import sync
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.calibrate.costs import measure_latency
from treespec.calibrate.step_cost import Builder, choose_tree
from treespec.core.buffers import Envelope
from treespec.core.compiling import graphs_compiled

from .bench import ACCEPTANCE_T0, Bench, treespec_run
from .levers import LEVERS, Lever, lever
from .profiling import clock_events, kernel_table
from .shapes import sweep_shapes

#: the builders also sized by the device's costs (each at its own best budget and depth, predicted), beside the
#: Sequoia tree that runs: a shape comparison at each shape's best size rather than at the sweep's fixed budgets
SIZED_BUILDERS = {"chain": Builder("chain"), "kary-2": Builder("kary", 2), "kary-4": Builder("kary", 4)}


def sweep_lever(name: str, done: dict[str, Any]) -> tuple[str, Lever]:
    """``--sweep-lever``: a lever of ``LEVERS`` by name, or ``best`` (the lowest level seconds of phase levels'
    saved results, ``done``: one more level's where every timed lever has it, else drafting per forward, which
    every record has)."""
    if name == "best":
        levels = done.get("levels") or {}
        timed = {k: v for k, v in (levels.get("levers") or {}).items() if "level_ms" in v}
        if not timed and levels.get("cuda_only"):
            raise SystemExit(f"--sweep-lever best: phase levels timed no lever here ({', '.join(levels['cuda_only'])} "
                             "run on CUDA only): add a lever that runs here (--levers default ...) or name one "
                             "(--sweep-lever default)")
        if not timed:
            raise SystemExit("--sweep-lever best needs phase levels' timed levers in --out: run --phase levels first")
        key = "level_ms" if all("level_ms_per_forward" in v for v in timed.values()) else "level_ms_per_forward"
        name = min(timed, key=lambda k: timed[k].get(key, timed[k]["level_ms"]))
    if name not in LEVERS:
        raise SystemExit(f"--sweep-lever {name!r} is not one of LEVERS or 'best'")
    return name, LEVERS[name]


def phase_sweep(b: Bench, done: dict[str, Any]) -> dict[str, Any]:
    """Tree shapes x budgets on ONE set of compiled graphs (a padded envelope), then a tree sized by this device's
    costs, measured from those very steps (no graph of its own to compile: the phase fits one command on a cold
    machine).

    1. Every family of ``SWEEP_FAMILIES`` at each ``--sweep-budgets`` budget, in one envelope (theirs, widened so
       that a device-sized tree fits it too): the first tree compiles (its seconds recorded apart), the others must
       not (dynamo's graph count is recorded per shape). Measured: seconds per step and its sections.
    2. The device's costs, read off those steps (:func:`step_costs`): a draft level's seconds (the slope of
       drafting per step over the tree's depth, its intercept charged to every step) and a verification's (flat in
       the node count up to the envelope's, the median over the shapes); with
       ``--sweep-costs dynamic`` also the compiled forwards timed alone (``measure_latency(compiled=...)``: one
       graph each with a dynamic token count, minutes of compiles on a GPU).
    3. The device-sized tree: ``choose_tree`` on the step costs with the shipped T=0 acceptance (per-depth rows),
       run in the same envelope when it fits.
    4. Predicted (NOT measured: random weights): each shape's tau from the shipped acceptance's replay, hence
       real-pair tok/s and the speedup over HF static+compile (phase hf, same machine). The kernel table of the
       device-sized tree's step (``torch.profiler``).

    Every shape runs with ``--sweep-lever`` (:func:`sweep_lever`; ``done``: the phases saved so far)."""
    name, setting = sweep_lever(b.args.sweep_lever, done)
    with lever(setting, b.model("draft")):
        return {"lever": name, "lever_setting": dataclasses.asdict(setting), **_sweep(b)}


def _sweep(b: Bench) -> dict[str, Any]:
    """:func:`phase_sweep`'s shapes, costs and device-sized tree, under whatever lever is in effect."""
    a, target, draft = b.args, b.model("target"), b.model("draft")
    acc = MeasuredAcceptance.load(ACCEPTANCE_T0)
    out: dict[str, Any] = {}
    shapes, env = sweep_shapes(b, acc)
    out["envelope"] = {"nodes": env.nodes, "rows": list(env.rows), "children": env.children, "describe": env.describe()}
    runs = out["runs"] = {}
    for name, shape in shapes.items():
        runs[name] = _sweep_run(b, acc, name, shape, env)
        b.checkpoint("sweep", out)
    out["step_costs"] = step_costs(runs)
    if a.sweep_costs == "dynamic":
        t = time.perf_counter()
        out["t_compiled"] = measure_latency(target, [1, 2, 4, 8] if b.tiny else [1, 2, 4, 8, 16, 32, 64],
                                            context=a.prompt_len, repeats=a.repeats, compiled=b.compile)
        out["level_compiled"] = measure_latency(draft, [2, 4, 8] if b.tiny else [2, 4, 8, 16], context=a.prompt_len,
                                                repeats=a.repeats, compiled=b.compile)
        out["costs_seconds"] = time.perf_counter() - t
    c = out["step_costs"]

    def sized(builder: Builder | None) -> Any:  # the best tree of a builder under the swept steps' costs
        return choose_tree(acc, {1: c["verify"], env.nodes: c["verify"]}, c["level"],
                           budgets=list(range(1, env.nodes + 1)), max_depth=env.depth, max_width=env.children,
                           per_depth=True, overhead=c["engine"] + c.get("drafting_fixed", 0.0), builder=builder)

    def described(choice: Any) -> dict[str, Any]:
        return {"budget": choice.budget, "depth": choice.depth, "size": choice.shape.size,
                "widths": list(choice.shape.widths), "predicted_tau_rows": choice.tau,
                "predicted_step_seconds": choice.step_seconds, "paths": [list(p) for p in choice.shape.paths]}

    choice = sized(None)
    out["device_sized"] = described(choice)
    out["device_sized_builders"] = {name: described(sized(builder)) for name, builder in SIZED_BUILDERS.items()}
    b.checkpoint("sweep", out)
    if choice.shape.size > 1 and env.covers(Envelope.for_shapes([choice.shape])):
        runs["device-sized"] = _sweep_run(b, acc, "device-sized", choice.shape, env)
        shape = choice.shape
        b.checkpoint("sweep", out)
        try:  # measurement aids: a failure is recorded, the sweep's results stay
            out["kernel_table"] = kernel_table(
                lambda: treespec.generate(target, b.prompts[0], [treespec.ModelDrafter(draft, shape)],
                                          max_new_tokens=a.new_tokens, compile=b.compile, envelope=env), b.device)
            b.checkpoint("sweep", out)
            out["clock"] = clock_ab(b, shape, env)
            if a.trace:
                out["traces"] = {name: step_trace(b, shape, env, events, Path(a.out) / f"trace-{name}.json.gz")
                                 for name, events in (("waits", False), ("events", True))}
        except Exception as e:
            out["clock_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    return out


def clock_ab(b: Bench, shape, env: Envelope, rounds: int = 3) -> dict[str, Any]:
    """The device-sized tree's seconds with the step's sections timed by CUDA events (``Clock.device_events``,
    no wait) and by waiting for the device at every charge, alternating ``rounds`` times: the waits' cost."""
    out: dict[str, Any] = {"waits": [], "events": []}
    for _ in range(rounds):
        for name, events in (("waits", False), ("events", True)):
            with clock_events(events):
                run = treespec_run(b, b.model("target"), b.model("draft"), shape, b.compile, budget=env.nodes,
                                   envelope=env)
            decode = run["seconds"] - run["sections_seconds"]["prefill"]
            out[name].append({"seconds": run["seconds"], "steps": run["steps"],
                              "wall_s_per_step": decode / run["steps"], "sections_s_per_step": run["step_seconds"],
                              "per_step_seconds": run["per_step_seconds"]})
    for name in ("waits", "events"):
        out[f"{name}_median_s_per_step"] = statistics.median(r["wall_s_per_step"] for r in out[name])
    return out


def _sweep_run(b: Bench, acc: MeasuredAcceptance, name: str, shape, env: Envelope) -> dict[str, Any]:
    """One shape of phase sweep in envelope ``env``: measured seconds per step (``treespec_run``), graphs compiled,
    and the shipped acceptance's predicted tau."""
    print(f"  sweep {name}: size {shape.size}, depth {shape.depth}", flush=True)
    graphs = graphs_compiled()
    run = treespec_run(b, b.model("target"), b.model("draft"), shape, b.compile, budget=env.nodes, envelope=env)
    run.update(size=shape.size, depth=shape.depth, widths=list(shape.widths), new_graphs=graphs_compiled() - graphs,
               predicted_tau_t0=acc.replayed_tau(shape), predicted_tau_rows_t0=shape.expected_tokens(acc.matrix))
    return run


def step_costs(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """A draft level's, a verification's and the engine's seconds per step read off the swept shapes' steps (one
    envelope, so every verification has the same width: medians over the shapes).

    Drafting is fitted as ``fixed + level * depth`` (Theil-Sen: the median of the pairwise slopes, so one shape
    timed through a hiccup does not move it): ``level`` is what one more level costs, ``drafting_fixed`` what a
    step drafts whatever its depth. With a single depth among the shapes there is no slope: the median of drafting
    per level, nothing fixed. ``level_per_forward`` is that median in any case (what this returned before)."""
    per = list(runs.values())
    depths = [r["depth"] for r in per]
    drafting = [r["per_step_seconds"]["drafting"] for r in per]
    per_forward = statistics.median(d / depth for d, depth in zip(drafting, depths))
    level, fixed = per_forward, 0.0
    if len(set(depths)) > 1:
        slope, intercept, *_ = scipy.stats.theilslopes(drafting, depths)
        if slope > 0:
            level, fixed = float(slope), max(float(intercept), 0.0)
    return {"level": level, "drafting_fixed": fixed, "level_per_forward": per_forward,
            "verify": statistics.median(r["per_step_seconds"]["verifying"] for r in per),
            "engine": statistics.median(r["per_step_seconds"]["overhead"] for r in per)}


def step_trace(b: Bench, shape, env: Envelope, events: bool, path: Path, new_tokens: int = 8) -> dict[str, Any]:
    """A chrome trace (``torch.profiler``, gzipped) of one short ``generate`` of the device-sized tree, sections
    timed by events or by waits: where the device idles inside a step, and what the host does meanwhile."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if b.device.type == "cuda" else [])
    with clock_events(events), profile(activities=acts, with_stack=False) as prof:
        out = treespec.generate(b.model("target"), b.prompts[1 % len(b.prompts)],
                                [treespec.ModelDrafter(b.model("draft"), shape)], max_new_tokens=new_tokens,
                                compile=b.compile, envelope=env)
        sync(b.device)
    prof.export_chrome_trace(str(path))
    return {"path": path.name, "steps": out.stats.steps, "bytes": path.stat().st_size}
