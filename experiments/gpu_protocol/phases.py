"""Phases first, costs, hf, treespec, validate and predict (the module docstring of ``bench_gpu.py``)."""

from __future__ import annotations

import time
from typing import Any

import torch

import treespec
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.calibrate.costs import draft_level_cost, measure_latency
from treespec.calibrate.step_cost import choose_tree
from treespec.core import compiled
from treespec.core.buffers import Envelope
from treespec.core.compiling import graphs_compiled

from .bench import ACCEPTANCE_T0, ROOT, Bench, hf_generate, hf_generate_frozen, timed, treespec_run
from .models import build, weak_draft
from .shapes import CHECK_SHAPE, FIRST_ENVELOPE, SECOND_SHAPE, step_shapes


def phase_first(b: Bench) -> dict[str, Any]:
    """A tiny float32 model through the real compiled step on the device: equal to eager and to HF; then a
    second tree shape in the same envelope compiles nothing and is exact too."""
    if b.tiny:  # the smoke's float32 target and weak draft are tiny already: phase validate reuses this runner
        model, weak = b.model("target32"), b.model("weak")
    else:
        model = build("target", True, torch.float32, b.device, 0)
        weak = weak_draft(model, 2, noise=0.1)  # partial agreement: steps of several accepted lengths
    second, env = SECOND_SHAPE, FIRST_ENVELOPE
    out: dict[str, Any] = {"cases": [], "envelope": env.describe()}
    for shape, prompts in ((CHECK_SHAPE, ([1, 2, 3, 4, 5], list(range(20, 60)), list(range(100, 107)))),
                           (second, ([7, 3, 9, 1], list(range(30, 90))))):
        for prompt in prompts:
            graphs = graphs_compiled()
            t = time.perf_counter()
            comp = treespec.generate(model, prompt, [treespec.ModelDrafter(weak, shape)], max_new_tokens=24, budget=8,
                                     compile=b.compile, envelope=env)
            seconds = time.perf_counter() - t
            eager = treespec.generate(model, prompt, [treespec.ModelDrafter(weak, shape)], max_new_tokens=24, budget=8)
            with torch.inference_mode():
                hf = model.generate(torch.tensor([prompt], device=b.device), do_sample=False, max_new_tokens=24,
                                    min_new_tokens=24, pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
            out["cases"].append({"shape": len(shape) + 1, "prompt_len": len(prompt),
                                 "new_graphs": graphs_compiled() - graphs,
                                 "compiled_equals_eager": comp.new_tokens == eager.new_tokens,
                                 "compiled_equals_hf": comp.new_tokens == hf, "seconds_with_compile": seconds,
                                 "tau": comp.stats.tau, "accepted_hist": comp.stats.accepted_hist,
                                 "step": comp.stats.step})
    out["ok"] = all(c["compiled_equals_eager"] and c["compiled_equals_hf"] for c in out["cases"])
    out["second_shape_compiled_nothing"] = all(c["new_graphs"] == 0 for c in out["cases"][3:])
    return out


@torch.inference_mode()
def compiled_latency(b: Bench, model: torch.nn.Module, sizes: list[int], repeats: int) -> dict[int, float]:
    """t(n) of the compiled static-shape tree forward after ``prompt_len`` cached tokens."""
    context, out = b.args.prompt_len, {}
    for n in sizes:
        runner = compiled._Runner(model, compiled.round_up(context + n + 1, compiled.CAPACITY_BUCKET), n, b.backend,
                                  b.mode)
        runner.prefill(list(range(1, context + 2)))
        ids = torch.randint(0, model.config.vocab_size, (n,), device=b.device)
        depth = torch.arange(n, device=b.device)
        anc = torch.ones(n, n, dtype=torch.bool, device=b.device).tril()
        out[n] = timed(lambda: runner.forward(ids, depth, anc).clone(), b.device, repeats, warmup=3)
    return out


def phase_costs(b: Bench) -> dict[str, Any]:
    a, target, draft = b.args, b.model("target"), b.model("draft")
    eager_sizes = [1, 2, 4, 8] if b.tiny else list(range(1, 129))
    out = {"t_eager": measure_latency(target, eager_sizes, context=a.prompt_len, repeats=a.repeats),
           "draft_level_eager": draft_level_cost(draft, tokens=4, context=a.prompt_len, repeats=a.repeats)}
    b.checkpoint("costs", out)
    out["t_compiled"] = compiled_latency(b, target, a.compiled_sizes, a.repeats)  # {} with --compiled-sizes 0
    out["draft_level_compiled"] = compiled_latency(b, draft, [4], a.repeats)[4] if a.compiled_sizes else None
    return out


def phase_hf(b: Bench) -> dict[str, Any]:
    out = {"hf_generate_eager": hf_generate(b, b.model("target"), False),
           "hf_generate_static_compiled": hf_generate(b, b.model("target"), True)}
    b.checkpoint("hf", out)
    if not b.tiny:  # the smoke's backend is dynamo's eager one: nothing to freeze
        try:
            out["hf_generate_static_compiled_frozen"] = hf_generate_frozen(b, b.model("target"))
        except Exception as e:  # a finding, not a reason to lose the phase
            out["hf_frozen_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    return out


def phase_treespec(b: Bench) -> dict[str, Any]:
    """Seconds per step of Sequoia trees (budgets ``--step-budgets``): captured (``compile=True``) at each
    budget, eager at the first. The draft is random: a step costs the same whatever is accepted (no
    confidence stop on CUDA), so these are the real pair's step costs; acceptance comes from the
    shipped acceptance at report time."""
    acc = MeasuredAcceptance.load(ACCEPTANCE_T0)
    runs = {}
    for i, (budget, shape) in enumerate(step_shapes(b, acc).items()):
        # the smoke pads the tree's levels to one row count, as a device does (one level graph, not one per width)
        env = Envelope.for_shapes([shape]) if b.tiny else None
        for mode, comp in (("compiled", b.compile), ("eager", False)):
            if mode == "eager" and (i or b.args.no_eager):
                continue
            run = treespec_run(b, b.model("target"), b.model("draft"), shape, comp, profile=True, budget=shape.size,
                               envelope=env)
            run.update(budget=budget, size=shape.size, depth=shape.depth, widths=list(shape.widths),
                       predicted_tau_t0=shape.expected_tokens(acc.matrix))
            runs[f"{mode}_budget{budget}"] = run
            b.checkpoint("treespec", runs)  # a later run's crash or timeout keeps this one
    return runs


def phase_validate(b: Bench) -> dict[str, Any]:
    """Float32 (bf16 random logits have near-ties). draft = target: every uncut step accepts the whole
    chain, eager and compiled. A weak draft (the target's first quarter of layers, perturbed): steps of
    varying accepted length, compiled output == eager == HF greedy. The weak draft runs first: in the smoke
    it is phase first's pair, whose runner (``FIRST_ENVELOPE``) the smoke's compiled runs reuse (on a device the
    envelope is the tree's own, padded)."""
    target = b.model("target32")
    env = FIRST_ENVELOPE if b.tiny else None
    weak = b.model("weak")
    prompt, n = b.prompts[0], b.args.new_tokens
    runs = [treespec.generate(target, prompt, [treespec.ModelDrafter(weak, CHECK_SHAPE)], max_new_tokens=n,
                              budget=b.args.budget, compile=c, envelope=env if c else None) for c in (False, b.compile)]
    with torch.inference_mode():
        hf = target.generate(torch.tensor([prompt], device=b.device), do_sample=False, max_new_tokens=n,
                             min_new_tokens=n, pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    weak_check = {"tau_eager": runs[0].stats.tau, "tau_compiled": runs[1].stats.tau,
                  "accepted_hist_compiled": runs[1].stats.accepted_hist, "step": runs[1].stats.step,
                  "compiled_equals_eager": runs[0].new_tokens == runs[1].new_tokens,
                  "compiled_equals_hf": runs[1].new_tokens == hf}
    out: dict[str, Any] = {}
    for mode, comp in (("eager", False), ("compiled", b.compile)):
        r = treespec_run(b, target, target, CHECK_SHAPE, comp, envelope=env)
        share = r["uncut_steps_committing_whole_chain"] / max(r["uncut_steps"], 1)
        out[mode] = {"tau": r["tau"], "expected_tau": 5.0, "steps_accepting_whole_chain": share, "ok": share == 1.0,
                     "step": r["step"]}
    same = [treespec.generate(target, b.prompts[0], [treespec.ModelDrafter(target, CHECK_SHAPE)],
                              max_new_tokens=b.args.new_tokens, budget=b.args.budget, compile=c,
                              envelope=env if c else None).new_tokens
            for c in (False, b.compile)]
    out["compiled_equals_eager_greedy"] = same[0] == same[1]
    out["weak_draft"] = weak_check
    return out


def phase_predict(b: Bench, done: dict[str, Any]) -> dict[str, Any]:
    """choose_tree on each shipped acceptance (its per-depth rows, as the tuner) with each cost model
    (predicted, NOT measured)."""
    if "costs" not in done or "hf" not in done:
        raise SystemExit("phase predict needs the results of phases costs and hf: run them first")
    c = done["costs"]
    lat_e = {int(k): v for k, v in c["t_eager"].items()}
    lat_c = {int(k): v for k, v in c["t_compiled"].items()}
    budgets = [b.args.budget] if b.tiny else list(range(1, 129))
    out = {}
    for path in sorted((ROOT / "treespec" / "data").glob("acceptance-*.json")):
        acc, rows = MeasuredAcceptance.load(path), {}
        for name, lat, level in (("eager", lat_e, c["draft_level_eager"]),
                                 ("compiled target, eager draft levels", lat_c, c["draft_level_eager"]),
                                 ("compiled target and draft levels", lat_c, c.get("draft_level_compiled"))):
            if not lat or level is None:  # that cost model was not measured (--compiled-sizes 0)
                continue
            ch = choose_tree(acc, lat, level, budgets=[x for x in budgets if x <= max(lat)], max_depth=10,
                             per_depth=True)
            rows[name] = {"budget": ch.budget, "depth": ch.depth, "tau": ch.tau, "speedup_vs_own_decode": ch.speedup,
                          "tok_s": ch.speedup / lat[1], "c": ch.c}
        out[path.stem] = rows
    return out
