"""KV cache for tree verification, driven through the stock HuggingFace forward.

``TreeCache`` is a ``transformers`` ``Cache`` whose layers preallocate their key/value buffers
(gpt-fast style): appending writes into the buffer, and committing the accepted path is a gather
of a few rows plus a new length. ``forward_masked`` runs an unmodified model over new tokens with
an explicit 4D additive mask and explicit position ids (``docs/design.md``, "Tree attention on HuggingFace models").

Both run the model through ``attention.tree_forward`` (grouped-query SDPA without copying the
key/value heads). The compiled steps' cache, of fixed shapes, is ``treespec.core.static_cache``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from transformers.cache_utils import Cache, DynamicLayer

from .attention import tree_forward
from .checks import context_of

if TYPE_CHECKING:
    from .drafting import Forward
    from .tree import FlatTree


class TreeKVLayer(DynamicLayer):
    """One layer's K/V in a growable preallocated buffer; rows ``[0, length)`` are valid."""

    def __init__(self, capacity: int = 256) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        # zeros, not new_empty: masked slots still enter the attention product, and NaN garbage
        # there would give NaN (0 * NaN) whatever the mask says
        self._k = key_states.new_zeros(b, h, self.capacity, d)
        self._v = value_states.new_zeros(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        if needed <= self._k.shape[-2]:
            return
        size = max(needed, 2 * self._k.shape[-2])

        def grow(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t.new_zeros(*t.shape[:-2], size - t.shape[-2], t.shape[-1])], dim=-2)
        self._k, self._v = grow(self._k), grow(self._v)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self._reserve(self.length + n)
        self._k[..., self.length : self.length + n, :] = key_states
        self._v[..., self.length : self.length + n, :] = value_states
        self.length += n
        self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def keep(self, prefix: int, rows: torch.Tensor) -> None:
        """Keep rows ``[0, prefix)`` followed by ``rows`` (absolute, increasing, >= prefix), in every batch row."""
        if self.is_initialized:
            self.move(Moves.of([prefix] * self._k.shape[0], [rows] * self._k.shape[0], self.device))

    def move(self, moves: "Moves") -> None:
        """Per batch row ``b`` (a batch of prompts, ``treespec.core.batch``): keep its slots ``[0, prefix_b)``
        followed by its kept slots (:class:`Moves`: every row's in one gather and one write per tensor). The next
        tokens are written after the longest row kept; a shorter row's slots between its length and that offset
        are stale (its masks never allow them)."""
        if not self.is_initialized:
            return
        if moves.one is not None:  # one row moves: into a slice of it, cheaper than a scatter
            b, start = moves.one
            self._k[b, :, start : start + len(moves.src)] = self._k[b, :, moves.src]
            self._v[b, :, start : start + len(moves.src)] = self._v[b, :, moves.src]
        elif len(moves.src):  # the gather reads every source before the write (a row's kept slots move down)
            self._k[moves.batch, :, moves.dst] = self._k[moves.batch, :, moves.src]
            self._v[moves.batch, :, moves.dst] = self._v[moves.batch, :, moves.src]
        self.length = moves.length
        self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]

    def select(self, batch_rows: torch.Tensor) -> None:
        """Keep only these batch rows (a finished prompt leaves the batch)."""
        if self.is_initialized:
            self._k, self._v = self._k.index_select(0, batch_rows), self._v.index_select(0, batch_rows)
            self.keys, self.values = self._k[..., : self.length, :], self._v[..., : self.length, :]

    def crop(self, tokens_to_remove: int) -> None:
        self.keep(max(self.length - abs(tokens_to_remove), 0), torch.empty(0, dtype=torch.long))

    def reset(self) -> None:
        self.length = 0
        self.is_initialized = False
        self.keys = self.values = None


class TreeCache(Cache):
    """A KV cache whose committed rows stay contiguous; see ``keep``."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=TreeKVLayer)

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def keep(self, prefix: int, rows: torch.Tensor | list[int]) -> None:
        """Keep the first ``prefix`` rows and then ``rows`` (absolute indices, increasing), contiguously.

        The index is moved once per device (a target dispatched over several devices keeps each
        layer's cache on its layer's device)."""
        self.keep_rows([prefix], [rows])

    def keep_rows(self, prefixes: Sequence[int], rows: Sequence[torch.Tensor | list[int]]) -> None:
        """:meth:`keep` per batch row: row ``b`` keeps ``[0, prefixes[b])`` then ``rows[b]`` (one prefix and one
        index for a batch of one apply to every row; see ``TreeKVLayer.keep_rows``)."""
        # rows already in place (a chain's accepted path, plain decoding's one token: the first rows after the prefix)
        # are kept by moving the prefix past them, with no copy (two per layer per step otherwise)
        prefixes, rows = zip(*(_in_place(p, r) for p, r in zip(prefixes, rows)))
        on: dict[torch.device, Moves] = {}
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            if layer.device not in on:
                batch = layer._k.shape[0]
                one = len(rows) == 1 and batch > 1  # one prefix and index for every row
                on[layer.device] = Moves.of(prefixes * batch if one else prefixes, rows * batch if one else rows,
                                            layer.device)
            layer.move(on[layer.device])

    def select(self, batch_rows: Sequence[int]) -> None:
        """Keep only these batch rows, in this order."""
        index: dict[torch.device, torch.Tensor] = {}
        for layer in self.layers:
            if layer.is_initialized:
                layer.select(index.setdefault(layer.device, torch.tensor(list(batch_rows), dtype=torch.long,
                                                                     device=layer.device)))


@dataclass(frozen=True)
class Moves:
    """The slot moves of a commit over a batch's rows, as three indices: slot ``src[i]`` of batch row ``batch[i]``
    moves to its slot ``dst[i]``; ``length``: the longest row's slots after it. When a single row moves, ``one`` is
    that row and its first destination slot (its slots ``src`` follow it), and ``batch`` and ``dst`` are empty; when
    none moves, all three are."""

    batch: torch.Tensor
    dst: torch.Tensor
    src: torch.Tensor
    length: int
    one: tuple[int, int] | None

    @classmethod
    def of(cls, prefixes: Sequence[int], rows: Sequence[torch.Tensor | Sequence[int]], device: torch.device
           ) -> "Moves":
        """Batch row ``b`` keeps ``[0, prefixes[b])`` then its slots ``rows[b]`` (increasing, >= its prefix),
        which move to follow the prefix. Built on the host (an index on a device: on that device) and moved once."""
        sizes = [len(r) for r in rows]
        kept = [b for b, m in enumerate(sizes) if m]
        length = max(p + m for p, m in zip(prefixes, sizes))
        if not kept:  # every row's slots in place already (a chain's path, plain decoding): nothing moves
            return cls(EMPTY, EMPTY, EMPTY, length, None)
        if len(kept) == 1:  # a prompt alone, or the one row of a batch that keeps slots
            b = kept[0]
            return cls(EMPTY, EMPTY, torch.as_tensor(rows[b], dtype=torch.long).to(device), length, (b, prefixes[b]))
        if any(isinstance(rows[b], torch.Tensor) and rows[b].device.type != "cpu" for b in kept):
            src = torch.cat([torch.as_tensor(rows[b], dtype=torch.long, device=device) for b in kept])
        else:
            src = torch.from_numpy(np.concatenate([np.asarray(rows[b], dtype=np.int64) for b in kept]))
        batch = np.repeat(np.array(kept, dtype=np.int64), [sizes[b] for b in kept])
        dst = np.concatenate([np.arange(prefixes[b], prefixes[b] + sizes[b]) for b in kept])
        return cls(torch.from_numpy(batch).to(device), torch.from_numpy(dst).to(device), src.to(device), length, None)


#: an empty index
EMPTY = torch.zeros(0, dtype=torch.long)


def _in_place(prefix: int, rows: torch.Tensor | Sequence[int]) -> tuple[int, torch.Tensor | Sequence[int]]:
    """``(prefix, rows)`` to keep, as ``(prefix + len(rows), ())`` when ``rows`` are the rows right after ``prefix``
    already (read on the host only: a device index is kept as given)."""
    if isinstance(rows, torch.Tensor) and rows.device.type != "cpu":
        return prefix, rows
    index = np.asarray(rows, dtype=np.int64)
    if index.size and np.array_equal(index, np.arange(prefix, prefix + index.size)):
        return prefix + int(index.size), ()
    return prefix, rows


class RowsCache(TreeCache):
    """A :class:`TreeCache` over the rows of a batch of prompts (``treespec.core.batch``): batch row ``b`` holds
    its row's committed tokens in slots ``[0, lengths[b])``. :meth:`forward` writes every row's new tokens at
    one offset (the longest row's length; a shorter row's slots below it are stale and masked) and then moves
    each row's to follow its own length, so each row sees a cache of its own (:class:`RowCache`). Rows are named
    by their index in the batch as it started; a finished row leaves (:meth:`drop`)."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = list(range(rows))  # the row in each batch row
        self.lengths = [0] * rows  # committed slots of each batch row
        #: row -> (prefix, kept slots): the rows' own keeps (:class:`RowCache`), applied together before the next
        #: forward (each row's drafter keeps its own slots at the start of its step: one pass over the batch for
        #: all of them, not one per row)
        self.pending: dict[int, tuple[int, torch.Tensor | list[int]]] = {}

    def length_of(self, row: int) -> int:
        if row in self.pending:
            prefix, kept = self.pending[row]
            return prefix + len(kept)
        return self.lengths[self.rows.index(row)]

    def flush(self) -> None:
        """Apply the rows' pending keeps (:meth:`keep_row`), all in one pass."""
        if self.pending:
            pending, self.pending = self.pending, {}
            self.keep_each(pending)

    def forward(self, model: torch.nn.Module, asks: dict[int, "Forward"]) -> dict[int, torch.Tensor]:
        """One forward of ``model`` over every row's ask (``drafting.Forward``, in the row's own coordinates;
        rows without one get padding): the asks' logits by row. A row's padding attends to itself only. Prompts
        into this empty cache (every ask a ``prompt``) go row by row instead (:meth:`prompts`)."""
        self.flush()
        if self.length == 0 and all(a.prompt for a in asks.values()):
            return self.prompts(model, asks)
        device, past = next(iter(asks.values())).ids.device, self.length
        n, at = max(len(a.ids) for a in asks.values()), {row: b for b, row in enumerate(self.rows)}
        asked = [asks.get(row) for row in self.rows]
        none = torch.zeros(0, dtype=torch.long, device=device)
        ids = pad_sequence([none if a is None else a.ids for a in asked], batch_first=True)
        pos = pad_sequence([none if a is None else a.positions for a in asked], batch_first=True)
        allowed = np.zeros((len(self.rows), n, past + n), dtype=bool)  # built on the host: one copy
        allowed[:, :, past:] = np.eye(n, dtype=bool)
        new = [0 if a is None else len(a.ids) for a in asked]
        for b, a in enumerate(asked):
            if a is not None:
                k, length, mask = new[b], self.lengths[b], a.allowed.cpu().numpy()
                allowed[b, :k, :length] = mask[:, :length]
                allowed[b, :k, past : past + k] = mask[:, length:]
        last = all(a.last for a in asks.values())  # then only each ask's last row goes through the LM head
        keep = sorted({new[at[row]] - 1 for row in asks}) if last else []
        logits = forward_masked(model, self, ids, pos, torch.from_numpy(allowed),
                                logits_to_keep=torch.tensor(keep, device=device) if last else 0)
        self.keep_rows(self.lengths, [np.arange(past, past + k) for k in new])  # each row's new slots follow its own
        if not last:
            return {row: logits[at[row], : new[at[row]]] for row in asks}
        column = {k: i for i, k in enumerate(keep)}
        return {row: logits[at[row], column[new[at[row]] - 1]][None] for row in asks}

    def prompts(self, model: torch.nn.Module, asks: dict[int, "Forward"]) -> dict[int, torch.Tensor]:
        """Each row's prompt into this empty cache through a forward of its own (:func:`forward_prompt`: the
        model's causal route, no mask, no padding), its keys and values then laid into the row's slots: each row
        holds, and each row's logits are, exactly what its prompt gives alone. One forward of the rows padded to
        the longest under a mask ran 1.3-2.5x as long on this project's CPU (4 and 8 HumanEval prompts of 94-274
        tokens, the int4 pair; ``experiments/bench_batch_prefill.py``), and an int4 draft's int8 twins quantise
        each forward's activations together, so a row's logits there moved with the batch's other rows. Rows of
        one prompt (several samples of it) share its forward (:func:`forward_each`)."""
        forwarded = forward_each(model, {row: (a.ids, 1 if a.last else 0) for row, a in asks.items()})
        alone = {row: cache for row, (cache, _) in forwarded.items()}
        logits = {row: out for row, (_, out) in forwarded.items()}
        lengths = {row: len(a.ids) for row, a in asks.items()}
        n = max(lengths.values())
        for i, first in enumerate(alone[next(iter(asks))].layers):
            k = first.keys.new_zeros(len(self.rows), first.keys.shape[1], n, first.keys.shape[-1])
            v = first.values.new_zeros(len(self.rows), first.values.shape[1], n, first.values.shape[-1])
            for row, cache in alone.items():
                b = self.rows.index(row)
                k[b, :, : lengths[row]] = cache.layers[i].keys[0]
                v[b, :, : lengths[row]] = cache.layers[i].values[0]
            self.update(k, v, i)  # a row's slots past its own length are zeros its masks never allow
        self.lengths = [lengths.get(row, 0) for row in self.rows]
        return logits

    def keep_rows(self, prefixes: Sequence[int], rows: Sequence[torch.Tensor | list[int]]) -> None:
        self.flush()  # the rows' waiting keeps first: ``prefixes`` and ``rows`` are of what the rows hold after them
        super().keep_rows(prefixes, rows)
        self.lengths = [p + len(r) for p, r in zip(prefixes, rows)]

    def keep_row(self, row: int, prefix: int, kept: torch.Tensor | list[int]) -> None:
        """:meth:`TreeCache.keep` for one row: its slots ``[0, prefix)`` then ``kept`` (the others unchanged), when
        the cache is next forwarded or its rows kept (:attr:`pending`; :meth:`length_of` counts it at once)."""
        if row in self.pending:  # a row keeps from what it holds now (the other rows' keeps touch only theirs)
            self.flush()
        self.pending[row] = (prefix, kept)

    def keep_each(self, kept: dict[int, tuple[int, torch.Tensor | list[int]]]) -> None:
        """:meth:`keep_row` for several rows in one pass (row -> its prefix and kept slots; the others unchanged)."""
        self.flush()
        self.keep_rows([kept[row][0] if row in kept else n for row, n in zip(self.rows, self.lengths)],
                       [kept[row][1] if row in kept else [] for row in self.rows])

    def drop(self, rows: Sequence[int]) -> None:
        """These rows finished: they leave the batch (their slots are freed)."""
        self.flush()
        stay = [b for b, row in enumerate(self.rows) if row not in set(rows)]
        self.select(stay)
        self.rows = [self.rows[b] for b in stay]
        self.lengths = [self.lengths[b] for b in stay]


class RowCache:
    """One row of a :class:`RowsCache` seen as a cache of its own (its ``length`` and ``keep``): the cache of a
    batch row's drafter, whose forwards the batch runs for every row at once."""

    def __init__(self, rows: RowsCache, row: int) -> None:
        self.rows, self.row = rows, row

    @property
    def length(self) -> int:
        return self.rows.length_of(self.row)

    def keep(self, prefix: int, rows: torch.Tensor | list[int]) -> None:
        self.rows.keep_row(self.row, prefix, rows)


def tree_inputs(flat: "FlatTree", past: int, root_cached: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The token ids, positions and mask ``allowed`` (``[n, past + n]``) of a forward of ``flat`` after ``past``
    cached rows, each node attending to every cached row and to its ancestors. ``root_cached``: the root is the
    last cached row already (the prefill took it and holds its logits), so only the nodes below it go in."""
    s = int(root_cached)
    n = len(flat) - s
    allowed = torch.ones(n, past + n, dtype=torch.bool)
    allowed[:, past:] = torch.from_numpy(flat.ancestors[s:, s:])
    return torch.from_numpy(flat.tokens[s:]), torch.from_numpy(past - s + flat.depth[s:]), allowed


def kept_rows(flat: "FlatTree", path: Sequence[int], past: int, root_cached: bool = False) -> np.ndarray:
    """The cache rows the accepted ``path`` (tree nodes, the root first) was written to by a forward of
    :func:`tree_inputs`, to keep after the ``past`` committed rows (a cached root is among those already)."""
    rows = past - int(root_cached) + flat.index[list(path)]
    return rows[1:] if root_cached else rows


def forward_masked(
    model: torch.nn.Module,
    cache: TreeCache,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    allowed: torch.Tensor,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """One forward of ``model`` over ``n`` new tokens appended to ``cache``.

    ``allowed[i, j]`` (bool, ``[n, cache.length + n]``) says whether new token ``i`` attends to key
    ``j``. It is passed as an additive float mask (0 or the dtype's minimum), the encoding that is
    correct under both ``sdpa`` and ``eager``. Returns logits ``[n, V]`` (or the last
    ``logits_to_keep`` rows). A batch (``treespec.core.batch``) passes ``input_ids`` and ``position_ids``
    ``[B, n]`` and ``allowed`` ``[B, n, cache.length + n]``, and gets ``[B, n, V]``.
    """
    batched = input_ids.dim() == 2
    device = input_ids.device
    dtype = model.dtype
    context = context_of(model)
    if context is not None:
        # a node past the model's context is never emitted (a target's: ``step.tree_depth``; a draft's:
        # ``checks.check_reach`` holds the run inside its context) and its forward feeds deeper ones only: clamped,
        # as ``StaticTreeCache.forward`` does, so that no table of positions is read past its end
        position_ids = position_ids.clamp(max=context - 1)
    allowed = allowed.to(device, non_blocking=True)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    out = tree_forward(
        model,
        input_ids=input_ids if batched else input_ids[None],
        attention_mask=mask[:, None] if batched else mask[None, None],
        position_ids=position_ids if batched else position_ids[None],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=logits_to_keep,
    )
    return out.logits if batched else out.logits[0]


def forward_prompt(model: torch.nn.Module, cache: TreeCache, input_ids: torch.Tensor,
                   logits_to_keep: int = 1) -> torch.Tensor:
    """A prompt's forward into an empty ``cache``: ``input_ids [n]`` at positions ``0..n-1`` under ordinary causal
    attention, with no mask passed, so the model takes its own causal route (SDPA's causal kernel, no ``[n, n]``
    additive mask), as HF's prefill does: the same numbers as :func:`forward_masked` with :func:`causal_allowed`
    and, on long prompts, less time: on a Zen 4 host 18.8 s against 20.6 s for the int4 target's 1,900-token prompt
    (HF's own 18.8 s), 4.5 s against 6.1 s for the int4 draft's; within a few percent up to 512 tokens
    (``experiments/results/prompt-forward-cpu``). Returns the last ``logits_to_keep`` rows' logits."""
    if cache.length:
        raise ValueError(f"forward_prompt fills an empty cache; this one holds {cache.length} tokens")
    n = input_ids.shape[-1]
    out = tree_forward(model, input_ids=input_ids[None], position_ids=torch.arange(n, device=input_ids.device)[None],
                       past_key_values=cache, use_cache=True, logits_to_keep=logits_to_keep)
    return out.logits[0]


def forward_each(model: torch.nn.Module, prompts: dict[int, tuple[torch.Tensor, int]]
                 ) -> dict[int, tuple[TreeCache, torch.Tensor]]:
    """Each row's prompt (row -> ``(input_ids, logits_to_keep)``) through :func:`forward_prompt` into a cache of its
    own: row -> (that cache, its logits). Rows of one prompt share its forward (a cache read only, and a copy of
    the logits each: a row may scale its own in place)."""
    out: dict[int, tuple[TreeCache, torch.Tensor]] = {}
    first_of: dict[tuple, int] = {}  # a prompt and its logits_to_keep -> its first row
    for row, (ids, keep) in prompts.items():
        same = first_of.setdefault((keep, *ids.tolist()), row)
        if same == row:
            cache = TreeCache()
            out[row] = cache, forward_prompt(model, cache, ids, logits_to_keep=keep)
        else:
            out[row] = out[same][0], out[same][1].clone()
    return out


def causal_allowed(past: int, n: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Mask for ``n`` new tokens in sequence after ``past`` cached ones: ordinary causal attention."""
    allowed = torch.ones(n, past + n, dtype=torch.bool, device=device)
    allowed[:, past:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return allowed


def kv_shape(config) -> tuple[int, int, int]:
    """``(layers, kv heads, head dim)`` of a HF decoder config."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or heads, head_dim
