"""Hand-worked checks of the n-gram drafter (treespec.drafters.ngram)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from treespec.core.drafting import ROOT, DraftProposals
from treespec.drafters.ngram import NGramDrafter, NGramTables, PromptLookupIndex
from treespec.core.sampling import SamplingParams

W = {w: i for i, w in enumerate("the cat sat on mat . under dog".split(), start=1)}
INV = {i: w for w, i in W.items()}


def ids(text: str) -> list[int]:
    return [W[w] for w in text.split()]


def words(tokens) -> str:
    return " ".join(INV[t] for t in tokens)


# "under the mat . the cat sat on the mat"
#   positions: under0 the1 mat2 .3 the4 cat5 sat6 on7 the8 mat9
CHAPTER = ids("under the mat . the cat sat on the mat")


def brute_counts(seq, max_order, window):
    """Reference: count every n-gram lying inside the last ``window`` tokens."""
    hist = seq[-window:]
    out = {n: {} for n in range(2, max_order + 1)}
    for n in range(2, max_order + 1):
        for i in range(len(hist) - n + 1):
            ctx, tok = tuple(hist[i : i + n - 1]), hist[i + n - 1]
            out[n].setdefault(ctx, Counter())[tok] += 1
    return {n: {c: dict(v) for c, v in t.items()} for n, t in out.items()}


def greedy():
    return SamplingParams(0.0)


# --------------------------------------------------------------------------- tables, by hand


def test_chapter_tables_by_hand():
    t = NGramTables(max_order=4, window=512)
    t.update(CHAPTER)
    # bigrams: "the" is followed by mat (pos 2 and 9) twice and by cat (pos 5) once
    assert t.counts(ids("the")) == {W["mat"]: 2, W["cat"]: 1}
    assert t.counts(ids("mat")) == {W["."]: 1}
    assert t.counts(ids("on")) == {W["the"]: 1}
    # trigrams
    assert t.counts(ids("the mat")) == {W["."]: 1}
    assert t.counts(ids("on the")) == {W["mat"]: 1}
    assert t.counts(ids("the cat")) == {W["sat"]: 1}
    # 4-grams
    assert t.counts(ids("the cat sat")) == {W["on"]: 1}
    assert t.counts(ids("sat on the")) == {W["mat"]: 1}
    assert t.counts(ids("on the mat")) == {}  # "on the mat" ends the history: never followed
    snap = t.snapshot()
    u, th, m, dot, c, s_, o = (W[w] for w in "under the mat . cat sat on".split())
    assert snap[2] == {  # the whole bigram table, by hand
        (u,): {th: 1}, (th,): {m: 2, c: 1}, (m,): {dot: 1}, (dot,): {th: 1},
        (c,): {s_: 1}, (s_,): {o: 1}, (o,): {th: 1},
    }
    assert sum(sum(v.values()) for v in snap[2].values()) == 9  # 10 tokens -> 9 bigrams
    assert sum(sum(v.values()) for v in snap[3].values()) == 8
    assert sum(sum(v.values()) for v in snap[4].values()) == 7
    assert snap == brute_counts(CHAPTER, 4, 512)


def test_chapter_trace_longest_context_first_with_fallback():
    t = NGramTables(max_order=4)
    t.update(CHAPTER)
    # The chapter's trace: 4-grams give on, the, mat; 4-gram (on the mat) is absent -> trigram (the mat) -> "."
    assert t.predict(ids("the cat sat")) == [(W["on"], 1)]
    assert t.predict(ids("cat sat on")) == [(W["the"], 1)]
    assert t.predict(ids("sat on the")) == [(W["mat"], 1)]
    assert t.predict(ids("on the mat")) == [(W["."], 1)]
    assert words(t.draft(ids("the cat sat"), max_tokens=4)) == "on the mat ."
    # Fallback to the bigram: (dog sat) and (cat dog the) are unseen contexts of order 3/4.
    assert t.predict(ids("dog sat")) == [(W["on"], 1)]
    # bigram "the" -> mat (2) beats cat (1): the most frequent continuation
    assert t.predict(ids("cat dog the")) == [(W["mat"], 2)]
    # A longer context wins over a more frequent shorter one: the trigram context (. the) was
    # followed by cat once, although the bigram "the" prefers mat (2 against 1).
    assert t.predict(ids(". the")) == [(W["cat"], 1)]
    assert t.predict(ids("dog . the")) == [(W["cat"], 1)]
    # no suffix seen at any order -> nothing
    assert t.predict(ids("dog")) == []
    assert t.predict([99, 98, 97]) == []
    assert t.draft([99], max_tokens=4) == []


def test_chapter_drafter_chains_from_the_end_of_the_prompt():
    d = NGramDrafter()
    d.reset(CHAPTER, sampling=greedy(), seed=0)
    props = d.propose(CHAPTER)
    # root "mat": 4-gram (on the mat) unseen -> trigram (the mat) -> "."; then (the mat .) -> the,
    # (mat . the) -> cat, (. the cat) -> sat
    assert words(props.tokens) == ". the cat sat"
    assert props.parents == [ROOT, 0, 1, 2]
    assert props.dist_rows is None and props.dists is None and props.exclude is None
    props.validate()
    # chain stops where nothing more is predicted
    d2 = NGramDrafter(max_tokens=10)
    d2.reset(CHAPTER, sampling=greedy(), seed=0)
    chain = d2.propose(CHAPTER).tokens
    assert words(chain[:4]) == ". the cat sat"
    assert words(chain[4:8]) == "on the mat ."  # the tables loop; max_tokens bounds the chain
    assert len(chain) == 10


def test_tie_break_most_recent_occurrence_wins():
    t = NGramTables(max_order=2)
    t.update([1, 2, 1, 3])  # (1) -> 2 at pos 1, (1) -> 3 at pos 3: tie, 3 is more recent
    assert t.predict([1]) == [(3, 1)]
    assert t.predict([1], width=2) == [(3, 1), (2, 1)]
    t.update([1, 2])  # now 2 seen twice: frequency first
    assert t.predict([1], width=2) == [(2, 2), (3, 1)]
    t.update([1, 3, 1, 3])  # 3 three times
    assert t.predict([1], width=3) == [(3, 3), (2, 2)]


def test_window_removes_counts_of_tokens_that_slid_out():
    t = NGramTables(max_order=2, window=3)
    t.update([1, 2, 1, 3])  # window [2, 1, 3]: bigram (1)->2 slid out
    assert t.history() == [2, 1, 3]
    assert t.counts([1]) == {3: 1}
    assert t.counts([2]) == {1: 1}
    assert t.predict([1]) == [(3, 1)]
    t.update([5])  # window [1, 3, 5]: (2)->1 slid out
    assert t.predict([2]) == []
    assert t.snapshot() == {2: {(1,): {3: 1}, (3,): {5: 1}}}
    # a pattern only before the window no longer predicts, at any order
    t4 = NGramTables(max_order=4, window=6)
    t4.update([7, 8, 9, 6] + [1, 2, 3, 4, 5, 1])
    assert t4.predict([7, 8, 9]) == []
    assert t4.predict([8, 9]) == []
    assert t4.predict([9]) == []
    assert t4.predict([1]) == [(2, 1)]


def test_tie_break_survives_eviction():
    t = NGramTables(max_order=2, window=5)
    t.update([1, 2, 1, 3, 1, 2])  # window [2,1,3,1,2]: (1)->3 at 3, (1)->2 at 5; first (1)->2 evicted
    assert t.counts([1]) == {3: 1, 2: 1}
    assert t.predict([1]) == [(2, 1)]  # 2 seen more recently
    t.update([1, 3])  # window [3,1,2,1,3]: (1)->2 at 5, (1)->3 at 7
    assert t.counts([1]) == {2: 1, 3: 1}
    assert t.predict([1]) == [(3, 1)]


def test_width_backs_off_to_shorter_contexts_without_duplicates():
    t = NGramTables(max_order=3)
    t.update([1, 2, 5, 3, 2, 6, 1, 2])
    # trigram (1 2) -> 5 only; bigram (2) -> {5, 6}: fill with 6, skip the duplicate 5
    assert t.predict([1, 2], width=2) == [(5, 1), (6, 1)]
    assert t.predict([1, 2], width=5) == [(5, 1), (6, 1)]
    assert t.predict([3, 2], width=2) == [(6, 1), (5, 1)]
    # unseen trigram context: bigram only, tie -> the most recent (6 at pos 5) first
    assert t.predict([9, 2], width=2) == [(6, 1), (5, 1)]
    assert t.predict([9, 2], width=1) == [(6, 1)]


# --------------------------------------------------------------------------- drafter: trees


def test_width_tree_structure_by_hand():
    # bigrams of [1,2,1,3,1,2,3,4,3,1]:
    #   (1) -> {2: 2, 3: 1}   (2) -> {1: 1 @2, 3: 1 @6} (3 more recent)   (3) -> {1: 2, 4: 1}   (4) -> {3: 1}
    ctx = [1, 2, 1, 3, 1, 2, 3, 4, 3, 1]
    d = NGramDrafter(max_order=2, max_tokens=2, width=2)
    d.reset(ctx, sampling=greedy(), seed=0)
    p = d.propose(ctx)
    assert p.tokens == [2, 3, 3, 1, 1, 4]
    assert p.parents == [ROOT, ROOT, 0, 0, 1, 1]

    d3 = NGramDrafter(max_order=2, max_tokens=3, width=2)
    d3.reset(ctx, sampling=greedy(), seed=0)
    p3 = d3.propose(ctx)
    # depth 3, breadth first: under node 2 (3): 1, 4; node 3 (1): 2, 3; node 4 (1): 2, 3; node 5 (4): 3
    assert p3.tokens == [2, 3, 3, 1, 1, 4, 1, 4, 2, 3, 2, 3, 3]
    assert p3.parents == [ROOT, ROOT, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    p3.validate()

    capped = NGramDrafter(max_order=2, max_tokens=3, width=2, max_nodes=5)
    capped.reset(ctx, sampling=greedy(), seed=0)
    pc = capped.propose(ctx)
    assert pc.tokens == [2, 3, 3, 1, 1]
    assert pc.parents == [ROOT, ROOT, 0, 0, 1]


def _check_tree(p: DraftProposals) -> None:
    p.validate()
    pairs = list(zip(p.parents, p.tokens))
    assert len(pairs) == len(set(pairs)), "a token proposed twice under one parent"
    assert p.dist_rows is None


@pytest.mark.parametrize("mode", ["ngram", "prompt_lookup"])
def test_random_contexts_give_valid_trees(mode):
    rng = random.Random(1234)
    for trial in range(30):
        seq = [rng.randrange(4) for _ in range(rng.randrange(1, 80))]
        d = NGramDrafter(max_order=rng.choice([2, 3, 4]), max_tokens=rng.choice([1, 3, 5]),
                         width=rng.choice([1, 2, 3]), window=rng.choice([8, 16, 512]), mode=mode,
                         max_nodes=rng.choice([None, 7]))
        d.reset(seq[:1], sampling=greedy(), seed=trial)
        p = d.propose(seq)
        _check_tree(p)
        assert len(p) <= (d.max_nodes or 10**9)
        depth = [0] * len(p)
        for j, par in enumerate(p.parents):
            depth[j] = 1 if par == ROOT else depth[par] + 1
        assert max(depth, default=0) <= d.max_tokens


def test_novel_context_gives_empty_proposals():
    rng = random.Random(7)
    prompt = rng.sample(range(10_000), 200)  # all distinct: the last token was never followed
    for mode in ("ngram", "prompt_lookup"):
        d = NGramDrafter(mode=mode)
        d.reset(prompt, sampling=greedy(), seed=0)
        p = d.propose(prompt)
        assert len(p) == 0 and p.tokens == [] and p.parents == []
        p2 = d.propose(prompt + [10_001])
        assert len(p2) == 0
    assert len(NGramDrafter().propose([])) == 0


# --------------------------------------------------------------------------- prompt lookup


def test_prompt_lookup_most_recent_match_and_width():
    ctx = [7, 8, 9, 10, 11, 7, 8, 12, 13, 7, 8]
    d = NGramDrafter(max_order=3, max_tokens=3, mode="prompt_lookup")  # match 2 tokens, then 1
    d.reset(ctx, sampling=greedy(), seed=0)
    p = d.propose(ctx)
    assert p.tokens == [12, 13, 7]  # (7 8) most recently at 5..6, followed by 12 13 7
    assert p.parents == [ROOT, 0, 1]
    d2 = NGramDrafter(max_order=3, max_tokens=3, width=2, mode="prompt_lookup")
    d2.reset(ctx, sampling=greedy(), seed=0)
    p2 = d2.propose(ctx)
    assert p2.tokens == [12, 13, 7, 9, 10, 11]
    assert p2.parents == [ROOT, 0, 1, ROOT, 3, 4]
    # width 3: the 1-token matches of (8) give the same two continuations: nothing new
    d3 = NGramDrafter(max_order=3, max_tokens=3, width=3, mode="prompt_lookup")
    d3.reset(ctx, sampling=greedy(), seed=0)
    assert d3.propose(ctx).tokens == p2.tokens


def test_prompt_lookup_backs_off_to_shorter_matches_and_shares_prefixes():
    ctx = [5, 1, 2, 3, 5, 1, 4, 0, 9, 5]
    # (9 5) never occurred before; (5) at 4 -> 1 4 0, at 0 -> 1 2 3 (shares the first node)
    d = NGramDrafter(max_order=3, max_tokens=3, width=2, mode="prompt_lookup")
    d.reset(ctx, sampling=greedy(), seed=0)
    p = d.propose(ctx)
    assert p.tokens == [1, 4, 0, 2, 3]
    assert p.parents == [ROOT, 0, 1, 0, 3]
    _check_tree(p)
    capped = NGramDrafter(max_order=3, max_tokens=3, width=2, mode="prompt_lookup", max_nodes=4)
    capped.reset(ctx, sampling=greedy(), seed=0)
    assert capped.propose(ctx).tokens == [1, 4, 0, 2]


def test_prompt_lookup_overlapping_copy_continues_a_repeat():
    idx = PromptLookupIndex(max_order=4)
    idx.update([4, 4, 4, 4])
    assert idx.continuations(max_tokens=4) == [[4, 4, 4, 4]]
    idx2 = PromptLookupIndex(max_order=3)
    idx2.update([1, 2, 1, 2, 1])  # (2 1) at 1..2 followed by 2 1 |end| -> copies on: 2 1 2 1
    assert idx2.continuations(max_tokens=4) == [[2, 1, 2, 1]]


def test_prompt_lookup_respects_the_window():
    ctx = [1, 2, 3, 4, 5, 6, 1]
    small = NGramDrafter(max_order=2, max_tokens=4, window=4, mode="prompt_lookup")
    small.reset(ctx, sampling=greedy(), seed=0)
    assert small.propose(ctx).tokens == []  # the earlier 1 slid out of [4, 5, 6, 1]
    big = NGramDrafter(max_order=2, max_tokens=4, window=7, mode="prompt_lookup")
    big.reset(ctx, sampling=greedy(), seed=0)
    assert big.propose(ctx).tokens == [2, 3, 4, 5]


# --------------------------------------------------------------------------- incremental updates


@pytest.mark.parametrize("max_order,window", [(2, 3), (3, 7), (4, 50), (4, 512)])
def test_incremental_updates_equal_a_from_scratch_build(max_order, window):
    rng = random.Random(max_order * 1000 + window)
    seq = [rng.randrange(5) for _ in range(400)]
    inc = NGramTables(max_order, window)
    i = 0
    while i < len(seq):
        k = rng.randrange(1, 9)
        inc.update(seq[i : i + k])
        i += k
        ref = brute_counts(seq[:i], max_order, window)
        assert inc.snapshot() == ref
    scratch = NGramTables(max_order, window)
    scratch.update(seq)
    tail = NGramTables(max_order, window)
    tail.update(seq[-window:])
    assert inc.history() == scratch.history() == tail.history() == seq[-window:]
    for a in range(5):
        for b in range(5):
            for c in range(5):
                want = scratch.predict([a, b, c], width=3)
                assert inc.predict([a, b, c], width=3) == want
                assert tail.predict([a, b, c], width=3) == want


@pytest.mark.parametrize("mode", ["ngram", "prompt_lookup"])
def test_drafter_incremental_matches_fresh_and_feeds_only_new_tokens(mode):
    rng = random.Random(99 if mode == "ngram" else 98)
    seq = [rng.randrange(6) for _ in range(300)]
    d = NGramDrafter(max_order=4, max_tokens=3, width=2, window=64, mode=mode)
    n = 20
    d.reset(seq[:n], sampling=greedy(), seed=0)
    while n < len(seq):
        fed_before = d.tables.total
        k = rng.randrange(1, 5)
        n = min(len(seq), n + k)
        p = d.propose(seq[:n])
        assert d.tables.total - fed_before == k or n == len(seq)  # only the new tokens were fed
        fresh = NGramDrafter(max_order=4, max_tokens=3, width=2, window=64, mode=mode)
        fresh.reset(seq[:n], sampling=greedy(), seed=0)
        q = fresh.propose(seq[:n])
        assert (p.tokens, p.parents) == (q.tokens, q.parents)
        if mode == "ngram":
            assert d.tables.snapshot() == brute_counts(seq[:n], 4, 64)


def test_drafter_rebuilds_when_the_context_is_not_an_extension():
    d = NGramDrafter(max_order=2, max_tokens=2)
    d.reset([1, 2, 1, 2], sampling=greedy(), seed=0)
    assert d.propose([1, 2, 1, 2, 1]).tokens == [2, 1]
    # a different history (same length + 1): must not reuse the old counts
    assert d.propose([3, 4, 3, 5, 3, 6]).tokens == []  # (6) never followed
    assert d.tables.snapshot() == brute_counts([3, 4, 3, 5, 3, 6], 2, 512)
    assert d.propose([3, 4, 3, 5, 3]).tokens == [5, 3]  # shorter context: rebuilt, (3)->5 most recent
    # a propose without reset also works (builds lazily); tensors are accepted
    import torch

    d2 = NGramDrafter(max_order=2, max_tokens=2)
    assert d2.propose(torch.tensor([1, 2, 1, 2, 1])).tokens == [2, 1]


def test_per_step_cost_does_not_grow_with_the_context():
    # tables fed only the appended tokens: a long prompt then 200 single-token steps
    rng = random.Random(5)
    seq = [rng.randrange(50) for _ in range(5000)]
    d = NGramDrafter()
    d.reset(seq[:4000], sampling=greedy(), seed=0)
    assert d.tables.total == 512  # rebuilt from the window only
    for n in range(4001, 4201):
        d.propose(seq[:n])
    assert d.tables.total == 512 + 200


# --------------------------------------------------------------------------- validation, describe


@pytest.mark.parametrize(
    "kwargs,msg",
    [
        (dict(max_order=1), "n-gram order must be >= 2"),
        (dict(max_order=0), "n-gram order must be >= 2"),
        (dict(max_tokens=0), "max_tokens must be an int >= 1"),
        (dict(width=0), "width must be an int >= 1"),
        (dict(window=3), "window must be >= max_order"),
        (dict(max_order=5, window=4), "window must be >= max_order"),
        (dict(mode="bogus"), "unknown mode 'bogus'"),
        (dict(max_nodes=0), "max_nodes must be an int >= 1"),
        (dict(width=1.5), "width must be an int"),
    ],
)
def test_validation_errors(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        NGramDrafter(**kwargs)


def test_tables_validation():
    with pytest.raises(ValueError, match="n-gram order must be >= 2"):
        NGramTables(max_order=1)
    with pytest.raises(ValueError, match="window must be >= max_order"):
        PromptLookupIndex(max_order=4, window=2)
    with pytest.raises(ValueError, match="width must be an int >= 1"):
        NGramTables().predict([1], width=0)


def test_describe():
    assert NGramDrafter().describe() == "ngram(order<=4, tokens<=4, width=1)"
    assert NGramDrafter(max_order=3, max_tokens=5, width=2, mode="prompt_lookup").describe() == (
        "prompt_lookup(order<=3, tokens<=5, width=2)"
    )
    assert NGramDrafter(window=64, max_nodes=8).describe() == "ngram(order<=4, tokens<=4, width=1, window=64, nodes<=8)"
