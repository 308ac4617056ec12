"""Property tests (hypothesis): the exactness promises over random combinations of what a call can hold.

The other tests pin named cases; these draw the combinations between them (drafter mixes: static trees in
each drafting mode, EAGLE-2 dynamic trees, confidence stops, n-gram and prompt-lookup drafters, two drafters
merged in one trie; budgets down to 1, EOS mid-sequence, one to 30 new tokens, prompts of one token or many,
single calls and batches, two vocabularies, drafts near the target and far from it, eager steps and the compiled
ones run uncompiled: ``compile="uncompiled"``, the captured or host-drafted step's functions as plain PyTorch) and
check, for each:

- greedy output equals HF ``generate``'s greedy continuation (float32), a batch's rows included, with the step
  counts consistent and no verified tree over the budget;
- sampled output is reproducible: the same seed gives the same tokens, and a batch's row gives what its prompt
  gives alone with the row's seed through the route the batch ran (``stats.step``).

and that ``treespec.run`` of a greedy recipe of each tree kind (Sequoia, chain, k-ary, chains, dynamic, paths; with
or without the n-gram drafter) gives the target's greedy output, and an int4 target's its own up to bfloat16 ties.

``derandomize=True``: the same examples on every run (CI stays deterministic); a failure is shrunk by hypothesis
to a small case and printed. Distributions are tested by the G-tests (``tests/test_exactness.py`` and others).
"""

from __future__ import annotations

import functools

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treespec
from treespec.core.batch import row_seed
from treespec.bench.compare import first_divergence
from treespec.models.precision import to_precision
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model
from treespec.recipes import NGramSettings

#: examples per test (the suite's minutes are shared with every other file; the named cases are pinned elsewhere):
#: a greedy example costs ~0.13 s on the slower CI host, a sampled one ~0.75 s (its rows run alone twice as well)
SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SHAPES = {"chain": [(0,), (0, 0), (0, 0, 0)], "kary": [(0,), (1,), (0, 0), (0, 1), (1, 0)],
          "lopsided": [(0,), (1,), (2,), (0, 0), (0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0, 0)], "one": [(0,)]}
STATIC_MODES = ("topk", "sample_without_replacement", "sample")  # the captured step's first


@functools.lru_cache(maxsize=None)
def models(family: str, vocab: int, noise: float, precision: str = "float32"
           ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A peaky tiny target (no near-ties at float32; ``precision="int4"``: on the int4 kernel, its prompt on
    bfloat16 twins, as a GGUF target runs) and a float32 draft ``noise`` away from it, made once."""
    target = tiny_model(family, vocab=vocab, hidden=64, layers=1, scale=6, seed=0)
    draft = perturbed_copy(target, noise)
    return (to_precision(target, "int4", twin="bfloat16") if precision == "int4" else target), draft


drafter_spec = st.one_of(
    st.tuples(st.just("model"), st.sampled_from(list(SHAPES)), st.sampled_from(STATIC_MODES),
              st.sampled_from([None, 0.5, 0.05])),
    st.tuples(st.just("dynamic"), st.integers(1, 4), st.integers(1, 3), st.integers(1, 8),
              st.sampled_from([None, 0.3])),
    st.tuples(st.just("ngram"), st.integers(2, 4), st.integers(1, 4), st.integers(1, 2),
              st.sampled_from(["ngram", "prompt_lookup"])),
)


def build(spec: tuple, draft: torch.nn.Module) -> treespec.Drafter:
    """A fresh drafter from its drawn ``spec`` (drafters hold state: each call gets its own)."""
    kind, *args = spec
    if kind == "model":
        shape, mode, stop = args
        return treespec.ModelDrafter(draft, SHAPES[shape], mode, min_confidence=stop)
    if kind == "dynamic":
        depth, topk, nodes, stop = args
        return treespec.ModelDrafter(draft, mode="dynamic", depth=depth, topk=topk, nodes=nodes, min_confidence=stop)
    order, tokens, width, mode = args
    return treespec.NGramDrafter(max_order=order, max_tokens=tokens, width=width, mode=mode)


@st.composite
def calls(draw: st.DrawFn) -> dict:
    """One call's models, prompts (one, or a batch of 2-3 where one may repeat another), drafters and lengths."""
    family = draw(st.sampled_from(["llama", "qwen2"]))
    vocab = draw(st.sampled_from([16, 64]))
    noise = draw(st.sampled_from([0.1, 0.3, 1.5]))
    prompt = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=24)
    batch = draw(st.booleans())  # a batch of one is a batch too
    prompts = draw(st.lists(prompt, min_size=1, max_size=3)) if batch else [draw(prompt)]
    if len(prompts) > 1 and draw(st.booleans()):
        prompts[-1] = list(prompts[0])
    # hypothesis draws the first of a list's values most (and shrinks to them): the richer cases go first
    drafters = draw(st.sampled_from([1, 2, 0]))
    return {"family": family, "vocab": vocab, "noise": noise, "prompts": prompts,
            "batch": batch,
            "drafters": [draw(drafter_spec) for _ in range(drafters)],
            "max_new_tokens": draw(st.sampled_from([30, 7, 3, 2, 1])),
            "budget": draw(st.sampled_from([None, 9, 5, 3, 2, 1])),
            "eos_at": draw(st.one_of(st.integers(0, 29), st.none())),
            "compile": draw(st.sampled_from(["uncompiled", False]))}


def run(c: dict, prompts: list, seed, **kw):
    """``treespec.generate`` of ``c`` over ``prompts`` (a list of prompts: a batch), fresh drafters; ``compile``:
    ``c``'s unless ``kw`` holds one."""
    target, draft = models(c["family"], c["vocab"], c["noise"], c.get("precision", "float32"))
    return treespec.generate(target, prompts, [build(s, draft) for s in c["drafters"]],
                             max_new_tokens=c["max_new_tokens"], budget=c["budget"], seed=seed,
                             compile=kw.pop("compile", c["compile"]), **kw)


@SETTINGS
@given(calls())
def test_greedy_output_is_the_targets_for_any_call(c):
    target, _ = models(c["family"], c["vocab"], c["noise"])
    n = c["max_new_tokens"]
    eos = None
    if c["eos_at"] is not None:  # a token the target emits (mid-sequence or last)
        free = greedy_reference(target, c["prompts"][0], n)
        eos = free[c["eos_at"] % len(free)]
    out = run(c, c["prompts"] if c["batch"] else c["prompts"][0], 0, eos_token_id=eos)
    rows = out.rows if c["batch"] else [out]
    for prompt, row in zip(c["prompts"], rows):
        assert row.new_tokens == greedy_reference(target, prompt, n, eos=eos)
        assert row.stats.new_tokens == len(row.new_tokens) and row.stats.steps == sum(row.stats.accepted_hist)
        if c["budget"] is not None:
            assert max(row.stats.tree_sizes) <= c["budget"]


@settings(SETTINGS, max_examples=40)
@given(calls())
def test_an_int4_targets_greedy_output_is_its_own_up_to_bfloat16_ties(c):
    """An int4 target (the kernel rounds at bfloat16): greedy output equals HF's greedy decoding of the same module,
    or first differs where its top two logits tie at bfloat16 (``compare.near_tie``: a tree's forward and a single
    token's sum in other orders), as ``--compare`` judges a quantised target's."""
    c = {**c, "precision": "int4"}
    target, _ = models(c["family"], c["vocab"], c["noise"], "int4")
    n = c["max_new_tokens"]
    out = run(c, c["prompts"] if c["batch"] else c["prompts"][0], 0)
    for prompt, row in zip(c["prompts"], out.rows if c["batch"] else [out]):
        ref = greedy_reference(target, prompt, n)
        where = first_divergence(target, prompt, ref, row.new_tokens)
        assert where is None or where["near_tie"], where


@settings(SETTINGS, max_examples=40)
@given(calls(), st.sampled_from([0.7, 1.0, 1.5]), st.sampled_from([0, 5]), st.sampled_from([1.0, 0.8]),
       st.sampled_from(["rrs", "traversal"]), st.integers(0, 2**32))
def test_sampled_output_is_reproducible_and_a_rows_is_its_prompts_alone(c, temperature, top_k, top_p, verifier,
                                                                          seed):
    kw = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "verifier": verifier}
    try:
        out = run(c, c["prompts"], seed, **kw)
    except treespec.core.verifiers.NotExactError:
        return  # a tree this verifier is not exact for: refused (tests/test_verifiers.py)
    if out.stats.step.startswith("eager"):
        kw["compile"] = False  # the batch's route: a batch that cannot be captured runs the eager batched step
    for r, (prompt, row) in enumerate(zip(c["prompts"], out.rows)):
        alone = run(c, prompt, row_seed(seed, r), **kw)
        assert row.new_tokens == alone.new_tokens and row.stats.step_tokens == alone.stats.step_tokens
        assert run(c, prompt, row_seed(seed, r), **kw).new_tokens == alone.new_tokens  # the same seed again


@st.composite
def recipes(draw: st.DrawFn) -> treespec.Recipe:
    """A greedy recipe of each tree kind with its own settings, an n-gram drafter or not, a stop or not."""
    tree = draw(st.sampled_from(["sequoia", "chain", "kary", "chains", "dynamic", "paths"]))
    kw = {"tree": tree, "budget": draw(st.sampled_from([7, 12, 4, 2, 1])),
          "depth": draw(st.sampled_from([None, 5, 2, 1])) if tree != "paths" else None,
          "min_confidence": draw(st.sampled_from([None, 0.5, 0.1])),
          "draft_mode": draw(st.sampled_from([None, "sample_without_replacement", "sample"])) if tree != "dynamic"
          else None,  # a dynamic tree reads no drafting mode (Recipe refuses one)
          "compile": draw(st.sampled_from(["uncompiled", False]))}
    if tree == "sequoia":
        kw["acceptance"] = draw(st.sampled_from([[0.6, 0.2, 0.1], [0.9, 0.05], [0.3]]))
        kw["max_width"] = draw(st.sampled_from([None, 1, 2]))
    kw |= {"kary": {"kary_width": draw(st.integers(1, 3))}, "chains": {"chains": draw(st.sampled_from([None, 1, 3]))},
           "dynamic": {"dynamic_depth": draw(st.integers(1, 6)), "dynamic_topk": draw(st.sampled_from([8, 2, 1]))},
           "paths": {"paths": draw(st.sampled_from([[[0], [0, 0], [1]], [[0], [1], [2], [0, 0], [0, 0, 0]]]))},
           }.get(tree, {})
    if draw(st.booleans()):
        kw["ngram"] = NGramSettings(max_order=draw(st.integers(2, 4)), max_tokens=draw(st.integers(1, 3)),
                                    width=draw(st.integers(1, 2)), mode=draw(st.sampled_from(["ngram",
                                                                                               "prompt_lookup"])))
    return treespec.Recipe(**kw)


@settings(SETTINGS, max_examples=60)
@given(recipes(), st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=20), min_size=1, max_size=3),
       st.sampled_from([24, 5, 1]))
def test_greedy_output_of_any_recipe_is_the_targets(recipe, prompts, n):
    """``treespec.run``: each tree kind built from its settings (``treespec.recipes.plan``) into drafters."""
    target, draft = models("qwen2", 64, 0.3)
    out = treespec.run(recipe, target, [draft], prompts if len(prompts) > 1 else prompts[0], max_new_tokens=n,
                       seed=1)
    for prompt, row in zip(prompts, out.rows if len(prompts) > 1 else [out]):
        assert row.new_tokens == greedy_reference(target, prompt, n)
