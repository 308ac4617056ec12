"""One implementation of each acceptance rule for every step: the eager step verifies a tree with the same
tensor functions the compiled steps compile (``treespec.core.padded.accept`` over ``treespec.core.rule``), so on
a recorded tree (its proposals, the target's logits over it and the step's random numbers) the eager walk and
the compiled, padded walk must give the same path and the same extra token, rule by rule. A control that
changes one side only (the compiled graph's padding read as nodes) must make them disagree."""

from types import SimpleNamespace

import pytest
import torch

from treespec.core import padded
from treespec.core.drafting import ROOT, DraftProposals
from treespec.core.sampling import SamplingParams
from treespec.core.tree import TokenTree, flatten

V = 7
#: the compiled walk's width: every recorded tree (at most 7 nodes) padded to it, so one graph serves them all
PADDED = 10


def recorded_tree(seed: int) -> tuple[TokenTree, torch.Tensor]:
    """A tree of two drafters (i.i.d. draws with a merged duplicate, and point masses) and random target logits."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(3, V, generator=g), -1)
    drawn = torch.multinomial(q[0], 3, replacement=True, generator=g).tolist()
    sampled = DraftProposals(drawn + [int(torch.multinomial(q[1], 1, generator=g))],
                             [ROOT, ROOT, ROOT, 0], q, [0, 0, 0, 1])
    points = DraftProposals([int(torch.randint(V, (1,), generator=g)), 3], [ROOT, 0])
    tree = TokenTree.rooted_at(1)
    tree.merge([sampled, points])
    return tree, torch.randn(tree.size, V, generator=g) * 2


def walk(tree: TokenTree, logits: torch.Tensor, params: SamplingParams, verifier: str, seed: int, width: int,
         fn=padded.accept) -> tuple[list[int], int]:
    """The tree's walk at ``width`` (padded past its size: the compiled steps' layout), as tree nodes."""
    flat = flatten(tree)
    cpu = torch.device("cpu")
    logits = torch.cat([logits[flat.order], torch.zeros(width - len(flat), V)])  # the padded rows' logits: junk
    tree_t = padded.PaddedTree.of(flat, width, cpu)
    props = padded.Proposals.of(tree, flat, V, width, cpu) if not params.greedy else None
    noise = None
    if props is not None:  # the same random numbers for both widths: one per proposal, the exponentials
        g = torch.Generator().manual_seed(seed)
        n_props = sum(len(p) for p in tree.proposals)
        u = torch.rand(n_props, generator=g)
        noise = padded.Noise(torch.cat([u, torch.ones(props.token.shape[0] - n_props)]),
                             torch.empty(V).exponential_(generator=g))
        if verifier != "rrs":  # leaf tests: one per non-root node, in flat order
            noise = padded.Noise(torch.cat([torch.rand(len(flat) - 1, generator=g), torch.ones(props.token.shape[0])])
                                 [: props.token.shape[0]], noise.exponentials)
    on_path, extra = fn(logits[None], *padded.rows_of(tree_t, props, noise), params, verifier)  # a batch of one
    return [int(flat.order[i]) for i in on_path[0, : len(flat)].nonzero()[:, 0].tolist()], int(extra[0])


@pytest.mark.parametrize("verifier,temperature", [("rrs", 0.0), ("rrs", 1.0), ("traversal", 1.0), ("rrs", 0.6)])
def test_eager_and_compiled_walks_agree_on_recorded_trees(verifier, temperature):
    params = SamplingParams(temperature)
    compiled = torch.compile(padded.accept, fullgraph=True, backend="aot_eager")
    paths = set()
    for seed in range(12):
        tree, logits = recorded_tree(seed)
        eager = walk(tree, logits, params, verifier, seed, tree.size)  # the eager step: unpadded
        graph = walk(tree, logits, params, verifier, seed, PADDED, fn=compiled)  # the compiled: padded (one graph)
        assert eager == graph, (seed, eager, graph)
        paths.add(len(eager[0]))
    assert len(paths) > 1  # the recorded steps accept paths of several lengths


def test_the_check_sees_a_compiled_walk_that_differs():
    """Control: a compiled walk that takes the padding for nodes (its ``valid`` all true) disagrees on some tree."""
    params = SamplingParams(0.0)

    def padding_as_nodes(logits, tree, props, noise, params, verifier):
        return padded.accept(logits, tree._replace(valid=torch.ones_like(tree.valid),
                                                   parent=torch.zeros_like(tree.parent)), props, noise, params,
                             verifier)

    differs = False
    for seed in range(12):
        tree, logits = recorded_tree(seed)
        eager = walk(tree, logits, params, "rrs", seed, tree.size)
        differs |= eager != walk(tree, logits, params, "rrs", seed, tree.size + 3, fn=padding_as_nodes)
    assert differs


@pytest.mark.parametrize("verifier,temperature", [("rrs", 0.0), ("rrs", 1.0), ("traversal", 1.0)])
def test_rows_walked_in_one_call_equal_each_row_walked_alone(verifier, temperature):
    """A batch's rows (trees of different sizes, each its own generator) in one call of the rule
    (``padded.accept_rows``: padded to the widest tree and the longest proposal list) give each row's outcome
    alone; the rows accept paths of several lengths."""
    req = SimpleNamespace(params=SamplingParams(temperature), verifier=verifier, vocab=V, device=torch.device("cpu"))
    rows = []
    for seed in range(10):
        tree, logits = recorded_tree(seed)
        flat = flatten(tree)
        rows.append((tree, flat, logits[flat.order], seed))
    alone = [padded.HostAcceptance(req, torch.Generator().manual_seed(s)).accept(t, f, x) for t, f, x, s in rows]
    together = padded.accept_rows([(padded.HostAcceptance(req, torch.Generator().manual_seed(s)), t, f, x)
                                   for t, f, x, s in rows])
    assert together == alone
    assert len({len(f) for _, f, _, _ in rows}) > 1 and len({len(path) for path, _ in alone}) > 1
