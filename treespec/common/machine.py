"""What a measurement was made on, in one place: the machine, the model, treespec's version.

Timings and the decisions cached from them (precision, tree costs, sweep baselines) are only valid
on the machine that measured them: a cloud VM can come back on a CPU generation 1.7x faster under
the same bare name ("AMD EPYC"), so the CPU is named with its family, model and stepping numbers.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path

import torch


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name with its family, model and stepping numbers ("AMD EPYC (family 26, model 2,
    stepping 1)"), read from ``/proc/cpuinfo`` (or the text given); ``platform.processor()`` elsewhere.
    Virtual machines often show a bare "AMD EPYC": the numbers tell two CPU generations apart."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return platform.processor() or platform.machine() or "cpu"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine() or "cpu"
    numbers = ", ".join(f"{label} {fields[key]}" for key, label in
                        (("cpu family", "family"), ("model", "model"), ("stepping", "stepping")) if key in fields)
    return f"{name} ({numbers})" if numbers else name


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU model (:func:`cpu_model`)."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


def machine(device: torch.device | str) -> str:
    """What a timing was measured on: the GPU's name, or the CPU model and core count. Timings made
    on different machines are never compared (a host swap can change speed by 1.7x)."""
    name = device_name(device)
    return name if torch.device(device).type == "cuda" else f"{name}, {os.cpu_count()} cores"


def measurement_key(*parts: str, device: torch.device | str) -> str:
    """The key of a cached measurement: ``parts`` (what was measured), then everything a timing
    depends on besides them: device, its name, torch's thread count and torch's version."""
    device = torch.device(device)
    return "|".join([*parts, str(device), device_name(device), f"threads={torch.get_num_threads()}",
                     f"torch={torch.__version__}"])


def model_name(model: torch.nn.Module) -> str:
    """A model's name: the id or path it was loaded from, else its architecture."""
    config = model.config
    return getattr(config, "_name_or_path", "") or config.model_type


def measured_name(model: torch.nn.Module) -> str:
    """What a cached measurement names a model by: the id or path it was loaded from; a model built in-process (no
    path) by its architecture, a digest of its config and a sample of its weights (its name, the architecture alone,
    let two models of one family share measurements: a larger one read a small one's profile)."""
    name = getattr(model.config, "_name_or_path", "")
    if name:
        return name
    digest = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    for p in model.parameters():
        digest.update(str(tuple(p.shape)).encode())
        if p.device.type != "meta":  # a model laid out without weights (a test's stand-in device) has no data
            digest.update(p.detach().reshape(-1)[:64].float().cpu().numpy().tobytes())
    return f"{model.config.model_type}@{digest.hexdigest()[:12]}"


def version() -> str:
    """treespec's installed version ("unknown" in a source checkout that was not installed)."""
    try:
        return importlib.metadata.version("treespec")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "unknown"


def available_memory(meminfo: str | os.PathLike = "/proc/meminfo") -> int | None:
    """Bytes of memory this machine can give a new allocation without swapping (Linux's ``MemAvailable``: free
    memory and the page cache it can reclaim), else free physical pages; None where neither can be read."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
