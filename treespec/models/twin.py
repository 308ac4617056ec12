"""Whether a quantised target's prompts run on its layers' bfloat16 twins or on their kernels: measured here.

An int4 target's layers keep bfloat16 twins of their own weights for a prompt's rows (``treespec.models.quantized``:
on the Zen 4 host, with AVX-512's bfloat16 products, the twins prefilled the built-in target's prompts in 2.26 s
against 3.21 s on the kernel). A CPU without bfloat16 arithmetic multiplies in bfloat16 slowly: on a Zen 3 host
(AVX2) the twins took 19.08 s over a prompt (the median of HumanEval 150-152, 85-225 tokens) and the kernels 7.90 s
(``experiments/int4_target_prefill.py --prefill-only``). So :func:`auto_twin` times a prompt-wide input
(``2 * PROMPT_ROWS`` rows) through the largest layer of each kernel the model's decoder holds (the LM head takes a
prompt's last row only), on its twin and on its kernel, and keeps the twins only where they are faster in sum (the
built-in target here, as ``load`` logs its decision: 179 ms on the twins, 48 ms on the kernels); cached like the
precision decisions (keyed by model, device, CPU model, threads and torch). What a prompt's forward multiplies with
is the same weights either way, up to bfloat16 rounding; a step never takes a twin.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ..common.files import read_json_dict, write_json
from ..common.machine import measurement_key, measured_name
from .quantized import PROMPT_ROWS, BFloat16Linear, KernelLinear, kernel_only, without_twins

#: the file under the treespec cache root where twin decisions are kept
TWIN_DECISIONS = "prompt-twin.json"
#: what ``load(..., prompt_twin=)`` takes: measure here, keep the twins, or run prompts on the kernels
TWIN_CHOICES = ("auto", "twin", "kernel")


def auto_twin(model: torch.nn.Module, *, name: str | None = None, decisions: str | os.PathLike | None = None,
              timer: Callable[[list[torch.nn.Module], bool], float] | None = None
              ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Keep ``model``'s bfloat16 twins where its prompts run faster on them here, else drop them (in place);
    returns ``(model, record)``. ``timer(layers, twins)``: seconds of a prompt-wide input through ``layers`` on
    their twins (``twins=True``) or their kernels (default :func:`prompt_seconds`). ``record``: ``prompt``
    (``"twin"`` or ``"kernel"``), ``seconds`` per choice, ``key``, ``cached`` and ``why``. With ``decisions`` (a JSON
    file) the choice is cached and read back."""
    layers = [m for m in model.modules() if isinstance(m, KernelLinear) and isinstance(m.wide, BFloat16Linear)]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    timed = [m for m in layers if m is not head]  # a prompt's logits are its last row's: the head takes one row
    if not layers:
        return model, {"prompt": "kernel", "seconds": {}, "cached": False, "why": "no bfloat16 twins"}
    key = twin_key(name or measured_name(model), next(model.parameters()).device)
    path = None if decisions is None else Path(decisions)
    record = cached_twin(key, path)
    if record is None:
        largest = {}  # the largest layer of each kernel (int4, int8): the last of its kind by size
        for layer in sorted(timed or layers, key=lambda m: m.in_features * m.out_features):
            largest[type(layer)] = layer
        timer = prompt_seconds if timer is None else timer
        seconds = {"twin": timer(list(largest.values()), True), "kernel": timer(list(largest.values()), False)}
        record = {"prompt": min(seconds, key=seconds.get), "seconds": seconds, "rows": 2 * PROMPT_ROWS, "key": key,
                  "why": "measured", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        if path is not None:
            write_json(path, {**read_json_dict(path), key: record}, sort_keys=True)
        record = {**record, "cached": False}
    return (model if record["prompt"] == "twin" else without_twins(model)), record


def twin_key(name: str, device: torch.device | str) -> str:
    """The key of a model's twin decision (``name``: what it was loaded by)."""
    return measurement_key("prompt-twin", name, device=device)


def cached_twin(key: str, decisions: str | os.PathLike | None) -> dict[str, Any] | None:
    """The decision cached under ``key`` in the file ``decisions`` (marked ``cached``), or None: ``load`` reads it
    before building a target's layers, to build no twins where its prompts run on the kernels."""
    record = None if decisions is None else read_json_dict(Path(decisions)).get(key)
    if isinstance(record, dict) and record.get("prompt") in ("twin", "kernel"):
        return {**record, "cached": True}
    return None


def prompt_seconds(layers: list[torch.nn.Module], twins: bool, repeats: int = 2) -> float:
    """Seconds (the fastest of ``repeats`` after one warm-up) of one input of ``2 * PROMPT_ROWS`` rows through each
    of ``layers``, summed: on their twins, or on their kernels."""
    total = 0.0
    for layer in layers:
        x = torch.randn(1, 2 * PROMPT_ROWS, layer.in_features, generator=torch.Generator().manual_seed(0))
        times = []
        with torch.inference_mode(), (contextlib.nullcontext() if twins else kernel_only(layer)):
            for _ in range(repeats + 1):
                start = time.perf_counter()
                layer(x)
                times.append(time.perf_counter() - start)
        total += min(times[1:])
    return total


def describe_twin(record: dict[str, Any]) -> str:
    """One line saying what a prompt runs on and the timings it was chosen on."""
    what = "bfloat16 twins of its weights" if record["prompt"] == "twin" else "the kernels (no twins kept)"
    if not record.get("seconds"):
        return f"prompts run {what} ({record.get('why', 'requested')})"
    timings = ", ".join(f"{k} {s * 1e3:.0f} ms" for k, s in record["seconds"].items())
    how = "cached measurement" if record.get("cached") else "measured now"
    return f"prompts run {what} ({how}; {record.get('rows')} rows through its largest layers: {timings})"
