"""The compiled steps' KV cache: zero-filled ``[B, H, C, D]`` buffers at fixed addresses and a committed length
that is a device tensor (one per batch row), so a step has the same shapes every time and rollback is an index
(gpt-fast style). Driven through the stock HuggingFace forward (``attention.tree_forward``) with a 4D mask built
on the device from the committed length and the tree's block of columns.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import Cache, StaticLayer

from . import attention
from .attention import cache_argument, tree_forward
from .checks import context_of
from .kv import forward_each, kv_shape


class StaticTreeLayer(StaticLayer):
    """One layer's K/V buffers ``[B, H, C, D]``; new tokens are written at ``length + arange(n)`` (per row)."""

    def __init__(self, capacity: int, length: torch.Tensor) -> None:
        super().__init__(max_cache_len=capacity)
        self.cumulative_length = length  # shared by every layer of the cache (see StaticTreeCache)
        self.write_start: torch.Tensor | None = None  # where a forward writes (None: at the committed length)

    def allocate(self, rows: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.batch_size, self.num_heads = rows, heads
        self.k_head_dim = self.v_head_dim = head_dim
        self.keys = torch.zeros(rows, heads, self.max_cache_len, head_dim, dtype=dtype, device=device)
        self.values = torch.zeros_like(self.keys)
        # fixed data pointers: compiled graphs (and CUDA graphs) may mutate them in place. guard=True: under
        # inductor's weight freezing a static tensor becomes an attribute of the graph, so a graph compiled
        # for one cache must not pass its guards with another cache (it would read and write the first one)
        torch._dynamo.mark_static_address(self.keys, guard=True)
        torch._dynamo.mark_static_address(self.values, guard=True)
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("StaticTreeLayer is allocated by StaticTreeCache, never lazily")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self.cumulative_length if self.write_start is None else self.write_start
        slots = start[..., None] + torch.arange(key_states.shape[-2], device=self.device)  # [n], or [B, n] by row
        write_rows(self.keys, slots, key_states)
        write_rows(self.values, slots, value_states)
        return self.keys, self.values


def cached_parts(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[int]]:
    """What a prefill caches of each prompt (all but its last token), right-padded with 0 to the longest
    (``[B, n]``), and each row's own token count."""
    lengths = [len(p) - 1 for p in prompts]
    n = max(lengths)
    return torch.tensor([list(p[:-1]) + [0] * (n - k) for p, k in zip(prompts, lengths)], dtype=torch.long), lengths


def write_rows(buffer: torch.Tensor, slots: torch.Tensor, states: torch.Tensor) -> None:
    """``buffer[:, :, slots] = states`` (``[B, H, n, D]``): the same slots for the one row (``slots`` ``[n]``), or
    each row's own (``[B, n]``; a batch of one takes the one row's index copy)."""
    if slots.shape[0] == 1 or slots.dim() == 1:
        buffer.index_copy_(2, slots.view(-1), states)
    else:
        batch = torch.arange(slots.shape[0], device=slots.device)[:, None]
        buffer[batch, :, slots] = states.transpose(1, 2)  # indexed as [B, n, H, D]


def read_rows(buffer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``buffer[:, :, slots]`` as ``[B, H, n, D]`` (``slots`` as :func:`write_rows` takes them)."""
    if slots.shape[0] == 1 or slots.dim() == 1:
        return buffer.index_select(2, slots.view(-1))
    batch = torch.arange(slots.shape[0], device=slots.device)[:, None]
    return buffer[batch, :, slots].transpose(1, 2)


class StaticTreeCache(Cache):
    """Preallocated tree-verification cache for ``model``; rows ``[0, length)`` are committed.

    ``length`` is a device tensor: 0-d for one sequence (``rows=None``), ``[B]`` for ``rows=B`` sequences,
    each batch row at its own length (``treespec.core.captured``'s batches). A forward over ``n`` tokens
    writes slots ``[length, length + n)`` (per row) and leaves ``length`` alone; ``commit`` then keeps the
    accepted rows.
    """

    def __init__(self, model: torch.nn.Module, capacity: int, rows: int | None = None) -> None:
        n_layers, heads, head_dim = kv_shape(model.config)
        param = next(model.parameters())
        self.capacity, self.rows = capacity, rows
        # the attention mask's dtype, read once: a traced ``model.dtype`` walks every parameter (7% of a graph's trace)
        self.mask_dtype = model.dtype
        # the last position a token can be committed at (None: no context given). A fixed tree near the end of the
        # context holds nodes past it, whose outputs are never used (the run ends first: ``checks.check_lengths``);
        # their positions are clamped here so that no forward shows the model a position past its context, where
        # a "dynamic" RoPE would recompute its frequencies for every token of that forward (HF's
        # ``dynamic_rope_update``: the kept nodes' logits would then differ from the target's own)
        context = context_of(model)
        self.last_position = None if context is None else context - 1
        self.length = torch.zeros(() if rows is None else (rows,), dtype=torch.long, device=param.device)
        torch._dynamo.mark_static_address(self.length, guard=True)
        layers = [StaticTreeLayer(capacity, self.length) for _ in range(n_layers)]
        super().__init__(layers=layers)
        for layer in layers:
            layer.allocate(rows or 1, heads, head_dim, param.dtype, param.device)
        # the forward's name for its cache, resolved here: a compiled forward reads this attribute, never
        # attention's memo, whose length its graph would guard on (another model class's first forward would
        # then compile every earlier graph again)
        self.cache_argument = cache_argument(type(model))

    def forward(self, model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor, block: torch.Tensor,
                committed: torch.Tensor | None = None, write_start: torch.Tensor | None = None,
                logits_to_keep: int = 0, flex: bool = False) -> torch.Tensor:
        """``model`` over ``ids`` written at slots ``[write_start, write_start + n)``, not committed.

        Each token attends to the ``committed`` rows (default: ``length``) and, inside the block of rows
        ``[committed, committed + S)``, to the columns ``block[i]`` (bool ``[n, S]``: its tree ancestors
        and itself). ``write_start`` defaults to ``committed`` (a tree drafted level by level writes each
        level further into its block). The mask is built on the device, so shapes never change. A
        compiled graph that only reads ``length`` should pass it as ``committed`` (a graph input):
        inductor's weight freezing folds static tensors a graph does not mutate into constants.
        Returns logits ``[n, V]`` (the last ``logits_to_keep`` rows if given). A batched cache takes
        ``ids``, ``positions`` ``[B, n]``, ``committed``, ``write_start`` ``[B]`` and ``block`` ``[n, S]``
        or ``[B, n, S]``, and returns ``[B, n, V]``. ``flex``: the mask as a FlexAttention block mask
        (``attention.tree_flex``; a static token count).
        """
        committed = self.length if committed is None else committed
        if self.last_position is not None:
            positions = positions.clamp(max=self.last_position)
        n_block = block.shape[-1]
        rel = torch.arange(self.capacity, device=block.device) - committed[..., None]  # [C], or [B, C]
        inside = (rel >= 0) & (rel < n_block)
        if rel.dim() == 1:
            allowed = (rel < 0) | (block[:, rel.clamp(0, n_block - 1)] & inside)
            mask_rows, ids, positions = allowed[None, None], ids[None], positions[None]
        else:
            b, n = ids.shape
            cols = rel.clamp(0, n_block - 1)[:, None, :].expand(b, n, self.capacity)
            allowed = (rel < 0)[:, None] | (block.expand(b, n, n_block).gather(2, cols) & inside[:, None])
            mask_rows = allowed[:, None]
        if flex:
            mask = attention.block_mask(mask_rows)
        else:
            zero = torch.zeros((), dtype=self.mask_dtype, device=block.device)
            mask = torch.where(mask_rows, zero, torch.finfo(self.mask_dtype).min)
        for layer in self.layers:
            layer.write_start = committed if write_start is None else write_start
        out = tree_forward(model, input_ids=ids, attention_mask=mask, position_ids=positions,
                           use_cache=True, logits_to_keep=logits_to_keep, **{self.cache_argument: self})
        for layer in self.layers:
            layer.write_start = None
        return out.logits if self.rows is not None else out.logits[0]

    def prefill(self, model: torch.nn.Module, prompt: Sequence[int]) -> None:
        """Empty the cache and commit ``prompt[:-1]`` (eager: prompts vary in length and run once)."""
        self.prefill_rows(model, [prompt])

    def prefill_rows(self, model: torch.nn.Module, prompts: Sequence[Sequence[int]]) -> None:
        """Empty the cache and commit each row's ``prompt[:-1]``: each row's through ``kv.forward_prompt`` (no mask:
        the model's own causal route, as HF's prefill) into a growable cache, whose keys and values are then copied
        to the row's first slots. The static cache's own forward under a causal mask over its whole capacity took
        1.07-1.20x as long for the int4 target and 1.28-1.48x for the int4 draft at 128-1,900 tokens on a Zen 4 host
        (``experiments/results/prompt-forward-cpu``)."""
        self.reset()
        device = self.length.device
        rows = forward_each(model, {row: (torch.tensor(list(p[:-1]), device=device), 1)
                                    for row, p in enumerate(prompts) if len(p) > 1})
        for row, (grown, _) in rows.items():
            n = len(prompts[row]) - 1
            for layer, filled in zip(self.layers, grown.layers):
                layer.keys[row, :, :n] = filled.keys[0]
                layer.values[row, :, :n] = filled.values[0]
        self.length.copy_(torch.tensor([len(p) - 1 for p in prompts], device=device).view(self.length.shape))

    def commit(self, src: torch.Tensor, m: torch.Tensor) -> None:
        """Move rows ``src[:m]`` (absolute slots, increasing, ``>= length``) to ``[length, length + m)``
        (per batch row: ``src`` ``[B, P]``, ``m`` ``[B]``).

        ``src`` has a fixed size ``P``: the entries past ``m`` should be ``length + j`` (a no-op copy);
        whatever they copy lands beyond the new length, in scratch slots. One index for all layers.
        """
        dst = self.length[..., None] + torch.arange(src.shape[-1], device=src.device)
        for layer in self.layers:
            write_rows(layer.keys, dst, read_rows(layer.keys, src))
            write_rows(layer.values, dst, read_rows(layer.values, src))
        self.length.add_(m)

    def reset(self) -> None:
        """Empty the cache (buffers zeroed, addresses kept)."""
        self.length.zero_()
        for layer in self.layers:
            layer.keys.zero_()
            layer.values.zero_()
