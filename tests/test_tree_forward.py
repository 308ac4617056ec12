"""Tree forward and KV commit against ordinary causal runs (fp32, tiny models)."""

import numpy as np
import pytest
import torch

from conftest import counted_forwards
from treespec.models.tiny import tiny_model
from treespec.core.drafting import DraftProposals
from treespec.core.drafting import Forward
from treespec.core.kv import (RowCache, RowsCache, TreeCache, causal_allowed, forward_masked, forward_prompt, kept_rows,
                               tree_inputs)
from treespec.core.tree import TokenTree, flatten


def random_tree(rng: np.random.Generator, root: int, n: int, vocab: int) -> TokenTree:
    tokens, parents = [], []
    for j in range(n):
        parents.append(int(rng.integers(-1, j)) if j else -1)
        tokens.append(int(rng.integers(vocab)))
    tree = TokenTree.rooted_at(root)
    tree.merge([DraftProposals(tokens, parents)])
    return tree


def path_to(tree: TokenTree, node: int) -> list[int]:
    toks = []
    while node > 0:
        toks.append(tree.tokens[node])
        node = tree.parent[node]
    return toks[::-1]


def test_flatten_is_dfs_with_ancestor_mask():
    tree = random_tree(np.random.default_rng(0), 3, 40, 10)
    flat = flatten(tree)
    seen = set()
    for i, node in enumerate(flat.order):
        par = tree.parent[node]
        assert par < 0 or par in seen  # parents before children
        seen.add(int(node))
        anc = {int(flat.order[j]) for j in np.flatnonzero(flat.ancestors[i])}
        expect, v = set(), int(node)
        while v >= 0:
            expect.add(v)
            v = tree.parent[v]
        assert anc == expect
    # DFS: each subtree occupies a contiguous block of the flat order
    for node in range(tree.size):
        sub = [j for j in range(len(flat)) if flat.ancestors[j, flat.index[node]]]
        assert sub == list(range(min(sub), max(sub) + 1))
    assert list(flat.depth) == [tree.depth[v] for v in flat.order]


def tree_forward(model, prompt: list[int], flat, root_cached: bool = False) -> tuple[TreeCache, int, torch.Tensor]:
    """Prefill all but the prompt's last token, then one masked forward over the flattened tree (``kv.tree_inputs``);
    ``root_cached``: prefill the whole prompt (its last token the root) and forward the nodes below the root, the
    root's logits the prefill's (the eager step's first tree)."""
    cache = TreeCache()
    past = len(prompt) - (0 if root_cached else 1)
    held = forward_masked(model, cache, torch.tensor(prompt[:past]), torch.arange(past), causal_allowed(0, past),
                          logits_to_keep=1)
    ids, pos, allowed = tree_inputs(flat, past, root_cached)
    logits = forward_masked(model, cache, ids, pos, allowed)
    return cache, past, torch.cat([held, logits]) if root_cached else logits


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("root_cached", [False, True])
def test_tree_logits_equal_path_logits(family, attn, root_cached):
    model = tiny_model(family, attn=attn, vocab=50, scale=5)
    rng = np.random.default_rng(1)
    prompt = [int(t) for t in rng.integers(50, size=7)]
    tree = random_tree(rng, prompt[-1], 30, 6)
    flat = flatten(tree)
    with torch.no_grad():
        cache, past, logits = tree_forward(model, prompt, flat, root_cached)
        for node in range(tree.size):
            ids = torch.tensor([prompt + path_to(tree, node)])
            ref = model(ids).logits[0, -1]
            torch.testing.assert_close(logits[flat.index[node]], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("root_cached", [False, True])
def test_commit_keeps_exactly_the_path(family, root_cached):
    model = tiny_model(family, vocab=50, scale=5)
    rng = np.random.default_rng(2)
    prompt = [int(t) for t in rng.integers(50, size=5)]
    tree = random_tree(rng, prompt[-1], 25, 5)
    flat = flatten(tree)
    leaf = max(range(tree.size), key=lambda v: tree.depth[v])
    path_nodes, v = [], leaf
    while v >= 0:
        path_nodes.append(v)
        v = tree.parent[v]
    path_nodes = path_nodes[::-1]
    with torch.no_grad():
        cache, past, _ = tree_forward(model, prompt, flat, root_cached)
        cache.keep(past, kept_rows(flat, path_nodes, past, root_cached))
        committed = prompt + path_to(tree, leaf)
        assert cache.length == len(committed)
        nxt = [7, 8, 9]
        n = cache.length
        logits = forward_masked(model, cache, torch.tensor(nxt), torch.arange(n, n + 3), causal_allowed(n, 3))
        ref = model(torch.tensor([committed + nxt])).logits[0, -3:]
        torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows, copied", [([5, 6, 7], False), ([5], False), ([5, 7], True), ([6, 7], True)])
def test_rows_already_in_place_are_kept_without_a_copy(rows, copied):
    """``keep(prefix, rows)`` with rows right after the prefix (a chain's accepted path; plain decoding's token)
    moves the prefix past them and copies nothing; any other rows are gathered (control); either way the cache
    holds the prefix and then those rows, in order."""
    cache = TreeCache()
    k, v = torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4)
    cache.update(k.clone(), v.clone(), 0)
    writes: list[int] = []
    layer = cache.layers[0]
    real = layer.move
    layer.move = lambda moves: writes.append(len(moves.src)) or real(moves)
    cache.keep(5, np.array(rows))
    assert cache.length == 5 + len(rows) and (writes[0] > 0) == copied
    expected = [*range(5), *rows]
    assert torch.equal(cache.layers[0].keys[0], k[0][:, expected]) and torch.equal(cache.layers[0].values[0],
                                                                                  v[0][:, expected])


def test_a_batchs_commit_moves_every_rows_slots_at_once():
    """``keep_rows`` over a batch's rows (one gather per layer's tensor, ``kv.Moves``): row ``b`` holds its prefix
    and then its kept slots, in order, in every layer, whatever the other rows keep (nothing; slots already in
    place; slots whose destinations overlap them); one prefix and index given for a batch applies to every row."""
    cache = TreeCache()
    layers = [(torch.randn(4, 2, 12, 4), torch.randn(4, 2, 12, 4)) for _ in range(2)]
    for i, (k, v) in enumerate(layers):
        cache.update(k.clone(), v.clone(), i)
    prefixes, rows = [3, 5, 2, 6], [[4, 6, 7], [], [2, 3], torch.tensor([8, 11])]
    cache.keep_rows(prefixes, rows)
    assert cache.length == 8
    for layer, (k, v) in zip(cache.layers, layers):
        for b, (prefix, kept) in enumerate(zip(prefixes, rows)):
            expected = [*range(prefix), *map(int, kept)]
            assert torch.equal(layer.keys[b, :, : len(expected)], k[b][:, expected])
            assert torch.equal(layer.values[b, :, : len(expected)], v[b][:, expected])
    before = [layer.keys.clone() for layer in cache.layers]
    cache.keep(2, [4, 5])
    assert cache.length == 4
    for layer, old in zip(cache.layers, before):
        assert torch.equal(layer.keys, old[:, :, [0, 1, 4, 5]])


def test_the_rows_own_keeps_wait_for_the_next_forward_and_move_in_one_pass():
    """Each row's drafter keeps its own slots (``kv.RowCache.keep``) at the start of its step: the keeps wait
    (``RowsCache.pending``; a row's ``length`` counts its own at once) and the next forward moves every row's in one
    pass over the layers, before it writes; each row then holds its prefix, its kept slots and the forward's tokens.
    A row keeping twice keeps from what its first keep left."""
    model = tiny_model("llama", vocab=32, hidden=16, layers=2, seed=3)
    rows = RowsCache(3)
    with torch.inference_mode():
        rows.forward(model, {r: Forward(torch.arange(r + 1, r + 7), torch.arange(6), causal_allowed(0, 6),
                                        prompt=True) for r in range(3)})
        before = [layer.keys.clone() for layer in rows.layers]
        passes = []
        real = rows.keep_rows
        rows.keep_rows = lambda prefixes, kept: passes.append(list(prefixes)) or real(prefixes, kept)
        RowCache(rows, 0).keep(2, [4, 5])
        RowCache(rows, 1).keep(3, [])
        RowCache(rows, 2).keep(1, [3, 4, 5])
        assert passes == [] and rows.layers[0].keys.equal(before[0])  # nothing moved yet
        assert [RowCache(rows, r).length for r in range(3)] == [4, 3, 4]
        RowCache(rows, 2).keep(2, [3])  # from its first keep's slots (0, 3, 4, 5): 0, 3 then 5
        assert passes == [[2, 3, 1]] and RowCache(rows, 2).length == 3  # the three waiting keeps in one pass
        rows.forward(model, {r: Forward(torch.tensor([9]), torch.tensor([rows.length_of(r)]),
                                        causal_allowed(rows.length_of(r), 1)) for r in range(3)})
        assert passes[1] == [4, 3, 2] and len(passes) == 3  # row 2's second keep, then the forward's own pass
        assert rows.lengths == [5, 4, 4]
        for layer, old in zip(rows.layers, before):
            for b, kept in enumerate([[0, 1, 4, 5], [0, 1, 2], [0, 3, 5]]):
                assert torch.equal(layer.keys[b, :, : len(kept)], old[b][:, kept])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_prompts_forward_without_a_mask_is_the_masked_causal_forward(family):
    """``forward_prompt`` passes no mask (the model's own causal route, as HF's prefill): the same logits and cached
    keys and values as the causal 4D mask gives, every row and the last alone; a non-empty cache is refused."""
    model = tiny_model(family, vocab=64, hidden=64, layers=2, seed=5)
    ids = torch.randint(64, (23,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        masked, plain = TreeCache(), TreeCache()
        want = forward_masked(model, masked, ids, torch.arange(23), causal_allowed(0, 23))
        got = forward_prompt(model, plain, ids, logits_to_keep=0)
        assert torch.allclose(got, want, atol=1e-5) and plain.length == masked.length == 23
        for (k1, v1), (k2, v2) in zip(layer_kv(plain), layer_kv(masked)):
            assert torch.allclose(k1, k2, atol=1e-6) and torch.allclose(v1, v2, atol=1e-6)
        assert torch.allclose(forward_prompt(model, TreeCache(), ids), want[-1:], atol=1e-5)
        with pytest.raises(ValueError, match="fills an empty cache"):
            forward_prompt(model, plain, ids[:3])


@pytest.mark.parametrize("last", [True, False])
def test_a_batchs_prompts_each_go_through_a_forward_of_their_own(last):
    """``RowsCache.forward`` over prompt asks into an empty cache (``RowsCache.prompts``): each row's logits and
    cached keys and values are its prompt's alone (``forward_prompt``), rows of different lengths in one cache, a
    row's slots past its length zero; a row without an ask (its drafter had nothing to cache) stays empty. The next
    forward writes every row's new tokens after its own length (the batch's usual route)."""
    model = tiny_model("qwen2", vocab=64, hidden=64, layers=2, seed=5)
    g = torch.Generator().manual_seed(1)
    prompts = {0: torch.randint(64, (9,), generator=g), 2: torch.randint(64, (17,), generator=g),
               3: torch.randint(64, (4,), generator=g)}
    asks = {row: Forward(ids, torch.arange(len(ids)), causal_allowed(0, len(ids)), last=last, prompt=True)
            for row, ids in prompts.items()}
    with torch.inference_mode():
        rows = RowsCache(4)
        got = rows.forward(model, asks)
        assert rows.lengths == [9, 0, 17, 4] and rows.length == 17
        for row, ids in prompts.items():
            alone = TreeCache()
            want = forward_prompt(model, alone, ids, logits_to_keep=1 if last else 0)
            assert got[row].shape == want.shape and torch.equal(got[row], want)
            for (k, v), (k1, v1) in zip(layer_kv(rows), layer_kv(alone)):
                assert torch.equal(k[row, :, : len(ids)], k1[0]) and torch.equal(v[row, :, : len(ids)], v1[0])
                assert not k[row, :, len(ids):].any() and not v[row, :, len(ids):].any()
                assert not torch.equal(k[row, :, :4], k[(row + 2) % 4, :, :4])  # control: rows differ
        assert all(not k[1].any() for k, _ in layer_kv(rows))
        # a next token for row 2 after its prompt: the same logits as its prompt and that token alone
        nxt = torch.tensor([7])
        out = rows.forward(model, {2: Forward(nxt, torch.tensor([17]), torch.ones(1, 18, dtype=torch.bool))})
        want = forward_masked(model, TreeCache(), torch.cat([prompts[2], nxt]), torch.arange(18),
                              causal_allowed(0, 18))[-1:]
        assert torch.allclose(out[2], want, atol=1e-5) and rows.lengths[2] == 18


def test_rows_of_one_prompt_share_its_forward():
    """Several rows of one prompt (samples of it) prefill in one forward of it, each row then holding its keys,
    values and logits; another prompt gets its own."""
    model = tiny_model("llama", vocab=64, hidden=64, layers=2, seed=3)
    g = torch.Generator().manual_seed(2)
    a, b = torch.randint(64, (11,), generator=g), torch.randint(64, (6,), generator=g)
    prompts = {0: a, 1: b, 2: a.clone(), 3: a.clone()}
    asks = {row: Forward(ids, torch.arange(len(ids)), causal_allowed(0, len(ids)), last=True, prompt=True)
            for row, ids in prompts.items()}
    with torch.inference_mode():
        rows = RowsCache(4)
        with counted_forwards(model) as calls:
            got = rows.forward(model, asks)
        assert len(calls) == 2 and rows.lengths == [11, 6, 11, 11]
        want = forward_prompt(model, TreeCache(), a)
        for row in (0, 2, 3):
            assert torch.equal(got[row], want) and (row == 0 or got[row] is not got[0])
            assert all(torch.equal(k[row], k[0]) and torch.equal(v[row], v[0]) for k, v in layer_kv(rows))
        assert not all(torch.equal(k[1, :, :6], k[0, :, :6]) for k, _ in layer_kv(rows))  # control: b is its own


def layer_kv(cache: TreeCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]
