"""Traversal (and block) verification on the device: ``rule.traversal_path`` and both compiled steps.

1. The pure function against the host rule (``verifiers.traversal``) on hand-made trees over a 5-token
   vocabulary: the host's law of (accepted node, extra token) computed exactly by enumerating its
   decisions, the device's sampled 50,000 times at once (``torch.vmap`` over the uniforms), G-test;
   without-replacement siblings, point masses (top-k), a chain (= block), merged duplicates, two
   drafters; negative controls (top-k children weighed against the draft ``q``; no parent update).
2. ``generate(compile=..., verifier="traversal" | "block")`` end to end: the joint law of 3 tokens
   (``tests/test_exactness.py``'s pair and G-test) through the captured step (top-k, without
   replacement) and the host-drafted compiled step (i.i.d. draws, merged duplicates), ``block`` on a
   chain, a negative control; no graph break or recompile over 30+ steps; greedy unchanged; the refusals.
"""

from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

import treespec
from stats import ALPHA, g_test
from test_exactness import BUSHY, PROMPT, four_token_pair, joint_p
from test_verifiers import decisions
from treespec.core import buffers, captured, padded as padded_tree, rule, verifiers
from treespec.core.compiling import UNCOMPILED
from treespec.core.drafting import ROOT, DraftProposals
from treespec.core.tree import TokenTree, flatten
from treespec.models.tiny import greedy_reference

#: one worker runs this file in order: the tie of the graphs to the uncompiled step reuses the no-recompile test's
#: runner (compiled graphs)
pytestmark = pytest.mark.xdist_group("compiled-traversal")

BACKEND = "aot_eager"
#: joint-distribution tests run their thousands of steps through the steps' functions uncompiled; the compiled
#: graphs are tied to them token for token under sampling with the same seed (test_the_graphs_are_the_steps_code)
JOINT_BACKEND = UNCOMPILED
V = 5
SAMPLES = 50_000

# -- 1. the pure function against the host rule ----------------------------------------------------

# (tokens, parents, q row per proposal or None for a point mass, exclude) of one drafter; rows index
# the draft distributions of the case (one per drafted context)
WOR = ([1, 3, 0, 2, 4, 1, 0], [ROOT, ROOT, ROOT, 0, 0, 1, 3], [0, 0, 0, 1, 1, 2, 3],
       [(), (1,), (1, 3), (), (2,), (), ()])
TOPK = ([1, 3, 0, 2, 4, 1, 0], [ROOT, ROOT, ROOT, 0, 0, 1, 3], None, None)
CHAIN = ([2, 0, 4, 1], [ROOT, 0, 1, 2], [0, 1, 2, 3], None)
# i.i.d. draws: two of token 1 at the root merge into one node, whose children come from both
DUPLICATES = ([1, 1, 3, 2, 4, 2], [ROOT, ROOT, ROOT, 0, 1, 2], [0, 0, 0, 1, 1, 2], None)
CASES = {"wor": [WOR], "topk": [TOPK], "chain": [CHAIN], "duplicates": [DUPLICATES],
         "topk+iid": [([4, 1, 2], [ROOT, ROOT, 1], None, None), ([1, 0, 1, 3], [ROOT, ROOT, 0, 0], [0, 0, 1, 1], None)]}


SEED = {"duplicates": 4}  # where the merged child is rejected as often as accepted


def hand_tree(case: str, seed: int | None = None) -> tuple[TokenTree, torch.Tensor, list[torch.Tensor]]:
    """The case's tree, a target row per tree node (float32) and each drafter's draft rows. A draft row is its
    context's target times noise, the proposed tokens made likelier, so the weights fall strictly inside (0, 1);
    the root's target gives token 3 no mass (a weight-0 subtree, as under top-p)."""
    g = torch.Generator().manual_seed(SEED.get(case, 2) if seed is None else seed)

    def dirichlet(n: int) -> torch.Tensor:
        x = torch._standard_gamma(torch.ones(n, V, dtype=torch.float64), g)
        return (x / x.sum(-1, keepdim=True)).float()

    shape = TokenTree.rooted_at(0)  # where the proposals go (their q does not change it)
    shape.merge([DraftProposals(tokens, parents) for tokens, parents, _, _ in CASES[case]])
    target = dirichlet(shape.size)
    target[0, 3] = 0.0
    target[0] /= target[0].sum()
    tree, drafts, rows_of = TokenTree.rooted_at(0), [], []
    for tokens, parents, rows, exclude in CASES[case]:
        dists, node_of = None, []
        for t, par in zip(tokens, parents):
            node_of.append(shape.children[0 if par == ROOT else node_of[par]][t])
        if rows is not None:
            context = {r: 0 if parents[j] == ROOT else node_of[parents[j]] for j, r in reversed(list(enumerate(rows)))}
            boost = 0.2 + torch.rand(max(rows) + 1, V, generator=g)  # and the proposed tokens up to 5 more
            boost[rows, tokens] += 5 * torch.rand(len(tokens), generator=g)
            dists = torch.stack([target[context[r]] for r in range(len(boost))]) * boost
            dists = (dists / dists.sum(-1, keepdim=True)).clamp_min(0.01)
        drafts.append(DraftProposals(tokens, parents, dists, rows, exclude))
        rows_of.append(dists)
    tree.merge(drafts)
    return tree, target, rows_of


def host_law(tree: TokenTree, target: torch.Tensor, verify=verifiers.traversal) -> dict:
    """Exact law of (accepted node, extra token) of a host verifier: every branch of its decisions."""
    law: dict = defaultdict(float)
    for (path, extra), p in decisions(lambda coins: verify(tree, lambda v: target[v].double(), coins)):
        law[(path[-1], extra)] += p
    return law


def device_counts(tree: TokenTree, target: torch.Tensor, walk=rule.traversal_path, seed: int = 0,
                  q_rows=None) -> Counter:
    """(accepted node, extra token) of ``SAMPLES`` runs of the device walk on the padded tree (2 padding
    nodes); ``q_rows``: replace the proposals' ``q`` (negative controls)."""
    flat = flatten(tree)
    w, cpu = len(flat) + 2, torch.device("cpu")
    probs = torch.full((w, V), 1.0 / V)
    probs[: len(flat)] = target[flat.order]
    padded = padded_tree.PaddedTree.of(flat, w, cpu)
    q, ptok, pparent, pchild, plast, has_props, post = padded_tree.Proposals.of(tree, flat, V, w, cpu)
    if q_rows is not None:
        q = q_rows(q, flat)
    g = torch.Generator().manual_seed(seed)
    uniforms = torch.rand(SAMPLES, ptok.shape[0], generator=g)
    exponentials = torch.empty(SAMPLES, V).exponential_(generator=g)
    rows = lambda *ts: [t.expand(SAMPLES, *t.shape) for t in ts]  # noqa: E731 (the tree's, in every row)
    if walk is rule.traversal_path:
        on_path, extra = walk(*rows(probs, q, ptok, pparent), pchild, padded.anc, post, uniforms, exponentials)
    else:
        on_path, extra = walk(*rows(probs, q, ptok, pparent), pchild, *rows(plast, has_props), uniforms, exponentials)
    deepest = (on_path * torch.arange(w)).argmax(-1)  # DFS order: the path's last node has the largest index
    return Counter(zip(flat.order[deepest.numpy()].tolist(), extra.tolist()))


@pytest.mark.parametrize("case", list(CASES))
def test_device_traversal_has_the_host_law(case):
    tree, target, _ = hand_tree(case)
    law = host_law(tree, target)
    nodes = defaultdict(float)
    for (node, _), p in law.items():
        nodes[node] += p
    assert sum(p > 0.03 for p in nodes.values()) >= 2, nodes  # the walk stops at several nodes
    if case == "chain":  # traversal is block on a chain
        assert host_law(tree, target, verifiers.block).keys() == law.keys()
        assert all(abs(host_law(tree, target, verifiers.block)[k] - p) < 1e-12 for k, p in law.items())
    if case == "duplicates":
        assert len(tree.proposals[0]) == 3 and len(tree.children[0]) == 2  # two proposals of one child
    assert g_test(device_counts(tree, target), law) > ALPHA


def test_the_harness_sees_the_device_rrs_walk_agree_with_the_host_rrs():
    tree, target, _ = hand_tree("wor")
    assert g_test(device_counts(tree, target, rule.sampled_path), host_law(tree, target, verifiers.rrs)) > ALPHA
    # and that traversal's law is another one (it accepts more)
    assert g_test(device_counts(tree, target), host_law(tree, target, verifiers.rrs)) < ALPHA


def test_negative_control_top_k_children_weighed_against_the_draft_q():
    """Top-k children verified as if drawn from the draft ``q`` (the paper's setting applied to top-k)."""
    tree, target, _ = hand_tree("topk")
    draft = torch.softmax(torch.randn(tree.size, V, generator=torch.Generator().manual_seed(1)), -1)

    def as_draws(q, flat):
        parent_rows = [int(flat.order[i]) for i in range(len(flat)) for _ in tree.proposals[flat.order[i]]]
        q = q.clone()
        q[: len(parent_rows)] = draft[parent_rows]
        return q

    assert g_test(device_counts(tree, target, q_rows=as_draws), host_law(tree, target)) < ALPHA


def test_negative_control_no_parent_update(monkeypatch):
    """A rejected child leaves its parent's weight as it was (the update of Algorithm 1 skipped)."""
    tree, target, _ = hand_tree("wor")
    monkeypatch.setattr(rule, "log_weight_after_rejection", lambda log_w, mass: log_w)
    assert g_test(device_counts(tree, target), host_law(tree, target)) < ALPHA


def test_negative_control_merged_duplicate_ignored():
    """The walk run on the deduplicated trie (the second proposal of the merged child dropped, so the root
    is not updated by it): biased."""
    tree, target, _ = hand_tree("duplicates")
    law = host_law(tree, target)
    tree.proposals[0] = [p for j, p in enumerate(tree.proposals[0]) if p.child not in
                         {o.child for o in tree.proposals[0][:j]}]
    assert g_test(device_counts(tree, target), law) < ALPHA


def test_compiles_fullgraph_and_matches_eager():
    tree, target, _ = hand_tree("duplicates")
    flat = flatten(tree)
    w, cpu = len(flat), torch.device("cpu")
    padded = padded_tree.PaddedTree.of(flat, w, cpu)
    q, ptok, pparent, pchild, _, _, post = padded_tree.Proposals.of(tree, flat, V, w, cpu)
    args = (target[flat.order][None], q[None], ptok[None], pparent[None], pchild, padded.anc, post)
    fn = torch.compile(rule.traversal_path, fullgraph=True, backend=BACKEND)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        u, e = torch.rand(1, ptok.shape[0], generator=g), torch.empty(1, V).exponential_(generator=g)
        eager, traced = rule.traversal_path(*args, u, e), fn(*args, u, e)
        assert torch.equal(eager[0], traced[0]) and torch.equal(eager[1], traced[1])


# -- 2. generate(compile=..., verifier=...) end to end ---------------------------------------------

@pytest.fixture(scope="module")
def pair():
    """``test_exactness.four_token_pair``: the stated error of ``test_exactness.trials`` shows at 400 trials."""
    return four_token_pair()


def joint(target, draft, make, tag, **kwargs) -> float:
    return joint_p(target, draft, make, tag, compile=JOINT_BACKEND, temperature=1.0, **kwargs)


@pytest.mark.parametrize("mode,step", [("topk", "captured"), ("sample_without_replacement", "captured"),
                                       ("sample", "compiled, drafted on the host")])
def test_joint_distribution_matches_target(pair, mode, step):
    """Top-k and draws without replacement on the device; i.i.d. draws (merged duplicates) on the host."""
    target, draft = pair
    make = lambda: [treespec.ModelDrafter(draft, BUSHY, mode)]  # noqa: E731
    out = treespec.generate(target, PROMPT, make(), max_new_tokens=3, temperature=1.0, verifier="traversal",
                            compile=JOINT_BACKEND, seed=0)
    assert out.stats.step.startswith(step) and out.stats.verifier == "traversal"
    assert joint(target, draft, make, f"traversal-{mode}", verifier="traversal") > ALPHA


def test_block_on_a_chain_matches_target(pair):
    target, draft = pair
    make = lambda: [treespec.ModelDrafter(draft, [(0,), (0, 0), (0, 0, 0)], "sample_without_replacement")]  # noqa: E731
    assert joint(target, draft, make, "block-chain", verifier="block") > ALPHA


def test_negative_control_leaf_tests_in_dfs_order(pair, monkeypatch):
    """Leaf tests taken in the flat tree's DFS order (each node before its subtree) instead of post-order:
    biased, and the same test at the same size must see it (the captured step's trees, draws without
    replacement: its trials run as the rows of batches)."""
    target, draft = pair
    dfs = lambda parent: np.arange(len(parent))  # noqa: E731
    monkeypatch.setattr(padded_tree, "post_order", dfs)
    monkeypatch.setattr(buffers, "post_order", dfs)
    captured.RUNNERS.clear()  # runners hold their tree's buffers: laid out again under the fault
    p = joint(target, draft, lambda: [treespec.ModelDrafter(draft, BUSHY, "sample_without_replacement")],
              "traversal-dfs", verifier="traversal")
    captured.RUNNERS.clear()
    assert p < ALPHA


def test_no_graph_break_and_no_recompile_over_varying_steps(pair):
    target, draft = pair
    kw = dict(temperature=1.0, verifier="traversal", compile=BACKEND)
    make = lambda: [treespec.ModelDrafter(draft, BUSHY, "sample_without_replacement")]  # noqa: E731
    treespec.generate(target, [1, 2, 3], make(), max_new_tokens=8, seed=0, **kw)  # compiles (unless a test above did)
    graphs = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = treespec.generate(target, [3, 2, 1, 0, 1, 2, 3], make(), max_new_tokens=130, seed=1, **kw)
    assert out.stats.step == "captured"
    assert counters["stats"]["unique_graphs"] == graphs
    assert not counters["graph_break"]
    assert out.stats.steps >= 30
    assert sum(1 for c in out.stats.accepted_hist if c) >= 2  # acceptance varied across the steps


@pytest.mark.parametrize("mode", ["sample_without_replacement", "sample"], ids=["captured", "host-drafted"])
def test_the_graphs_are_the_steps_code(pair, mode):
    """What the joint tests run uncompiled, the compiled graphs give token for token under traversal with the
    same seed (the captured case: the runner of test_no_graph_break_and_no_recompile_over_varying_steps)."""
    target, draft = pair
    kw = dict(max_new_tokens=60, temperature=1.0, verifier="traversal", seed=3)
    make = lambda: [treespec.ModelDrafter(draft, BUSHY, mode)]  # noqa: E731
    out = treespec.generate(target, [1, 3, 2, 0, 3], make(), compile=BACKEND, **kw)
    plain = treespec.generate(target, [1, 3, 2, 0, 3], make(), compile=UNCOMPILED, **kw)
    assert out.stats.step == plain.stats.step and out.stats.step.startswith(("captured", "compiled"))
    assert out.new_tokens == plain.new_tokens and out.stats.step_tokens == plain.stats.step_tokens
    assert sum(1 for c in out.stats.accepted_hist if c) >= 2  # acceptance varied across the steps


@pytest.mark.parametrize("mode", ["topk", "sample"], ids=["captured", "host-drafted"])
def test_greedy_is_unchanged(pair, mode):
    """Greedy walks ignore the verifier: the steps' code (uncompiled; the greedy graphs are tied to HF's tokens in
    tests/test_captured.py and tests/test_compile.py) gives HF's tokens under ``verifier="traversal"``."""
    target, draft = pair
    prompt = [1, 3, 2, 0, 3]
    out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, BUSHY, mode)], max_new_tokens=20,
                            verifier="traversal", compile=UNCOMPILED, budget=8)
    assert out.new_tokens == greedy_reference(target, prompt, 20)


def test_refusals_are_the_eager_steps(pair):
    """``block`` on a tree raises the eager step's NotExactError in both compiled steps; ``spectr`` runs on
    the host only."""
    target, draft = pair
    for mode in ("topk", "sample_without_replacement", "sample"):
        errors = []
        for compile in (False, BACKEND):
            with pytest.raises(verifiers.NotExactError) as e:
                treespec.generate(target, [1, 2], [treespec.ModelDrafter(draft, BUSHY, mode)], max_new_tokens=4,
                                  temperature=1.0, verifier="block", compile=compile, seed=0)
            errors.append(str(e.value))
        assert errors[0] == errors[1], errors
    with pytest.raises(ValueError, match="verifier='spectr' runs on the host only"):
        treespec.generate(target, [1, 2], [treespec.ModelDrafter(draft, BUSHY, "sample")], max_new_tokens=4,
                          temperature=1.0, verifier="spectr", compile=BACKEND)
