"""The run's settings and models (:class:`Bench`), and the timed calls every phase makes: HF ``generate`` and
treespec's."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import torch
from transformers.generation import CompileConfig

import treespec
from treespec.common.device import sync
from treespec.common.machine import device_name
from treespec.core import compiling
from treespec.core.buffers import Envelope

from .models import COMMON, TINY_COMMON, build, weak_draft
from .profiling import launch_profile

ROOT = Path(__file__).resolve().parents[2]
#: the shipped HumanEval T=0 acceptance: the trees' per-depth rows and the predicted tau
ACCEPTANCE_T0 = ROOT / "treespec" / "data" / "acceptance-qwen2.5-coder-t0.json"
#: the protocol's phases, in the order they run
PHASES = ("first", "costs", "hf", "treespec", "validate", "predict", "levels", "sweep")
# the smoke's target: one layer (dynamo traces every layer of every graph; phase first on a device keeps TINY's)
SMOKE_TARGET_LAYERS = 1


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
    CUDA graphs run with; on a CPU HF's fastest already): the baselines' own method
    (``treespec.bench.compare.hf_compiled_method``), whose one reused ``StaticCache`` per model stays valid under
    freezing (HF's per-call cache would be folded into the first call's graphs). One warm-up call (it compiles),
    then every prompt timed."""
    from treespec.bench.compare import hf_compiled_method

    n = b.args.new_tokens
    model.generation_config.eos_token_id = None
    method = hf_compiled_method(model)
    method.run(b.prompts[0], n)  # warm-up (compiles)
    seconds = sum(method.run(p, n)[1] for p in b.prompts)
    return {"tokens": n * len(b.prompts), "seconds": seconds, "tok_s": n * len(b.prompts) / seconds}


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
           "accepted_hist": s.accepted_hist, "uncut_steps": len(kept), "outputs": [o.new_tokens for o in outs],
           "uncut_steps_committing_whole_chain": sum(k == depth + 1 for k in kept),
           # drafting includes the draft model's host loop: the engine's own share is overhead / step time
           "engine_share_of_step": s.overhead_seconds / max(models + s.overhead_seconds, 1e-12)}
    if profile:
        try:
            run["profile"] = launch_profile(lambda: one(b.prompts[0]), b.device)
        except Exception as e:  # the profiler is a measurement aid: its failure must not lose the run
            run["profile"] = {"error": f"{type(e).__name__}: {e}"}
    return run
