"""Sampling exactness end to end: the joint law of the first 3 tokens equals the target's.

Tiny models with a 6-token vocabulary, so the exact joint distribution (216 cells) is computed by
enumeration; G-test at alpha = 1e-3 with seeds spread by hashing (docs/design.md).

How many trials a test runs is a stated power calculation (:func:`trials`): the smallest number at which
the G-test detects, with probability 0.99, a step that emits the draft's first token without verifying it
(``stats.root_unverified``: the law such a step produces), and at least 400. The draft of the pair is
perturbed enough (noise 2.0) for that error to be visible at about a thousand trials (a draft closer to the
target would need 9,350 at T=1: the 0.6 of the earlier pair).
"""

import functools
from collections import Counter

import pytest
import torch

import treespec
from stats import ALPHA, exact_joint, g_test, root_unverified, trials_to_detect
from treespec.core.batch import row_seed
from treespec.core.sampling import spread_seed
from treespec.models.tiny import perturbed_copy, tiny_model

K, PROMPT = 3, [1, 2, 3]
#: the fewest trials a joint-distribution test runs, whatever the power calculation says: with fewer, the
#: G-test pools most of the 216 cells of three tokens
FEWEST = 400
#: trials run as the rows of batches of this many prompts (:func:`sample_joint`); trial counts are multiples of 50
ROWS = 50
#: rows of the first batch that also run alone, and must give the row's tokens
ALONE = 20
BUSHY = [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
REPEAT = [1, 2, 3, 1, 2, 3, 1, 2]
CHAINS = [(0,), (1,), (2,), (0, 0), (1, 0), (2, 0)]  # 3 independent chains of length 2


@pytest.fixture(scope="session")
def pair():
    target = tiny_model("llama", vocab=6, hidden=16, layers=1, scale=3, seed=5)
    return target, perturbed_copy(target, 2.0, seed=2)


@functools.lru_cache(maxsize=None)
def four_token_pair():
    """The pair with a 4-token vocabulary (64 cells for 3 tokens) and a draft perturbed enough (noise 1.5) that the
    stated error of :func:`trials` shows at its floor of 400 trials: for the steps whose trials run one by one."""
    target = tiny_model("llama", vocab=4, hidden=16, layers=1, scale=3, seed=5)
    return target, perturbed_copy(target, 1.5, seed=2)


@functools.lru_cache(maxsize=None)
def _trials(target, draft, prompt: tuple[int, ...], temperature: float, top_k: int, top_p: float) -> int:
    exact = exact_joint(target, list(prompt), K, temperature, top_k, top_p)
    return max(FEWEST, trials_to_detect(exact, root_unverified(target, draft, list(prompt), K, temperature, top_k,
                                                                top_p)))


def trials(target, draft, prompt=PROMPT, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> int:
    """The trials of a joint-distribution test of ``target`` with ``draft`` (module docstring)."""
    return _trials(target, draft, tuple(prompt), float(temperature), int(top_k), float(top_p))


def sample_joint(target, make_drafters, tag, n: int, prompt=PROMPT, **kwargs) -> Counter:
    """The first ``K`` tokens of ``n`` seeded trials of ``treespec.generate``, counted.

    The trials run as the rows of batches of ``ROWS`` copies of the prompt (``n`` rounded up to whole batches): a
    batch's row decodes as its prompt alone with the row's seed (``batch.row_seed``), by the batched form of the
    step the prompt alone runs, so the rows are independent trials of that step's law (tests/test_batch.py and
    tests/test_batch_captured.py test rows against prompts alone; here the first ``ALONE`` rows of the first batch
    are run alone too, and must give the same tokens). A step with no batched form (the compiled step drafted on
    the host: a batch falls back to the eager step) runs its ``n`` trials one by one.
    """
    first = treespec.generate(target, [prompt] * ROWS, make_drafters(), max_new_tokens=K, seed=spread_seed(tag, 0),
                              **kwargs)
    alone = [treespec.generate(target, prompt, make_drafters(), max_new_tokens=K,
                               seed=row_seed(spread_seed(tag, 0), r), **kwargs) for r in range(ALONE)]
    counts = Counter()
    if first.stats.step != f"{alone[0].stats.step}, batched":  # no batched form: one trial per call
        for i in range(n):
            out = treespec.generate(target, prompt, make_drafters(), max_new_tokens=K, seed=spread_seed(tag, i),
                                    **kwargs)
            counts[tuple(out.new_tokens)] += 1
        return counts
    assert [row.new_tokens for row in first.rows[:ALONE]] == [out.new_tokens for out in alone]
    for c in range(-(-n // ROWS)):
        out = first if c == 0 else treespec.generate(target, [prompt] * ROWS, make_drafters(), max_new_tokens=K,
                                                     seed=spread_seed(tag, c), **kwargs)
        counts.update(tuple(row.new_tokens) for row in out.rows)
    return counts


def joint_p(target, draft, make_drafters, tag, prompt=PROMPT, **kwargs) -> float:
    """The G-test p-value of the joint law of ``K`` tokens from ``treespec.generate(**kwargs)`` against the target's,
    over :func:`trials` trials (the draft's: the model whose unverified root is the stated error)."""
    sampling = {k: kwargs.get(k, d) for k, d in (("temperature", 0.0), ("top_k", 0), ("top_p", 1.0))}
    n = trials(target, draft, prompt, **sampling)
    return g_test(sample_joint(target, make_drafters, tag, n, prompt, **kwargs),
                  exact_joint(target, prompt, K, **sampling))


CASES = {
    "topk-T1": (lambda d: [treespec.ModelDrafter(d, BUSHY, "topk")], dict(temperature=1.0)),
    "sample-T1": (lambda d: [treespec.ModelDrafter(d, BUSHY, "sample")], dict(temperature=1.0)),
    "wor-T0.7": (lambda d: [treespec.ModelDrafter(d, BUSHY, "sample_without_replacement")], dict(temperature=0.7)),
    "chains-topp0.9": (lambda d: [treespec.ModelDrafter(d, CHAINS, "sample")], dict(temperature=1.0, top_p=0.9)),
    "duplicates-topk3": (lambda d: [treespec.ModelDrafter(d, CHAINS, "sample"),
                                    treespec.ModelDrafter(d, BUSHY, "topk")],
                         dict(temperature=0.7, top_k=3)),
    "dynamic-T1": (lambda d: [treespec.ModelDrafter(d, mode="dynamic", depth=3, topk=3, nodes=6)],
                   dict(temperature=1.0)),
    # on a repetitive prompt the n-gram guesses overlap the model's samples
    "model+ngram": (lambda d: [treespec.ModelDrafter(d, BUSHY, "sample"), treespec.NGramDrafter(width=2)],
                    dict(temperature=1.0, prompt=REPEAT)),
    # budget 5: the n-gram's 2 guesses, then the model's draws until the tree holds 5 nodes; draws that
    # merge into existing nodes take no room, so where the cut falls depends on earlier tokens
    "budget-cut": (lambda d: [treespec.NGramDrafter(max_tokens=2),
                              treespec.ModelDrafter(d, BUSHY, "sample_without_replacement")],
                   dict(temperature=1.0, prompt=REPEAT, budget=5)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_joint_distribution_matches_target(pair, case):
    target, draft = pair
    make, kwargs = CASES[case]
    assert joint_p(target, draft, lambda: make(draft), case, **kwargs) > ALPHA


def test_the_test_detects_a_biased_verifier(pair, monkeypatch):
    """Negative control: accepting every proposal (the shared rule, ``rule.verify_proposals``, patched; output =
    the draft's law) must fail the G-test at the same size."""
    target, draft = pair
    from treespec.core import rule

    monkeypatch.setattr(rule, "verify_proposals",
                        lambda r, tokens, q, u: (torch.zeros(r.shape[:-1], dtype=torch.long), r))
    assert joint_p(target, draft, lambda: [treespec.ModelDrafter(draft, CHAINS, "sample")], "biased",
                   temperature=1.0) < ALPHA
