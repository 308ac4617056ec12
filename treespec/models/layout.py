"""Choosing a model's ``nn.Linear`` layout for treespec's forwards by measuring both here.

``treespec.core.linear_layout`` runs a model's float ``nn.Linear`` layers as ``x @ W.T`` (stock) or as
``(W @ x.T).T`` (weight-first) inside treespec's forwards. Which is faster depends on the CPU and its BLAS, not
on anything a flag says: :func:`auto_layout` times one tree forward in each at the sizes ``auto`` precision times
(``precision.AUTO_SIZES``) and keeps the faster, cached like the precision decisions (keyed by model, precision,
role, device, CPU model, threads and torch). On CUDA (cuBLAS picks its own kernel for either form) and for models
without float ``nn.Linear`` layers (int8, int4) nothing is timed and the layout stays stock.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..common.files import read_json_dict, write_json
from ..common.machine import measurement_key, measured_name
from ..core.linear_layout import LAYOUTS, STOCK, set_layout, switchable
from .precision import AUTO_SIZES, ROLES, default_timer, precision_of

#: the file under the treespec cache root where layout decisions are kept
LAYOUT_DECISIONS = "linear-layout.json"


def auto_layout(model: torch.nn.Module, role: str = "target", *, name: str | None = None,
                decisions: str | os.PathLike | None = None,
                timer: Callable[[torch.nn.Module, tuple[int, ...]], float] | None = None
                ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Mark ``model`` with the ``nn.Linear`` layout its tree forwards run fastest in here; returns
    ``(model, record)``.

    Each layout of ``linear_layout.LAYOUTS`` is timed with ``timer(model, AUTO_SIZES[role])`` (default
    ``precision.default_timer``: a forward of each size after 128 cached tokens, through treespec's own forward);
    the faster is kept. ``record``: ``layout``, ``seconds`` per layout (empty when nothing was timed), ``sizes``,
    ``key``, ``cached`` and ``why``. With ``decisions`` (a JSON file) the choice is cached and read back."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    device = next(model.parameters()).device
    sizes = AUTO_SIZES[role]
    if device.type != "cpu" or not switchable(model):
        why = "not a CPU" if device.type != "cpu" else "no float nn.Linear layers"
        return set_layout(model, STOCK), {"layout": STOCK, "seconds": {}, "sizes": list(sizes), "cached": False,
                                          "why": why}
    key = measurement_key("linear-layout", name or measured_name(model), precision_of(model), role, device=device)
    path = None if decisions is None else Path(decisions)
    if path is not None:
        record = read_json_dict(path).get(key)
        if isinstance(record, dict) and record.get("layout") in LAYOUTS:
            return set_layout(model, record["layout"]), {**record, "cached": True}
    timer = default_timer if timer is None else timer
    seconds: dict[str, float] = {}
    for layout in LAYOUTS:
        seconds[layout] = timer(set_layout(model, layout), sizes)
    best = min(seconds, key=seconds.get)
    record = {"layout": best, "seconds": seconds, "sizes": list(sizes), "key": key, "why": "measured",
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if path is not None:
        write_json(path, {**read_json_dict(path), key: record}, sort_keys=True)
    return set_layout(model, best), {**record, "cached": False}


def describe_layout(record: dict[str, Any], model: torch.nn.Module | None = None) -> str:
    """One line saying which layout was kept and on what timings (and, given the ``model``, that its Conv1D
    layers, GPT-2's products, keep their own: the layout switches ``nn.Linear`` ones only)."""
    from transformers.pytorch_utils import Conv1D

    conv1d = 0 if model is None else sum(isinstance(m, Conv1D) for m in model.modules())
    others = f"; {conv1d} Conv1D layers keep their own" if conv1d else ""
    if not record.get("seconds"):
        return f"{record['layout']} ({record.get('why', 'not measured')}{others})"
    timings = ", ".join(f"{layout} {s * 1e3:.0f} ms" for layout, s in record["seconds"].items())
    how = "cached measurement" if record.get("cached") else "measured now"
    return f"{record['layout']} ({how}; forward over {record.get('sizes')} tokens: {timings}{others})"
