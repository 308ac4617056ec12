"""Bad input gets an error that says what is wrong and how to fix it."""

import numpy as np
import pytest
import torch

import treespec
from treespec.models.tiny import tiny_model
from tree_builders import (SequoiaDP, TreeShape, chain, for_budget, greedy_best_first, independent_chains, kary,
                           kary_widths, sequoia)
from treespec.core.drafting import POINT_MASS, DraftProposals


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab=64)


def test_vocabulary_mismatch(target):
    draft = tiny_model("llama", vocab=80)
    with pytest.raises(ValueError, match="vocabulary of 80 tokens but the target has 64"):
        treespec.generate(target, [1, 2], drafters=[treespec.ModelDrafter(draft, [(0,)])], max_new_tokens=2)


def test_empty_shape(target):
    with pytest.raises(ValueError, match="shape is empty"):
        treespec.ModelDrafter(target, [])


@pytest.mark.parametrize("shape,fragment", [([(0, 0)], "ancestor-closed"), ([(1,)], "contiguous")])
def test_malformed_shape(target, shape, fragment):
    with pytest.raises(ValueError, match=fragment):
        treespec.ModelDrafter(target, shape)


def test_unknown_mode(target):
    with pytest.raises(ValueError, match="unknown ModelDrafter mode"):
        treespec.ModelDrafter(target, [(0,)], mode="beam")


@pytest.mark.parametrize("kwargs,fragment", [
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.01}, r"top_p must be in \(0, 1\]"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
    ({"budget": 0}, "budget must be an int >= 1"),
])
def test_bad_arguments(target, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        treespec.generate(target, [1, 2], **{"max_new_tokens": 2, **kwargs})


def test_a_tensor_of_several_rows_says_to_pass_a_list_of_prompts(target):
    with pytest.raises(ValueError, match=r"shape \(2, 2\).*list of token lists.*as a batch"):
        treespec.generate(target, torch.tensor([[1, 2], [3, 4]]), max_new_tokens=2)


def test_prompt_longer_than_context(target):
    with pytest.raises(ValueError, match="exceeds the model's context of 512 positions"):
        treespec.generate(target, list(range(60)) * 8, max_new_tokens=40)


def test_empty_prompt(target, monkeypatch):
    """``[]`` is neither a prompt nor a batch: said so, and by ``treespec.run`` before a tuning measures anything
    (the tuner is made to fail if called); an empty prompt in a batch, or as a tensor, is named as such."""
    from treespec.calibrate import choices

    for empty in ([], ()):
        with pytest.raises(ValueError, match="input_ids is empty: give a prompt of at least one token id .* or a "
                                             "non-empty list of prompts"):
            treespec.generate(target, empty, max_new_tokens=2)
    monkeypatch.setattr(choices, "resolve", lambda *a, **k: pytest.fail("tuned before the input was checked"))
    with pytest.raises(ValueError, match="input_ids is empty"):
        treespec.run(treespec.Recipe(tree="sequoia", acceptance=[0.6, 0.2]), target, [target], [],
                     max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt 1 of the batch: the prompt is empty"):
        treespec.generate(target, [[1, 2], []], max_new_tokens=2)
    with pytest.raises(ValueError, match="the prompt is empty"):
        treespec.generate(target, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2)


def test_unsupported_family():
    from transformers import BloomConfig, BloomForCausalLM

    bloom = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=32, n_layer=1, n_head=2)).eval()  # ALiBi
    with pytest.raises(ValueError, match="model family 'bloom' is not supported"):
        treespec.generate(bloom, [1, 2], max_new_tokens=2)


def test_dynamic_arguments(target):
    with pytest.raises(ValueError, match="nodes must be an int >= 1"):
        treespec.ModelDrafter(target, mode="dynamic", nodes=0)
    with pytest.raises(ValueError, match="not a shape"):
        treespec.ModelDrafter(target, [(0,)], mode="dynamic")


# --------------------------------------------------------------------------- generate's arguments


@pytest.mark.parametrize("kwargs,fragment", [
    ({"temperature": float("nan")}, "temperature must be finite"),
    ({"temperature": float("inf")}, "temperature must be finite"),
    ({"temperature": "1.0"}, "temperature must be a number"),
    ({"temperature": 1.0, "top_p": float("nan")}, "top_p must be finite"),
    ({"top_p": "0.9"}, "top_p must be a number"),
    ({"top_k": -1}, "top_k must be an int >= 0"),
    ({"top_k": 2.0}, "top_k must be an int"),
    ({"top_k": True}, "top_k must be an int"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be an int >= 1"),
    ({"max_new_tokens": "3"}, "max_new_tokens must be an int >= 1"),
    ({"max_new_tokens": True}, "max_new_tokens must be an int >= 1"),
    ({"seed": 1.5}, "seed must be an int"),
    ({"seed": "7"}, "seed must be an int"),
    ({"seed": -1}, "seed must be an int >= 0"),
    ({"seed": 10**23}, r"seed must be < 2\*\*64"),
    ({"budget": 2.0}, "budget must be an int >= 1"),
    ({"budget": True}, "budget must be an int >= 1"),
    ({"on_tokens": "print"}, "on_tokens must be callable"),
])
def test_bad_scalar_arguments(target, kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        treespec.generate(target, [1, 2], **{"max_new_tokens": 2, **kwargs})


def test_numpy_and_tensor_scalars_are_accepted(target):
    ref = treespec.generate(target, [1, 2], max_new_tokens=4, temperature=1.0, top_k=5, seed=3).new_tokens
    out = treespec.generate(target, np.array([1, 2]), max_new_tokens=np.int64(4), temperature=np.float32(1.0),
                            top_k=np.int64(5), seed=torch.tensor(3)).new_tokens
    assert out == ref
    # a list of 0-d tensors (``list(tensor)``) is one prompt's tokens, not a batch
    assert treespec.generate(target, list(torch.tensor([1, 2])), max_new_tokens=4, temperature=1.0, top_k=5,
                             seed=3).new_tokens == ref


@pytest.mark.parametrize("prompt,fragment", [
    ([1, 64], r"token id 64 at position 1, outside the model's vocabulary \[0, 64\)"),
    (torch.tensor([[-1, 2]]), r"token id -1 at position 0, outside the model's vocabulary \[0, 64\)"),
    (torch.tensor([[1.0, 2.0]]), "input_ids must hold integer token ids"),
    ([1.5, 2], r"input_ids\[0\] must be an int"),
    ("hello", "tokenize text first"),
])
def test_bad_prompt_ids(target, prompt, fragment):
    with pytest.raises(ValueError, match=fragment):
        treespec.generate(target, prompt, max_new_tokens=2)


# --------------------------------------------------------------------------- eos_token_id as HF takes it


@pytest.fixture(scope="module")
def eos_case(target):
    free = treespec.generate(target, [1, 2, 3], max_new_tokens=30).new_tokens
    k = next(i for i in range(3, 30) if free[i] not in free[:i])  # first occurrence, not at the start
    return free, k


@pytest.mark.parametrize("wrap", [int, lambda t: [t], lambda t: (t, 63) if t != 63 else (t,), torch.tensor,
                                  lambda t: torch.tensor([t]), np.int64, lambda t: np.array([t]),
                                  lambda t: torch.tensor([t], dtype=torch.int32)],
                         ids=["int", "list", "tuple", "tensor0d", "tensor1d", "numpy-int", "numpy-array", "int32"])
def test_eos_forms_all_stop(target, eos_case, wrap):
    free, k = eos_case
    out = treespec.generate(target, [1, 2, 3], max_new_tokens=30, eos_token_id=wrap(free[k]))
    assert out.new_tokens == free[: k + 1]


@pytest.mark.parametrize("eos,fragment", [
    ("53", "eos_token_id must hold token ids"),
    (53.0, "eos_token_id must hold token ids"),
    ([53, "1"], "eos_token_id must hold token ids"),
    ([[53]], "eos_token_id must hold token ids"),
    (torch.tensor([53.0]), "integer tensor of 0 or 1 dimensions"),
    (torch.tensor([[53]]), "integer tensor of 0 or 1 dimensions"),
    (-3, "negative id -3"),
    (True, "eos_token_id must hold token ids"),
    ([53, 10_000], "the id 10000, which the target never writes"),  # silent before: the run never stopped there
])
def test_bad_eos(target, eos, fragment):
    with pytest.raises(ValueError, match=fragment):
        treespec.generate(target, [1, 2], max_new_tokens=2, eos_token_id=eos)


# --------------------------------------------------------------------------- drafters


def test_drafters_must_be_a_list_of_distinct_drafters(target):
    d = treespec.NGramDrafter()
    with pytest.raises(ValueError, match=r"pass drafters=\[d\]"):
        treespec.generate(target, [1, 2], drafters=d, max_new_tokens=2)
    with pytest.raises(ValueError, match="same object as an earlier drafter"):
        treespec.generate(target, [1, 2], drafters=[d, d], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"drafters\[0\] is a str, not a treespec Drafter"):
        treespec.generate(target, [1, 2], drafters=["ngram"], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"a draft model drafts through treespec.ModelDrafter\(model"):
        treespec.generate(target, [1, 2], drafters=[target], max_new_tokens=2)


@pytest.mark.parametrize("budget", [4, None])  # as given, and left to resolve (which sees the drafts first)
@pytest.mark.parametrize("drafts, fragment", [
    ("model", r"got one LlamaForCausalLM: pass \[draft\]"),
    ("draft", "drafts must be a list of draft models, got str"),
    (["draft"], r"drafts\[0\] is a str, not a draft model"),
])
def test_run_takes_a_list_of_draft_models(target, budget, drafts, fragment):
    drafts = target if drafts == "model" else drafts
    with pytest.raises(ValueError, match=fragment):
        treespec.run(treespec.Recipe(tree="chain", budget=budget), target, drafts, [1, 2], max_new_tokens=2)


class FixedDrafter(treespec.Drafter):
    """Returns the same proposals at every step (a stand-in for a user's custom drafter)."""

    def __init__(self, proposals):
        self.proposals = proposals

    def propose(self, context):
        return self.proposals

    def describe(self):
        return "Fixed"


def sampled(tokens, parents, dists, rows, exclude=None):
    return DraftProposals(list(tokens), list(parents), dists, list(rows), exclude)


def uniform(rows=1, vocab=64):
    return torch.full((rows, vocab), 1.0 / vocab)


def q_zero_at(token, vocab=64):
    q = uniform(1, vocab)
    q[0, token] = 0.0
    return q / q.sum()


def negative_at(token, vocab=64):
    """A row summing to 1 with a negative entry at ``token``."""
    q = uniform(1, vocab)
    q[0, token] -= 0.5
    q[0, token + 1] += 0.5
    return q


@pytest.mark.parametrize("proposals,fragment", [
    (DraftProposals([1, 2, 3], [-1, 0]), "3 tokens but 2 parents"),
    (sampled([1, 2], [-1, 0], uniform(), [0]), "2 tokens but 1 dist_rows"),
    (sampled([1, 2], [-1, 0], uniform(), [0, 0], [()]), "2 tokens but 1 exclude"),
    (DraftProposals([1, 2], [-1, 1]), "proposal 1 has parent 1; a parent must be ROOT"),
    (DraftProposals([1, 2], [-1, -2]), "proposal 1 has parent -2"),
    (DraftProposals([1, 64], [-1, 0]), r"proposal 1 has token id 64, outside the vocabulary \[0, 64\)"),
    (DraftProposals([-5], [-1]), "proposal 0 has token id -5"),
    (DraftProposals([1.0, 2.0], [-1, 0]), "tokens must be a list of ints"),
    (sampled([1, 2], [-1, 0], uniform(), [0, 1]), "proposal 1 has dist row 1 but dists has 1 rows"),
    (sampled([1], [-1], uniform(1, 80), [0]), "dists has 80 columns but the vocabulary has 64"),
    (sampled([1], [-1], None, [0]), "proposal 0 has dist row 0 but dists is None"),
    (sampled([1, 7], [-1, 0], q_zero_at(7), [POINT_MASS, 0]), r"proposal 1 \(token 7\).*q\(x\) = 0"),
    (sampled([1, 7], [-1, -1], uniform(), [0, 0], [(), (7,)]), "proposal 1 .*one of its exclude tokens"),
    (sampled([1], [-1], uniform(), [0], [(99,)]), "proposal 0 has excluded token id 99"),
    # a row that is no distribution: verification would divide by another q than the tokens were drawn from
    (sampled([1, 2], [-1, 0], torch.cat([uniform(), 0.3 * uniform()]), [0, 1]),
     "proposal 1 is drawn from dist row 1, which is no distribution .*sum to 0.3"),
    (sampled([1], [-1], negative_at(3), [0]), r"sum to 1, the least is -0\.48"),
])
def test_draft_proposals_validate(proposals, fragment):
    with pytest.raises(ValueError, match=fragment):
        proposals.validate(64)


def test_valid_proposals_pass():
    sampled([1, 2, 3], [-1, -1, 0], uniform(2), [0, 0, 1], [(), (1,), ()]).validate(64)
    DraftProposals().validate(64)
    DraftProposals([5, 6], [-1, 0]).validate(64)


def test_engine_names_the_bad_drafter_and_proposal(target):
    """q(x) = 0 for a sampled proposal would be accepted with certainty: refused, with who and where."""
    bad = FixedDrafter(sampled([1, 7], [-1, 0], q_zero_at(7), [POINT_MASS, 0]))
    with pytest.raises(ValueError, match=r"drafters\[1\] \(Fixed\) returned invalid proposals: .*proposal 1"):
        treespec.generate(target, [1, 2], drafters=[treespec.NGramDrafter(), bad], max_new_tokens=4, temperature=1.0)
    out_of_vocab = FixedDrafter(DraftProposals([3, 64], [-1, 0]))
    with pytest.raises(ValueError, match=r"drafters\[0\] \(Fixed\).*token id 64"):
        treespec.generate(target, [1, 2], drafters=[out_of_vocab], max_new_tokens=4)
    not_proposals = FixedDrafter([3, 4])
    with pytest.raises(ValueError, match="propose\\(\\) must return a DraftProposals, got list"):
        treespec.generate(target, [1, 2], drafters=[not_proposals], max_new_tokens=4)


# --------------------------------------------------------------------------- tree builders


@pytest.mark.parametrize("call,fragment", [
    (lambda: for_budget("chains", 8, chains=0), "chains must be an int >= 1"),
    (lambda: for_budget("chains", 8, chains=2.0), "chains must be an int >= 1, got 2.0"),
    (lambda: for_budget("kary", 8, kary_width=0), "kary_width must be an int >= 1"),
    (lambda: for_budget("chain", 8, max_depth=0), "max_depth must be an int >= 1"),
    (lambda: for_budget("chain", 8.0), "budget must be an int >= 2"),
    (lambda: for_budget("chain", 1), "budget must be an int >= 2"),
    (lambda: for_budget(None, 8), "unknown tree builder None"),
    (lambda: chain(2.0), "gamma must be an int >= 0"),
    (lambda: chain(True), "gamma must be an int >= 0"),
    (lambda: kary(3), "widths must be a sequence of ints"),
    (lambda: kary((2, 1.5)), r"widths\[1\] must be an int >= 0"),
    (lambda: independent_chains(2, 1.5), "depth must be an int >= 0"),
    (lambda: kary_widths(8, 0), "width must be an int >= 1"),
    (lambda: greedy_best_first((0.5,), 4, max_depth=-1), "max_depth must be an int >= 0"),
    (lambda: greedy_best_first((0.5,), 4, max_width=1.5), "max_width must be an int >= 0"),
    (lambda: sequoia((0.5,), 8.0), "budget must be an int >= 1"),
    (lambda: sequoia((0.5,), None), "budget must be an int >= 1"),
    (lambda: SequoiaDP((0.5,), 8).shape(2.5), "budget must be an int >= 1"),
    (lambda: TreeShape([(1.0,)]), "non-integer ranks"),
    (lambda: TreeShape([(True,)]), "non-integer ranks"),
    (lambda: TreeShape.from_paths([(0,), (0.5,)]), "non-integer ranks"),
    (lambda: TreeShape.from_parents([-1, 0.0]), "node 1 has parent 0.0"),
    (lambda: sequoia(["0.5"], 8), "acceptance entries must be numbers"),
    (lambda: sequoia([True, 0.1], 8), "acceptance entries must be numbers"),
    (lambda: sequoia("0.5", 8), "acceptance must be a vector"),
    (lambda: sequoia(np.array(["a"]), 8), "numeric array"),
    (lambda: sequoia([0.5, float("nan")], 8), r"finite and in \[0, 1\]"),
])
def test_builder_arguments(call, fragment):
    with pytest.raises(ValueError, match=fragment):
        call()


def test_builders_take_numpy_ints():
    assert chain(np.int64(3)) == chain(3)
    assert for_budget("chains", np.int64(9), chains=np.int32(2)) == independent_chains(2, 4)
    assert sequoia(np.array([0.6, 0.2]), np.int64(6)) == sequoia((0.6, 0.2), 6)
    assert TreeShape([(np.int64(0),)]) == chain(1)


def test_a_flat_list_of_ranks_is_not_a_shape(target):
    with pytest.raises(ValueError, match=r"a path must be a sequence of ints, got 0"):
        treespec.ModelDrafter(target, [0, 1])


def test_a_dynamic_int8_target_is_refused(target, tmp_path):
    """Dynamic int8 scales a forward's activations over all its rows, so a tree's rows change each other's logits
    (greedy output then parts from the model's own): refused as a target at load and at generate; a draft's."""
    import copy

    from treespec.models import load
    from treespec.models.precision import to_precision

    int8 = to_precision(copy.deepcopy(target), "int8")
    with pytest.raises(ValueError, match="int8 is for drafts only"):
        treespec.generate(int8, [1, 2], max_new_tokens=2)
    treespec.generate(target, [1, 2], drafters=[treespec.ModelDrafter(int8, [(0,)])], max_new_tokens=2)
    target.save_pretrained(tmp_path / "m")
    with pytest.raises(ValueError, match="dtype 'int8' is for drafts only"):
        load(tmp_path / "m", dtype="int8", role="target")


@pytest.mark.parametrize("batch", [False, True])
def test_an_on_tokens_of_the_wrong_arity_is_refused_before_the_prefill(target, batch):
    prompts, wrong = ([[1, 2], [3]], lambda tokens: None) if batch else ([1, 2], lambda row, tokens: None)
    with pytest.raises(ValueError, match="on_tokens.* is called with"):
        treespec.generate(target, prompts, max_new_tokens=2, on_tokens=wrong)


@pytest.mark.parametrize("kwargs,fragment", [(dict(tree="sequoia", chains=3), "chains is an option of tree='chains'"),
                                             (dict(tree="chain", kary_width=4), "kary_width is an option of"),
                                             (dict(tree="kary", max_width=1), "max_width is an option of tree=")])
def test_a_builder_option_of_another_tree_is_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        treespec.Recipe(**kwargs)
