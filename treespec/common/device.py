"""The device a model runs on: waiting for its queued work."""

from __future__ import annotations

import torch


def default_device() -> str:
    """``cuda`` where this machine has a CUDA device, else ``cpu`` (the commands' default ``--device``)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: torch.device | str) -> torch.device:
    """``device`` as a ``torch.device``, refused with what to pass instead when it is not a device name or this
    machine has no such device (e.g. ``cuda`` under a CPU-only torch)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"not a torch device: {device!r} (e.g. cpu, cuda, cuda:1)") from None
    backend = getattr(torch, dev.type, None) if dev.type != "cpu" else None
    if backend is not None and hasattr(backend, "is_available") and hasattr(backend, "device_count"):
        if not backend.is_available():
            kind = {"cuda": "CUDA", "xpu": "XPU", "mps": "MPS"}.get(dev.type, dev.type)
            raise ValueError(f"device {str(dev)!r}: this machine has no {kind} device (torch {torch.__version__} "
                             "sees none); use cpu")
        if dev.index is not None and dev.index >= backend.device_count():
            raise ValueError(f"device {str(dev)!r} does not exist: this machine has {backend.device_count()} "
                             f"{dev.type} device(s), numbered from 0")
    return dev


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work, so that a wall-clock section measures what it claims (no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def execution_device(model: torch.nn.Module) -> torch.device:
    """Where a model's inputs go: its parameters' device, or, for a model dispatched over several
    devices by accelerate (``device_map``, as ``from_pretrained`` does), the execution device of its
    input embeddings (offloaded weights sit on ``meta`` until their layer runs)."""
    hook = getattr(model.get_input_embeddings(), "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    param = next(model.parameters())
    return param.device if param.device.type != "meta" else torch.device("cpu")


def dispatched(model: torch.nn.Module) -> bool:
    """Whether accelerate spread ``model`` over several devices (or offloaded part of it)."""
    device_map = getattr(model, "hf_device_map", None) or {}
    return len({str(d) for d in device_map.values()}) > 1 or any(d in ("disk", "meta") for d in device_map.values())
