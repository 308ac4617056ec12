"""Same-tree replay of verifiers: the recorded steps reproduce the live walk, the enumerated expectation
is the walks' mean, and the comparison pairs every exact rule with the baseline on the same steps."""

import pytest
import torch

import treespec
from treespec.bench import replay
from treespec.core.verifiers import TorchCoins
from treespec.models.tiny import perturbed_copy, tiny_model

CHAIN = [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]
BUSHY = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", vocab=32, hidden=32, scale=3, seed=3)
    return target, perturbed_copy(target, 0.4, seed=2)


def test_replaying_rrs_with_the_live_random_numbers_reproduces_the_live_run(pair) -> None:
    target, draft = pair
    rec = replay.record(target, [1, 2, 3, 4], [treespec.ModelDrafter(draft, BUSHY, "sample_without_replacement")],
                        max_new_tokens=40, temperature=1.0, seed=7)
    s = rec.output.stats
    live = [(n, cut) for n, cut, size in zip(s.step_tokens, s.step_cut, s.tree_sizes) if size > 1]
    assert len(live) == len(rec.steps) >= 5
    for (tokens, cut), step in zip(live, rec.steps):
        accepted = replay.live(step, rec.params, "rrs")
        if not cut:
            assert accepted + 1 == tokens
    # the live run itself is the ordinary one: the same seed without recording gives the same tokens
    plain = treespec.generate(target, [1, 2, 3, 4], [treespec.ModelDrafter(draft, BUSHY, "sample_without_replacement")],
                              max_new_tokens=40, temperature=1.0, seed=7)
    assert plain.new_tokens == rec.output.new_tokens


def test_compare_pairs_each_exact_rule_with_the_baseline(pair) -> None:
    target, draft = pair
    chains = [replay.record(target, [i, i + 1, 5], [treespec.ModelDrafter(draft, CHAIN, "sample")], max_new_tokens=30,
                            temperature=1.0, seed=i) for i in range(3)]
    out = replay.compare(chains)
    v = out["verifiers"]
    assert set(v) == {"rrs", "block", "traversal", "spectr"}  # a chain of one i.i.d. draw per node, no budget cut
    steps = sum(len(r.steps) for r in chains)
    assert all(e["steps"] == steps for e in v.values())
    assert (v["block"]["tau_ratio"]["estimate"]
            == pytest.approx(v["traversal"]["tau_ratio"]["estimate"]))  # one rule on a chain
    assert "tau_ratio" not in v["rrs"]
    tree = replay.record(target, [1, 2, 3], [treespec.ModelDrafter(draft, BUSHY, "sample_without_replacement")],
                         max_new_tokens=20, temperature=1.0, seed=1, budget=5)
    assert (set(replay.compare([tree])["verifiers"])
            == {"rrs", "traversal"})  # not block (a tree), not spectr (w/o repl.)


def test_expected_accepted_is_the_mean_of_the_walks(pair) -> None:
    """The enumerated expectation agrees with the average of many seeded walks of the same step (within
    4 standard errors), for a top-down rule and a leaf-to-root rule."""
    target, draft = pair
    rec = replay.record(target, [1, 2, 3, 4], [treespec.ModelDrafter(draft, BUSHY, "sample_without_replacement")],
                        max_new_tokens=24, temperature=1.0, seed=3)
    for step in rec.steps[:3]:
        for name in ("rrs", "traversal"):
            walks = torch.tensor([float(replay.replay(step, rec.params, name,
                                                      TorchCoins(torch.Generator().manual_seed(i))))
                                  for i in range(300)])
            exact = replay.expected_accepted(step, rec.params, name)
            assert abs(walks.mean().item() - exact) <= 4 * max(walks.std().item(), 0.05) / 300 ** 0.5, (name, exact)
    # on sampled trees traversal expects more than rrs (Weng et al.; exhaustively in test_verifiers.py)
    gain = [replay.expected_accepted(s, rec.params, "traversal") - replay.expected_accepted(s, rec.params, "rrs")
            for s in rec.steps]
    assert sum(gain) > 0


def test_greedy_is_refused(pair) -> None:
    target, draft = pair
    with pytest.raises(ValueError, match="temperature > 0"):
        replay.record(target, [1, 2], [treespec.ModelDrafter(draft, CHAIN)], max_new_tokens=4, temperature=0.0)
