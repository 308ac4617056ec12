"""Greedy treespec output is token-identical to the target's own greedy decoding (fp32)."""

import functools

import pytest
import torch

import treespec
from treespec.models.tiny import greedy_reference, opposite_copy, perturbed_copy, tiny_model

CHAIN = [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]
KARY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
BUSHY = [(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0)]
MODES = ["topk", "sample", "sample_without_replacement"]


FAMILIES = ["llama", "qwen2"]
#: each (mode, shape) case on one family, the two in turn: each family still decodes every shape in every mode
CASES = [(FAMILIES[i % 2], mode, shape) for i, (mode, shape) in
         enumerate((m, s) for m in MODES for s in ("chain", "kary", "bushy"))]
SHAPES = {"chain": CHAIN, "kary": KARY, "bushy": BUSHY}


@functools.lru_cache(maxsize=None)
def pair_of(family: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    target = tiny_model(family, vocab=64, hidden=64, scale=6, seed=0)
    return target, perturbed_copy(target, 0.3)


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    return pair_of(request.param)


@functools.lru_cache(maxsize=None)
def reference(target: torch.nn.Module, prompt: tuple[int, ...]) -> list[int]:
    """HF's greedy continuation of a module target (never changed in place), made once for its cases below."""
    return greedy_reference(target, list(prompt), 40)


@pytest.mark.parametrize("family,mode,shape", CASES, ids=["-".join(c) for c in CASES])
def test_greedy_equals_target(family, mode, shape):
    target, draft = pair_of(family)
    shape = SHAPES[shape]
    for k, prompt in enumerate([[1, 5, 7, 9, 3], [4], [10, 11, 12, 13, 14, 15, 16, 17]]):
        ref = reference(target, tuple(prompt))
        out = treespec.generate(target, torch.tensor([prompt]), drafters=[treespec.ModelDrafter(draft, shape, mode)],
                                max_new_tokens=40, seed=k)
        assert out.new_tokens == ref
        assert out.sequences[0].tolist() == prompt + ref
        assert out.stats.new_tokens == 40 and out.stats.steps == sum(out.stats.accepted_hist)


@pytest.mark.parametrize("depth,topk,nodes", [(1, 4, 4), (4, 3, 10), (6, 8, 40)])
def test_greedy_equals_target_dynamic(pair, depth, topk, nodes):
    target, draft = pair
    for prompt in ([1, 5, 7, 9, 3], [4]):
        drafter = treespec.ModelDrafter(draft, mode="dynamic", depth=depth, topk=topk, nodes=nodes)
        out = treespec.generate(target, prompt, drafters=[drafter], max_new_tokens=40)
        assert out.new_tokens == greedy_reference(target, prompt, 40)
        assert max(out.stats.tree_sizes) <= nodes + 1
    full = [size for size, cut in zip(out.stats.tree_sizes, out.stats.step_cut) if not cut]
    assert min(full) == min(nodes, topk + (depth - 1) * topk * topk) + 1  # near the end trees are capped


def test_dynamic_tree_beats_its_own_chain(pair):
    """EAGLE-2's point: the confident part of a wide candidate set is accepted more often."""
    target, draft = pair
    dyn = treespec.generate(target, [1, 5, 7], drafters=[treespec.ModelDrafter(draft, mode="dynamic", depth=5,
                                                                               topk=4, nodes=12)], max_new_tokens=60)
    chain = treespec.generate(target, [1, 5, 7], drafters=[treespec.ModelDrafter(draft, CHAIN)], max_new_tokens=60)
    assert dyn.stats.tau > chain.stats.tau


def test_greedy_drafts_are_accepted(pair):
    """Sanity of the fixture: the perturbed draft is good enough that trees pay off."""
    target, draft = pair
    out = treespec.generate(target, [1, 5, 7], drafters=[treespec.ModelDrafter(draft, BUSHY)], max_new_tokens=40)
    assert out.stats.tau > 1.5


def test_eos_stops_like_hf(pair):
    target, draft = pair
    prompt = [1, 5, 7, 9, 3]
    free = greedy_reference(target, prompt, 40)
    eos = free[17]  # a token the target emits mid-sequence
    ref = greedy_reference(target, prompt, 40, eos=eos)
    out = treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(draft, BUSHY)], max_new_tokens=40,
                            eos_token_id=eos)
    assert out.new_tokens == ref
    assert out.new_tokens[-1] == eos and len(out.new_tokens) < 40


def test_identical_draft_accepts_whole_path():
    target = tiny_model("llama", vocab=64, hidden=64, scale=6)
    out = treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(target, CHAIN + [(1,), (1, 0)])],
                            max_new_tokens=41)
    # every step accepts the whole rank-0 path (4 drafted tokens + 1 bonus); max_new_tokens then
    # leaves one token, so the 9th step does not draft at all (a plain step, counted as cut)
    assert out.stats.accepted_hist == [1, 0, 0, 0, 8] and out.stats.tree_sizes[-1] == 1
    assert out.stats.step_cut == [False] * 8 + [True] and out.stats.tau_uncut == 5.0
    assert out.stats.steps == 9 and out.new_tokens == greedy_reference(target, [1, 2, 3], 41)


def test_always_wrong_draft_gives_tau_one_and_exact_output():
    target = tiny_model("qwen2", vocab=64, hidden=64, scale=6)
    draft = opposite_copy(target)
    out = treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(draft, KARY)], max_new_tokens=30)
    assert out.stats.tau == 1.0 and out.stats.accepted_hist == [30]
    assert out.new_tokens == greedy_reference(target, [1, 2, 3], 30)


def test_no_drafter_is_plain_greedy():
    target = tiny_model("llama", vocab=64, hidden=64, scale=6)
    out = treespec.generate(target, [3, 4], max_new_tokens=12)
    assert out.new_tokens == greedy_reference(target, [3, 4], 12) and out.stats.tau == 1.0


def test_same_seed_same_sampled_output(pair):
    target, draft = pair
    runs = [treespec.generate(target, [1, 2], drafters=[treespec.ModelDrafter(draft, KARY, "sample")],
                              max_new_tokens=20, temperature=1.0, seed=1234).new_tokens for _ in range(2)]
    assert runs[0] == runs[1]
    other = treespec.generate(target, [1, 2], drafters=[treespec.ModelDrafter(draft, KARY, "sample")],
                              max_new_tokens=20, temperature=1.0, seed=99).new_tokens
    assert other != runs[0]
