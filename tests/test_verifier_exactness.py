"""Every verifier end to end through ``treespec.generate``: G-tests of the joint law of 3 tokens on each
construction it accepts (tiny HF models, the harness of test_exactness.py), and the clear error for
every construction it refuses."""

import pytest

import treespec
from stats import ALPHA
from test_exactness import BUSHY, CHAINS, PROMPT, REPEAT, joint_p, pair  # noqa: F401 (fixture)
from treespec.models.tiny import greedy_reference
from treespec.core.verifiers import NotExactError

CHAIN3 = [(0,), (0, 0), (0, 0, 0)]
MD = treespec.ModelDrafter

CASES = {
    "block/chain-sample-T1": ("block", lambda d: [MD(d, CHAIN3, "sample")], dict(temperature=1.0)),
    "block/ngram-chain-T0.7": ("block", lambda d: [treespec.NGramDrafter(max_tokens=3)],
                               dict(temperature=0.7, prompt=REPEAT)),
    "traversal/sample-T1": ("traversal", lambda d: [MD(d, BUSHY, "sample")], dict(temperature=1.0)),
    "traversal/wor-T0.7": ("traversal", lambda d: [MD(d, BUSHY, "sample_without_replacement")], dict(temperature=0.7)),
    "traversal/topk-topp0.9": ("traversal", lambda d: [MD(d, BUSHY, "topk")], dict(temperature=1.0, top_p=0.9)),
    "traversal/model+ngram": ("traversal", lambda d: [MD(d, BUSHY, "sample"), treespec.NGramDrafter(width=2)],
                              dict(temperature=1.0, prompt=REPEAT)),
    "traversal/budget-cut": ("traversal", lambda d: [treespec.NGramDrafter(max_tokens=2),
                                                     MD(d, BUSHY, "sample_without_replacement")],
                             dict(temperature=1.0, prompt=REPEAT, budget=5)),
    "spectr/chains-topk3": ("spectr", lambda d: [MD(d, CHAINS, "sample")], dict(temperature=0.7, top_k=3)),
    "spectr/bushy-T1": ("spectr", lambda d: [MD(d, BUSHY, "sample")], dict(temperature=1.0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_joint_distribution_matches_target(pair, case):  # noqa: F811
    target, draft = pair
    verifier, make, kwargs = CASES[case]
    assert joint_p(target, draft, lambda: make(draft), case, verifier=verifier, **kwargs) > ALPHA


REFUSED = {
    # verifier, drafters, generate kwargs, what the message must say
    "block/tree": ("block", lambda d: [MD(d, BUSHY, "sample")], {},
                   r"'block' is not exact .*i\.i\.d\. draws.*exact for this tree: rrs, traversal, spectr\."),
    "block/ngram-tree": ("block", lambda d: [treespec.NGramDrafter(width=2)], dict(prompt=REPEAT),
                         r"point-mass proposals.*exact for this tree: rrs, traversal\."),
    "spectr/wor": ("spectr", lambda d: [MD(d, BUSHY, "sample_without_replacement")], {},
                   r"'spectr' is not exact .*draws without replacement.*exact for this tree: rrs, traversal"),
    "spectr/topk": ("spectr", lambda d: [MD(d, BUSHY, "topk")], {}, r"point-mass proposals"),
    "spectr/model+ngram": ("spectr", lambda d: [MD(d, BUSHY, "sample"), treespec.NGramDrafter(width=2)],
                           dict(prompt=REPEAT), r"mix of proposal kinds.*2 drafters"),
    "spectr/two-samplers": ("spectr", lambda d: [MD(d, CHAINS, "sample"), MD(d, BUSHY, "sample")], {},
                            r"2 drafters"),
    "spectr/budget-cut": ("spectr", lambda d: [MD(d, BUSHY, "sample")], dict(budget=4), r"cut by the budget"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_constructions_raise_a_clear_error(pair, case):  # noqa: F811
    target, draft = pair
    verifier, make, kwargs, message = REFUSED[case]
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", PROMPT)
    with pytest.raises(NotExactError, match="(?s)" + message):
        treespec.generate(target, prompt, drafters=make(draft), max_new_tokens=6, temperature=1.0, seed=1,
                          verifier=verifier, **kwargs)


def test_unknown_verifier_is_refused_before_any_work(pair):  # noqa: F811
    target, draft = pair
    with pytest.raises(ValueError, match="unknown verifier 'specinfer'; choose one of rrs, block, traversal, spectr"):
        treespec.generate(target, PROMPT, drafters=[MD(draft, BUSHY)], temperature=1.0, verifier="specinfer")


@pytest.mark.parametrize("verifier", ["rrs", "block", "traversal", "spectr"])
def test_greedy_ignores_the_verifier(pair, verifier):  # noqa: F811
    """T = 0 walks the argmax whatever the verifier, on trees the verifier would refuse when sampling."""
    target, draft = pair
    out = treespec.generate(target, PROMPT, drafters=[MD(draft, BUSHY, "sample_without_replacement")],
                            max_new_tokens=12, verifier=verifier, seed=3)
    assert out.new_tokens == greedy_reference(target, PROMPT, 12)
    assert out.stats.verifier == verifier


def test_same_seed_same_output_and_verifier_recorded(pair):  # noqa: F811
    target, draft = pair
    runs = [treespec.generate(target, PROMPT, drafters=[MD(draft, BUSHY, "sample")], max_new_tokens=10,
                              temperature=1.0, seed=42, verifier="traversal") for _ in range(2)]
    assert runs[0].new_tokens == runs[1].new_tokens
    assert runs[0].stats.as_dict()["verifier"] == "traversal"
