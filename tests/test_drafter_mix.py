"""Several drafters merged into one trie, the node budget, the n-gram drafter end to end."""

import pytest
import torch

import treespec
from treespec.models.tiny import cycle_model, greedy_reference, opposite_copy, perturbed_copy, tiny_model

KARY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]
CHAIN = [(0,), (0, 0), (0, 0, 0)]


@pytest.fixture(scope="module")
def models():
    target = tiny_model("qwen2", vocab=64, hidden=64, scale=6, seed=0)
    return target, perturbed_copy(target, 0.3, seed=1), perturbed_copy(target, 0.5, seed=2)


MIXES = {
    "ngram": lambda a, b: [treespec.NGramDrafter()],
    "ngram-tree+lookup": lambda a, b: [treespec.NGramDrafter(width=2), treespec.NGramDrafter(mode="prompt_lookup")],
    "model+ngram": lambda a, b: [treespec.ModelDrafter(a, KARY), treespec.NGramDrafter(width=2)],
    "two-models+ngram": lambda a, b: [treespec.ModelDrafter(a, KARY, "sample"),
                                      treespec.ModelDrafter(b, CHAIN, "sample_without_replacement"),
                                      treespec.NGramDrafter()],
}


@pytest.mark.parametrize("budget", [1, 2, 5, 9, None])
@pytest.mark.parametrize("mix", list(MIXES))
def test_greedy_equality_for_every_mix_and_budget(models, mix, budget):
    target, a, b = models
    for prompt in ([1, 5, 7, 1, 5, 7, 1, 5], [3, 2, 1]):
        out = treespec.generate(target, prompt, drafters=MIXES[mix](a, b), max_new_tokens=40, budget=budget, seed=7)
        assert out.new_tokens == greedy_reference(target, prompt, 40)
        if budget is not None:
            assert max(out.stats.tree_sizes) <= budget


def test_budget_caps_tree_in_proposal_order(models):
    target, a, _ = models
    bushy = [(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]
    out = treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(a, bushy)], max_new_tokens=10, budget=4)
    assert set(out.stats.tree_sizes) == {4}  # root + the 3 first proposals (the depth-1 children)
    assert max(len(out.stats.accepted_hist) - 1, 0) <= 1  # nothing deeper than depth 1 was kept


def test_budget_one_is_plain_decoding(models):
    target, a, _ = models
    out = treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(a, KARY)], max_new_tokens=8, budget=1)
    assert out.stats.tau == 1.0 and out.stats.tree_sizes == [1] * 8


def test_per_drafter_stats_show_who_pays():
    target = tiny_model("llama", vocab=64, hidden=64, scale=6)
    good, bad = treespec.ModelDrafter(target, CHAIN), treespec.ModelDrafter(opposite_copy(target), CHAIN)
    out = treespec.generate(target, [1, 2, 3], drafters=[bad, good], max_new_tokens=20)
    s_bad, s_good = out.stats.drafters
    drafted = sum(k * n for k, n in enumerate(out.stats.accepted_hist))
    assert s_good.accepted == drafted and s_bad.accepted == 0
    assert s_bad.proposed == s_good.proposed == 3 * out.stats.steps


def test_ngram_alone_on_a_repetitive_prompt():
    cycle = [5, 9, 13, 17, 21, 30]
    target = cycle_model(cycle)
    prompt = cycle * 4
    assert greedy_reference(target, prompt, 12) == (cycle * 2)  # the target continues the pattern
    out = treespec.generate(target, prompt, drafters=[treespec.NGramDrafter()], max_new_tokens=60)
    assert out.new_tokens == (cycle * 10)
    assert out.stats.tau > 2  # in fact every step accepts max_tokens = 4 guesses
    assert out.stats.accepted_hist[-1] == out.stats.steps


def test_ngram_on_random_tokens_degrades_to_plain_steps():
    target = tiny_model("llama", vocab=1000, hidden=64, scale=6, seed=0)
    prompt = torch.randperm(1000, generator=torch.Generator().manual_seed(0))[:50].tolist()
    out = treespec.generate(target, prompt, drafters=[treespec.NGramDrafter()], max_new_tokens=12)
    assert out.stats.tau == 1.0
    assert out.new_tokens == greedy_reference(target, prompt, 12)


def test_duplicates_stay_as_separate_proposals():
    target = tiny_model("llama", vocab=6, hidden=16, layers=1, scale=3, seed=5)
    chains = [(0,), (1,), (2,), (3,), (0, 0), (1, 0)]
    out = treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(target, chains, "sample")],
                            max_new_tokens=30, temperature=1.0, seed=3)
    drafted_nodes = sum(s - 1 for s in out.stats.tree_sizes)
    assert out.stats.drafters[0].proposed == 6 * out.stats.steps > drafted_nodes  # merged, none dropped
