"""What ``torch.profiler`` reads off a ``generate`` call (runtime calls per step, the kernel table), and the step
clock's two ways of timing its sections."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from treespec.common.device import sync

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


def compile_phase_seconds() -> dict[str, float]:
    """Seconds spent so far in this process in each of dynamo's timed compile phases (tracing, AOT, inductor's
    passes, lowering, code generation, kernel compiles, GEMM autotuning: ``torch._dynamo.utils.compile_times``,
    nested phases counted in their parents too); two readings' difference is where a first call's compile went."""
    from torch._dynamo.utils import compile_times

    names, seconds = compile_times(repr="csv", aggregate=True)
    return {name: float(s) for name, s in zip(names, seconds)}


def compile_phases_between(before: dict[str, float], after: dict[str, float], least: float = 1.0
                           ) -> dict[str, float]:
    """The compile phases that took at least ``least`` seconds between two :func:`compile_phase_seconds`
    readings, longest first."""
    grown = {name: s - before.get(name, 0.0) for name, s in after.items()}
    return {name: round(s, 1) for name, s in sorted(grown.items(), key=lambda kv: -kv[1]) if s >= least}


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


@contextlib.contextmanager
def clock_events(on: bool):
    """treespec's step sections timed by CUDA events (``on``) or by a wait per section, for the block."""
    from treespec.core.step import Clock

    saved, Clock.device_events = Clock.device_events, on
    try:
        yield
    finally:
        Clock.device_events = saved
