"""The n-gram drafter's indexes over a sliding window of the context: frequency tables and prompt lookup.

See ``treespec.drafters.ngram`` for the rules (windowed counts, tie-breaking by recency, back-off
for ``width > 1``, LZ77-style overlapping copies for prompt lookup).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Iterable, Sequence

from ..core.checks import check_int
from ..core.drafting import ROOT

__all__ = ["NGramTables", "PromptLookupIndex", "as_token_list", "check_order_window"]


def check_order_window(max_order: object, window: object) -> None:
    """``max_order`` >= 2 and a ``window`` that holds one full n-gram (ValueError saying how to fix it)."""
    check_int("max_order", max_order, hint="pass e.g. max_order=4 (3 tokens of context).")
    if max_order < 2:
        raise ValueError(
            f"n-gram order must be >= 2 (a bigram has one token of context), got max_order={max_order}; "
            "pass max_order=2 or more (the default 4 uses up to 3 tokens of context)."
        )
    check_int("window", window, hint="pass e.g. window=512.")
    if window < max_order:
        raise ValueError(
            f"window must be >= max_order so that one full n-gram fits in it, got window={window} < "
            f"max_order={max_order}; raise window (default 512) or lower max_order."
        )


def as_token_list(tokens: Iterable[int] | Sequence[int]) -> list[int]:
    """Plain Python ints from a list, tuple, tensor or array of token ids."""
    if isinstance(tokens, list):
        return tokens  # no copy: callers only read it
    if isinstance(tokens, tuple):
        return list(tokens)
    tolist = getattr(tokens, "tolist", None)
    if tolist is not None:
        out = tolist()
        return out if isinstance(out, list) else [out]
    return [int(t) for t in tokens]


class _SlidingHistory:
    """The last ``window`` tokens of a stream, with hooks called as n-grams enter and leave it.

    Positions are absolute: the ``i``-th token ever fed has position ``i``. The window holds
    positions ``start .. total - 1``.
    """

    def __init__(self, max_order: int, window: int) -> None:
        check_order_window(max_order, window)
        self.max_order = int(max_order)
        self.window = int(window)
        self.total = 0  # tokens fed so far
        self.start = 0  # absolute position of the oldest token in the window
        self._buf: list[int] = []  # tokens from absolute position _off on (a little more than the window)
        self._off = 0

    def __len__(self) -> int:
        """Number of tokens in the window."""
        return self.total - self.start

    def history(self) -> list[int]:
        """The tokens in the window, oldest first."""
        return self._buf[self.start - self._off :]

    def update(self, tokens: Iterable[int] | Sequence[int]) -> None:
        """Append ``tokens`` (committed tokens, in order) to the history and the tables."""
        for tok in as_token_list(tokens):
            if self.total - self.start == self.window:
                self._evict(self.start)
                self.start += 1
                if self.start - self._off > self.window:  # amortised O(1) trimming of the buffer
                    del self._buf[: self.start - self._off]
                    self._off = self.start
            self._buf.append(int(tok))
            self.total += 1
            self._add(self.total - 1)

    def _tok(self, pos: int) -> int:
        return self._buf[pos - self._off]

    def _slice(self, lo: int, hi: int) -> tuple[int, ...]:
        return tuple(self._buf[lo - self._off : hi - self._off])

    def _add(self, pos: int) -> None:  # the token at ``pos`` was appended
        raise NotImplementedError

    def _evict(self, pos: int) -> None:  # the token at ``pos`` (the oldest) is about to leave
        raise NotImplementedError


class NGramTables(_SlidingHistory):
    """Frequency tables of the n-grams (orders ``2..max_order``) inside the last ``window`` tokens.

    ``table[order][context] = {token: [count, latest position]}`` where ``context`` is a tuple of
    ``order - 1`` tokens. Each appended token adds one n-gram per order (the one ending at it); each
    token leaving the window removes the n-grams that start at it. Cost per token: O(max_order).
    """

    def __init__(self, max_order: int = 4, window: int = 512) -> None:
        super().__init__(max_order, window)
        self._tables: dict[int, dict[tuple[int, ...], dict[int, list[int]]]] = {
            n: {} for n in range(2, max_order + 1)
        }

    def _add(self, pos: int) -> None:
        tok = self._tok(pos)
        for n in range(2, self.max_order + 1):
            lo = pos - (n - 1)
            if lo < self.start:
                break
            conts = self._tables[n].setdefault(self._slice(lo, pos), {})
            entry = conts.get(tok)
            if entry is None:
                conts[tok] = [1, pos]
            else:
                entry[0] += 1
                entry[1] = pos

    def _evict(self, pos: int) -> None:
        for n in range(2, self.max_order + 1):
            end = pos + n - 1  # position of the continuation token
            if end >= self.total:
                break
            ctx = self._slice(pos, end)
            table = self._tables[n]
            conts = table[ctx]
            tok = self._tok(end)
            entry = conts[tok]
            entry[0] -= 1
            # The evicted occurrence is the oldest one, so ``entry[1]`` (the latest) stays valid.
            if entry[0] == 0:
                del conts[tok]
                if not conts:
                    del table[ctx]

    def counts(self, context: Sequence[int]) -> dict[int, int]:
        """How often each token follows exactly ``context`` (order ``len(context) + 1``) in the window."""
        context = tuple(as_token_list(context))
        if not 1 <= len(context) <= self.max_order - 1:
            raise ValueError(
                f"context must hold 1..{self.max_order - 1} tokens (max_order={self.max_order}), got {len(context)}."
            )
        conts = self._tables[len(context) + 1].get(context, {})
        return {tok: entry[0] for tok, entry in conts.items()}

    def snapshot(self) -> dict[int, dict[tuple[int, ...], dict[int, int]]]:
        """All counts, ``{order: {context: {token: count}}}`` (for tests and inspection)."""
        return {
            n: {ctx: {tok: e[0] for tok, e in conts.items()} for ctx, conts in table.items()}
            for n, table in self._tables.items()
        }

    def predict(self, context_suffix: Sequence[int], width: int = 1) -> list[tuple[int, int]]:
        """Up to ``width`` distinct next tokens after ``context_suffix``, best first, with their counts.

        The longest context first: the last ``max_order - 1`` tokens of ``context_suffix``, then
        shorter suffixes down to one token. Within one context, the most frequent continuation
        first; on equal counts the one seen most recently first. When the longest matching context
        has fewer than ``width`` continuations, the list is filled from shorter contexts, skipping
        tokens already listed (each count is the one of the context the token was taken from).
        ``[]`` when no suffix of ``context_suffix`` was ever followed by anything in the window.
        """
        check_int("width", width, 1, "it is the number of candidates wanted; pass width=1 for the best one.")
        suffix = as_token_list(context_suffix) if not isinstance(context_suffix, (list, tuple)) else context_suffix
        out: list[tuple[int, int]] = []
        listed: set[int] = set()
        for n in range(min(self.max_order, len(suffix) + 1), 1, -1):
            conts = self._tables[n].get(tuple(suffix[len(suffix) - (n - 1) :]))
            if not conts:
                continue
            if width == 1 and not out:
                tok, entry = max(conts.items(), key=lambda kv: (kv[1][0], kv[1][1]))
                return [(tok, entry[0])]
            need = width - len(out)
            best = heapq.nlargest(
                need + len(listed), conts.items(), key=lambda kv: (kv[1][0], kv[1][1])
            )
            for tok, entry in best:
                if tok not in listed:
                    out.append((tok, entry[0]))
                    listed.add(tok)
                    if len(out) == width:
                        return out
        return out

    def draft(self, context_suffix: Sequence[int], max_tokens: int = 4) -> list[int]:
        """The chapter's chained prediction: up to ``max_tokens`` tokens, each predicted from the
        context extended by the previous guesses. Stops at the first position with no prediction."""
        tokens, _ = self.tree(context_suffix, max_tokens=max_tokens, width=1)
        return tokens

    def tree(
        self,
        context_suffix: Sequence[int],
        *,
        max_tokens: int = 4,
        width: int = 1,
        max_nodes: int | None = None,
    ) -> tuple[list[int], list[int]]:
        """An n-gram tree below the last token of ``context_suffix``: ``(tokens, parents)``.

        Every node gets the top-``width`` predictions (see :meth:`predict`) from the context
        extended by the tokens on its path, down to depth ``max_tokens``. Order: breadth first;
        within a depth, parents in their own order, children best first. ``parents[j]`` is ``ROOT``
        (-1) or an earlier index. ``max_nodes`` keeps the first ``max_nodes`` nodes of that order.
        """
        check_int("max_tokens", max_tokens, 1, "it is the depth of the drafted tree.")
        if max_nodes is not None:
            check_int("max_nodes", max_nodes, 1, "it caps the proposals; pass None for no cap.")
        keep = self.max_order - 1
        tokens: list[int] = []
        parents: list[int] = []
        cap = max_nodes if max_nodes is not None else float("inf")
        suffix = tuple(int(x) for x in as_token_list(context_suffix)[-keep:])
        level: list[tuple[int, tuple[int, ...]]] = [(ROOT, suffix)]
        memo: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for _ in range(max_tokens):
            nxt: list[tuple[int, tuple[int, ...]]] = []
            for parent, ctx in level:
                preds = memo.get(ctx)
                if preds is None:
                    preds = memo[ctx] = self.predict(ctx, width)
                for tok, _count in preds:
                    if len(tokens) >= cap:
                        return tokens, parents
                    nxt.append((len(tokens), (ctx + (tok,))[-keep:]))
                    tokens.append(tok)
                    parents.append(parent)
            if not nxt:
                break
            level = nxt
        return tokens, parents


class PromptLookupIndex(_SlidingHistory):
    """Where each short n-gram (``n = 1 .. max_order - 1``) starts inside the last ``window`` tokens.

    ``index[n][ngram]`` is a deque of absolute start positions, oldest first; the window slides by
    popping from the left. Cost per token: O(max_order).
    """

    def __init__(self, max_order: int = 4, window: int = 512) -> None:
        super().__init__(max_order, window)
        self._index: dict[int, dict[tuple[int, ...], deque[int]]] = {n: {} for n in range(1, max_order)}

    def _add(self, pos: int) -> None:
        for n in range(1, self.max_order):
            lo = pos - n + 1
            if lo < self.start:
                break
            self._index[n].setdefault(self._slice(lo, pos + 1), deque()).append(lo)

    def _evict(self, pos: int) -> None:
        for n in range(1, self.max_order):
            if pos + n > self.total:
                break
            key = self._slice(pos, pos + n)
            starts = self._index[n][key]
            starts.popleft()  # the oldest occurrence is the one starting at ``pos``
            if not starts:
                del self._index[n][key]

    def continuations(self, max_tokens: int = 4, width: int = 1) -> list[list[int]]:
        """Up to ``width`` distinct continuations of the end of the history, ``max_tokens`` tokens each.

        Matches the last ``n`` tokens (``n = max_order - 1`` down to 1) at earlier positions of the
        window, most recent match first, and copies the tokens that followed it; a copy that reaches
        the end of the history goes on reading its own output (overlapping copy), so every
        continuation has exactly ``max_tokens`` tokens. Continuations equal to an earlier one are
        skipped. ``[]`` when the last token never occurred earlier in the window.
        """
        check_int("max_tokens", max_tokens, 1, "it is the length of each continuation.")
        check_int("width", width, 1, "it is the number of continuations wanted.")
        out: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        end = self.total
        for n in range(min(self.max_order - 1, len(self) - 1), 0, -1):
            starts = self._index[n].get(self._slice(end - n, end))
            if not starts:
                continue
            for s in reversed(starts):
                if s + n >= end:  # the suffix itself
                    continue
                cont: list[int] = []
                for i in range(max_tokens):
                    p = s + n + i
                    cont.append(self._tok(p) if p < end else cont[p - end])
                key = tuple(cont)
                if key in seen:
                    continue
                seen.add(key)
                out.append(cont)
                if len(out) == width:
                    return out
        return out

    def tree(
        self, *, max_tokens: int = 4, width: int = 1, max_nodes: int | None = None
    ) -> tuple[list[int], list[int]]:
        """The continuations of :meth:`continuations` merged into a trie: ``(tokens, parents)``.

        Order: continuation by continuation (most recent match first), each adding its new nodes
        root to leaf. ``max_nodes`` keeps the first ``max_nodes`` nodes of that order.
        """
        tokens: list[int] = []
        parents: list[int] = []
        children: dict[tuple[int, int], int] = {}
        cap = max_nodes if max_nodes is not None else float("inf")
        for cont in self.continuations(max_tokens, width):
            node = ROOT
            for tok in cont:
                child = children.get((node, tok))
                if child is None:
                    if len(tokens) >= cap:
                        return tokens, parents
                    child = children[(node, tok)] = len(tokens)
                    tokens.append(tok)
                    parents.append(node)
                node = child
        return tokens, parents
