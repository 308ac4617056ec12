"""Grouped-query attention for tree forwards: SDPA with the queries of one key/value head stacked.

Models with grouped-query attention (Qwen2.5: 14 query heads over 2 key/value heads in the 0.5B
draft, 12 over 2 in the 1.5B target) share each key/value head among ``g`` query heads. Given a
4D mask, HF's stock ``sdpa`` path copies every key/value head ``g`` times (``repeat_kv``) before
calling SDPA, and always does so under ``torch.compile``: for a tree forward over a static cache of
``C`` rows that is ``2 g C D`` values written and read again per layer, for every forward.
Measured on this project's CPU (``experiments/results/draft-level-cpu.md``): one compiled attention
call of the draft over 1024 cached rows took 326 us (float32, one query) and 1257 us (bfloat16)
with the copy, against 105 and 210 us without it.

The copy is not needed: attention is computed per head, so the ``g`` query heads of one
key/value head can be stacked as ``g * q`` query rows of that one head (head ``h`` of query
``i`` becomes row ``(h mod g) * q + i`` of head ``h div g``, the order of ``repeat_kv``), the
mask's rows repeated likewise, and one SDPA call over the unexpanded keys and values gives the
same numbers. :func:`tree_forward` runs a model this way: it is registered with HF's public
``AttentionInterface`` (no modelling file is forked) and selected only for the call, and only for
models that use ``sdpa`` (an ``eager`` model keeps its own attention: the two round differently).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .linear_layout import linear_layout

#: the name under which the grouped attention is registered with ``transformers``
GROUPED_SDPA = "treespec_grouped_sdpa"


def grouped_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """HF's attention-function signature: ``query [B, H, q, D]``, ``key``/``value [B, Hkv, k, D]``, an
    additive or boolean ``attention_mask [B, 1, q, k]``; returns ``([B, q, H, D], None)`` like HF's SDPA.
    Without a mask, or with a per-head mask or extra features (softcap, position bias), it is HF's own
    ``sdpa_attention_forward``."""
    groups = query.shape[1] // key.shape[1]
    if groups == 1 or _plain(module, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    stacked, mask = _stacked(query, key, attention_mask)
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, scale=scaling)
    return _unstacked(out, query), None


def grouped_matmul(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """:func:`grouped_sdpa`'s attention written out: the stacked queries, scaled, times the keys as they lie in the
    cache (a transposed operand, no copy), the mask added, a softmax in float32, times the values. SDPA's math path
    scales the keys too and so copies the whole cache's keys per layer (a transposing kernel over every cached row
    on the H200, ``experiments/results/gpu-h200-math/trace-graphs.md``). ``TREE_ATTENTION = "matmul"``: a lever of
    ``experiments/bench_gpu.py``, not a default."""
    if _plain(module, attention_mask, dropout, kwargs):
        return grouped_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
    stacked, mask = _stacked(query, key, attention_mask)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(stacked * scale, key.transpose(-1, -2))
    # a boolean mask as the engine's additive ones (``StaticTreeCache.forward``'s): the dtype's lowest, not -inf, so
    # that a row that sees nothing (an envelope's padding) stays finite
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return _unstacked(torch.matmul(weights, value), query), None


def _plain(module: torch.nn.Module, attention_mask: torch.Tensor | None, dropout: float, kwargs: dict) -> bool:
    """Whether a call is left to HF's own SDPA: no mask, a per-head mask or extra features (softcap, position
    bias), or dropout in training."""
    return (attention_mask is None or attention_mask.shape[1] != 1 or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None or (module.training and dropout > 0))


def _stacked(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``g`` query heads of each key/value head stacked as its ``g * q`` rows (head ``h = kv * g + r`` becomes
    rows ``r * q + i`` of head ``kv``), and the mask's rows repeated alike."""
    b, heads, q, d = query.shape
    groups, k = heads // key.shape[1], key.shape[2]
    mask = attention_mask.expand(b, 1, q, k)
    if q > 1 and groups > 1:
        mask = mask[:, :, None].expand(b, 1, groups, q, k).reshape(b, 1, groups * q, k)
    return query.reshape(b, key.shape[1], groups * q, d), mask


def _unstacked(out: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """:func:`_stacked`'s rows back to heads, in HF's output layout ``[B, q, H, D]``."""
    return out.reshape(query.shape).transpose(1, 2).contiguous()


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # masks are passed in 4D: never built through it
#: the name under which :func:`grouped_matmul` is registered with ``transformers``
GROUPED_MATMUL = "treespec_grouped_matmul"
AttentionInterface.register(GROUPED_MATMUL, grouped_matmul)
AttentionMaskInterface.register(GROUPED_MATMUL, sdpa_mask)

#: the attention of the captured step's tree forwards (``StaticTreeCache.forward``): ``"sdpa"`` (:func:`grouped_sdpa`
#: over an additive 4D mask), ``"flex"`` (FlexAttention over a block mask made once per forward, which skips the
#: cache's blocks that no query sees: the rows past the used length; :func:`tree_flex`), or ``"flex-levels"``
#: (FlexAttention in the draft levels only, the verification on SDPA), or ``"matmul"`` (:func:`grouped_matmul` in
#: every forward: two batched products and a softmax, the keys read in place). On an H200 cuDNN's SDPA
#: call for a draft level cost 11.2 us over 512 rows, and a memset and 4.6 us of idling before it
#: (``experiments/results/gpu-h200-qkv/trace-graphs.md``); FlexAttention timed alone 7.3 us over 1,024 rows
#: (``experiments/results/gpu-h200-sweep/attention.json``). A lever of ``experiments/bench_gpu.py``, not a default.
TREE_ATTENTION = "sdpa"
#: the name under which :func:`tree_flex` is registered with ``transformers``
TREE_FLEX = "treespec_flex"


def tree_flex(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Any, dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """HF's attention-function signature over a FlexAttention ``BlockMask`` (grouped heads read their key/value
    head in the kernel: no copy); any other mask (a prefill's 4D one, none) goes to :func:`grouped_sdpa`."""
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    if not isinstance(attention_mask, BlockMask):
        return grouped_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            is_causal=is_causal, **kwargs)
    out = flex_attention(query, key, value, block_mask=attention_mask, scale=scaling,
                         enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def flex_in(forward: str) -> bool:
    """Whether the captured step's ``forward`` (``"level"`` or ``"verify"``) attends by FlexAttention."""
    return TREE_ATTENTION == "flex" or (TREE_ATTENTION == "flex-levels" and forward == "level")


def block_mask(allowed: torch.Tensor) -> Any:
    """The FlexAttention block mask of a boolean ``allowed [B, 1, n, C]`` (query row may see cache row)."""
    from torch.nn.attention.flex_attention import create_block_mask

    b, _, n, c = allowed.shape
    return create_block_mask(lambda batch, head, q, kv: allowed[batch, 0, q, kv], b, None, n, c,
                             device=allowed.device)


AttentionInterface.register(TREE_FLEX, tree_flex)
AttentionMaskInterface.register(TREE_FLEX, sdpa_mask)  # masks are passed whole: never built through it
#: each value of :data:`TREE_ATTENTION` -> the attention function's registered name
TREE_ATTENTIONS = {"sdpa": GROUPED_SDPA, "flex": TREE_FLEX, "flex-levels": TREE_FLEX, "matmul": GROUPED_MATMUL}


_CACHE_ARGUMENT: dict[type, str] = {}  # model class -> its forward's name for the KV cache


def cache_argument(model_class: type) -> str:
    """The name the model's forward takes its KV cache under: ``cache`` (transformers >= 5.2x, where
    ``past_key_values`` is deprecated) or ``past_key_values``. Memoised in a plain dict, which
    ``torch.compile`` reads without a graph break (it warns on ``functools`` caches), but a graph that
    reads it guards on the memo's length, and is compiled again once another model class fills it:
    compiled forwards pass the name resolved beforehand (``StaticTreeCache.cache_argument``)."""
    if model_class not in _CACHE_ARGUMENT:
        names = inspect.signature(model_class.forward).parameters
        _CACHE_ARGUMENT[model_class] = "cache" if "cache" in names else "past_key_values"
    return _CACHE_ARGUMENT[model_class]


@contextlib.contextmanager
def grouped_attention(*models: torch.nn.Module) -> Iterator[None]:
    """:func:`grouped_sdpa` (or :func:`tree_flex`: :data:`TREE_ATTENTION`) as the attention of each model that
    uses ``sdpa``, for the block.

    The choice is the config's ``_attn_implementation`` (what HF's ``set_attn_implementation`` writes),
    restored on leaving. A compiled step switches its models around each call of its graphs
    (``compiling.compile_graph``): switched inside, the config's writes would be traced into every graph."""
    configs = [m.config for m in models if m.config._attn_implementation == "sdpa"]
    for config in configs:
        config._attn_implementation = TREE_ATTENTIONS[TREE_ATTENTION]
    try:
        yield
    finally:
        for config in configs:
            config._attn_implementation = "sdpa"


@contextlib.contextmanager
def own_kernels(*models: torch.nn.Module, layouts: bool = True) -> Iterator[None]:
    """The kernels treespec's forwards run the models with, for the block: :func:`grouped_attention`, and each
    model's measured ``nn.Linear`` layout (``linear_layout``; ``layouts=False``: stock layers)."""
    with grouped_attention(*models), linear_layout(*(models if layouts else ())):
        yield


def tree_forward(model: torch.nn.Module, **inputs: Any) -> Any:
    """``model(**inputs)`` with treespec's kernels (:func:`own_kernels`): :func:`grouped_sdpa` as its attention
    when it uses ``sdpa``, and its measured ``nn.Linear`` layout. A graph compiled by ``compiling.compile_graph``
    finds them switched already; another one traces the attention's switch too and guards on the model's own
    setting (the layout is only switched outside graphs).
    A ``past_key_values`` input is passed under the name this transformers version's forward takes. An eager
    call's ``logits_to_keep=k`` becomes the index of the last ``k`` rows (:func:`last_rows`)."""
    if "past_key_values" in inputs:
        inputs[cache_argument(type(model))] = inputs.pop("past_key_values")
    keep = inputs.get("logits_to_keep")
    if isinstance(keep, int) and keep > 0 and not torch.compiler.is_compiling():
        inputs["logits_to_keep"] = last_rows(inputs["input_ids"], keep)
    with own_kernels(model):
        return model(**inputs)


def last_rows(input_ids: torch.Tensor, k: int) -> torch.Tensor:
    """The index of the last ``k`` of ``input_ids``' rows, for ``logits_to_keep``. An int makes HF slice the hidden
    states, and the LM head over that slice (a view at an offset into the prompt's hidden states) takes a slow
    kernel on this project's CPU: 1.4-1.5 s for one row of the 1.5B target in bfloat16 against 28 ms over a
    tensor of its own; a 126-token prompt's eager forward 2.38 s against 1.09 s
    (``experiments/bench_lm_head_slice.py``).
    An index gathers the rows into a tensor of their own."""
    n = input_ids.shape[-1]
    return torch.arange(max(n - k, 0), n, device=input_ids.device)
