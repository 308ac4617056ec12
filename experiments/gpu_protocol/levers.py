"""The draft level's levers (settings of the captured step) and phase levels, which times each."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any

import torch

import treespec
from tree_builders.budgeted import for_budget
from treespec.calibrate.acceptance import MeasuredAcceptance
from treespec.core import attention, captured_runner, compiled, compiling, fused_qkv
from treespec.core.compiling import graphs_compiled
from treespec.core.runners import RunnerCache

from .bench import ACCEPTANCE_T0, Bench, treespec_run
from .profiling import compile_phase_seconds, compile_phases_between, kernel_table
from .shapes import sweep_shapes
from . import split_k


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
    attention: str = "sdpa"  # the tree forwards' ("flex", "flex-levels", "matmul"): attention.TREE_ATTENTION
    # Triton GEMM templates autotuned against cuBLAS's in the draft level's graph alone (inductor's
    # max_autotune_gemm while that graph compiles: no split-K reduction kernel where a template wins); unlike mode
    # max-autotune it keeps freezing and CUDA graphs, and autotunes no other graph (less to compile)
    gemm_autotune: bool = False
    # with gemm_autotune, inductor settings for the level's graph alone: ``decompose_k`` (inductor's decompose_k
    # threshold: a product whose K is at least this many times its M and N also tries K split into a batched
    # product and a sum, a split-K of Triton's own; 0: inductor's default, 32, which the level's down projection
    # (K 4864, N 896) misses) and ``pdl`` (programmatic dependent launch on Hopper: a Triton kernel other than a
    # GEMM template starts before the one it follows ends, and waits on the device where it reads that one's
    # output)
    decompose_k: int = 0
    pdl: bool = False
    # the draft's products of these roles (``split_k.ROLES``) as split-K sums of that many pieces in the level's
    # graph (``split_k.SplitK``: the sum joins the kernels that read it), e.g. (("down", 8),)
    split_k: tuple[tuple[str, int], ...] = ()

    def level_settings(self, draft: torch.nn.Module | None = None) -> dict[str, Any]:
        """The inductor settings the draft level's graph alone compiles under (``compile_level_with``; none: the
        level compiles as the runner's other graphs); a split-K lever's are for ``draft``'s products."""
        settings: dict[str, Any] = {"max_autotune_gemm": True} if self.gemm_autotune else {}
        if self.decompose_k:
            settings["triton.decompose_k_threshold"] = self.decompose_k
        if self.pdl:
            settings["triton.enable_pdl"] = True
        if self.split_k:
            if draft is None:
                raise ValueError(f"lever {self.what!r} splits the draft's products: pass the draft")
            settings.update(split_k.settings(split_k.SplitK(split_k.shapes_of(draft.config, dict(self.split_k)))))
        return settings

    def __post_init__(self) -> None:
        if (self.decompose_k or self.pdl) and not self.gemm_autotune:
            raise ValueError(f"lever {self.what!r}: decompose_k and pdl are settings of the level's autotuned GEMMs "
                             "(decompose_k a choice autotuning ranks); set gemm_autotune=True")
        # inductor freezes only without a mode or under reduce-overhead (compiling.graph_settings): a lever that
        # claims freezing under another mode would be timed unfrozen and reported as frozen
        if self.freezing and self.mode not in (None, "reduce-overhead"):
            raise ValueError(f"lever {self.what!r}: mode {self.mode!r} compiles without freezing; set freezing=False, "
                             "or keep the mode and autotune GEMMs with gemm_autotune=True")


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
    "default+math": Lever("treespec's CUDA defaults, SDPA's math path in every tree forward (reducing in bfloat16): "
                          "the level's attention (its rows over the cache's) as two small batched products and one "
                          "fused masked softmax instead of cuDNN's call and the memset before it", sdpa="math"),
    "default+gemm-autotune": Lever("treespec's CUDA defaults, the draft level's GEMMs autotuned (Triton templates: no "
                                   "split-K reduction where one wins)", gemm_autotune=True),
    "default+matmul": Lever("treespec's CUDA defaults, the tree forwards' attention written out (attention."
                            "grouped_matmul): the scaled queries times the keys read in place (SDPA's math path "
                            "scales and so copies the whole cache's keys per layer), a float32 softmax, the values",
                            attention="matmul"),
    # the attention levers with the level's GEMMs autotuned: a device call times the pair whose attention won
    "default+math+gemm-autotune": Lever("SDPA's math path in every tree forward, the level's GEMMs autotuned",
                                        sdpa="math", gemm_autotune=True),
    "default+flex+gemm-autotune": Lever("FlexAttention in every tree forward, the level's GEMMs autotuned",
                                        attention="flex", gemm_autotune=True),
    "default+flex-levels+gemm-autotune": Lever("FlexAttention in the draft levels, the level's GEMMs autotuned",
                                               attention="flex-levels", gemm_autotune=True),
    "default+matmul+gemm-autotune": Lever("the attention written out, the level's GEMMs autotuned", attention="matmul",
                                          gemm_autotune=True),
    # the H200's trace of that lever (2026-11-30): the down projection's Triton template (no split-K: 28 blocks of
    # 32 columns for 132 SMs) took 12.8 us a layer, against cuBLAS's split-K 5.6 us + 1.7 us reduction before
    "default+matmul+gemm-autotune+split-k": Lever(
        "the attention written out, the level's GEMMs autotuned with inductor's split-K (decompose_k) among the "
        "choices of the down projection", attention="matmul", gemm_autotune=True, decompose_k=5),
    "default+matmul+gemm-autotune+split-k+pdl": Lever(
        "as +split-k, and the level's Triton kernels launched with programmatic dependent launch",
        attention="matmul", gemm_autotune=True, decompose_k=5, pdl=True),
    # the split written into the level's graph instead (nothing autotuned: the same kernels on every machine); its
    # sum unrolled into the kernels that read it, so cuBLAS's reduction kernel and the gap before it go
    "default+matmul+split-k": Lever(
        "the attention written out, the draft's down projection as a sum of 8 products over slices of its input "
        "(one batched product; the sum inside the next kernel)", attention="matmul", split_k=(("down", 8),)),
    "default+matmul+split-k+o+qkv": Lever(
        "as default+matmul+split-k, and the o projection and q/k/v's one product as sums of 8 (896 = 8 x 112 "
        "input columns)", attention="matmul", split_k=(("down", 8), ("o", 8), ("qkv", 8))),
}


#: the lever whose runners ``captured.RUNNERS`` holds (phase sweep reuses them when it runs the same lever)
APPLIED: list[Lever | None] = [None]
#: each lever's runners once another lever took over: entering it again restores them (``--sweep-lever best`` after
#: phase levels replays the winner's graphs, whichever lever ran last, instead of compiling them all again)
KEPT: dict[Lever, Any] = {}


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


def compile_level_with(fn, backend, mode, models=(), *, settings: dict[str, Any]):
    """``compiling.compile_graph``, whose draft-level graph (``CapturedRunner._level``) compiles under inductor's
    ``settings`` (:meth:`Lever.level_settings`: its GEMMs autotuned, split-K, ...; read while inductor compiles); the
    runner's other graphs as ``compile_graph`` makes them. The settings are switched on around the level's calls
    until one compiles nothing (switching them costs the host time on every call, which a replay should not
    carry)."""
    call = compiling.compile_graph(fn, backend, mode, models)
    if getattr(fn, "__func__", None) is not captured_runner.CapturedRunner._level:
        return call
    compiling_yet = [True]

    @functools.wraps(call)
    def level(*args, **kwargs):
        if not compiling_yet[0]:
            return call(*args, **kwargs)
        graphs = graphs_compiled()
        with torch._inductor.config.patch(settings):
            out = call(*args, **kwargs)
        compiling_yet[0] = graphs_compiled() > graphs
        return out

    return level


@contextlib.contextmanager
def lever(setting: Lever, draft: torch.nn.Module | None = None):
    """The captured step with one lever (see :class:`Lever`). Runners are keyed by models, envelope and capacity,
    not by the compile settings, so each lever has runners of its own: entering a lever sets the others' aside
    (:data:`KEPT`) and restores its own, so phase sweep after phase levels replays any lever's graphs. A frozen
    lever compiles without inductor's graph cache, whose key does not hold the q/k/v rewrite
    (``fused_qkv.applied``). Yields the level's settings (a split-K lever's pass counts what it took), which a
    split-K lever makes for ``draft``'s products."""
    from treespec.core import captured

    level_settings = setting.level_settings(draft)

    names = ("CAPACITY_BUCKET", "CUDA_CAPACITY_BUCKET"), ("CUDA_GRAPHS_FREEZE", "CUDA_GRAPHS_ONE_QKV")
    saved = ([getattr(compiled, n) for n in names[0]], [getattr(compiling, n) for n in names[1]],
             captured.compile_options, sdpa_backends(), attention.TREE_ATTENTION)
    attention.TREE_ATTENTION = setting.attention
    for n in names[0]:
        setattr(compiled, n, setting.bucket)
    compiling.CUDA_GRAPHS_FREEZE, compiling.CUDA_GRAPHS_ONE_QKV = setting.freezing, setting.concat_qkv
    if setting.mode is not None:
        captured.compile_options = lambda c, device: (saved[2](c, device)[0], setting.mode)
    if level_settings:  # the runners made inside the lever keep their level graph
        captured_runner.compile_graph = functools.partial(compile_level_with, settings=level_settings)
    allowed = {"cudnn": setting.sdpa == "cudnn", "flash": setting.sdpa != "math", "efficient": setting.sdpa != "math"}
    set_sdpa_backends({k: saved[3][k] and allowed[k] for k in allowed})
    # SDPA's math path takes bfloat16 inputs to float32 (three casts and float32 products per layer) unless told
    # to reduce in their own precision: the lever is about the kernel, not the precision
    math_reduction = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(setting.sdpa == "math" or math_reduction)
    if APPLIED[0] != setting:
        if APPLIED[0] is not None:  # the leaving lever's runners kept, the entering one's restored (or none)
            KEPT[APPLIED[0]] = captured.RUNNERS
        captured.RUNNERS = KEPT.pop(setting, None) or RunnerCache(captured.RUNNERS.limit)
        APPLIED[0] = setting
    try:
        with fused_qkv.uncached() if setting.freezing else contextlib.nullcontext():
            yield level_settings
    finally:
        for n, v in zip(names[0], saved[0]):
            setattr(compiled, n, v)
        for n, v in zip(names[1], saved[1]):
            setattr(compiling, n, v)
        captured.compile_options = saved[2]
        captured_runner.compile_graph = compiling.compile_graph
        set_sdpa_backends(saved[3])
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(math_reduction)
        attention.TREE_ATTENTION = saved[4]


def phase_levels(b: Bench) -> dict[str, Any]:
    """What each lever of ``LEVERS`` (or ``--levers``) does to a draft level, timed inside the captured step
    (the level's own graph, as a step replays it): a level's marginal seconds (an 8-level chain's drafting per
    step less a 4-level chain's, over the 4 levels between: what one more level costs, without the drafting a step
    does whatever its depth), the 4-level chain's drafting per forward (``level_ms_per_forward``, what this phase
    reported before), its verification, and its kernels per step (``torch.profiler``), one compile per lever (the
    two chains share the envelope's graphs). Saved after
    every lever; a lever is started only if the phase, with the slowest first call of a lever so far, ends within
    ``--levels-seconds`` (the others are skipped, and named). Each lever records its CUDA graph skips (a lever
    that runs without CUDA graphs is host-bound, not slow in its kernels) and how many of its tokens agree with
    the first lever's (a lever fast because it computes something else would show)."""
    _, env = sweep_shapes(b, MeasuredAcceptance.load(ACCEPTANCE_T0))
    # the deeper chain as deep as the envelope lets it, up to 8 levels (the sweep's: 8; the smoke's: 7)
    shape, deeper = for_budget("chain", 5), for_budget("chain", min(env.depth, 8) + 1)
    if deeper.depth <= shape.depth:
        raise SystemExit(f"phase levels needs an envelope deeper than 4 levels, this one has {env.depth}")
    out: dict[str, Any] = {"shape": f"chain of 4 in the sweep's envelope ({env.describe()})",
                           "context": b.args.prompt_len,
                           "levers": {}, "skipped": []}
    start, slowest_first, reference = time.perf_counter(), 0.0, None
    for name in b.args.levers or LEVERS:
        setting = LEVERS[name]
        cuda_only = (setting.mode == "max-autotune" or setting.gemm_autotune or setting.sdpa == "efficient"
                     or setting.attention.startswith("flex"))
        if (b.tiny or b.device.type != "cuda") and cuda_only:
            # CUDA levers (on a CPU max-autotune times C++ templates for many minutes; inductor's CPU flex template
            # takes no mask computed inside the graph): named, so that a rehearsal here says why it timed nothing
            out.setdefault("cuda_only", []).append(name)
            print(f"  {name}: a CUDA lever, not run on {'the smoke' if b.tiny else b.device.type}", flush=True)
            continue
        if b.tiny and out["levers"]:
            break  # the smoke checks the phase's path: one lever (each compiles its own runner)
        if b.args.levels_seconds and time.perf_counter() - start + slowest_first > b.args.levels_seconds:
            out["skipped"].append(name)
            continue
        graphs, skips, phases = graphs_compiled(), cudagraph_skips(), compile_phase_seconds()
        try:
            with lever(setting, b.model("draft")) as level:
                run, run_deeper = (treespec_run(b, b.model("target"), b.model("draft"), s, b.compile, budget=env.nodes,
                                                envelope=env) for s in (shape, deeper))
            split = level.get("post_grad_custom_pre_pass")  # inductor's pass (the smoke's eager backend runs none)
            if split is not None and not split.taken and b.backend == "inductor":
                raise RuntimeError(f"the split-K pass took none of the level's products {sorted(split.splits)}")
        except Exception as e:  # a lever that does not compile or run is a finding: record it, go on to the next
            out["levers"][name] = {"error": f"{type(e).__name__}: {str(e)[:500]}", **dataclasses.asdict(setting)}
            print(f"  {name}: failed: {out['levers'][name]['error']}", flush=True)
            b.checkpoint("levels", out)
            continue
        slowest_first = max(slowest_first, run["first_call_seconds"])
        reference = reference or run["outputs"]
        sec, drafting_deeper = run["per_step_seconds"], run_deeper["per_step_seconds"]["drafting"]
        marginal = (drafting_deeper - sec["drafting"]) / (deeper.depth - shape.depth)
        out["levers"][name] = {"level_ms": marginal * 1e3, "level_ms_per_forward": sec["drafting"] / shape.depth * 1e3,
                               "drafting_fixed_ms": (sec["drafting"] - marginal * shape.depth) * 1e3,
                               "verify_ms": sec["verifying"] * 1e3,
                               "step_ms": run["step_seconds"] * 1e3, "first_call_seconds": run["first_call_seconds"],
                               "new_graphs": graphs_compiled() - graphs, "cudagraph_skips": cudagraph_skips() - skips,
                               # where the first call's compile went (a lever's is minutes on a cold GPU machine)
                               "compile_phases_s": compile_phases_between(phases, compile_phase_seconds()),
                               "tokens_agreeing_with_first_lever": agreement(run["outputs"], reference),
                               # the products the split-K pass rewrote in the level's graph (the real draft: 24 a role)
                               **({"split_k_products": split.taken} if split is not None else {}),
                               **dataclasses.asdict(setting)}
        try:  # the kernels of one step: a measurement aid, whose failure keeps the lever's timing
            with lever(setting, b.model("draft")):
                table = kernel_table(lambda: treespec.generate(b.model("target"), b.prompts[0],
                                                               [treespec.ModelDrafter(b.model("draft"), shape)],
                                                               max_new_tokens=b.args.new_tokens, budget=env.nodes,
                                                               compile=b.compile, envelope=env), b.device)
            out["levers"][name].update(kernels_per_step=table["kernels_per_step"],
                                       device_us_per_step=table["device_us_per_step"], top=table["top"])
        except Exception as e:
            out["levers"][name]["kernel_table_error"] = f"{type(e).__name__}: {str(e)[:500]}"
        timed = out["levers"][name]
        print(f"  {name}: {timed['level_ms']:.3f} ms per level (marginal), {timed['level_ms_per_forward']:.3f} ms "
              "per forward of the 4-level chain", flush=True)
        longest = list(timed["compile_phases_s"].items())[:6]
        print("  its compile's longest phases (s): "
              + (", ".join(f"{k} {v}" for k, v in longest) or "none of a second or more"), flush=True)
        b.checkpoint("levels", out)
    return out


def cudagraph_skips() -> int:
    """How many times inductor has run a graph without CUDA graphs in this process (its counter)."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> float:
    """The share of ``reference``'s tokens that ``outputs`` repeats up to its first difference, prompt by prompt (1:
    the same tokens; bfloat16 near-ties may part two exact runs late)."""
    def same(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return sum(same(o, r) for o, r in zip(outputs, reference)) / max(sum(map(len, reference)), 1)
