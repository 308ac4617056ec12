"""Exhaustive exactness of every verifier on tiny vocabularies, with negative controls that must fail.

A world of 3 tokens with explicit target and draft tables for every context. For one verification
step we enumerate every draft outcome (all token assignments of a drafted tree, with their
probabilities) and every random decision of the verifier (each ``accept(p)`` branches into True/False
with probabilities ``p`` and ``1 - p``, each ``draw(dist)`` into every token), so the law of the
committed tokens is computed exactly. Extending the committed tokens by the target's own sampling to
a fixed length, that law must equal the target's joint law (total variation ~1e-12): the condition
for exactness step after step.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections import defaultdict

import pytest
import torch

from treespec.core import verifiers
from treespec.core.drafting import ROOT, DraftProposals
from treespec.core.tree import TokenTree

V = 3
ROOT_TOKEN = 0


class World:
    """Target ``P`` and draft ``Q`` next-token tables for every context (a tuple of tokens after the root)."""

    def __init__(self, seed: int, depth: int, concentration: float = 0.7) -> None:
        g = torch.Generator().manual_seed(seed)
        dirichlet = lambda: torch._standard_gamma(torch.full((V,), concentration, dtype=torch.float64), g)  # noqa: E731
        self.P, self.Q = {}, {}
        for n in range(depth + 2):
            for ctx in itertools.product(range(V), repeat=n):
                p, q = dirichlet(), dirichlet()
                self.P[ctx], self.Q[ctx] = p / p.sum(), q / q.sum()

    def joint(self, n: int) -> dict[tuple[int, ...], float]:
        law = {(): 1.0}
        for _ in range(n):
            law = {s + (t,): w * float(self.P[s][t]) for s, w in law.items() for t in range(V)}
        return law

    def extend(self, law: dict[tuple[int, ...], float], n: int) -> dict[tuple[int, ...], float]:
        """Continue every committed string with the target's sampling up to length ``n``."""
        out: dict[tuple[int, ...], float] = defaultdict(float)
        stack = list(law.items())
        while stack:
            s, w = stack.pop()
            if len(s) >= n:
                out[s[:n]] += w
                continue
            stack.extend((s + (t,), w * float(self.P[s][t])) for t in range(V))
        return out


@functools.lru_cache(maxsize=None)
def world_of(seed: int, depth: int) -> World:
    """``World(seed, depth)``, built once per session: a pure function of its arguments, only read."""
    return World(seed, depth)


# -- drafted trees: every outcome of a static shape in one mode, with its probability -------------


def children_draws(q: torch.Tensor, b: int, mode: str):
    """Every ``b``-tuple of children drawn from ``q`` in ``mode``, with its probability."""
    if mode == "topk":
        yield tuple(torch.topk(q, b).indices.tolist()), 1.0
    elif mode == "sample":
        for toks in itertools.product(range(V), repeat=b):
            yield toks, float(torch.prod(q[list(toks)]))
    else:  # sequential sampling without replacement
        for toks in itertools.permutations(range(V), b):
            prob, left = 1.0, 1.0
            for t in toks:
                prob *= float(q[t]) / left
                left -= float(q[t])
            if prob > 0:
                yield toks, prob


def drafted(world: World, shape: list[tuple[int, ...]], mode: str, q_mode: str | None = None):
    """Every outcome of ``shape`` (child-rank paths) drafted in ``mode``, as (prob, DraftProposals).

    ``q_mode`` labels the proposals differently from how they were drawn (negative controls): e.g.
    top-k children labelled as draws without replacement from the draft ``q``.
    """
    q_mode = q_mode or mode
    paths = sorted(set(shape), key=lambda p: (len(p), p))
    parents = sorted({p[:-1] for p in paths}, key=lambda p: (len(p), p))
    width = {par: sum(1 for p in paths if p[:-1] == par) for par in parents}

    def rec(i: int, tokens: dict, prob: float):
        if i == len(parents):
            yield prob, tokens
            return
        par = parents[i]
        if par and par not in tokens:  # a dropped parent (never here: V >= widths)
            yield from rec(i + 1, tokens, prob)
            return
        ctx = tuple(tokens[par[:k]] for k in range(1, len(par) + 1))
        for toks, w in children_draws(world.Q[ctx], width[par], mode):
            yield from rec(i + 1, {**tokens, **{par + (r,): t for r, t in enumerate(toks)}}, prob * w)

    for prob, tokens in rec(0, {}, 1.0):
        ctxs = {p: tuple(tokens[p[:k]] for k in range(1, len(p))) for p in paths}
        toks = [tokens[p] for p in paths]
        pars = [ROOT if len(p) == 1 else paths.index(p[:-1]) for p in paths]
        if q_mode == "topk":
            yield prob, DraftProposals(toks, pars)
            continue
        # one row per parent node, as ModelDrafter does: siblings merged in the trie carry equal rows
        rows = [par for par in parents if all(q in tokens for q in [par[:k] for k in range(1, len(par) + 1)])]
        dists = torch.stack([world.Q[ctxs[par + (0,)]] for par in rows])
        exclude = [tuple(tokens[p[:-1] + (r,)] for r in range(p[-1])) if q_mode == "without_replacement" else ()
                   for p in paths]
        yield prob, DraftProposals(toks, pars, dists, [rows.index(p[:-1]) for p in paths], exclude)


def deduplicated(outcomes):
    """The same draws with repeated siblings dropped (a deduplicated trie), still labelled i.i.d."""
    for prob, d in outcomes:
        keep, index, seen = [], {}, set()
        for j, (t, par) in enumerate(zip(d.tokens, d.parents)):
            if (par, t) in seen or (par != ROOT and par not in index):
                continue
            seen.add((par, t))
            index[j] = len(keep)
            keep.append(j)
        yield prob, DraftProposals([d.tokens[j] for j in keep],
                                   [ROOT if d.parents[j] == ROOT else index[d.parents[j]] for j in keep],
                                   d.dists, [d.dist_rows[j] for j in keep], [() for _ in keep])


def point_masses(tokens: list[int], parents: list[int]):
    yield 1.0, DraftProposals(tokens, parents)


# -- every random decision of a verifier ---------------------------------------------------------


class Replay:
    """:class:`verifiers.Coins` that replays a prefix of choices and then takes the first open branch."""

    def __init__(self, prefix: tuple[int, ...]) -> None:
        self.prefix, self.log = prefix, []  # log: (choice, [(option, prob), ...])

    def _choose(self, options: list[tuple[object, float]]):
        options = [(o, p) for o, p in options if p > 0]
        i = len(self.log)
        choice = self.prefix[i] if i < len(self.prefix) else 0
        self.log.append((choice, options))
        return options[choice][0]

    def accept(self, prob: float) -> bool:
        prob = min(max(float(prob), 0.0), 1.0)
        return self._choose([(True, prob), (False, 1.0 - prob)])

    def draw(self, dist: torch.Tensor) -> int:
        return self._choose(list(enumerate(dist.tolist())))


def decisions(run):
    """Every outcome of ``run(coins)`` with its probability, over all branches of its decisions."""
    stack, out = [()], []
    while stack:
        prefix = stack.pop()
        coins = Replay(prefix)
        result = run(coins)
        prob = 1.0
        for choice, options in coins.log:
            prob *= options[choice][1]
        out.append((result, prob))
        taken = tuple(c for c, _ in coins.log)
        for i in range(len(prefix), len(coins.log)):
            stack.extend(taken[:i] + (alt,) for alt in range(1, len(coins.log[i][1])))
    return out


@contextlib.contextmanager
def memoised_arithmetic():
    """:func:`decisions` replays a verifier from its start for every branch of its decisions, so one enumeration
    asks the same pure arithmetic of the same few nodes thousands of times (SpecTr's rho: 17,457 calls on 18
    inputs in spectr's iid-deep case; a traversal child's weight: 36,477 on 91 in two-samplers): within the
    enumeration each input is computed once, by the verifier's own function (a formula a test patches in is
    what computes a miss)."""
    kseq_rho, log_weight = verifiers.kseq_rho, verifiers._log_weight
    verifiers.kseq_rho = _memoised(kseq_rho, lambda r, q, k: (r.dtype, r.shape, r.numpy().tobytes(), q.dtype,
                                                              q.shape, q.numpy().tobytes(), k))
    verifiers._log_weight = _memoised(log_weight, lambda log_w, p_x, q_x: (log_w, float(p_x), float(q_x)))
    try:
        yield
    finally:
        verifiers.kseq_rho, verifiers._log_weight = kseq_rho, log_weight


def _memoised(fn, key_of):
    """``fn`` computing each input (as ``key_of`` names it) once."""
    seen = {}

    def call(*args):
        key = key_of(*args)
        if key not in seen:
            seen[key] = fn(*args)
        return seen[key]

    return call


def step_law(world: World, draft_sets, verify, budget: int | None = None):
    """Exact law of one step's committed tokens, and the expected number of accepted draft tokens."""
    with memoised_arithmetic():
        return _step_law(world, draft_sets, verify, budget)


def _step_law(world: World, draft_sets, verify, budget: int | None):
    law: dict[tuple[int, ...], float] = defaultdict(float)
    accepted = 0.0
    for combo in itertools.product(*draft_sets):
        p_draft = 1.0
        for p, _ in combo:
            p_draft *= p
        tree = TokenTree.rooted_at(ROOT_TOKEN)
        tree.merge([d for _, d in combo], budget)
        ctx = {0: ()}
        for v in range(1, tree.size):
            ctx[v] = ctx[tree.parent[v]] + (tree.tokens[v],)
        target = lambda v: world.P[ctx[v]]  # noqa: E731
        for (path, extra), p in decisions(lambda coins: verify(tree, target, coins)):
            law[ctx[path[-1]] + (extra,)] += p_draft * p
            accepted += p_draft * p * (len(path) - 1)
    return law, accepted


def tv(world: World, law, depth: int) -> float:
    n = depth + 1
    full, exact = world.extend(law, n), world.joint(n)
    return 0.5 * sum(abs(full.get(k, 0.0) - exact[k]) for k in exact) + 0.5 * sum(
        v for k, v in full.items() if k not in exact)


@functools.lru_cache(maxsize=None)
def draft_sets(world: World, case: str):
    """The draft outcomes of one named construction (a tuple of per-drafter outcome tuples).

    Built once per (world, case) and shared by every verifier's enumeration of it: only read (each
    enumeration merges them into trees of its own)."""
    chain2, chain3 = [(0,), (0, 0)], [(0,), (0, 0), (0, 0, 0)]
    bushy = [(0,), (1,), (0, 0), (0, 1), (1, 0)]
    deep = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0), (1, 0)]
    cases = {  # built on demand: only the asked case enumerates its drafts
        "chain2-sample": lambda: [list(drafted(world, chain2, "sample"))],
        "chain3-sample": lambda: [list(drafted(world, chain3, "sample"))],
        "chain3-topk": lambda: [list(drafted(world, chain3, "topk"))],
        "wor-bushy": lambda: [list(drafted(world, bushy, "without_replacement"))],
        "wor-deep": lambda: [list(drafted(world, deep, "without_replacement"))],
        "iid-bushy": lambda: [list(drafted(world, bushy, "sample"))],  # duplicates merge in the trie
        "iid-deep": lambda: [list(drafted(world, deep, "sample"))],
        "iid-chains": lambda: [list(drafted(world, [(0,), (1,), (2,), (0, 0), (1, 0), (2, 0)], "sample"))],
        "topk-bushy": lambda: [list(drafted(world, bushy, "topk"))],
        "points-merged": lambda: [list(drafted(world, bushy, "topk")), list(point_masses([2, 1, 0], [ROOT, 0, ROOT]))],
        "sample+points": lambda: [list(drafted(world, bushy, "sample")), list(point_masses([2, 1], [ROOT, 0]))],
        "two-samplers": lambda: [list(drafted(world, chain2, "sample")),
                                 list(drafted(world, bushy, "without_replacement"))],
        # labelled as draws from the draft q, but drawn otherwise: no verifier can be exact on these
        "topk-as-wor": lambda: [list(drafted(world, bushy, "topk", q_mode="without_replacement"))],
        "iid-as-wor": lambda: [list(drafted(world, bushy, "sample", q_mode="without_replacement"))],
        "iid-deduplicated": lambda: [list(deduplicated(drafted(world, [(0,), (1,), (2,), (0, 0), (1, 0), (2, 0)],
                                                               "sample")))],
        "wor-as-iid": lambda: [list(drafted(world, bushy, "without_replacement", q_mode="sample"))],
    }
    return tuple(tuple(outcomes) for outcomes in cases[case]())


DEPTH = {"chain3-sample": 3, "chain3-topk": 3, "wor-deep": 3, "iid-deep": 3, "iid-deep-cut": 3}
BUDGET = {"iid-deep-cut": 4, "sample+points-cut": 3, "two-samplers-cut": 4}
EVERY = ["chain2-sample", "chain3-sample", "chain3-topk", "wor-bushy", "wor-deep", "iid-bushy", "iid-deep",
         "iid-chains", "topk-bushy", "points-merged", "sample+points", "two-samplers", "iid-deep-cut",
         "sample+points-cut", "two-samplers-cut"]
EXACT = {
    "rrs": EVERY,
    "block": ["chain2-sample", "chain3-sample", "chain3-topk"],
    "traversal": EVERY,
    "spectr": ["chain2-sample", "chain3-sample", "iid-bushy", "iid-deep", "iid-chains"],
}
SEEDS = (11, 12)


@functools.lru_cache(maxsize=None)
def case_law(case: str, verify, seed: int):
    """(world, law, expected accepted tokens, depth) of one named case under ``verify``: memoised (the comparisons of
    acceptance reuse the exactness tests' enumerations of the same world; a test that patches a verifier's insides
    calls :func:`step_law`)."""
    depth = DEPTH.get(case, 2)
    world = world_of(seed, depth)
    law, accepted = step_law(world, draft_sets(world, case.removesuffix("-cut")), verify, BUDGET.get(case))
    return world, law, accepted, depth


def trees(world: World, case: str):
    for combo in itertools.product(*draft_sets(world, case.removesuffix("-cut"))):
        tree = TokenTree.rooted_at(ROOT_TOKEN)
        tree.merge([d for _, d in combo], BUDGET.get(case))
        yield tree, sum(len(d) for _, d in combo) > sum(map(len, tree.proposals))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name,case", [(n, c) for n, cs in EXACT.items() for c in cs])
def test_exact_on_every_accepted_construction(name, case, seed):
    world, law, _, depth = case_law(case, verifiers.get(name).verify, seed)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert tv(world, law, depth) < 1e-12
    # the engine would run it: the construction read off each tree is one the verifier declares exact
    for tree, truncated in trees(world, case):
        assert verifiers.get(name).exact_for(verifiers.classify(tree, truncated))


@pytest.mark.parametrize("name", ["block", "spectr"])
def test_refused_constructions_are_really_refused(name):
    """Every case outside a verifier's list has some tree its declaration rejects."""
    world = world_of(11, 3)
    for case in set(EVERY) - set(EXACT[name]):
        assert any(not verifiers.get(name).exact_for(verifiers.classify(t, cut)) for t, cut in trees(world, case)), case


@pytest.mark.parametrize("case", ["chain3-sample", "wor-deep", "wor-bushy", "iid-deep", "sample+points",
                                  "two-samplers", "iid-deep-cut"])
def test_traversal_and_block_accept_at_least_as_much_as_rrs(case):
    acc = {name: case_law(case, verifiers.get(name).verify, SEEDS[0])[2] for name in ("rrs", "traversal")}
    assert acc["traversal"] > acc["rrs"] + 1e-6  # strictly more on these sampled trees
    if case.startswith("chain"):
        acc_block = case_law(case, verifiers.block, SEEDS[0])[2]
        assert abs(acc_block - acc["traversal"]) < 1e-12  # traversal on a chain is block verification


@pytest.mark.parametrize("case", ["topk-bushy", "points-merged"])
def test_point_mass_trees_gain_nothing(case):
    """No exact rule can accept a deterministic path more often than its target probability, which
    rrs already achieves: traversal accepts exactly as much."""
    acc = {name: case_law(case, verifiers.get(name).verify, SEEDS[0])[2] for name in ("rrs", "traversal")}
    assert abs(acc["traversal"] - acc["rrs"]) < 1e-12


def test_block_equals_traversal_decision_by_decision():
    world = World(3, 3)
    for _, d in draft_sets(world, "chain3-sample")[0]:
        tree = TokenTree.rooted_at(ROOT_TOKEN)
        tree.merge([d])
        ctx = [()]
        for v in range(1, tree.size):
            ctx.append(ctx[tree.parent[v]] + (tree.tokens[v],))
        target = lambda v: world.P[ctx[v]]  # noqa: E731
        a = sorted((r, round(p, 12)) for r, p in decisions(lambda c: verifiers.block(tree, target, c)))
        b = sorted((r, round(p, 12)) for r, p in decisions(lambda c: verifiers.traversal(tree, target, c)))
        assert a == b


# -- negative controls: the same test must fail on these --------------------------------------


@pytest.mark.parametrize("name,case", [("traversal", "topk-as-wor"), ("traversal", "iid-as-wor"),
                                       ("spectr", "iid-deduplicated"), ("spectr", "wor-as-iid")])
def test_biased_when_proposals_are_misdescribed(name, case):
    """Negative controls: traversal weighing top-k children against the draft q, i.i.d. siblings
    updated as draws without replacement; K-SEQ on a deduplicated trie or on draws without
    replacement. All biased, and the exhaustive test sees it."""
    world, law, _, depth = case_law(case, verifiers.get(name).verify, 11)
    assert tv(world, law, depth) > 1e-3


@pytest.mark.parametrize("wrong", ["no-residual-term", "ratio-to-remaining-q"])
def test_a_wrong_weight_formula_is_caught(monkeypatch, wrong):
    """Weight update off by the ``1 - w`` term, or the ``min(1, R / (1 - q(x)))`` seen in public code."""
    world = World(11, 2)
    # the host walk's update is the shared one (rule.log_weight_after_rejection), in logs
    if wrong == "no-residual-term":
        monkeypatch.setattr(verifiers, "log_weight_after_rejection", lambda log_w, mass: mass.clamp_max(1.0).log())
    else:
        monkeypatch.setattr(verifiers, "log_weight_after_rejection",
                            lambda log_w, mass: (mass / 0.6).clamp_max(1.0).log())
    law, _ = step_law(world, draft_sets(world, "wor-deep" if wrong == "no-residual-term" else "chain2-sample"),
                      verifiers.traversal)
    assert tv(world, law, 3 if wrong == "no-residual-term" else 2) > 1e-3


def test_block_refuses_a_tree():
    world = World(1, 2)
    tree = TokenTree.rooted_at(ROOT_TOKEN)
    tree.merge([draft_sets(world, "wor-bushy")[0][0][1]])
    with pytest.raises(ValueError, match="chain"):
        verifiers.block(tree, lambda v: world.P[()], Replay(()))


# -- the construction read off a tree ----------------------------------------------------------


def test_classify():
    world = World(1, 2)

    def cls(case, budget=None):
        tree = TokenTree.rooted_at(ROOT_TOKEN)
        tree.merge([outcomes[0][1] for outcomes in draft_sets(world, case)], budget)
        return verifiers.classify(tree, budget is not None)

    assert cls("chain2-sample").draws == "sampled" and cls("chain2-sample").chain
    assert cls("wor-bushy").draws == "without_replacement"
    assert cls("topk-bushy").draws == "point_mass" and not cls("topk-bushy").chain
    assert cls("points-merged").merged and cls("points-merged").drafters == 2
    assert cls("sample+points").draws == "mixed"
    iid = cls("iid-bushy")  # the first outcome draws token 0 everywhere: merged duplicates
    assert iid.draws == "iid" and iid.merged
    assert verifiers.get("spectr").exact_for(iid) and not verifiers.get("spectr").exact_for(cls("iid-bushy", budget=3))
    assert not verifiers.get("spectr").exact_for(cls("wor-bushy"))
    with pytest.raises(verifiers.NotExactError,
                       match=r"(?s)'spectr' is not exact .*mix of proposal kinds.*exact for this tree: rrs, traversal"):
        verifiers.check_exact("spectr", cls("sample+points"))
    with pytest.raises(verifiers.NotExactError, match=r"(?s)'block' .*exact for this tree: rrs, traversal, spectr\."):
        verifiers.check_exact("block", cls("iid-bushy"))
    with pytest.raises(ValueError, match="unknown verifier 'spectr2'"):
        verifiers.get("spectr2")


# -- the residual, the one home of normalize(max(w r - q, 0)) -----------------------------------


def test_residual_is_the_normalised_positive_part_and_keeps_r_where_nothing_is_left():
    from treespec.core.rule import residual

    r = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.3, 0.5]], dtype=torch.float64)  # row 1: q = r, nothing left
    res, mass = residual(r, q)
    assert torch.allclose(res[0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert torch.allclose(mass, torch.tensor([0.4, 0.0], dtype=torch.float64))
    assert torch.equal(res[1], r[1])  # mass 0: rejection had probability 0, r is kept
    w = torch.tensor([[1.0], [2.0]], dtype=torch.float64)  # a path weight per row broadcasts
    res, mass = residual(r, q, w)
    assert torch.allclose(mass, torch.tensor([0.4, 1.0], dtype=torch.float64))
    assert torch.allclose(res[1], r[1])  # 2 r - q = r here, mass 1


# -- K-SEQ's division factor against a direct sum -----------------------------------------------


def test_kseq_rho_is_the_smallest_feasible_rho_of_a_direct_sum():
    """Against the direct ``beta = sum_x min(q(x), r(x) / rho)`` in torch, ``kseq_rho``'s ``c`` is ``c(rho)``,
    its ``rho`` is feasible (``c(rho) <= rho``) and a slightly smaller ``rho`` is not (the smallest feasible one,
    the largest acceptance). Zeros in ``q`` and ``r``, tied ratios (a target proportional to the draft on part of
    the vocabulary); tiny and larger vocabularies."""
    g = torch.Generator().manual_seed(0)

    def dist(n: int, zeros: float) -> torch.Tensor:
        x = torch._standard_gamma(torch.full((n,), 0.7, dtype=torch.float64), g)
        x[torch.rand(n, generator=g, dtype=torch.float64) < zeros] = 0.0
        x[0] += 1e-3  # never all zero
        return x / x.sum()

    def c_direct(r: torch.Tensor, q: torch.Tensor, k: int, rho: float) -> float:
        beta = float(torch.minimum(q, r / rho).sum())
        return k if beta <= 0 else (1 - (1 - beta) ** k) / beta

    cases = [(n, zeros, k, dist(n, zeros), dist(n, zeros)) for n in (3, 5, 50, 1000) for zeros in (0.0, 0.3)
             for k in (1, 2, 3, 5)]
    for n in (3, 1000):
        q = dist(n, 0.0)
        r = torch.where(torch.arange(n) % 3 > 0, q, 0.0)
        cases += [(n, "tied", k, r / r.sum(), q) for k in (2, 3)]
    interior = 0
    for n, zeros, k, r, q in cases:
        rho, c = verifiers.kseq_rho(r, q, k)
        assert 1.0 <= rho <= k and abs(c - c_direct(r, q, k, rho)) < 1e-12, (n, zeros, k)
        assert c <= rho or rho == 1.0  # k = 1: rho = 1 and c = 1 up to rounding
        if rho > 1.0:
            interior += 1
            smaller = rho * (1 - 1e-9)
            assert c_direct(r, q, k, smaller) > smaller, (n, zeros, k, rho)
    assert interior >= 20  # most cases have 1 < rho < k


def test_the_commands_verifier_names_are_the_registrys():
    """``treespec generate --verifier`` offers the names of ``treespec.common.options`` (torch-free, for a fast
    ``--help``): the registry's, in its order."""
    from treespec.common.options import VERIFIER_NAMES

    assert tuple(verifiers.VERIFIERS) == VERIFIER_NAMES
