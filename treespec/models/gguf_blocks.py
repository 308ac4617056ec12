"""A GGUF file's 4-bit blocks as the CPU int4 kernel's groups, kept as they are (not dequantised and re-rounded).

llama.cpp's 4-bit types store each group of 32 weights of a row as 4-bit codes ``q`` (0..15) with a scale and,
for some, a minimum (ggml's ``dequantize_row_q4_0`` / ``_q4_1`` / ``_q4_K``):

* ``Q4_0`` (18-byte blocks of 32): ``w = d (q - 8)``;
* ``Q4_1`` (20-byte blocks of 32): ``w = d q + m``;
* ``Q4_K`` (144-byte super-blocks of 256: ``d``, ``dmin``, twelve bytes of 6-bit sub-block scales ``sc_j`` and
  minima ``m_j``, then the codes): sub-block ``j`` of 32 is ``w = (d sc_j) q - dmin m_j``.

torch's int4 kernel (``treespec.models.quantized.Int4Linear``) computes ``w = (q - 8) scale + zero`` per group of
32 input columns, so each of these maps onto it with the file's own codes: ``scale = d`` (``d sc_j``) and
``zero = 8 scale`` plus the block's offset (``0``, ``m``, ``-dmin m_j``). The mapped weights equal the file's
up to the precision the kernel keeps its scales in (bfloat16). Other types (``Q5_*``, ``Q6_K``, ``Q8_0``, ...)
have no such map: :func:`int4_groups` returns None for them, and the caller re-quantises or keeps floats.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .gguf_file import architecture

#: ggml type ids (``gguf.GGMLQuantizationType``; their block sizes: ``gguf.GGML_QUANT_SIZES``) whose blocks map
#: onto the int4 kernel exactly
Q4_0, Q4_1, Q4_K = 2, 3, 12
EXACT_INT4 = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q4_K: "Q4_K"}
GROUP = 32  # weights per scale (and offset) in every type above: the kernel's group size 32


def _halves(raw: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of every block of ``raw`` ``[blocks, bytes]``, as float32 ``[blocks]``."""
    return raw[:, at : at + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Codes ``[blocks, 2 * bytes]`` of ``qs`` ``[blocks, bytes]``: every byte's low nibbles, then its high ones
    (the order of the 32 weights of a ggml 4-bit group)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit sub-block scales and minima ``[blocks, 8]`` packed in twelve bytes (ggml's
    ``get_scale_min_k4``): bytes 0-3 and 4-7 hold the low six bits of scales and minima 0-3; bytes 8-11
    hold the low four bits of 4-7, whose top two bits are the top bits of bytes 0-7."""
    s = s.astype(np.int32)
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc.astype(np.float32), m.astype(np.float32)


def int4_groups(raw: np.ndarray, qtype: int, rows: int, columns: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(codes [rows, columns] uint8, scale [rows, columns / 32], zero [rows, columns / 32])`` (float32) of a
    weight stored as ``qtype`` blocks (``raw``: the tensor's bytes, row after row), such that
    ``(codes - 8) * scale + zero`` is the file's weight group by group; None for a type with no such map."""
    if qtype not in EXACT_INT4:
        return None
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    per, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]  # weights and bytes per block
    if columns % per:
        raise ValueError(f"a {EXACT_INT4[qtype]} row holds whole blocks of {per} weights, got {columns} columns")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(rows * columns // per, size)
    if qtype == Q4_K:
        d, dmin = _halves(blocks, 0), _halves(blocks, 2)
        sc, m = _q4k_scales(blocks[:, 4:16])
        # each 32 bytes of codes: sub-block 2i in the low nibbles, 2i + 1 in the high ones
        codes = np.concatenate([_nibbles(blocks[:, 16 + 32 * i : 48 + 32 * i]) for i in range(4)], axis=1)
        scale = d[:, None] * sc
        offset = -(dmin[:, None] * m)
    else:
        scale = _halves(blocks, 0)[:, None]
        codes = _nibbles(blocks[:, -16:])
        # Q4_0: w = d (q - 8), zero 0; Q4_1: w = d q + m = (q - 8) d + (m + 8 d)
        offset = -8 * scale if qtype == Q4_0 else _halves(blocks, 2)[:, None]
    zero = 8 * scale + offset
    return (codes.reshape(rows, columns).astype(np.uint8), scale.reshape(rows, -1).astype(np.float32),
            zero.reshape(rows, -1).astype(np.float32))


#: architectures whose GGUF rows are the Hugging Face weight's rows in order (llama's converter permutes the rows
#: of q and k, which transformers undoes on load; its blocks would need the same permutation: not read here)
SAME_ROWS = ("qwen2",)


def read_file_blocks(gguf_path: str | Path, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The 4-bit blocks of the GGUF file at ``gguf_path`` that map onto the kernel exactly, for the weights of
    ``model`` (the same file loaded by transformers; names by gguf-py's ``TensorNameMap``): per weight name
    ``W``, ``W.codes`` (``[out, in / 2]`` uint8: column ``2i`` in the low nibble, ``2i + 1`` in the high one),
    ``W.scale`` and ``W.zero`` (``[out, in / 32]`` float32). Refused for an architecture not in :data:`SAME_ROWS`."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = architecture(reader)
    if arch not in SAME_ROWS:
        raise ValueError(f"{gguf_path}: int4 keeps a GGUF's own 4-bit blocks for {', '.join(SAME_ROWS)} only, not "
                         f"{arch}; load it in bfloat16, or save it as safetensors and load that with dtype='int4' "
                         "(re-quantised from its float weights)")
    names = gguf.TensorNameMap({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch],
                               model.config.num_hidden_layers)
    hf_of = {names.get_name(k, try_suffixes=(".weight", ".bias")): k for k in model.state_dict()}
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name, (columns, rows) = hf_of.get(t.name), (int(t.shape[0]), int(t.shape[-1]))
        groups = None if name is None or len(t.shape) != 2 else int4_groups(t.data, int(t.tensor_type), rows, columns)
        if groups is not None:
            codes, scale, zero = groups
            out.update({f"{name}.codes": torch.from_numpy(codes[:, 0::2] | (codes[:, 1::2] << 4)),
                        f"{name}.scale": torch.from_numpy(scale), f"{name}.zero": torch.from_numpy(zero)})
    return out


def with_file_blocks(model: torch.nn.Module, blocks: dict[str, torch.Tensor], twin: str | None = "bfloat16"
                     ) -> tuple[torch.nn.Module, dict[str, int]]:
    """``model`` (float32, CPU; loaded from the file ``blocks`` were read from) with every Linear layer whose weight
    has blocks an ``Int4Linear`` of the file's own codes and every other one (a type the int4 kernel does not hold
    exactly: Q6_K, Q8_0, ...) an ``Int8Linear`` of its dequantised weights re-quantised to int8 per output row, in
    place. Returns the model and how many layers went each way (``exact``, ``int8``).

    Why int8 for the others (the nearest kernel that measures faster than bfloat16 here): on the built-in 1.5B
    target the 29 Q6_K tensors (the LM head among them) kept in bfloat16 were half of a one-token forward; in int8
    that forward took 71-81 ms against 107-119 (the whole target, one token after 128; 112-120 against 128-142 for
    four; none at eight: the int8 kernel's cost grows with the rows too, and a wider tree is not chosen for an int4
    target here; ``experiments/int8_layers_forward.py``),
    and the model's next-token distribution moved from the file's float32 dequantisation by 0.00061 nats per token
    (KL) against 0.00035 with them in bfloat16 and 0.00070 for the whole model in bfloat16
    (``experiments/results/gguf-fidelity-cpu-int8``): as near the file as bfloat16. Re-quantised to 4 bits instead
    they put it 0.0100 away. Each layer
    keeps bfloat16 twins for a prompt (``twin="bfloat16"``: the same codes, ``quantized`` module doc; None: none,
    prompts on the kernels too: ``treespec.models.twin``), its steps run the kernels."""
    from .quantized import Int4Linear, Int8Linear, _check_cpu_float32, replace_layers

    _check_cpu_float32(model, "int4 from a GGUF's blocks")
    counts = {"exact": 0, "int8": 0}

    def from_file(name: str, linear: torch.nn.Linear) -> torch.nn.Module:
        key = f"{name}.weight"
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        if f"{key}.codes" not in blocks:
            counts["int8"] += 1
            return Int8Linear.from_weight(linear.weight, bias, twin)
        counts["exact"] += 1
        return Int4Linear.from_groups(blocks[f"{key}.codes"], blocks[f"{key}.scale"], blocks[f"{key}.zero"], bias,
                                      twin, nibbles=True)

    return replace_layers(model, torch.nn.Linear, from_file), counts
