"""Quantised Linear layers for CPU drafts: ``int8`` (``torch.ao``'s dynamic quantisation) and ``int4``.

A draft model's forward over a few tree tokens reads every weight once and does little arithmetic
with it: on a CPU its speed is the memory traffic of its weights. Both precisions quantise every
``nn.Linear`` (the LM head included); embeddings, norms, attention and the KV cache stay float32.

``int8`` (:func:`quantize_int8`): int8 weights with per-channel scales and dynamic int8 activations,
through ``torch.ao.quantization.quantize_dynamic`` (fbgemm kernels). Its packed weights are opaque
script objects that ``torch.compile`` cannot trace.

``int4`` (:func:`quantize_int4`): each weight in 4 bits with one scale and one offset per group of
``group_size`` input columns (asymmetric round-to-nearest: a group's minimum to maximum in 15
steps), multiplied with ``torch.ops.aten._weight_int4pack_mm_for_cpu`` (bfloat16 activations,
dequantised inside the kernel). The kernel is an ordinary aten operator: ``torch.compile`` traces
it, so an int4 draft can run inside the captured step (``treespec.core.captured``).

A quantised draft is still an exact drafter: its proposals are point masses or draws from its
own ``q``. What quantisation changes is how often the target accepts them, which the benchmarks
measure (``experiments/bench_draft_level.py``).

The kernel's constraints: the output size a multiple of 16 and the input size a multiple of the group
size (32, 64, 128 or 256). A layer that does not fit keeps its float32 weights.

The kernel dequantises for every row it multiplies: at one to four rows (draft levels) it is the
fastest traceable draft here, but a prompt's prefill is compute-bound, where it ran the 0.5B draft's
Linear layers 2.8x slower than ``torch.ao``'s int8 (383 against 139 ms for 64 rows, against 17.8 and
26.2 ms for one row; ``experiments/results/draft-level-cpu.md``). So each layer also keeps int8 weights (fbgemm, as
the ``int8`` precision): inputs of at least :data:`WIDE_ROWS` rows outside ``torch.compile`` take
them (the captured step prefills an int4 draft eagerly, ``treespec.core.prefill.prefill_for``).
The draft's cache of the prompt then holds int8 results and its drafting int4 ones: both are the
draft's own forwards, so its proposals stay exact drafts; only their acceptance could differ.
"""

from __future__ import annotations

import warnings

import torch

#: inputs with at least this many rows (a prompt) take the int8 weights outside ``torch.compile``
WIDE_ROWS = 16
#: columns per scale/offset pair (32, 64, 128 or 256). 128: the fastest compiled draft level of the three
#: measured (22.2 ms against 24.9 and 26.8 for 64 and 32, one token) at the same agreement with the target
#: (0.939 code / 0.520 prose, int8 0.931 / 0.485; ``experiments/results/draft-level-cpu.md``)
GROUP_SIZE = 128
_GROUPS = (32, 64, 128, 256)


class Int4Linear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` in 4 bits per entry (``from_linear``); ``x`` of any float dtype, ``y`` of
    the same dtype. Buffers: ``packed`` (the kernel's layout, ``[out, in / 2]`` uint8),
    ``scales_and_zeros`` (``[in / group, out, 2]`` bfloat16: ``W = (code - 8) * scale + zero``)."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, in_features: int,
                 out_features: int, bias: torch.Tensor | None, wide: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", bias)
        # the int8 twin for wide inputs: a plain attribute, not a submodule (torch.compile never sees it, and
        # model.modules() lists no torch.ao layer, so the model still counts as traceable)
        self.__dict__["wide"] = wide

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group_size: int | None = None, wide: bool = True) -> "Int4Linear":
        """Quantise ``linear``'s weight group-wise (``group_size`` input columns per scale and offset; None: the
        one :func:`group_size_for` gives); ``wide``: keep an int8 twin for wide inputs (see the module)."""
        w = linear.weight.detach().float()
        n, k = w.shape
        group_size = group_size_for(linear) if group_size is None else group_size
        if group_size not in _GROUPS or k % group_size or n % 16:
            raise ValueError(f"the int4 kernel cannot take a {k} -> {n} Linear with group size {group_size} (it needs "
                             f"the output size a multiple of 16 and the input size a multiple of a group size in "
                             f"{_GROUPS})")
        groups = w.view(n, k // group_size, group_size)
        low, high = groups.amin(-1), groups.amax(-1)
        scale = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
        codes = ((groups - low[..., None]) / scale[..., None]).round().clamp(0, 15).view(n, k)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls.from_groups(codes, scale, low + 8 * scale, bias, _int8_twin(linear) if wide else None)

    @classmethod
    def from_groups(cls, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias: torch.Tensor | None = None,
                    wide: torch.nn.Module | None = None) -> "Int4Linear":
        """The layer whose weight is ``(codes - 8) * scale + zero`` group by group (``codes`` ``[out, in]`` in
        0..15; ``scale``, ``zero`` ``[out, groups]``, the group size ``in / groups``), the kernel keeping
        ``scale`` and ``zero`` in bfloat16: what :meth:`from_linear` rounds a float weight to, or a file's own
        4-bit blocks (``treespec.models.gguf_blocks``). ``wide``: a layer for wide inputs (see the module)."""
        n, k = codes.shape
        group_size = k // scale.shape[1]
        if group_size not in _GROUPS or k % group_size or n % 16:
            raise ValueError(f"the int4 kernel cannot take a {k} -> {n} Linear with group size {group_size} (it needs "
                             f"the output size a multiple of 16 and the input size a multiple of a group size in "
                             f"{_GROUPS})")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.as_tensor(codes).to(torch.int32), 1)
        scales_and_zeros = torch.stack([torch.as_tensor(scale).float().t(), torch.as_tensor(zero).float().t()],
                                       -1).to(torch.bfloat16).contiguous()
        return cls(packed, scales_and_zeros, group_size, k, n, bias, wide)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wide is not None and x.numel() >= WIDE_ROWS * self.in_features and not torch.compiler.is_compiling():
            return self.wide(x.float()).to(x.dtype)
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scales_and_zeros)
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


class BFloat16Linear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` kept in bfloat16 inside a float32 model (``x`` rounded to bfloat16 for the
    product, ``y`` and ``b`` in ``x``'s dtype): a GGUF tensor of a type the int4 kernel does not hold (Q6_K, Q8_0,
    ...) at its file's precision, where re-quantising it to 4 bits would change the model."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", linear.weight.detach().to(torch.bfloat16).clone())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def _check_cpu_float32(model: torch.nn.Module, what: str) -> None:
    """Refuse a model the quantiser ``what`` cannot take: one off the CPU, or not in float32."""
    param = next(model.parameters())
    if param.device.type != "cpu":
        raise ValueError(f"{what} runs on the CPU only (the model is on {param.device}); use "
                         "dtype='bfloat16' or 'float16' on an accelerator")
    if param.dtype != torch.float32:
        raise ValueError(f"{what} starts from a float32 model; load it with dtype=torch.float32 first")


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Quantise every ``nn.Linear`` of a float32 CPU model in place (int8 weights, per-channel scales,
    dynamic int8 activations); returns ``model``."""
    _check_cpu_float32(model, "int8 dynamic quantisation")
    with warnings.catch_warnings():  # torch.ao's eager quantisation API warns that it is deprecated
        warnings.simplefilter("ignore")
        torch.ao.quantization.quantize_dynamic(
            model, {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8,
            inplace=True)
    return model


def _int8_twin(linear: torch.nn.Linear) -> torch.nn.Module:
    """``linear`` as ``torch.ao``'s dynamic int8 Linear (per-channel weight scales), the ``int8`` precision's."""
    copy = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    copy.load_state_dict({k: v.detach().float() for k, v in linear.state_dict().items()})
    return quantize_int8(torch.nn.Sequential(copy))[0]


def group_size_for(linear: torch.nn.Linear, preferred: int = GROUP_SIZE) -> int | None:
    """The group size ``linear`` is quantised with: ``preferred`` if the kernel takes the layer with it, else
    the largest smaller one it takes; None when none fits (the layer stays float)."""
    if linear.out_features % 16:
        return None
    fits = [g for g in _GROUPS if g <= preferred and linear.in_features % g == 0]
    return max(fits) if fits else None


def quantize_int4(model: torch.nn.Module, group_size: int = GROUP_SIZE, wide: bool = True) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of a float32 CPU model that the kernel takes by an :class:`Int4Linear`, in
    place; returns ``model``. Tied weights (an LM head sharing the embeddings) are copied, not shared: the
    embeddings stay float32. ``wide``: each layer keeps an int8 twin for wide inputs (a draft's prompt); False
    for a target, whose every forward must run one set of weights (its law is what the output follows)."""
    if group_size not in _GROUPS:
        raise ValueError(f"group_size must be one of {_GROUPS} (the int4 kernel's), got {group_size!r}")
    _check_cpu_float32(model, "int4 quantisation")
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                group = group_size_for(child, group_size)
                if group is not None:
                    setattr(module, name, Int4Linear.from_linear(child, group, wide))
    return model


def has_int4(model: torch.nn.Module) -> bool:
    """Whether any Linear layer of ``model`` is an :class:`Int4Linear`."""
    return any(isinstance(m, Int4Linear) for m in model.modules())
