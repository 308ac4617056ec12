"""Sampling exactness end to end: the joint law of the first 3 tokens equals the target's.

Tiny models with a 6-token vocabulary, so the exact joint distribution (216 cells) is computed by
enumeration; G-test at alpha = 1e-3 with seeds spread by hashing (docs/design.md).
"""

from collections import Counter

import pytest
import torch

import treespec
from stats import ALPHA, exact_joint, g_test
from treespec.core.sampling import spread_seed
from treespec.models.tiny import perturbed_copy, tiny_model

N, K, PROMPT = 3000, 3, [1, 2, 3]
BUSHY = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
REPEAT = [1, 2, 3, 1, 2, 3, 1, 2]
CHAINS = [(0,), (1,), (2,), (0, 0), (1, 0), (2, 0)]  # 3 independent chains of length 2


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", vocab=6, hidden=16, layers=1, scale=3, seed=5)
    return target, perturbed_copy(target, 0.6, seed=2)


def sample_joint(target, make_drafters, tag, prompt=PROMPT, **kwargs) -> Counter:
    counts = Counter()
    for i in range(N):
        out = treespec.generate(target, prompt, drafters=make_drafters(), max_new_tokens=K,
                                seed=spread_seed(tag, i), **kwargs)
        counts[tuple(out.new_tokens)] += 1
    return counts


CASES = {
    "topk-T1": (lambda d: [treespec.ModelDrafter(d, BUSHY, "topk")], dict(temperature=1.0)),
    "sample-T1": (lambda d: [treespec.ModelDrafter(d, BUSHY, "sample")], dict(temperature=1.0)),
    "wor-T0.7": (lambda d: [treespec.ModelDrafter(d, BUSHY, "sample_without_replacement")], dict(temperature=0.7)),
    "chains-topp0.9": (lambda d: [treespec.ModelDrafter(d, CHAINS, "sample")], dict(temperature=1.0, top_p=0.9)),
    "duplicates-topk3": (lambda d: [treespec.ModelDrafter(d, CHAINS, "sample"), treespec.ModelDrafter(d, BUSHY, "topk")],
                         dict(temperature=0.7, top_k=3)),
    "dynamic-T1": (lambda d: [treespec.ModelDrafter(d, mode="dynamic", depth=3, topk=3, nodes=6)],
                   dict(temperature=1.0)),
    # on a repetitive prompt the n-gram guesses overlap the model's samples
    "model+ngram": (lambda d: [treespec.ModelDrafter(d, BUSHY, "sample"), treespec.NGramDrafter(width=2)],
                    dict(temperature=1.0, prompt=REPEAT)),
    # budget 5: the n-gram's 2 guesses, then the model's draws until the tree holds 5 nodes; draws that
    # merge into existing nodes take no room, so where the cut falls depends on earlier tokens
    "budget-cut": (lambda d: [treespec.NGramDrafter(max_tokens=2), treespec.ModelDrafter(d, BUSHY, "sample_without_replacement")],
                   dict(temperature=1.0, prompt=REPEAT, budget=5)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_joint_distribution_matches_target(pair, case):
    target, draft = pair
    make, kwargs = CASES[case]
    counts = sample_joint(target, lambda: make(draft), case, **kwargs)
    exact = exact_joint(target, kwargs.get("prompt", PROMPT), K, kwargs["temperature"], kwargs.get("top_k", 0),
                        kwargs.get("top_p", 1.0))
    assert g_test(counts, exact) > ALPHA


def test_the_test_detects_a_biased_verifier(pair, monkeypatch):
    """Negative control: accepting every first proposal (output = draft's law) must fail the G-test."""
    target, draft = pair
    from treespec.core import verifiers

    def always_accept(tree, target_at, coins):
        path, node = [0], 0
        while tree.proposals[node]:
            node = tree.proposals[node][0].child
            path.append(node)
        return path, coins.draw(target_at(node))

    monkeypatch.setitem(verifiers.VERIFIERS, "rrs", verifiers.VerifierSpec(always_accept, lambda c: True, "biased"))
    counts = sample_joint(target, lambda: [treespec.ModelDrafter(draft, CHAINS, "sample")], "biased",
                          temperature=1.0)
    assert g_test(counts, exact_joint(target, PROMPT, K, 1.0)) < ALPHA
