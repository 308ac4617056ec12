"""GPU protocol: costs, tok/s and the predicted speedup of the real Qwen2.5-Coder pair, in phases.

The real weights cannot travel to a GPU node, so the models are built with random weights from the
real pair's configs (1.5B target, 0.5B draft). GPU time is scarce, so the protocol runs in phases,
each one command well under 10 minutes, each writing ``results.json`` and ``README.md`` the moment it
ends (a crash later loses nothing; a phase run again replaces only its own entry):

* ``first``: a tiny model, ``compile=True`` on the device with the real backend (inductor, and CUDA
  graphs on CUDA), greedy, against eager treespec and HF greedy, in float32. A compiled-step bug
  of the CUDA-graph class shows here in seconds, before minutes of compiles.
* ``costs``: the target's tree forward t(n), eager for n = 1..128 and compiled for a few sizes, and
  the draft's cost per tree level, eager and compiled.
* ``hf``: HF ``generate``, eager and with a static cache + ``torch.compile``.
* ``treespec``: seconds per step of Sequoia trees (``--step-budgets``; the DP trees of the shipped T=0
  acceptance's per-depth rows) captured (``compile=True``), and eager at the first budget (``--no-eager``: not),
  each with a ``torch.profiler`` count of launches, copies and syncs per step and the device's busy time per step;
  saved after every run. A random draft: a step costs the same whatever is accepted, so the real
  pair's tok/s is predicted from the shapes' tau at report time.
* ``validate``: float32 (bf16 random logits have near-ties): draft = target, the share of steps
  accepting the whole chain, eager and compiled, and compiled == eager greedy output; a weak draft
  (the target's first layers, perturbed: varying acceptance), compiled == eager == HF greedy.
* ``predict``: the real pair's speedup predicted from the measured costs and the shipped
  acceptance's per-depth rows (``treespec/data/acceptance-*.json``) through ``treespec.calibrate.costs``;
  needs ``costs`` and ``hf``. Predicted, NOT measured: the README says which is which.

    python experiments/bench_gpu.py --out experiments/results/gpu-h100 --phase first      # seconds
    python experiments/bench_gpu.py --out experiments/results/gpu-h100 --phase costs      # then hf, ...
    python experiments/bench_gpu.py --smoke --out /tmp/bench-smoke --phase all            # tiny, CPU
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runs from a checkout without installing treespec

import torch  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from transformers.generation import CompileConfig  # noqa: E402

import treespec  # noqa: E402
from treespec.calibrate.acceptance import MeasuredAcceptance  # noqa: E402
from tree_builders.budgeted import for_budget  # noqa: E402
from treespec.calibrate.costs import draft_level_cost, measure_latency  # noqa: E402
from treespec.calibrate.step_cost import choose_tree  # noqa: E402
from treespec.common.device import sync  # noqa: E402
from treespec.common.machine import device_name  # noqa: E402
from treespec.common.files import write_json  # noqa: E402
from treespec.core import attention, compiled, compiling, fused_qkv  # noqa: E402
from treespec.core.compiling import graphs_compiled  # noqa: E402
from treespec.core.buffers import Envelope  # noqa: E402


# Qwen2.5-Coder-{1.5B,0.5B}-Instruct (HF config.json; the GGUF-dequantised copies agree except that
# they untie the LM head, which does not change the cost of a forward).
REAL = {
    "target": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                   intermediate_size=8960),
    "draft": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, use_sliding_window=False)
# the smoke checks the script's paths: layers cost compile time (dynamo traces each), so as few as the checks need
TINY = {
    "target": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128),
    "draft": dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=64),
}
# untied: a tiny random model with a tied head repeats its last token, and every draft then agrees
TINY_COMMON = dict(COMMON, vocab_size=512, max_position_embeddings=2048, tie_word_embeddings=False)
CHAIN = [(0,) * k for k in range(1, 5)]  # a rank-0 chain of depth 4 ...
CHECK_SHAPE = CHAIN + [(1,)]  # ... and a branch: draft = target accepts the whole chain every step
SECOND_SHAPE = [(0,), (1,), (2,), (0, 0), (1, 0)]  # phase first's second tree, in the same envelope
FIRST_ENVELOPE = Envelope.for_shapes([CHECK_SHAPE, SECOND_SHAPE])
# the smoke's target: one layer (dynamo traces every layer of every graph; phase first on a device keeps TINY's)
SMOKE_TARGET_LAYERS = 1
PHASES = ("first", "costs", "hf", "treespec", "validate", "predict", "levels", "sweep")


def build(kind: str, tiny: bool, dtype: torch.dtype, device: torch.device, seed: int,
          layers: int | None = None) -> torch.nn.Module:
    """A Qwen2 model of the real (or tiny) ``kind`` config with random weights; ``layers`` overrides depth."""
    sizes = dict((TINY if tiny else REAL)[kind])
    if layers is not None:
        sizes["num_hidden_layers"] = layers
    cfg = Qwen2Config(**sizes, **(TINY_COMMON if tiny else COMMON), attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype).eval()


def weak_draft(target: torch.nn.Module, layers: int, noise: float = 2.0, seed: int = 2) -> torch.nn.Module:
    """The target's first ``layers`` layers with its embeddings, final norm and head, every weight
    perturbed by Gaussian noise of ``noise`` times its tensor's std: a draft that agrees with the
    target sometimes, not always (random weights give no real draft; a truncated copy alone agrees
    almost always on tiny random models)."""
    settings = {**target.config.to_dict(), "num_hidden_layers": layers}
    settings.pop("layer_types", None)  # derived from the number of layers
    cfg = Qwen2Config(**settings)
    p = next(target.parameters())
    with torch.device(p.device):
        draft = Qwen2ForCausalLM(cfg).to(p.dtype).eval()
    draft.load_state_dict(target.state_dict(), strict=False)  # the missing layers are simply not copied
    g = torch.Generator(p.device).manual_seed(seed)
    with torch.no_grad():
        for w in draft.parameters():
            if w.numel() > 1:
                w.add_(noise * w.float().std().to(w.dtype) * torch.randn(w.shape, generator=g, device=w.device,
                                                                         dtype=w.dtype))
    return draft


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Bench:
    """The run's settings and models; builds each model once, when a phase first needs it."""

    def __init__(self, args: argparse.Namespace,
                 checkpoint: Callable[[str, dict[str, Any]], None] = lambda phase, part: None) -> None:
        # checkpoint(phase, part): save a phase's finished part now (a later crash or timeout keeps it)
        self.args, self.tiny, self.device = args, args.smoke, torch.device(args.device)
        self.checkpoint = checkpoint
        self.dtype = torch.float32 if self.tiny else torch.bfloat16
        self.backend, self.mode = ("eager", None) if self.tiny else compiling.compile_options(True, self.device)
        self.compile = self.backend if self.tiny else True
        self.target_layers = SMOKE_TARGET_LAYERS if self.tiny else None
        self._models: dict[str, torch.nn.Module] = {}
        g = torch.Generator().manual_seed(0)
        vocab = (TINY_COMMON if self.tiny else COMMON)["vocab_size"]
        self.prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.prompts)]

    def model(self, name: str) -> torch.nn.Module:
        if name not in self._models:
            if name == "target":
                self._models[name] = build("target", self.tiny, self.dtype, self.device, 0, self.target_layers)
            elif name == "draft":
                self._models[name] = build("draft", self.tiny, self.dtype, self.device, 1)
            elif name == "weak":
                target = self.model("target32")
                self._models[name] = weak_draft(target, max(1, target.config.num_hidden_layers // 4), noise=0.1)
            elif name == "target32":
                self._models[name] = build("target", self.tiny, torch.float32, self.device, 0, self.target_layers)
        return self._models[name]

    def setup(self) -> dict[str, Any]:
        a = self.args
        return {"device": device_name(self.device), "torch": torch.__version__, "dtype": str(self.dtype),
                "smoke": self.tiny, "backend": self.backend, "mode": self.mode, "prompts": a.prompts,
                "prompt_len": a.prompt_len, "new_tokens": a.new_tokens, "budget": a.budget, "clock": a.clock,
                "weights": "random (tiny configs)" if self.tiny else "random (real configs)"}


# -- phases ---------------------------------------------------------------------------------------


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


def hf_generate(b: Bench, model: torch.nn.Module, compile: bool) -> dict[str, Any]:
    """HF ``generate`` greedy; eager (dynamic cache) or static cache + ``torch.compile``."""
    n = b.args.new_tokens
    kw: dict[str, Any] = dict(do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, eos_token_id=None)
    if compile:
        cc = CompileConfig(fullgraph=True, backend=b.backend, mode=b.mode)
        cc._compile_all_devices = True  # HF compiles on CUDA only unless told
        kw.update(cache_implementation="static", compile_config=cc)
    model.generation_config.eos_token_id = None
    with torch.inference_mode():
        model.generate(torch.tensor([b.prompts[0]], device=b.device), **kw)  # warm-up (compiles)
        sync(b.device)
        t = time.perf_counter()
        for p in b.prompts:
            model.generate(torch.tensor([p], device=b.device), **kw)
        sync(b.device)
    seconds = time.perf_counter() - t
    return {"tokens": n * len(b.prompts), "seconds": seconds, "tok_s": n * len(b.prompts) / seconds}


def hf_generate_frozen(b: Bench, model: torch.nn.Module) -> dict[str, Any]:
    """HF ``generate`` with a static cache + ``torch.compile`` under inductor's weight freezing (what treespec's own
    CUDA graphs run with; on a CPU HF's fastest already): ``treespec.bench.baselines.hf_generate``, whose one
    reused ``StaticCache`` per model stays valid under freezing (HF's per-call cache would be folded into the
    first call's graphs)."""
    from treespec.bench.baselines import hf_generate as baseline_generate

    n = b.args.new_tokens
    model.generation_config.eos_token_id = None
    with torch._inductor.config.patch(freezing=True):
        baseline_generate(model, b.prompts[0], n, static_compiled=True)  # warm-up (compiles)
        seconds = sum(baseline_generate(model, p, n, static_compiled=True)[1] for p in b.prompts)
    return {"tokens": n * len(b.prompts), "seconds": seconds, "tok_s": n * len(b.prompts) / seconds}


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


def hf_fastest(ph: dict[str, Any]) -> float | None:
    """HF's fastest measured tok/s with a static cache + compile (with or without freezing), the ratios' base."""
    runs = [v["tok_s"] for k, v in (ph.get("hf") or {}).items() if k.startswith("hf_generate_static_compiled")]
    return max(runs) if runs else None


def treespec_run(b: Bench, target: torch.nn.Module, draft: torch.nn.Module, shape, compile,
                 profile: bool = False, budget: int | None = None, envelope: Envelope | None = None) -> dict[str, Any]:
    """treespec on every prompt (one warm-up call first): tok/s, tau, sections per step, whole-chain steps;
    with ``profile``, one more call under ``torch.profiler`` (:func:`launch_profile`). ``budget``: the
    request's (default ``--budget``); ``envelope``: the captured step's (``treespec.core.buffers``)."""
    n, budget = b.args.new_tokens, budget or b.args.budget

    def one(p):
        return treespec.generate(target, p, [treespec.ModelDrafter(draft, shape)], max_new_tokens=n, budget=budget,
                                 compile=compile, envelope=envelope if compile else None)

    t = time.perf_counter()
    first = one(b.prompts[0])
    first_seconds = time.perf_counter() - t
    print(f"  {first.stats.step}: first call (compiles included) {first_seconds:.1f} s", flush=True)
    sync(b.device)
    t = time.perf_counter()
    outs = [one(p) for p in b.prompts]
    sync(b.device)
    seconds = time.perf_counter() - t
    print(f"  timed calls {seconds:.1f} s", flush=True)
    s = treespec.Stats.combined([o.stats for o in outs])
    depth = max(len(path) for path in shape)
    kept = [k for k, cut in zip(s.step_tokens, s.step_cut) if not cut]
    models = s.drafting_seconds + s.verifying_seconds
    per_step = {k: getattr(s, f"{k}_seconds") / s.steps for k in ("drafting", "verifying", "overhead")}
    run = {"step": first.stats.step, "tokens": s.new_tokens, "steps": s.steps, "tau": s.tau, "seconds": seconds,
           "tok_s": s.new_tokens / seconds, "first_call_seconds": first_seconds,
           "sections_seconds": {k: getattr(s, f"{k}_seconds")
                                for k in ("prefill", "drafting", "verifying", "overhead")},
           "step_seconds": sum(per_step.values()), "per_step_seconds": per_step,
           "accepted_hist": s.accepted_hist, "uncut_steps": len(kept),
           "uncut_steps_committing_whole_chain": sum(k == depth + 1 for k in kept),
           # drafting includes the draft model's host loop: the engine's own share is overhead / step time
           "engine_share_of_step": s.overhead_seconds / max(models + s.overhead_seconds, 1e-12)}
    if profile:
        try:
            run["profile"] = launch_profile(lambda: one(b.prompts[0]), b.device)
        except Exception as e:  # the profiler is a measurement aid: its failure must not lose the run
            run["profile"] = {"error": f"{type(e).__name__}: {e}"}
    return run


#: host-side runtime calls that launch work on, copy from or wait for a CUDA device
RUNTIME_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                 "cudaMemcpyAsync", "cudaMemsetAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                 "cudaEventSynchronize")


def launch_profile(call: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """One ``generate`` call under ``torch.profiler``, per decoding step: the runtime calls the host made
    (kernel launches, graph launches, copies, syncs), the aten operators dispatched outside compiled
    regions, and the device's busy time (kernels and copies; the profiler slows the host, so compare
    the busy time with the unprofiled step time, not with this call's)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        out = call()
        sync(device)
    steps = max(out.stats.steps, 1)
    calls = {name: 0 for name in RUNTIME_CALLS}
    aten_outside, busy_us = 0, 0.0
    for e in prof.events():
        if e.name in calls:
            calls[e.name] += 1
        elif e.device_type == torch.autograd.DeviceType.CUDA:
            busy_us += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        elif e.name.startswith("aten::") and e.cpu_parent is None:
            aten_outside += 1
    return {"steps": out.stats.steps, "per_step_runtime_calls": {k: v / steps for k, v in calls.items() if v},
            "per_step_top_level_aten_ops": aten_outside / steps, "per_step_device_busy_seconds": busy_us * 1e-6 / steps}


def step_shapes(b: Bench, acc: MeasuredAcceptance) -> dict[int, Any]:
    """The product's kind of tree for each ``--step-budgets`` budget: Sequoia's DP on ``acc``'s per-depth rows."""
    return {n: for_budget("sequoia", n, acc.matrix, max_depth=b.args.max_depth) for n in b.args.step_budgets}


def phase_treespec(b: Bench) -> dict[str, Any]:
    """Seconds per step of Sequoia trees (budgets ``--step-budgets``): captured (``compile=True``) at each
    budget, eager at the first. The draft is random: a step costs the same whatever is accepted (no
    confidence stop on CUDA), so these are the real pair's step costs; acceptance comes from the
    shipped acceptance at report time."""
    acc = MeasuredAcceptance.load(ROOT / "treespec" / "data" / "acceptance-qwen2.5-coder-t0.json")
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


SWEEP_FAMILIES = {  # name -> (builder, for_budget keyword arguments)
    "sequoia-d8": ("sequoia", dict(max_depth=8)),  # the CPU's kind of tree (deep)
    "sequoia-d4": ("sequoia", dict(max_depth=4)),
    "chain": ("chain", dict(max_depth=8)),
    "kary-2": ("kary", dict(kary_width=2, max_depth=8)),
    "kary-4": ("kary", dict(kary_width=4, max_depth=8)),
    "sequoia-w2": ("sequoia", dict(max_depth=6, max_width=2)),
}


def kernel_table(call: Callable[[], Any], device: torch.device, top: int = 15) -> dict[str, Any]:
    """One ``generate`` call under ``torch.profiler``: the kernels (CUDA; on a CPU the operators) with the most
    device time, per step, and the kernel launches per step."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        out = call()
        sync(device)
    steps = max(out.stats.steps, 1)
    rows, kernels = [], 0
    for e in prof.key_averages():
        us = (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)) if cuda \
            else e.self_cpu_time_total
        if cuda and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if cuda:
            kernels += e.count
        rows.append({"name": e.key[:90], "calls_per_step": e.count / steps, "us_per_step": us / steps})
    rows.sort(key=lambda r: -r["us_per_step"])
    return {"steps": out.stats.steps, "kernels_per_step": kernels / steps if cuda else None,
            "device_us_per_step": sum(r["us_per_step"] for r in rows) if cuda else None, "top": rows[:top]}


def sweep_lever(name: str, done: dict[str, Any]) -> tuple[str, Lever]:
    """``--sweep-lever``: a lever of ``LEVERS`` by name, or ``best`` (the lowest level seconds of phase levels'
    saved results, ``done``)."""
    if name == "best":
        timed = {k: v for k, v in ((done.get("levels") or {}).get("levers") or {}).items() if "level_ms" in v}
        if not timed:
            raise SystemExit("--sweep-lever best needs phase levels' timed levers in --out: run --phase levels first")
        name = min(timed, key=lambda k: timed[k]["level_ms"])
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
    2. The device's costs, read off those steps: a draft level's seconds (drafting per step / the tree's depth)
       and a verification's (flat in the node count up to the envelope's), medians over the shapes; with
       ``--sweep-costs dynamic`` also the compiled forwards timed alone (``measure_latency(compiled=...)``: one
       graph each with a dynamic token count, minutes of compiles on a GPU).
    3. The device-sized tree: ``choose_tree`` on the step costs with the shipped T=0 acceptance (per-depth rows),
       run in the same envelope when it fits.
    4. Predicted (NOT measured: random weights): each shape's tau from the shipped acceptance's replay, hence
       real-pair tok/s and the speedup over HF static+compile (phase hf, same machine). The kernel table of the
       device-sized tree's step (``torch.profiler``).

    Every shape runs with ``--sweep-lever`` (:func:`sweep_lever`; ``done``: the phases saved so far)."""
    name, setting = sweep_lever(b.args.sweep_lever, done)
    with lever(setting):
        return {"lever": name, "lever_setting": dataclasses.asdict(setting), **_sweep(b)}


def sweep_shapes(b: Bench, acc: MeasuredAcceptance) -> tuple[dict[str, Any], Envelope]:
    """Phase sweep's tree shapes (``SWEEP_FAMILIES`` x ``--sweep-budgets``) and their envelope, widened so that a
    device-sized tree fits it too (phase levels times its levers in this envelope, so that the sweep under the
    lever the levels phase ran last replays that lever's graphs)."""
    a = b.args
    shapes = {f"{name}-B{budget}": for_budget(builder, budget, acc.matrix, **kw)
              for budget in a.sweep_budgets for name, (builder, kw) in SWEEP_FAMILIES.items()
              if not a.sweep_families or name in a.sweep_families}
    env = Envelope.for_shapes(shapes.values())
    room = (max(a.sweep_budgets), 4, 4) if b.tiny else (64, 16, 8)  # nodes, rows, children a device tree may take
    env = Envelope(max(env.nodes, room[0]), (max(max(env.rows), room[1]),) * env.depth, max(env.children, room[2]))
    return shapes, env


def _sweep(b: Bench) -> dict[str, Any]:
    """:func:`phase_sweep`'s shapes, costs and device-sized tree, under whatever lever is in effect."""
    a, target, draft = b.args, b.model("target"), b.model("draft")
    acc = MeasuredAcceptance.load(ROOT / "treespec" / "data" / "acceptance-qwen2.5-coder-t0.json")
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
    choice = choose_tree(acc, {1: c["verify"], env.nodes: c["verify"]}, c["level"],
                         budgets=list(range(1, env.nodes + 1)), max_depth=env.depth, max_width=env.children,
                         per_depth=True, overhead=c["engine"])
    out["device_sized"] = {"budget": choice.budget, "depth": choice.depth, "size": choice.shape.size,
                           "widths": list(choice.shape.widths), "predicted_tau_rows": choice.tau,
                           "predicted_step_seconds": choice.step_seconds,
                           "paths": [list(p) for p in choice.shape.paths]}
    b.checkpoint("sweep", out)
    if choice.shape.size > 1 and env.covers(Envelope.for_shapes([choice.shape])):
        runs["device-sized"] = _sweep_run(b, acc, "device-sized", choice.shape, env)
        shape = choice.shape
        out["kernel_table"] = kernel_table(
            lambda: treespec.generate(target, b.prompts[0], [treespec.ModelDrafter(draft, shape)],
                                      max_new_tokens=a.new_tokens, compile=b.compile, envelope=env), b.device)
        b.checkpoint("sweep", out)
        try:  # measurement aids: a failure is recorded, the sweep's results stay
            out["clock"] = clock_ab(b, shape, env)
            if a.trace:
                out["traces"] = {name: step_trace(b, shape, env, events, Path(a.out) / f"trace-{name}.json.gz")
                                 for name, events in (("waits", False), ("events", True))}
        except Exception as e:
            out["clock_error"] = f"{type(e).__name__}: {str(e)[:500]}"
    return out


@contextlib.contextmanager
def clock_events(on: bool):
    """treespec's step sections timed by CUDA events (``on``) or by a wait per section, for the block."""
    from treespec.core.step import Clock

    saved, Clock.device_events = Clock.device_events, on
    try:
        yield
    finally:
        Clock.device_events = saved


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
    """A draft level's, a verification's and the engine's seconds per step, medians over the swept shapes' steps
    (a level: drafting per step / the tree's depth; one envelope, so every verification has the same width)."""
    per = list(runs.values())
    return {"level": statistics.median(r["per_step_seconds"]["drafting"] / r["depth"] for r in per),
            "verify": statistics.median(r["per_step_seconds"]["verifying"] for r in per),
            "engine": statistics.median(r["per_step_seconds"]["overhead"] for r in per)}


@dataclasses.dataclass(frozen=True)
class Lever:
    """One configuration of the captured step that phase levels times (each its own runner and compile); the
    defaults are treespec's own on CUDA."""

    what: str
    bucket: int = compiled.CUDA_CAPACITY_BUCKET  # the caches' row bucket: attention reads the whole capacity
    mode: str | None = None  # torch.compile mode (None: compiling.compile_options' own)
    freezing: bool = True  # inductor's weight freezing (gate and up as one product): compiling.CUDA_GRAPHS_FREEZE
    sdpa: str = "cudnn"  # SDPA's kernel: "cudnn" (cuDNN's where it takes the call), "efficient" (the memory-efficient
    # kernel), or "math" (no fused kernel: inductor lowers attention to two batched products and a fused softmax)
    concat_qkv: bool = True  # q, k, v as one product whatever their widths: compiling.CUDA_GRAPHS_ONE_QKV
    attention: str = "sdpa"  # the tree forwards' (FlexAttention: "flex", "flex-levels"): attention.TREE_ATTENTION


#: the draft level's levers (phase levels), in the order they run by default
LEVERS = {
    "default": Lever("treespec's CUDA defaults: caches in buckets of 512 rows, freezing, q, k, v as one product, "
                     "cuDNN's attention"),
    "baseline": Lever("before the levers: caches in buckets of 1024 rows, inductor + CUDA graphs", bucket=1024,
                      freezing=False, concat_qkv=False),
    "bucket-256+freezing+sdpa-efficient": Lever("caches in buckets of 256 rows, freezing, "
                                                "SDPA's memory-efficient kernel",
                                                bucket=256, sdpa="efficient", concat_qkv=False),
    "freezing": Lever("inductor weight freezing: weights as constants; on CUDA gate/up become one product (q/k/v "
                      "too where their widths are equal)", bucket=1024, concat_qkv=False),
    "bucket-256": Lever("attention over the used length: caches in buckets of 256 rows", bucket=256, freezing=False,
                        concat_qkv=False),
    "sdpa-efficient": Lever("SDPA's memory-efficient kernel instead of cuDNN's", bucket=1024, freezing=False,
                            sdpa="efficient", concat_qkv=False),
    "bucket-256+freezing": Lever("buckets of 256 rows and freezing", bucket=256, concat_qkv=False),
    "max-autotune": Lever("torch.compile mode max-autotune (GEMM autotuning)", bucket=1024, freezing=False,
                          concat_qkv=False, mode="max-autotune"),
    "bucket-256+freezing+qkv": Lever(
        "buckets of 256 rows (cuDNN's attention), freezing, and q, k, v as one product (torch 2.11's freezing "
        "concatenates equal widths only)", bucket=256),
    "default+flex": Lever("treespec's CUDA defaults, the tree forwards' attention FlexAttention over a block mask "
                          "(blocks past the used rows skipped; no cuDNN memset and launch gap)", attention="flex"),
    "default+flex-levels": Lever("treespec's CUDA defaults, FlexAttention in the draft levels only (the "
                                 "verification's 64 rows on cuDNN)", attention="flex-levels"),
    "default+flex+max-autotune": Lever("the lever above and max-autotune", attention="flex", mode="max-autotune"),
    "default+math": Lever("treespec's CUDA defaults, SDPA's math path in every tree forward: the level's attention "
                          "(4 rows over 512) as two small batched products and one fused masked softmax instead of "
                          "cuDNN's call and the memset before it", sdpa="math"),
    "default+max-autotune": Lever("treespec's CUDA defaults and max-autotune (Triton GEMM templates: no split-K "
                                  "reduction)", mode="max-autotune"),
    # the attention levers with max-autotune: a second device call times the pair whose attention won the first
    "default+math+max-autotune": Lever("SDPA's math path in every tree forward and max-autotune", sdpa="math",
                                       mode="max-autotune"),
    "default+flex-levels+max-autotune": Lever("FlexAttention in the draft levels and max-autotune",
                                              attention="flex-levels", mode="max-autotune"),
}


#: the lever whose runners ``captured.RUNNERS`` holds (phase sweep reuses them when it runs the same lever)
APPLIED: list[Lever | None] = [None]


def sdpa_backends() -> dict[str, bool]:
    """Which of SDPA's CUDA kernels it may take now (``torch.backends.cuda``'s switches; math is always allowed)."""
    cuda = torch.backends.cuda
    return {"cudnn": cuda.cudnn_sdp_enabled(), "flash": cuda.flash_sdp_enabled(),
            "efficient": cuda.mem_efficient_sdp_enabled()}


def set_sdpa_backends(enabled: dict[str, bool]) -> None:
    """Allow exactly SDPA's CUDA kernels ``enabled`` names (see :func:`sdpa_backends`)."""
    cuda = torch.backends.cuda
    cuda.enable_cudnn_sdp(enabled["cudnn"])
    cuda.enable_flash_sdp(enabled["flash"])
    cuda.enable_mem_efficient_sdp(enabled["efficient"])


@contextlib.contextmanager
def lever(setting: Lever):
    """The captured step with one lever (see :class:`Lever`). Runners are keyed by models, envelope and capacity,
    not by the compile settings, so the runners of another lever are dropped (a fresh compile); those of the same
    lever are kept (phase sweep after phase levels replays the last lever's graphs). A frozen lever compiles
    without inductor's graph cache, whose key does not hold the q/k/v rewrite (``fused_qkv.applied``)."""
    from treespec.core import captured

    names = ("CAPACITY_BUCKET", "CUDA_CAPACITY_BUCKET"), ("CUDA_GRAPHS_FREEZE", "CUDA_GRAPHS_ONE_QKV")
    saved = ([getattr(compiled, n) for n in names[0]], [getattr(compiling, n) for n in names[1]],
             captured.compile_options, sdpa_backends(), attention.TREE_ATTENTION)
    attention.TREE_ATTENTION = setting.attention
    for n in names[0]:
        setattr(compiled, n, setting.bucket)
    compiling.CUDA_GRAPHS_FREEZE, compiling.CUDA_GRAPHS_ONE_QKV = setting.freezing, setting.concat_qkv
    if setting.mode is not None:
        captured.compile_options = lambda c, device: (saved[2](c, device)[0], setting.mode)
    allowed = {"cudnn": setting.sdpa == "cudnn", "flash": setting.sdpa != "math", "efficient": setting.sdpa != "math"}
    set_sdpa_backends({k: saved[3][k] and allowed[k] for k in allowed})
    if APPLIED[0] != setting:
        captured.RUNNERS.clear()
        APPLIED[0] = setting
    try:
        with fused_qkv.uncached() if setting.freezing else contextlib.nullcontext():
            yield
    finally:
        for n, v in zip(names[0], saved[0]):
            setattr(compiled, n, v)
        for n, v in zip(names[1], saved[1]):
            setattr(compiling, n, v)
        captured.compile_options = saved[2]
        set_sdpa_backends(saved[3])
        attention.TREE_ATTENTION = saved[4]


def phase_levels(b: Bench) -> dict[str, Any]:
    """What each lever of ``LEVERS`` (or ``--levers``) does to a draft level, timed inside the captured step
    (the level's own graph, as a step replays it): a 4-level chain's drafting seconds per step over its 4
    levels, its verification, and its kernels per step (``torch.profiler``), one compile per lever. Saved after
    every lever; levers not started within ``--levels-seconds`` of the phase's start are skipped (and named)."""
    shape = for_budget("chain", 5)
    _, env = sweep_shapes(b, MeasuredAcceptance.load(ROOT / "treespec" / "data" / "acceptance-qwen2.5-coder-t0.json"))
    out: dict[str, Any] = {"shape": f"chain of 4 in the sweep's envelope ({env.describe()})",
                           "context": b.args.prompt_len,
                           "levers": {}, "skipped": []}
    start = time.perf_counter()
    for name in b.args.levers or LEVERS:
        setting = LEVERS[name]
        cuda_only = setting.mode == "max-autotune" or setting.sdpa == "efficient" or setting.attention != "sdpa"
        if (b.tiny or b.device.type != "cuda") and cuda_only:
            continue  # CUDA levers (on a CPU max-autotune times C++ templates for many minutes; inductor's CPU flex
            # template takes no mask computed inside the graph)
        if b.tiny and out["levers"]:
            break  # the smoke checks the phase's path: one lever (each compiles its own runner)
        if b.args.levels_seconds and time.perf_counter() - start > b.args.levels_seconds:
            out["skipped"].append(name)
            continue
        graphs = graphs_compiled()
        try:
            with lever(setting):
                run = treespec_run(b, b.model("target"), b.model("draft"), shape, b.compile, budget=env.nodes,
                                   envelope=env)
                table = kernel_table(lambda: treespec.generate(b.model("target"), b.prompts[0],
                                                               [treespec.ModelDrafter(b.model("draft"), shape)],
                                                               max_new_tokens=b.args.new_tokens, budget=env.nodes,
                                                               compile=b.compile, envelope=env), b.device)
        except Exception as e:  # a lever that does not compile or run is a finding: record it, go on to the next
            out["levers"][name] = {"error": f"{type(e).__name__}: {str(e)[:500]}", **dataclasses.asdict(setting)}
            print(f"  {name}: failed: {out['levers'][name]['error']}", flush=True)
            b.checkpoint("levels", out)
            continue
        sec = run["per_step_seconds"]
        out["levers"][name] = {"level_ms": sec["drafting"] / shape.depth * 1e3, "verify_ms": sec["verifying"] * 1e3,
                               "step_ms": run["step_seconds"] * 1e3, "first_call_seconds": run["first_call_seconds"],
                               "new_graphs": graphs_compiled() - graphs, "kernels_per_step": table["kernels_per_step"],
                               "device_us_per_step": table["device_us_per_step"], "top": table["top"],
                               **dataclasses.asdict(setting)}
        print(f"  {name}: {out['levers'][name]['level_ms']:.3f} ms per level", flush=True)
        b.checkpoint("levels", out)
    return out


# -- results: written after every phase -----------------------------------------------------------


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
                  "cached tokens)", "", "| lever | ms per level (measured) | verification ms | step ms | "
                  "kernels per step "
                  "| device us per step | first call s |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {k}: {v.get('what', '')} | {v['level_ms']:.3f} | {v['verify_ms']:.3f} | {v['step_ms']:.3f} | "
                  f"{_num(v.get('kernels_per_step'))} | {_num(v.get('device_us_per_step'))} | "
                  f"{v['first_call_seconds']:.0f} |" for k, v in lv["levers"].items() if "level_ms" in v]
        failed = {k: v["error"] for k, v in lv["levers"].items() if "error" in v}
        if failed:
            lines += ["", "Failed: " + "; ".join(f"{k}: `{e}`" for k, e in failed.items()) + "."]
        if lv.get("skipped"):
            lines += ["", "Not run (the phase's time was spent): " + "; ".join(lv["skipped"]) + "."]
        lines.append("")
    if ph.get("sweep"):
        lines += sweep_report(ph["sweep"], hf_fastest(ph))
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def sweep_report(sw: dict[str, Any], hf_c: float | None) -> list[str]:
    """The sweep phase's section of README.md."""
    lines = ["## Sweep: tree shapes x budgets on one set of compiled graphs", ""]
    if "lever" in sw:
        lines += [f"Every shape ran with the lever `{sw['lever']}` ({sw['lever_setting']}).", ""]
    if "step_costs" in sw:
        c = sw["step_costs"]
        lines += [f"Costs read off the swept steps (medians over the shapes): a draft level {c['level'] * 1e3:.2f} ms, "
                  f"a verification {c['verify'] * 1e3:.2f} ms, the engine {c['engine'] * 1e3:.2f} ms per step.", ""]
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
                  "are predictions for the real pair, not measurements.", ""]
    if sw.get("kernel_table"):
        k = sw["kernel_table"]
        lines += [f"Kernel table of the device-sized tree's step ({k['kernels_per_step']} kernels and "
                  f"{k['device_us_per_step']} us of device time per step):", "",
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="directory for results.json and README.md (resumed)")
    ap.add_argument("--phase", choices=(*PHASES, "all"), nargs="+", default=["all"],
                    help="which phases to run, in the protocol's order (default: all)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny models (CPU by default), dynamo's eager backend (whole graphs traced and replayed; the "
                         "suite's compiled-step tests check AOT and inductor): checks the script")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=32, help="tree budget of the treespec tok/s runs")
    ap.add_argument("--compiled-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128],
                    help="tree sizes whose compiled forward phase costs times (one compile each); 0: none")
    ap.add_argument("--no-eager", action="store_true", help="phase treespec: captured steps only")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--step-budgets", type=int, nargs="+", default=None,
                    help="budgets of the Sequoia trees whose captured steps phase treespec times (default: 16 32 64; "
                         "smoke: 8)")
    ap.add_argument("--max-depth", type=int, default=8, help="depth limit of those trees (the CLI's default)")
    ap.add_argument("--level-rows", type=int, default=4, help="rows of phase levels' draft level")
    ap.add_argument("--levers", nargs="+", default=None, choices=list(LEVERS), metavar="LEVER",
                    help="phase levels: these levers of LEVERS, in this order (default: all)")
    ap.add_argument("--levels-seconds", type=float, default=None,
                    help="phase levels: start no lever after this many seconds of the phase (the rest are named "
                         "as skipped)")
    ap.add_argument("--sweep-lever", default="default", metavar="LEVER",
                    help="phase sweep: run every shape with this lever of LEVERS (default: treespec's own settings; "
                         "'best': the "
                         "fastest level of phase levels' saved results)")
    ap.add_argument("--sweep-costs", choices=("steps", "dynamic"), default="steps",
                    help="phase sweep: the device's costs from the swept steps alone (default), or also the compiled "
                         "forwards timed alone (dynamic token counts: minutes of compiles on a GPU)")
    ap.add_argument("--sweep-families", nargs="+", default=None, help="phase sweep: only these of SWEEP_FAMILIES")
    ap.add_argument("--clock", choices=("events", "waits"), default="events",
                    help="how treespec's steps time their sections on CUDA: events (the default, no wait) or a wait "
                         "for the device at every section (treespec.core.step.Clock.device_events)")
    ap.add_argument("--trace", action="store_true",
                    help="phase sweep: chrome traces of the device-sized tree's short generate under each clock "
                         "(trace-waits.json.gz, trace-events.json.gz in --out)")
    ap.add_argument("--sweep-budgets", type=int, nargs="+", default=None,
                    help="budgets of phase sweep's tree families (default: 16 32; smoke: 8, three families)")
    args = ap.parse_args(argv)
    args.device = args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.smoke:
        # prompts under prefill.CHUNKED_MIN tokens prefill eagerly: phase costs compiles no prefill of its own
        # (phase first's longer prompts check the compiled prefill); short generations: the profiled ones (one
        # prompt's) cost seconds per step, and 8 tokens still give draft = target a whole uncut step
        args.prompts, args.prompt_len, args.new_tokens, args.budget, args.repeats = 3, 15, 8, 8, 2
        args.compiled_sizes = [1, 8]
    args.step_budgets = args.step_budgets or ([8] if args.smoke else [16, 32, 64])
    args.sweep_budgets = args.sweep_budgets or ([8] if args.smoke else [16, 32])
    if args.smoke and args.sweep_families is None:
        args.sweep_families = ["sequoia-d8", "chain", "kary-2"]
    args.compiled_sizes = [n for n in args.compiled_sizes if n > 0]
    out = Path(args.out)

    def checkpoint(phase: str, part: dict[str, Any]) -> None:
        """Record a phase's result (or finished part) and save it."""
        results["phases"][phase] = merged(phase, results["phases"].get(phase), part)
        save(out, results)

    from treespec.core.step import Clock
    Clock.device_events = args.clock == "events"
    b = Bench(args, checkpoint)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    results = {"setup": b.setup(), "phases": results.get("phases", {})}
    phases = {"first": phase_first, "costs": phase_costs, "hf": phase_hf, "treespec": phase_treespec,
              "validate": phase_validate, "predict": lambda bench: phase_predict(bench, results["phases"]),
              "sweep": lambda bench: phase_sweep(bench, results["phases"]), "levels": phase_levels}
    threads = torch.get_num_threads()
    if args.smoke:  # tiny models: a second thread only waits on the first (on a busy machine, many times over)
        torch.set_num_threads(1)
    try:
        for name in [p for p in PHASES if "all" in args.phase or p in args.phase]:
            t = time.perf_counter()
            print(f"phase {name} ...", flush=True)
            checkpoint(name, phases[name](b))
            results["phases"][name + "_seconds"] = time.perf_counter() - t
            results["phases"][name + "_settings"] = {k: results["setup"][k] for k in ("prompts", "prompt_len",
                                                                                        "new_tokens")}
            save(out, results)
            print(f"phase {name} done in {time.perf_counter() - t:.0f} s; written to {out}", flush=True)
    finally:
        torch.set_num_threads(threads)
    return results


if __name__ == "__main__":
    main()
