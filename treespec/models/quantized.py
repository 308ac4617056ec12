"""Quantised Linear layers on the CPU: ``int8`` (``torch.ao``'s dynamic quantisation, drafts) and ``int4`` (drafts,
and targets: a GGUF file's own 4-bit blocks, ``treespec.models.gguf_blocks``, whose other tensors run on torch's
weight-only int8 kernel: :class:`Int8Linear`).

A draft model's forward over a few tree tokens reads every weight once and does little arithmetic
with it: on a CPU its speed is the memory traffic of its weights. Both precisions quantise every
``nn.Linear`` (the LM head included); embeddings, norms, attention and the KV cache stay float32.

``int8`` (:func:`quantize_int8`): int8 weights with per-channel scales and dynamic int8 activations,
``torch.ao``'s dynamic Linear layers as ``torch.ao.quantization.quantize_dynamic`` makes them (fbgemm kernels). Their
packed weights are opaque script objects that ``torch.compile`` cannot trace.

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

A target cannot take other weights for its prompt (its law is what the output follows), and on the kernel the
built-in target's prompts of 63-272 tokens took 3.21 s (median) against 2.26 s for the same weights in bfloat16
(``experiments/int4_target_prefill.py``: whole 64-token runs 8.42 against 10.02 tok/s). So an int4 target's layers
can keep a **bfloat16 twin of their own 4-bit weights** (``twin="bfloat16"``: ``(code - 8) * scale + zero`` with
the kernel's bfloat16 scales, rounded to bfloat16; ``load`` keeps the twins where they measure faster than the
kernels, ``treespec.models.twin``: on a CPU without bfloat16 arithmetic they ran prompts 2.4x slower) for inputs of
at least :data:`PROMPT_ROWS` rows a sequence outside
``torch.compile``: a prompt (a batch's rows counted apart: its trees are steps). The tuner never sizes a tree that
wide on a CPU target in int4 (its forward grows with every four tokens: ``experiments/linear_kernels_by_rows.py``),
so every step verifies on the kernel, as HF's decoding of the same model does (a budget of 32 or more given by hand
verifies on the twin, and its greedy output can then part from HF's at near-ties: seen with trees of 42 and 84
nodes on a tiny model); the twin holds the same weights up to bfloat16
rounding (one part in 512: next-token KL from the file 0.00039 against the kernel's 0.00035,
``experiments/results/gguf-fidelity-cpu``), the rounding any two kernels differ by. The eager step forwards a whole
prompt, as HF's prefill does, so its layers match HF's at every length. The compiled steps cache the prompt less its
last token and forward that token with the first tree, on the kernel: from ``PROMPT_ROWS`` + 1 tokens on, that row is
the twin's in HF's prefill and the kernel's here (at exactly ``PROMPT_ROWS`` every cached row is on the kernel), and
the two can part at a near-tie (seen on a tiny model with prompts of 32-48 tokens; never eager), as forwards over a
tree and over one token can. In a batch a row's draft forward padded to a neighbour's ask of ``WIDE_ROWS`` tokens or
more (a catch-up after a long accepted chain: seen with an n-gram drafter of 24-token chains) takes the int8 twin with
it, whose activations share one scale, so that row's ``q`` can move with the batch (its law does not).
:func:`kernel_only` sets the twins aside for a block (measurements).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import warnings
from typing import Callable, Iterator

import torch

#: inputs with at least this many rows (a prompt) take a draft's int8 weights outside ``torch.compile``
WIDE_ROWS = 16
#: inputs with at least this many rows (a prompt) take a target's bfloat16 twin outside ``torch.compile``
PROMPT_ROWS = 32
#: the twins a layer may keep for wide inputs: a draft's int8 re-quantisation, a target's own weights in bfloat16
TWINS = ("int8", "bfloat16")
#: columns per scale/offset pair (32, 64, 128 or 256). 128: the fastest compiled draft level of the three
#: measured (22.2 ms against 24.9 and 26.8 for 64 and 32, one token) at the same agreement with the target
#: (0.939 code / 0.520 prose, int8 0.931 / 0.485; ``experiments/results/draft-level-cpu.md``)
GROUP_SIZE = 128
_GROUPS = (32, 64, 128, 256)
#: rows of a weight converted at a time when a layer is built (its codes, the kernel's packing, its twin): a
#: chunk's temporaries stay in the CPU's caches, where passes over a whole weight went to memory and faulted in
#: fresh pages (the built-in target's layers 13.7 -> 6.8 s to build here: ``experiments/layer_build_seconds.py``); a
#: multiple of the 64 rows the CPU kernel packs together, so the chunks' packings are the whole weight's
#: (``tests/test_int4.py``)
CHUNK_ROWS = 256


class KernelLinear(torch.nn.Module):
    """A Linear layer on a quantised kernel (:meth:`kernel`: ``x`` flattened to rows, in bfloat16, to ``y`` without
    the bias), with an optional twin that runs inputs of at least ``wide_rows`` rows a sequence (``x.shape[-2]``)
    outside ``torch.compile``
    (:meth:`_with`; the module doc). ``x`` of any float dtype, ``y`` of the same dtype."""

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", bias)
        # the twin for inputs of at least wide_rows rows (:meth:`_with`): a plain attribute, not a submodule
        # (torch.compile never sees it, and model.modules() lists no torch.ao layer: the model counts as traceable)
        self.__dict__["wide"], self.wide_rows = None, WIDE_ROWS

    def _with(self, wide: torch.nn.Module, rows: int) -> "KernelLinear":
        """This layer, its inputs of at least ``rows`` rows (outside ``torch.compile``) run on ``wide``."""
        self.__dict__["wide"], self.wide_rows = wide, rows
        return self

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # is_compiling first: a graph never takes the twin, nor guards on the input's size for it. Rows of one
        # sequence (x: [..., rows, in]), not of the whole input: a batch of B trees ([B, n, in]) is B steps, not a
        # prompt, and a row's layers must not change with the rows beside it
        if (not torch.compiler.is_compiling() and self.wide is not None and x.dim() >= 2
                and x.shape[-2] >= self.wide_rows):
            return self.wide(x.float()).to(x.dtype)
        y = self.kernel(x.reshape(-1, self.in_features).to(torch.bfloat16)).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.view(*x.shape[:-1], self.out_features)


class Int4Linear(KernelLinear):
    """``y = x W^T + b`` with ``W`` in 4 bits per entry (``from_linear``, ``from_groups``). Buffers: ``packed`` (the
    kernel's layout, ``[out, in / 2]`` uint8), ``scales_and_zeros`` (``[in / group, out, 2]`` bfloat16:
    ``W = (code - 8) * scale + zero``)."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int, in_features: int,
                 out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__(in_features, out_features, bias)
        self.group_size = group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, group_size: int | None = None, twin: str | None = "int8"
                    ) -> "Int4Linear":
        """Quantise ``linear``'s weight group-wise (``group_size`` input columns per scale and offset; None: the
        one :func:`group_size_for` gives); ``twin``: what wide inputs run on (one of :data:`TWINS`, or None: the
        kernel for every input; see the module)."""
        w = linear.weight.detach().float()
        n, k = w.shape
        group_size = group_size_for(linear) if group_size is None else group_size
        if group_size not in _GROUPS or k % group_size or n % 16:
            raise ValueError(f"the int4 kernel cannot take a {k} -> {n} Linear with group size {group_size} (it needs "
                             f"the output size a multiple of 16 and the input size a multiple of a group size in "
                             f"{_GROUPS})")
        groups = w.view(n, k // group_size, group_size)
        low, high = groups.aminmax(dim=-1)
        scale = ((high - low) / 15).clamp_min(torch.finfo(torch.float32).tiny)
        codes = torch.empty(n, k, dtype=torch.uint8)
        for rows in _row_chunks(n):
            steps = (groups[rows] - low[rows, :, None]) / scale[rows, :, None]
            codes[rows] = steps.round_().clamp_(0, 15).view(-1, k)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        if twin == "int8":
            return cls.from_groups(codes, scale, low + 8 * scale, bias, None)._with(_int8_twin(linear), WIDE_ROWS)
        return cls.from_groups(codes, scale, low + 8 * scale, bias, twin)

    @classmethod
    def from_groups(cls, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias: torch.Tensor | None = None,
                    twin: str | None = None, *, nibbles: bool = False) -> "Int4Linear":
        """The layer whose weight is ``(codes - 8) * scale + zero`` group by group (``codes`` ``[out, in]`` in
        0..15; ``scale``, ``zero`` ``[out, groups]``, the group size ``in / groups``), the kernel keeping
        ``scale`` and ``zero`` in bfloat16: what :meth:`from_linear` rounds a float weight to, or a file's own
        4-bit blocks (``treespec.models.gguf_blocks``). ``twin``: None, or ``"bfloat16"``, these weights in
        bfloat16 for prompts (see the module; an int8 twin needs the float weight: :meth:`from_linear`).
        ``nibbles``: ``codes`` given two a byte (``[out, in / 2]`` uint8, an even column's code in the low four
        bits), as a file's blocks are cached."""
        if twin not in (None, "bfloat16"):
            raise ValueError(f"from_groups keeps no twin or a bfloat16 one, got {twin!r}")
        codes = torch.as_tensor(codes)
        n, k = codes.shape[0], codes.shape[1] * (2 if nibbles else 1)
        group_size = k // scale.shape[1]
        if group_size not in _GROUPS or k % group_size or n % 16:
            raise ValueError(f"the int4 kernel cannot take a {k} -> {n} Linear with group size {group_size} (it needs "
                             f"the output size a multiple of 16 and the input size a multiple of a group size in "
                             f"{_GROUPS})")
        scales_and_zeros = torch.stack([torch.as_tensor(scale).float().t(), torch.as_tensor(zero).float().t()],
                                       -1).to(torch.bfloat16).contiguous()
        # the twin: the kernel's own weights (bfloat16 scales and zeros, codes - 8 exact), (codes - 8) * scale + zero
        # in float32 group by group (the scales broadcast over a group), rounded once to bfloat16
        s, z = (g.float().t()[:, :, None] for g in scales_and_zeros.unbind(-1))
        weight = torch.empty(n, k, dtype=torch.bfloat16) if twin == "bfloat16" else None
        packed = []
        for rows in _row_chunks(n):
            chunk = (unpack_nibbles(codes[rows]) if nibbles else codes[rows]).to(torch.int32)
            packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(chunk, 1))
            if weight is not None:
                w = chunk.view(-1, k // group_size, group_size).to(torch.float32)
                weight[rows] = w.sub_(8).mul_(s[rows]).add_(z[rows]).view(-1, k)
        layer = cls(torch.cat(packed), scales_and_zeros, group_size, k, n, bias)
        if weight is not None:
            layer._with(BFloat16Linear(weight, bias, copy=False), PROMPT_ROWS)
        return layer

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scales_and_zeros)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


class Int8Linear(KernelLinear):
    """``y = x W^T + b`` with ``W`` in int8, one scale per output row (``W ~ code * scale``, codes in -127..127),
    on torch's weight-only int8 kernel (``_weight_int8pack_mm``: bfloat16 activations, traceable). An int4 target's
    GGUF tensors of a type the int4 kernel does not hold exactly (Q6_K, Q5_0, Q8_0, ...), re-quantised to the
    nearest kernel that runs a few rows faster than bfloat16 (``treespec.models.gguf_blocks.with_file_blocks``);
    with a bfloat16 twin of its own int8 weights for a prompt (``PROMPT_ROWS``: the kernel's cost grows with the
    rows, as the int4 kernel's). Buffers: ``codes`` (``[out, in]`` int8), ``scales`` (``[out]`` bfloat16)."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__(codes.shape[1], codes.shape[0], bias)
        self.register_buffer("codes", codes)
        self.register_buffer("scales", scales)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, twin: str | None = "bfloat16"
                    ) -> "Int8Linear":
        """``weight`` (``[out, in]``) rounded to int8 per output row (symmetric: a row's largest magnitude is 127
        steps); ``twin``: ``"bfloat16"`` (these int8 weights in bfloat16, for prompts) or None."""
        if twin not in (None, "bfloat16"):
            raise ValueError(f"an int8 layer keeps no twin or a bfloat16 one, got {twin!r}")
        w = weight.detach().float()
        low, high = w.aminmax(dim=1)  # a row's largest magnitude
        scales = (torch.maximum(-low, high) / 127).clamp_min(torch.finfo(torch.float32).tiny).to(torch.bfloat16)
        row_scales = scales.float()[:, None]
        codes = torch.empty(w.shape, dtype=torch.int8)
        twin_weight = torch.empty(w.shape, dtype=torch.bfloat16) if twin == "bfloat16" else None
        for rows in _row_chunks(w.shape[0]):
            chunk = torch.div(w[rows], row_scales[rows]).round_().clamp_(-127, 127)
            codes[rows] = chunk
            if twin_weight is not None:  # these int8 weights (a code of 0 is +0), code * scale in float32, rounded
                twin_weight[rows] = codes[rows].to(torch.float32).mul_(row_scales[rows])  # once to bfloat16
        layer = cls(codes, scales, None if bias is None else bias.detach().float().clone())
        if twin_weight is not None:
            layer._with(BFloat16Linear(twin_weight, layer.bias, copy=False), PROMPT_ROWS)
        return layer

    def kernel(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(flat, self.codes, self.scales)


class BFloat16Linear(torch.nn.Module):
    """``y = x W^T + b`` with ``W`` kept in bfloat16 inside a float32 model (``x`` rounded to bfloat16 for the
    product, ``y`` and ``b`` in ``x``'s dtype): a quantised target layer's twin for its prompts (:class:`Int4Linear`,
    :class:`Int8Linear`). ``weight`` ``[out, in]`` (copied unless ``copy=False``), ``bias`` ``[out]`` or None."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, copy: bool = True) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        # copy=False: a weight made for this layer, already bfloat16, is kept as it is
        self.register_buffer("weight", weight.detach().to(torch.bfloat16, copy=copy))
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "BFloat16Linear":
        """``linear``'s weight and bias, the weight kept in bfloat16."""
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Codes kept two a byte (``[rows, columns / 2]`` uint8, an even column's in the low four bits) as ``[rows,
    columns]`` uint8."""
    return torch.stack([packed & 0x0F, packed >> 4], -1).reshape(packed.shape[0], -1)


def _row_chunks(rows: int) -> Iterator[slice]:
    """A weight's rows, :data:`CHUNK_ROWS` at a time."""
    return (slice(i, i + CHUNK_ROWS) for i in range(0, rows, CHUNK_ROWS))


def _check_cpu_float32(model: torch.nn.Module, what: str) -> None:
    """Refuse a model the quantiser ``what`` cannot take: one off the CPU, or not in float32."""
    param = next(model.parameters())
    if param.device.type != "cpu":
        raise ValueError(f"{what} runs on the CPU only (the model is on {param.device}); use "
                         "dtype='bfloat16' or 'float16' on an accelerator")
    if param.dtype != torch.float32:
        raise ValueError(f"{what} starts from a float32 model; load it with dtype=torch.float32 first")


def conv1d_as_linear(model: torch.nn.Module) -> torch.nn.Module:
    """Each of transformers' ``Conv1D`` layers (GPT-2's: ``x @ W + b`` with ``W`` stored ``[in, out]``) replaced by
    the ``nn.Linear`` that computes the same (``W`` transposed), in place, so that the quantisers take them; returns
    ``model``."""
    from transformers.pytorch_utils import Conv1D

    def linear(name: str, conv: torch.nn.Module) -> torch.nn.Linear:
        weight, bias = conv.weight.detach(), conv.bias
        layer = torch.nn.Linear(weight.shape[0], weight.shape[1], bias=bias is not None, device="meta")
        state = {"weight": weight.t().contiguous(), **({"bias": bias.detach()} if bias is not None else {})}
        layer.load_state_dict(state, assign=True)
        return layer

    return replace_layers(model, Conv1D, linear)


def quantize_int8(model: torch.nn.Module, threads: int | None = None) -> torch.nn.Module:
    """Quantise every ``nn.Linear`` of a float32 CPU model in place (int8 weights, per-channel scales,
    dynamic int8 activations; GPT-2's ``Conv1D`` layers as the Linear layers they are); returns ``model``.

    Each layer is converted as ``torch.ao.quantization.quantize_dynamic`` converts it (its ``from_float``), on
    ``threads`` threads at once (None: as many as torch computes on): fbgemm's weight packing and the quantisation
    run on one core (the built-in draft's LM head 5.4 s of them here), so layers convert side by side; the same
    packed weights (``experiments/layer_build_seconds.py``)."""
    _check_cpu_float32(model, "int8 dynamic quantisation")
    conv1d_as_linear(model)

    def int8(name: str, linear: torch.nn.Linear) -> torch.nn.Module | None:
        # quantize_dynamic's mapping: the class itself, not its subclasses
        return _dynamic_int8(linear) if type(linear) is torch.nn.Linear else None

    with _torch_ao_quiet():
        return replace_layers(model, torch.nn.Linear, int8, threads=threads or torch.get_num_threads())


def _dynamic_int8(linear: torch.nn.Linear) -> torch.nn.Module:
    """``linear`` as ``torch.ao``'s dynamic int8 Linear (per-channel weight scales), converted as
    ``quantize_dynamic`` converts it (its ``from_float``). It may run on a worker thread: the caller silences
    ``torch.ao``'s warnings (:func:`_torch_ao_quiet`, on its own thread: warnings' filters are the process's)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    linear.qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    return DynamicLinear.from_float(linear)


@contextlib.contextmanager
def _torch_ao_quiet() -> Iterator[None]:
    """``torch.ao``'s eager quantisation warns that it is deprecated: silenced for the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _int8_twin(linear: torch.nn.Linear) -> torch.nn.Module:
    """``linear`` as ``torch.ao``'s dynamic int8 Linear (per-channel weight scales), the ``int8`` precision's."""
    copy = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
    copy.load_state_dict({k: v.detach().float() for k, v in linear.state_dict().items()}, assign=True)  # no copy
    return _dynamic_int8(copy)


def group_size_for(linear: torch.nn.Linear, preferred: int = GROUP_SIZE) -> int | None:
    """The group size ``linear`` is quantised with: ``preferred`` if the kernel takes the layer with it, else
    the largest smaller one it takes; None when none fits (the layer stays float)."""
    if linear.out_features % 16:
        return None
    fits = [g for g in _GROUPS if g <= preferred and linear.in_features % g == 0]
    return max(fits) if fits else None


def quantize_int4(model: torch.nn.Module, group_size: int = GROUP_SIZE, twin: str | None = "int8",
                  threads: int | None = None) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of a float32 CPU model that the kernel takes by an :class:`Int4Linear`, in
    place; returns ``model``. Tied weights (an LM head sharing the embeddings) are copied, not shared: the
    embeddings stay float32. ``twin``: what each layer runs wide inputs on (see the module): ``"int8"``, a draft's
    re-quantisation for its prompt; ``"bfloat16"``, a target's own 4-bit weights in bfloat16 for its prompt (its
    law is what the output follows); None, the kernel for every input. GPT-2's ``Conv1D`` layers are taken as the
    Linear layers they are (:func:`conv1d_as_linear`). ``threads``: layers converted at once (None: as many as
    torch computes on; an int8 twin's packing runs on one core, :func:`quantize_int8`)."""
    if group_size not in _GROUPS:
        raise ValueError(f"group_size must be one of {_GROUPS} (the int4 kernel's), got {group_size!r}")
    if twin is not None and twin not in TWINS:
        raise ValueError(f"twin must be one of {TWINS} or None, got {twin!r}")
    _check_cpu_float32(model, "int4 quantisation")
    conv1d_as_linear(model)

    def int4(name: str, linear: torch.nn.Linear) -> Int4Linear | None:
        group = group_size_for(linear, group_size)
        return None if group is None else Int4Linear.from_linear(linear, group, twin)

    with _torch_ao_quiet():  # the int8 twins
        return replace_layers(model, torch.nn.Linear, int4, threads=threads or torch.get_num_threads())


def replace_layers(model: torch.nn.Module, kind: type,
                   make: Callable[[str, torch.nn.Module], torch.nn.Module | None], *, threads: int = 1
                   ) -> torch.nn.Module:
    """``model`` with each submodule of type ``kind`` replaced by ``make(its qualified name, it)`` (None: kept), in
    place; returns ``model``. ``threads`` > 1: ``make`` runs on that many threads at once, the largest layers first
    (for a ``make`` whose work runs on one core outside Python; it must not share state between calls, nor set
    warnings' filters: they are the process's)."""
    sites = [(module, name, f"{prefix}.{name}" if prefix else name, child)
             for prefix, module in list(model.named_modules()) for name, child in list(module.named_children())
             if isinstance(child, kind)]
    layers: list[torch.nn.Module | None] = [None] * len(sites)

    def make_site(i: int) -> None:
        layers[i] = make(sites[i][2], sites[i][3])

    if threads > 1 and len(sites) > 1:
        # the largest first: the longest conversion (an LM head) starts at once, the small ones fill in around it
        largest_first = sorted(range(len(sites)), key=lambda i: -sum(p.numel() for p in sites[i][3].parameters()))
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(make_site, largest_first))  # list: an error in any call raises here
    else:
        for i in range(len(sites)):
            make_site(i)
    for (module, name, _, _), layer in zip(sites, layers):
        if layer is not None:
            setattr(module, name, layer)
    return model


@contextlib.contextmanager
def kernel_only(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` with its quantised layers running every input on their kernel for the block (twins set aside)."""
    layers = [m for m in model.modules() if isinstance(m, KernelLinear)]
    kept = [m.wide for m in layers]
    without_twins(model)
    try:
        yield model
    finally:
        for m, wide in zip(layers, kept):
            m.__dict__["wide"] = wide


def without_twins(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its quantised layers running every input on their kernel for good (their twins dropped, and
    their memory with them), in place; returns ``model``."""
    for layer in model.modules():
        if isinstance(layer, KernelLinear):
            layer.__dict__["wide"] = None
    return model


def has_int4(model: torch.nn.Module) -> bool:
    """Whether any Linear layer of ``model`` is an :class:`Int4Linear`."""
    return any(isinstance(m, Int4Linear) for m in model.modules())
