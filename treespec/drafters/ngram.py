"""A model-free drafter: n-gram frequency tables and prompt lookup over the running context.

Follows the akunu n-gram drafter (a book chapter on n-gram speculative decoding): frequency
tables for orders ``2..max_order`` (up to ``max_order - 1`` tokens of context), the longest matching
context first, the most frequent continuation, predictions chained on the drafter's own guesses,
and a sliding history window. Two things differ from the chapter on purpose:

* the tables count only the n-grams that lie entirely inside the last ``window`` tokens: when a
  token leaves the window, the n-grams that start at it are removed (the chapter keeps counting
  them and windows only the history);
* ties between equally frequent continuations are broken deterministically: **the continuation
  whose latest occurrence is the most recent wins** (the chapter's hash-map scan leaves ties to
  the iteration order of its table).

Beyond the chapter:

* ``width > 1`` proposes the top-``width`` continuations at every position and chains each of them
  further, a small n-gram *tree*. When the longest matching context has fewer than ``width``
  continuations, the list is filled from shorter contexts (back-off), skipping tokens already
  listed, so a token is never proposed twice under the same parent.
* ``mode="prompt_lookup"`` matches the last ``n`` tokens (``n`` from ``max_order - 1`` down to 1)
  against earlier positions of the windowed context, most recent match first, and copies the
  ``max_tokens`` tokens that followed the match. A match near the end copies with overlap
  (LZ77-style: the copy reads its own earlier output), so a repeating pattern keeps repeating.
  With ``width > 1`` the distinct continuations of the several most recent matches (falling back to
  shorter ``n``) are merged into a trie.

All proposals are deterministic candidates, i.e. point masses (``dist_rows=None``): verification is
exact whatever the tables contain. The proposal order is fixed and computed without randomness:
breadth-first for the n-gram tree (level by level; within a level, parents in proposal order and
children best first), chain by chain for prompt lookup. An optional ``max_nodes`` cap keeps the
first ``max_nodes`` proposals of that order, so it is decided by order only, never by value.

Updates are incremental. ``NGramDrafter.propose(context)`` feeds the tables only the tokens appended
since the previous call; when the context is not an extension of what the drafter saw (checked on
the last ``window`` tokens, which is all the tables depend on) it rebuilds them from the last
``window`` tokens of the context.
"""

from __future__ import annotations

from typing import Sequence

from ..core.checks import check_int
from ..core.drafting import Drafter, DraftProposals
from ..core.sampling import SamplingParams
from .ngram_index import NGramTables, PromptLookupIndex, as_token_list, check_order_window

__all__ = ["MODES", "NGramTables", "PromptLookupIndex", "NGramDrafter"]

#: drafting modes of :class:`NGramDrafter`
MODES = ("ngram", "prompt_lookup")


class NGramDrafter(Drafter):
    """Drafts from n-gram tables (``mode="ngram"``) or prompt lookup (``mode="prompt_lookup"``).

    Args:
        max_order: largest n-gram order (``max_order - 1`` tokens of context); >= 2. In prompt-lookup
            mode the longest matched suffix has ``max_order - 1`` tokens.
        max_tokens: depth of the drafted chain or tree; >= 1.
        width: candidates per node (n-gram mode) or distinct continuations (prompt lookup); >= 1.
        window: the tables see only the last ``window`` committed tokens; >= max_order.
        mode: ``"ngram"`` or ``"prompt_lookup"``.
        max_nodes: optional cap on the number of proposals, applied by proposal order; >= 1.

    Returns empty proposals when it has nothing to predict (the engine then does a plain step).
    """

    def __init__(
        self,
        max_order: int = 4,
        max_tokens: int = 4,
        width: int = 1,
        window: int = 512,
        mode: str = "ngram",
        max_nodes: int | None = None,
    ) -> None:
        check_order_window(max_order, window)
        max_tokens = check_int("max_tokens", max_tokens, 1,
                                "it is the number of tokens drafted per step; pass e.g. max_tokens=4.")
        width = check_int("width", width, 1, "it is the number of candidates per node; pass width=1 for a chain.")
        if max_nodes is not None:
            max_nodes = check_int("max_nodes", max_nodes, 1, "it caps the proposals per step; pass None for no cap.")
        if not isinstance(mode, str) or mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; pass one of {', '.join(repr(m) for m in MODES)}.")
        self.max_order = int(max_order)
        self.max_tokens = max_tokens
        self.width = width
        self.window = int(window)
        self.mode = mode
        self.max_nodes = max_nodes
        self._tables: NGramTables | PromptLookupIndex | None = None
        self._seen = 0  # length of the committed sequence the tables reflect

    @property
    def tables(self) -> NGramTables | PromptLookupIndex | None:
        """The underlying predictor (None before the first ``reset``/``propose``)."""
        return self._tables

    def _new_tables(self) -> NGramTables | PromptLookupIndex:
        cls = NGramTables if self.mode == "ngram" else PromptLookupIndex
        return cls(self.max_order, self.window)

    def _rebuild(self, context: list[int]) -> None:
        self._tables = self._new_tables()
        self._tables.update(context[-self.window :])  # the tables depend on the window only
        self._seen = len(context)

    def reset(self, prompt: Sequence[int], *, sampling: SamplingParams | None = None, seed: int = 0) -> None:
        """Seed the tables from ``prompt``. Deterministic: ``sampling`` and ``seed`` are not used."""
        self._rebuild(as_token_list(prompt))

    def _sync(self, context: list[int]) -> None:
        """Bring the tables to ``context``: append the new tokens, or rebuild if it is not an extension."""
        t = self._tables
        n = len(context)
        if t is None or n < self._seen:
            self._rebuild(context)
            return
        k = len(t)  # == min(self._seen, window) tokens, all the tables depend on
        if context[self._seen - k : self._seen] != t.history():
            self._rebuild(context)
            return
        if n > self._seen:
            t.update(context[self._seen :])
            self._seen = n

    def propose(self, context: Sequence[int]) -> DraftProposals:
        """Proposals below ``context[-1]``: point masses, parents before children."""
        ctx = as_token_list(context)
        self._sync(ctx)
        if not ctx:
            return DraftProposals()
        t = self._tables
        if isinstance(t, NGramTables):
            tokens, parents = t.tree(
                ctx[-(self.max_order - 1) :], max_tokens=self.max_tokens, width=self.width, max_nodes=self.max_nodes
            )
        else:
            assert t is not None
            tokens, parents = t.tree(max_tokens=self.max_tokens, width=self.width, max_nodes=self.max_nodes)
        return DraftProposals(tokens=tokens, parents=parents)

    def given_chain(self) -> int | str:
        """A chain (``width=1``) of at most ``max_tokens`` (and ``max_nodes``) tokens; a tree of several widths
        is not one chain."""
        if self.width != 1:
            return f"{self.describe()} proposes a tree (width {self.width}); width=1 proposes one chain"
        return min(self.max_tokens, self.max_nodes or self.max_tokens)

    def describe(self) -> str:
        extra = ""
        if self.window != 512:
            extra += f", window={self.window}"
        if self.max_nodes is not None:
            extra += f", nodes<={self.max_nodes}"
        return f"{self.mode}(order<={self.max_order}, tokens<={self.max_tokens}, width={self.width}{extra})"
