"""Model precision: name a precision, convert a float32 model to it, and pick the fastest one here.

Five precisions: ``float32``, ``bfloat16``, ``float16``, ``int8`` and ``int4``. ``int8`` is weight
int8 with dynamic (per-token-batch) activation quantisation of every ``nn.Linear``, the LM head
included, through ``torch.ao.quantization.quantize_dynamic`` with per-channel weight scales (fbgemm
kernels, CPU only); embeddings, norms and attention stay float32. ``int4`` is weight-only,
group-wise 4-bit (``treespec.models.quantized``: torch's int4 CPU kernel, which ``torch.compile`` can
trace, unlike ``torch.ao``'s packed int8 weights). Both are meant for draft models: a quantised
draft is still an exact drafter, its proposals are point masses or draws from its own ``q``.

Why ``torch.ao`` and not ``torchao``: torchao 0.18 installs for torch 2.13, but in eager mode on
this project's CPU its ``Int8DynamicActivationInt8WeightConfig`` ran a 896x4864 + 4864x896 Linear
pair 30x slower than ``quantize_dynamic`` (4.0 vs 0.13 ms for 1 token, 3.9 vs 0.58 ms for 16;
slower than float32, 3.0 / 5.7 ms): its CPU path dequantises and needs ``torch.compile`` to fuse.
Compiled as the captured step compiles its draft, torchao's int8 (weight-only, or with int8
activations) runs a one-token level of the 0.5B draft at 38-46 ms against 22 ms for ``int4``
(``experiments/results/draft-level-torchao-cpu.md``), so the compiled draft is ``int4`` here too.

``auto_precision`` times one forward at a representative size in each candidate precision and
keeps the fastest: precision is a measured property of the machine, not of its CPU flags.
"""

from __future__ import annotations

import copy
import datetime
import os
from pathlib import Path
from typing import Any, Callable

import torch

from ..common.files import read_json_dict, write_json
from ..common.machine import measurement_key, measured_name
from ..common.options import PRECISIONS
from ..core.checks import has_dynamic_int8
from .quantized import Int8Linear, KernelLinear, has_int4, quantize_int4, quantize_int8

ROLES = ("target", "draft")
#: precisions ``auto`` times, per role: int8 and int4 only for drafts (a quantised target changes the output)
AUTO_CANDIDATES = {"target": ("float32", "bfloat16"), "draft": ("float32", "bfloat16", "int8", "int4")}
#: the precisions that run on the CPU only
CPU_ONLY = ("int8", "int4")
#: precisions ``torch.compile`` cannot trace (``auto`` for a compiled step leaves them out)
UNTRACEABLE = ("int8",)
#: tree sizes ``auto`` times (seconds summed): a decode token plus a verification tree / draft level
AUTO_SIZES = {"target": (1, 16), "draft": (1, 4)}
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16",
            "qint8": "int8", "qint4": "int4"}


def parse_precision(dtype: str | torch.dtype) -> str:
    """``dtype`` as one of ``PRECISIONS`` or ``"auto"`` (a ``torch.dtype`` or a name such as ``"bf16"``)."""
    if isinstance(dtype, torch.dtype):
        for name, value in _TORCH_DTYPES.items():
            if dtype == value:
                return name
        raise ValueError(f"dtype {dtype} is not supported; use one of {', '.join(PRECISIONS)} or 'auto'")
    if isinstance(dtype, str):
        name = dtype.strip().lower().removeprefix("torch.")
        name = _ALIASES.get(name, name)
        if name in PRECISIONS or name == "auto":
            return name
    raise ValueError(f"unknown dtype {dtype!r}: use 'auto' (measure and keep the fastest), "
                     f"{', '.join(repr(p) for p in PRECISIONS)}, or a torch.dtype")


def torch_dtype(precision: str) -> torch.dtype:
    """The dtype a model of ``precision`` is loaded in before conversion (float32 for int8 and int4)."""
    return _TORCH_DTYPES.get(precision, torch.float32)


def precision_of(model: torch.nn.Module) -> str:
    """The precision of a model: ``int8`` / ``int4`` if its Linear layers are quantised, else its dtype."""
    if has_dynamic_int8(model):
        return "int8"
    if has_int4(model):
        return "int4"
    dtype = next(model.parameters()).dtype
    return parse_precision(dtype) if dtype in _TORCH_DTYPES.values() else str(dtype).removeprefix("torch.")


def kernel_tags(*models: torch.nn.Module) -> list[str]:
    """What a cached timing of these models depends on besides their precision and layout: ``"rest=int8"`` for a
    model whose layers outside the int4 kernel run int8 (a GGUF target's Q6_K tensors since they left bfloat16:
    ``gguf_blocks.with_file_blocks``), so timings of the earlier loading are not read back for it; ``"twins=none"``
    for a model whose quantised layers keep no twin (an int4 target whose prompts run on its kernels,
    ``treespec.models.twin``): its forwards of ``quantized.PROMPT_ROWS`` rows or more (a tree of 32 tokens or more)
    run on the kernels, and a timing of the same model with its twins is not read back for it."""
    tags = []
    for model in models:
        layers = [m for m in model.modules() if isinstance(m, KernelLinear)]
        tags += ["rest=int8"] if any(isinstance(m, Int8Linear) for m in layers) else []
        tags += ["twins=none"] if layers and all(m.wide is None for m in layers) else []
    return tags


def float32_bytes(model: torch.nn.Module) -> int:
    """About the bytes ``model`` holds in float32: its parameters, and each quantised Linear layer's weight and bias
    counted as the float32 tensors they were made from (a quantised LM head tied to the embeddings counted apart:
    an upper bound)."""
    quantised = [m for m in model.modules()
                 if isinstance(m, (KernelLinear, torch.ao.nn.quantized.dynamic.Linear))]
    elements = sum(p.numel() for p in model.parameters() if p.is_floating_point())
    # torch.ao's layer gives its bias by a call, a kernel layer keeps it as a buffer
    biases = [m.bias() if callable(m.bias) else m.bias for m in quantised]
    elements += sum(m.in_features * m.out_features + (b.numel() if b is not None else 0)
                    for m, b in zip(quantised, biases))
    return 4 * elements


def to_precision(model: torch.nn.Module, precision: str, twin: str | None = "int8") -> torch.nn.Module:
    """``model`` (float32, or already in ``precision``) converted to ``precision`` in place (``twin``: what int4
    layers run a prompt on: ``"int8"`` for a draft, ``"bfloat16"`` (their own weights) for a target;
    ``quantized.quantize_int4``)."""
    precision = parse_precision(precision)
    if precision == "auto":
        raise ValueError("to_precision needs a concrete precision; use auto_precision to choose one")
    if precision_of(model) == precision:
        return model
    left = fused_weights(model) if precision in ("int8", "int4") else []
    if left:
        raise ValueError(f"{precision} quantises Linear layers, and this model keeps {len(left)} weights outside them "
                         f"({left[0]}, ...: a mixture of experts' fused expert weights) that would stay in float32 "
                         "while the model were called int8/int4: load it in bfloat16 or float32")
    if precision == "int8":
        return quantize_int8(model)
    if precision == "int4":
        quantize_int4(model, twin=twin)
        if not has_int4(model):  # every layer kept its float32 weights: the model would run, called int4, in float32
            raise ValueError("int4: no Linear layer of this model fits the int4 kernel (it needs output sizes a "
                             "multiple of 16 and input sizes a multiple of 32); load it in float32 or bfloat16, or "
                             "int8")
        return model
    return _cast(model, _TORCH_DTYPES[precision])


def fused_weights(model: torch.nn.Module) -> list[str]:
    """Names of the weights int8 and int4 would leave in float32: parameters of three or more dimensions (a mixture
    of experts' fused expert weights in transformers 5: Mixtral's, Qwen3-MoE's), which are no Linear layer."""
    return [name for name, p in model.named_parameters() if p.ndim >= 3]


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model``'s parameters and saved buffers in ``dtype``; the float buffers a checkpoint does not hold (RoPE's
    ``inv_freq``, computed at construction) stay as they were, as HF's ``from_pretrained(dtype=...)`` leaves them.
    ``model.to(dtype)`` would round the rotary frequencies to bfloat16 too: another model than the one a user
    loads in bfloat16 (on the built-in 1.5B target, greedy continuations part within a few tokens)."""
    kept = [(m, name, b) for m in model.modules() for name, b in m._buffers.items()
            if b is not None and b.is_floating_point() and name in m._non_persistent_buffers_set]
    model.to(dtype)
    for m, name, b in kept:
        m._buffers[name] = b
    return model


def default_timer(model: torch.nn.Module, sizes: tuple[int, ...]) -> float:
    """Seconds of one tree forward of each size in ``sizes`` after a 128-token context, summed."""
    from .timing import measure_latency  # timing does not import this module: no circle

    return float(sum(measure_latency(model, sizes, context=128, repeats=3).values()))


def auto_precision(model: torch.nn.Module, role: str = "target", *, name: str | None = None,
                   decisions: str | os.PathLike | None = None,
                   timer: Callable[[torch.nn.Module, tuple[int, ...]], float] | None = None,
                   traceable: bool = False) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Convert a float32 ``model`` to the precision that runs fastest here; returns ``(model, record)``.

    Each candidate of ``AUTO_CANDIDATES[role]`` is timed with ``timer(model,
    AUTO_SIZES[role])`` (default :func:`default_timer`) on its own copy (int8 and int4 on CPU only); the fastest
    is kept. With ``decisions`` (a JSON file) the
    choice is cached under ``measurement_key(name, role, device=device)`` and read back by later calls, which
    then only convert. ``record`` holds ``precision``, ``seconds`` (per candidate), ``sizes``,
    ``key`` and ``cached`` (True when read from the file): what was chosen and why.
    ``traceable``: only precisions ``torch.compile`` can trace (for the captured step: int8 is left out, int4
    stays), decided and cached apart.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if precision_of(model) != "float32":
        raise ValueError("auto_precision starts from a float32 model (every candidate is converted from it)")
    device = next(model.parameters()).device
    key = measurement_key(name or measured_name(model), role, *(["traceable"] if traceable else []), device=device)
    candidates = [p for p in AUTO_CANDIDATES[role] if not (traceable and p in UNTRACEABLE)]
    path = None if decisions is None else Path(decisions)
    if path is not None:
        record = read_json_dict(path).get(key)
        if isinstance(record, dict) and record.get("precision") in candidates:
            return to_precision(model, record["precision"]), {**record, "cached": True}
    sizes = AUTO_SIZES[role]
    timer = default_timer if timer is None else timer
    seconds: dict[str, float] = {}
    fused = bool(fused_weights(model))
    for precision in candidates:
        if (precision in CPU_ONLY and device.type != "cpu") or (fused and precision in ("int8", "int4")):
            continue
        candidate = model if precision == "float32" else to_precision(copy.deepcopy(model), precision)
        seconds[precision] = timer(candidate, sizes)
        del candidate
    best = min(seconds, key=seconds.get)
    record = {"precision": best, "seconds": seconds, "sizes": list(sizes), "key": key,
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if path is not None:
        write_json(path, {**read_json_dict(path), key: record}, sort_keys=True)
    return to_precision(model, best), {**record, "cached": False}


def describe_choice(record: dict[str, Any]) -> str:
    """One line saying which precision was kept and the timings it was kept on."""
    timings = ", ".join(f"{p} {s * 1e3:.0f} ms" for p, s in record.get("seconds", {}).items())
    how = "cached measurement" if record.get("cached") else "measured now"
    return f"{record['precision']} ({how}; forward over {record.get('sizes')} tokens: {timings})"
