"""Several prompts at once through the captured step (treespec.core.captured.BatchCapturedStep): every row's draft
levels and tree in one forward each, and each row exactly as its prompt decoded alone through the captured step
(greedy: the target's own tokens, the same trees step for step; sampled: the same tokens with the row's seed, so
the single-prompt captured step's joint-distribution tests, tests/test_captured.py, carry over row by row)."""

import pytest
import torch

import treespec
from test_batch import PROMPTS, TREE
from test_captured import BACKEND, PADDED
from treespec.core import captured
from treespec.core.compiling import UNCOMPILED
from treespec.core.batch import row_seed
from treespec.models.tiny import greedy_reference

from conftest import tiny_pair

#: one worker runs the captured tests: a batch's runner keeps its graphs for the next test of its size
pytestmark = pytest.mark.xdist_group("captured")


def drafter(draft, mode="topk", **kwargs):
    return [treespec.ModelDrafter(draft, TREE, mode, **kwargs)]


@pytest.mark.parametrize("stop,backend", [(None, BACKEND), (0.5, "eager")], ids=["full-tree", "confidence-stop"])
def test_captured_greedy_rows_equal_each_prompt_alone(stop, backend):
    """Batch 1-4 of prompts of different lengths (one of a single token); with the confidence stop each row's
    drafting ends at its own depth (rows of one batch stop at different levels). The batch of 2 runs compiled graphs:
    the full tree AOT's (functionalised), the confidence stop dynamo's (the per-row stop is host logic between the
    same calls); the other batches and each prompt alone run the step's functions uncompiled (the batch's code; a
    graph per batch size would cost seconds of tracing each)."""
    target, draft = tiny_pair("llama")
    for size in (1, 2, 4):
        prompts = PROMPTS[:size]
        out = treespec.generate(target, prompts, drafter(draft, min_confidence=stop), max_new_tokens=20,
                                compile=backend if size == 2 else UNCOMPILED, envelope=PADDED)
        assert out.stats.step == "captured, batched"
        for prompt, row in zip(prompts, out.rows):
            alone = treespec.generate(target, prompt, drafter(draft, min_confidence=stop), max_new_tokens=20,
                                      compile=UNCOMPILED, envelope=PADDED)
            assert alone.stats.step == "captured"
            assert row.new_tokens == alone.new_tokens == greedy_reference(target, prompt, 20)
            assert row.stats.step_tokens == alone.stats.step_tokens  # the same trees, step for step
        assert out.forwards == max(r.stats.steps for r in out.rows)


def test_captured_rows_finish_at_different_steps_and_commit_nothing_after():
    """EOS ends a row early: its slot stays in the batch but commits nothing (its cache never outgrows the
    capacity, however long the others run), and the other rows stay exact."""
    target, draft = tiny_pair("llama")
    prompts = PROMPTS[:3]
    refs = [greedy_reference(target, p, 40) for p in prompts]
    eos = refs[0][2]
    out = treespec.generate(target, prompts, drafter(draft), max_new_tokens=40, eos_token_id=eos, compile=UNCOMPILED,
                            envelope=PADDED)
    for ref, row in zip(refs, out.rows):
        assert row.new_tokens == (ref[: ref.index(eos) + 1] if eos in ref else ref)
    lengths = [len(row.new_tokens) for row in out.rows]
    assert min(lengths) < max(lengths)
    runner = next(r for r in captured.RUNNERS.values() if r.rows == 3 and r.target is target)
    # the finished row stopped growing after its last step (whose path may run past EOS: at most a path's nodes),
    # while the rows that ran on committed every token they emitted
    assert int(runner.cache.length[0]) <= len(prompts[0]) - 1 + lengths[0] + PADDED.depth < 40
    assert int(runner.cache.length[2]) >= len(prompts[2]) - 1 + lengths[2] - 1


@pytest.mark.parametrize("verifier,mode,temperature", [("rrs", "sample_without_replacement", 1.0),
                                                        ("traversal", "topk", 0.7)])
def test_captured_sampled_rows_equal_each_prompt_alone_with_the_rows_seed(verifier, mode, temperature):
    """Each row draws its own random numbers (its generator, seeded ``row_seed``) in the order the single-prompt
    step draws them, so a row's output does not depend on its batch mates; another seed changes it (the control).
    The batch runs dynamo's graphs, each prompt alone the step's functions uncompiled (what the joint-distribution
    tests run: this ties their batched rows to the compiled batch; tests/test_captured.py ties one row's)."""
    target, draft = tiny_pair("qwen2")
    kw = dict(max_new_tokens=16, temperature=temperature, verifier=verifier, envelope=PADDED)
    outs = {}
    for seed in (0, 7):
        out = outs[seed] = treespec.generate(target, PROMPTS[:3], drafter(draft, mode), seed=seed, compile="eager",
                                             **kw)
        for r, (prompt, row) in enumerate(zip(PROMPTS, out.rows)):
            alone = treespec.generate(target, prompt, drafter(draft, mode), seed=row_seed(seed, r),
                                      compile=UNCOMPILED, **kw)
            assert row.new_tokens == alone.new_tokens and row.stats.step_tokens == alone.stats.step_tokens
    assert [r.new_tokens for r in outs[0].rows] != [r.new_tokens for r in outs[7].rows]


#: the FX node count of each graph dynamo hands to :func:`_counting`
GRAPH_SIZES: list[int] = []


@torch._dynamo.register_backend(name="treespec_count_nodes")
def _counting(gm: torch.fx.GraphModule, example_inputs) -> object:
    """A ``torch.compile`` backend that runs dynamo's graph as it is and records its size."""
    GRAPH_SIZES.append(len(gm.graph.nodes))
    return gm.forward


def test_the_captured_graphs_do_not_grow_with_the_batch():
    """Every row's acceptance is one walk over the batch (``rule``'s walks run over ``[B, ...]``), so the captured
    step's graphs hold the same operations for 6 rows as for 2 (a walk traced row by row grew with the rows, and so
    did its compile time); and a row's output is still its prompt's alone. (Draws without replacement under
    ``rrs``: the walk with the most per-row work, each proposal's ``q`` without its older siblings.)"""
    target, draft = tiny_pair("qwen2")
    mode = "sample_without_replacement"
    kw = dict(max_new_tokens=6, temperature=1.0, compile="treespec_count_nodes", envelope=PADDED)
    sizes = {}
    for rows in (2, 6):
        GRAPH_SIZES.clear()
        out = treespec.generate(target, (PROMPTS * 2)[:rows], drafter(draft, mode), seed=3, **kw)
        assert out.stats.step == "captured, batched"
        sizes[rows] = list(GRAPH_SIZES)
    assert len(sizes[2]) >= 2 and sizes[2] == sizes[6], sizes
    kw["compile"] = UNCOMPILED  # the step's code as the graphs run it (tests/test_captured.py ties the two)
    alone = treespec.generate(target, PROMPTS[0], drafter(draft, mode), seed=3, **kw)
    assert out.rows[0].new_tokens == alone.new_tokens


def test_a_batch_the_captured_step_cannot_run_runs_eager_and_says_why():
    target, draft = tiny_pair("llama")
    drafters = drafter(draft) + [treespec.NGramDrafter(width=2)]
    out = treespec.generate(target, PROMPTS[:2], drafters, max_new_tokens=8, compile=BACKEND)
    assert out.stats.step.startswith("eager, batched: compile=... captures one model drafter's static tree")
    assert "2 drafters merge into a trie" in out.stats.step
    assert [r.new_tokens for r in out.rows] == [greedy_reference(target, p, 8) for p in PROMPTS[:2]]
