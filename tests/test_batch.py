"""Several prompts at once (treespec.core.batch): each row decodes exactly as its prompt alone.

Greedy rows equal the target's greedy output and the single-prompt run step for step (float32); sampled rows
equal the single-prompt run with the row's seed (the same random numbers in the same order), whichever prompts
share the batch; the joint law of a batch's rows is the target's (G-tests, trials as tests/test_exactness.py).
"""

from collections import Counter

import numpy as np
import pytest
import torch

import treespec
from stats import ALPHA, exact_joint, g_test
from test_exactness import BUSHY, K, four_token_pair, trials
from treespec.core.batch import BatchOutput, row_seed
from treespec.core.sampling import spread_seed
from treespec.models.tiny import greedy_reference

from conftest import counted_forwards, tiny_pair

#: prompts of different lengths (one of a single token: nothing to prefill)
PROMPTS = [[1, 5, 7, 9, 3], [4], [2, 8, 8, 2, 8, 8, 2, 8, 8, 2, 6], [11, 12, 13]]
TREE = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def drafter_sets(draft):
    return {
        "model": lambda: [treespec.ModelDrafter(draft, TREE, "topk")],
        "model+ngram": lambda: [treespec.ModelDrafter(draft, TREE, "topk"), treespec.NGramDrafter(width=2)],
        # rows whose drafting ends at different depths: the dynamic tree and the confidence stop
        "dynamic+stop": lambda: [treespec.ModelDrafter(draft, mode="dynamic", depth=4, topk=3, nodes=8),
                                 treespec.ModelDrafter(draft, TREE, "topk", min_confidence=0.5)],
        "none": lambda: [],
    }


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("drafters", ["model", "model+ngram", "dynamic+stop", "none"])
def test_greedy_rows_equal_each_prompt_decoded_alone(family, drafters):
    target, draft = tiny_pair(family)
    make = drafter_sets(draft)[drafters]
    for size in (1, 2, 4):
        prompts = PROMPTS[:size]
        out = treespec.generate(target, prompts, make(), max_new_tokens=20)
        assert isinstance(out, BatchOutput) and len(out.rows) == size
        for prompt, row in zip(prompts, out.rows):
            alone = treespec.generate(target, prompt, make(), max_new_tokens=20)
            assert row.new_tokens == alone.new_tokens == greedy_reference(target, prompt, 20)
            assert row.stats.step_tokens == alone.stats.step_tokens  # the same trees, step for step
            assert row.sequences[0].tolist() == prompt + row.new_tokens
        assert out.stats.new_tokens == 20 * size and out.forwards == max(r.stats.steps for r in out.rows)


class Delegating(treespec.Drafter):
    """A user's wrapper around another drafter (to log or filter its proposals): everything handed on."""

    def __init__(self, inner):
        self.inner, self.vocab_size = inner, inner.vocab_size

    def reset(self, prompt, *, sampling, seed):
        self.inner.reset(prompt, sampling=sampling, seed=seed)

    def prefill(self, prompt):
        self.inner.prefill(prompt)

    def propose(self, context):
        return self.inner.propose(context)

    def drafting(self, context):
        return self.inner.drafting(context)

    def for_row(self):
        return Delegating(self.inner.for_row())


class Counting(treespec.ModelDrafter):
    """A model drafter whose propose is its own (it counts its calls)."""

    calls = 0

    def propose(self, context):
        Counting.calls += 1
        return super().propose(context)


def test_a_wrapped_drafter_and_a_subclass_with_its_own_propose_draft_in_a_batch_as_alone():
    """A batch drafts in shared forwards only a drafter that says it may (``Drafter.drafts_in_forwards``: the model
    drafter); it took every drafter overriding ``drafting`` for one, so a wrapper failed in a batch (no ``model``;
    ``drafting`` None from an n-gram inside; its inner model drafter's cache never filled) and a subclass's own
    ``propose`` was skipped. Each now proposes row by row, as alone."""
    target, draft = tiny_pair("qwen2")
    for make, counted in ((lambda: [Delegating(treespec.NGramDrafter(width=2))], False),
                          (lambda: [Delegating(treespec.ModelDrafter(draft, TREE, "topk"))], False),
                          (lambda: [Counting(draft, TREE, "topk")], True)):
        Counting.calls = 0
        out = treespec.generate(target, PROMPTS, make(), max_new_tokens=12)
        assert (Counting.calls >= len(PROMPTS)) == counted  # the subclass's propose ran, for every row
        for prompt, row in zip(PROMPTS, out.rows):
            alone = treespec.generate(target, prompt, make(), max_new_tokens=12)
            assert row.new_tokens == alone.new_tokens == greedy_reference(target, prompt, 12)
            assert row.stats.step_tokens == alone.stats.step_tokens


def test_a_subclass_with_its_own_propose_is_not_captured():
    """The captured step drafts a model drafter's shape on the device: a subclass's own ``propose`` would not run
    there, so it drafts on the host (compile=True then takes the eager step, saying why)."""
    _, draft = tiny_pair("qwen2")
    assert isinstance(treespec.ModelDrafter(draft, TREE, "topk").capture(), treespec.core.drafting.Capture)
    assert "propose of its own" in Counting(draft, TREE, "topk").capture()


def test_rows_finish_at_different_steps_and_leave_the_batch():
    """EOS ends a row early; the rows left go on (the finished row's cache rows dropped) and stay exact."""
    target, draft = tiny_pair("llama")
    prompts = PROMPTS[:3]
    refs = [greedy_reference(target, p, 30) for p in prompts]
    eos = refs[0][4]  # row 0 stops at its fifth token (or earlier, where that token comes first)
    streamed = {r: [] for r in range(3)}
    out = treespec.generate(target, prompts, [treespec.ModelDrafter(draft, TREE, "topk")], max_new_tokens=30,
                            eos_token_id=eos, on_tokens=lambda r, toks: streamed[r].extend(toks))
    for r, (ref, row) in enumerate(zip(refs, out.rows)):
        cut = ref[: ref.index(eos) + 1] if eos in ref else ref
        assert row.new_tokens == cut == streamed[r]
    lengths = [len(row.new_tokens) for row in out.rows]
    assert min(lengths) < max(lengths)  # the rows did finish at different steps
    assert out.row_seconds[0] <= max(out.row_seconds)


@pytest.mark.parametrize("verifier,mode,temperature", [("rrs", "sample", 1.0), ("traversal", "topk", 0.7),
                                                        ("rrs", "sample_without_replacement", 1.0)])
def test_sampled_rows_equal_each_prompt_alone_with_the_rows_seed(verifier, mode, temperature):
    target, draft = tiny_pair("qwen2")

    def make():
        return [treespec.ModelDrafter(draft, TREE, mode)]

    for seed in (0, 7, 123):
        out = treespec.generate(target, PROMPTS, make(), max_new_tokens=16, temperature=temperature, seed=seed,
                                verifier=verifier)
        for r, (prompt, row) in enumerate(zip(PROMPTS, out.rows)):
            alone = treespec.generate(target, prompt, make(), max_new_tokens=16, temperature=temperature,
                                      seed=row_seed(seed, r), verifier=verifier)
            assert row.new_tokens == alone.new_tokens and row.stats.step_tokens == alone.stats.step_tokens


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_batch_rows_take_their_first_token_from_the_prefill(temperature):
    """Plain decoding of a batch: each row's prefill (a forward of its own prompt, ``RowsCache.prompts``) takes its
    last token and gives the row's first token (as ``EagerStep``'s does alone): N tokens in the prompts' forwards
    and N - 1 batch forwards; each row as its prompt alone, sampled ones with the row's seed."""
    target, _ = tiny_pair("qwen2")
    with counted_forwards(target) as calls:
        out = treespec.generate(target, PROMPTS, max_new_tokens=6, temperature=temperature, seed=5)
    assert len(calls) == len(PROMPTS) + 5 and out.forwards == 6 == max(r.stats.steps for r in out.rows)
    for r, (prompt, row) in enumerate(zip(PROMPTS, out.rows)):
        alone = treespec.generate(target, prompt, max_new_tokens=6, temperature=temperature, seed=row_seed(5, r))
        assert row.new_tokens == alone.new_tokens and len(row.new_tokens) == 6
        if temperature == 0.0:
            assert row.new_tokens == greedy_reference(target, prompt, 6)


def test_a_sampled_batchs_seed_repeats_it():
    """A sampled batch's pooled stats hold the call's seed, given or drawn (it held None: ``seed=stats.seed`` drew
    anew); a list of seeds has none to give, and greedy none."""
    target, draft = tiny_pair("qwen2")
    make = drafter_sets(draft)["model"]
    for given in (7, None):
        out = treespec.generate(target, PROMPTS, make(), max_new_tokens=8, temperature=1.0, seed=given)
        assert out.stats.seed == (7 if given is not None else out.rows[0].stats.seed) is not None
        again = treespec.generate(target, PROMPTS, make(), max_new_tokens=8, temperature=1.0, seed=out.stats.seed)
        assert [r.new_tokens for r in again.rows] == [r.new_tokens for r in out.rows]
    listed = treespec.generate(target, PROMPTS[:2], make(), max_new_tokens=4, temperature=1.0, seed=[1, 2])
    assert listed.stats.seed is None and [r.stats.seed for r in listed.rows] == [1, 2]
    assert treespec.generate(target, PROMPTS[:2], make(), max_new_tokens=4, seed=3).stats.seed is None


def test_a_list_of_seeds_gives_each_row_its_own():
    """``seed=[s0, s1, ...]``: row ``r`` decodes as its prompt alone with seed ``s_r`` (what a measurement that
    seeds each prompt by itself batches)."""
    target, draft = tiny_pair("qwen2")

    def make():
        return [treespec.ModelDrafter(draft, TREE, "sample")]

    seeds = [41, 5, 2**63, 41]
    out = treespec.generate(target, PROMPTS, make(), max_new_tokens=16, temperature=1.0, seed=seeds)
    for prompt, row, seed in zip(PROMPTS, out.rows, seeds):
        alone = treespec.generate(target, prompt, make(), max_new_tokens=16, temperature=1.0, seed=seed)
        assert row.new_tokens == alone.new_tokens and row.stats.step_tokens == alone.stats.step_tokens
    small = [41, 5, 7, 41]  # an array or tensor of seeds is such a list too
    listed = treespec.generate(target, PROMPTS, make(), max_new_tokens=8, temperature=1.0, seed=small)
    for array in (np.array(small), torch.tensor(small)):
        again = treespec.generate(target, PROMPTS, make(), max_new_tokens=8, temperature=1.0, seed=array)
        assert [r.new_tokens for r in again.rows] == [r.new_tokens for r in listed.rows]


def test_a_rows_output_does_not_depend_on_its_batch_mates():
    target, draft = tiny_pair("llama")

    def make():
        return [treespec.ModelDrafter(draft, TREE, "sample")]

    first = treespec.generate(target, [PROMPTS[0], PROMPTS[1]], make(), max_new_tokens=16, temperature=1.0, seed=5)
    other = treespec.generate(target, [PROMPTS[0], PROMPTS[2], PROMPTS[3]], make(), max_new_tokens=16,
                              temperature=1.0, seed=5)
    assert first.rows[0].new_tokens == other.rows[0].new_tokens
    # the control: another seed changes the row
    moved = treespec.generate(target, [PROMPTS[0], PROMPTS[1]], make(), max_new_tokens=16, temperature=1.0, seed=6)
    assert moved.rows[0].new_tokens != first.rows[0].new_tokens


#: each joint test's seeds (rrs keeps the draws it had before traversal joined it)
TAGS = {"rrs": "batch-joint", "traversal": "batch-joint-traversal"}
#: copies of the joint test's prompts in one batch
COPIES = 16


@pytest.mark.parametrize("verifier", list(TAGS))
def test_joint_law_of_each_row_of_a_batch_is_the_targets(verifier):
    """Three rows of different prompts at T=1 (a sampled tree; the token-level rule, and traversal verification):
    the first ``K`` tokens of each row, over seeded batches, against the target's exact law for that row's prompt
    (trials: the most any row needs). Rows accept different lengths, so they finish at different steps. The
    four-token pair and prompts on which its stated error (``test_exactness.trials``) shows at the floor of 400
    trials: 25 batches (the six-token pair's prompts needed up to 1,250)."""
    target, draft = four_token_pair()
    prompts = [[1, 2, 3], [1, 0], [0, 1, 1, 0]]
    n = max(trials(target, draft, p) for p in prompts)
    counts = [Counter() for _ in prompts]
    for i in range(-(-n // COPIES)):  # batches of the three prompts, COPIES times each (row j: prompt j % 3)
        out = treespec.generate(target, prompts * COPIES, [treespec.ModelDrafter(draft, BUSHY, "sample")],
                                max_new_tokens=K, temperature=1.0, seed=spread_seed(TAGS[verifier], i),
                                verifier=verifier)
        for j, row in enumerate(out.rows):
            counts[j % len(prompts)][tuple(row.new_tokens)] += 1
    for c, p in zip(counts, prompts):
        assert g_test(c, exact_joint(target, p, K, 1.0)) > ALPHA


def test_bad_batches_are_refused_with_what_to_do():
    target, _ = tiny_pair("llama")
    with pytest.raises(ValueError, match="prompt 1 of the batch: the prompt is empty"):
        treespec.generate(target, [[1, 2], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt 0 of the batch: .*exceeds the model's context"):
        treespec.generate(target, [[1] * (target.config.max_position_embeddings - 2), [3]], max_new_tokens=4)
    with pytest.raises(ValueError, match="prompt 0 of the batch: compile=... verifies on the device with"):
        treespec.generate(target, [[1], [2]], max_new_tokens=4, compile="aot_eager", temperature=1.0,
                          verifier="spectr")
    with pytest.raises(ValueError, match="non-empty list of prompts"):
        treespec.core.batch.generate_batch(target, [], max_new_tokens=4)
    with pytest.raises(ValueError, match="one seed per prompt; got 1 seeds for 2 prompts"):
        treespec.generate(target, [[1], [2]], max_new_tokens=4, seed=[3])
    with pytest.raises(ValueError, match="not None"):
        treespec.generate(target, [[1], [2]], max_new_tokens=4, seed=[3, None])


def test_a_batch_checks_its_settings_once_and_each_rows_prompt(monkeypatch):
    """The models and settings are checked once for a whole batch (with its first prompt), each row's prompt and
    its reach on its own: a batch of many rows does not check its target and draft once per row."""
    from treespec.core import checks

    target, draft = tiny_pair("llama")
    seen, prompts = [], []
    real_model, real_prompt = checks.check_model, checks.as_prompt
    monkeypatch.setattr(checks, "check_model",
                        lambda model, role="target": seen.append(role) or real_model(model, role))
    monkeypatch.setattr(checks, "as_prompt", lambda ids, vocab=None: prompts.append(ids) or real_prompt(ids, vocab))
    rows = [[1, 2], [3], [4, 5, 6], [7, 8]]
    out = treespec.generate(target, rows, [treespec.ModelDrafter(draft, BUSHY, "topk")], max_new_tokens=3)
    assert seen == ["target", "draft"] and prompts == rows and len(out.rows) == 4
    assert [r.stats.drafters[0].name for r in out.rows] == [out.rows[0].stats.drafters[0].name] * 4


def test_the_hf_baseline_decodes_a_batch_left_padded_as_each_prompt_alone():
    """``bench.baselines.hf_generate`` on a batch (HF's left padding and mask; the batch benchmark's baseline):
    each row equals the prompt's own greedy output in float32, eager and with HF's static cache compiled."""
    from treespec.bench.baselines import hf_generate

    target, _ = tiny_pair("qwen2")
    prompts = PROMPTS[:3]
    for static in (False, True):
        for batch in (prompts, prompts[:2], prompts):  # another batch size replaces the static cache, and back
            rows, seconds = hf_generate(target, batch, 8, static_compiled=static, compile_backend="eager")
            assert rows == [greedy_reference(target, p, 8) for p in batch] and seconds > 0
    assert hf_generate(target, prompts[0], 8)[0] == greedy_reference(target, prompts[0], 8)  # one prompt: one list


@pytest.mark.parametrize("drafters", ["model+ngram", "dynamic+stop", "none"])
def test_a_batch_that_cannot_be_captured_rows_equal_each_prompt_alone_eager(drafters):
    """``compile=`` with drafters the captured step does not take: the batch runs the eager batched step (its
    ``stats.step`` says so and why), and each sampled row equals its prompt alone through that route,
    ``compile=False``, with the row's seed. (Alone with ``compile=`` the prompt would run the compiled step
    drafted on the host, whose draws differ: the same law, other samples.)"""
    target, draft = tiny_pair("qwen2")
    make = drafter_sets(draft)[drafters]
    out = treespec.generate(target, PROMPTS, make(), max_new_tokens=12, temperature=1.0, seed=9, compile="aot_eager")
    assert out.stats.step.startswith("eager, batched: compile=... captures one model drafter's static tree")
    for r, (prompt, row) in enumerate(zip(PROMPTS, out.rows)):
        alone = treespec.generate(target, prompt, make(), max_new_tokens=12, temperature=1.0, seed=row_seed(9, r))
        assert row.new_tokens == alone.new_tokens and row.stats.step_tokens == alone.stats.step_tokens


@pytest.mark.parametrize("prompts, match", [
    ([[1, 2], []], "prompt 1 of the batch: .*empty"),
    ([[1, 2], "w1"], "prompt 1 of the batch: "),
    ([[1, 2], [3] * 600], r"prompt 1 of the batch: the prompt \(600 tokens\) plus max_new_tokens \(8\) exceeds"),
])
def test_a_run_that_tunes_its_tree_checks_each_prompt_before_measuring(prompts, match, monkeypatch):
    """``treespec.run`` with the budget left to tuning checks every prompt (tokens, context) before the tuner times
    anything, a batch's named by its place, as a run with a budget names it: before, a bad prompt failed unnamed and a
    too-long one only after the profile was measured and cached."""
    from treespec.calibrate import choices
    from treespec.recipes import Recipe

    target, draft = tiny_pair("llama")
    monkeypatch.setattr(choices, "resolve", lambda *a, **k: pytest.fail("tuned before the prompts were checked"))
    with pytest.raises(ValueError, match=match):
        treespec.run(Recipe(tree="chain", acceptance=[0.6, 0.2]), target, [draft], prompts, max_new_tokens=8)


@pytest.mark.parametrize("precisions", ["int4 target, int4 draft", "int8 draft"])
def test_quantised_rows_equal_each_prompt_alone(precisions):
    """A row's quantised layers do not move with its batch mates: an int4 layer took its twin (bfloat16 for a
    target, int8 for a draft: a prompt's) when the whole batch's rows reached the threshold, not one sequence's (a
    batch of 8 small trees verified on the twin, parting from the int4 target's own decoding); a torch.ao int8
    draft quantised every row's activations with one scale (each row's q moved with the others). Greedy rows equal
    the target's own greedy decoding, sampled rows their prompt alone with the row's seed."""
    import random

    from treespec.models.precision import to_precision
    from treespec.models.quantized import quantize_int4
    from treespec.models.tiny import perturbed_copy, tiny_model

    base = tiny_model("llama", vocab=128, hidden=64, layers=2, scale=1.0, seed=3)
    if precisions == "int8 draft":
        target, draft = base, to_precision(perturbed_copy(base, 0.3), "int8")
    else:
        target = quantize_int4(perturbed_copy(base, 0.0), group_size=32, twin="bfloat16")
        draft = quantize_int4(perturbed_copy(base, 0.3), group_size=32, twin="int8")
    rng = random.Random(0)
    prompts = [[rng.randrange(128) for _ in range(n)] for n in (5, 9, 3, 7, 4, 6, 8, 2)]
    tree = [(0,), (1,), (0, 0), (0, 1), (1, 0)]  # 8 rows x 5 nodes: past both twins' thresholds together

    def make(mode):
        return [treespec.ModelDrafter(draft, tree, mode)]

    greedy = treespec.generate(target, prompts, make("topk"), max_new_tokens=16)
    sampled = treespec.generate(target, prompts, make("sample_without_replacement"), max_new_tokens=16,
                                temperature=1.0, seed=5)
    for r, prompt in enumerate(prompts):
        alone = treespec.generate(target, prompt, make("topk"), max_new_tokens=16)
        assert greedy.rows[r].stats.step_tokens == alone.stats.step_tokens
        assert greedy.rows[r].new_tokens == greedy_reference(target, prompt, 16)
        alone = treespec.generate(target, prompt, make("sample_without_replacement"), max_new_tokens=16,
                                  temperature=1.0, seed=row_seed(5, r))
        assert sampled.rows[r].new_tokens == alone.new_tokens
