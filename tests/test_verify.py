"""The acceptance rule on explicit distributions, many vectorised trials per case."""

import zlib
from collections import Counter

import pytest
import torch

from stats import ALPHA, g_test
from treespec.core.rule import point_masses, verify_proposals

V, T = 6, 200_000


def run(r, q_rows, tokens, gen):
    """Verify ``T`` trials; return the emitted tokens (accepted proposal or correction)."""
    u = torch.rand(T, tokens.shape[1], generator=gen)
    acc, res = verify_proposals(r.expand(T, V), tokens, q_rows, u)
    correction = torch.multinomial(res, 1, generator=gen).squeeze(1)
    picked = tokens.gather(1, acc.clamp_min(0)[:, None]).squeeze(1)
    return torch.where(acc >= 0, picked, correction), acc


def dist(gen):
    return torch.distributions.Dirichlet(torch.ones(V)).sample().to(torch.float32)


def iid(q, k, gen):
    tokens = torch.multinomial(q.expand(T, V), k, replacement=True, generator=gen)
    return tokens, q.expand(T, k, V)


def without_replacement(q, k, gen):
    keys = q.log() - (-torch.rand(T, V, generator=gen).log()).log()
    tokens = keys.topk(k, dim=-1).indices
    qs = q.expand(T, k, V).clone()
    for i in range(1, k):  # draw i comes from q with draws 0..i-1 removed
        qs[:, i:, :].scatter_(-1, tokens[:, i - 1 : i, None].expand(T, k - i, 1), 0.0)
    return tokens, qs / qs.sum(-1, keepdim=True)


def check(out, r):
    counts = Counter(out.tolist())
    assert g_test(counts, {t: float(r[t]) for t in range(V)}) > ALPHA


@pytest.mark.parametrize("case", ["single", "iid3", "wor3", "points", "mixed", "duplicates"])
def test_output_follows_target(case):
    seed = zlib.crc32(case.encode())  # str's hash() is salted per process: each run would draw anew
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    r, q, q2 = dist(gen), dist(gen), dist(gen)
    if case == "single":
        tokens, qs = iid(q, 1, gen)
    elif case == "iid3":
        tokens, qs = iid(q, 3, gen)
    elif case == "wor3":
        tokens, qs = without_replacement(q, 3, gen)
    elif case == "points":  # deterministic candidates (e.g. top-2 of q, an n-gram guess)
        tokens = torch.tensor([int(q.argmax()), 3]).expand(T, 2)
        qs = point_masses(tokens, V)
    elif case == "mixed":  # two drafters: a sample from q, then a sample from q2, then a point mass
        t1, q1s = iid(q, 1, gen)
        t2, q2s = iid(q2, 1, gen)
        tokens = torch.cat([t1, t2, torch.full((T, 1), 2)], 1)
        qs = torch.cat([q1s, q2s, point_masses(torch.full((T, 1), 2), V)], 1)
    else:  # the same token proposed twice: both proposals stay, both residual updates apply
        t1, q1s = iid(q, 1, gen)
        tokens = torch.cat([t1, t1], 1)
        qs = torch.cat([q1s, point_masses(t1, V)], 1)
    out, _ = run(r, qs, tokens, gen)
    check(out, r)


def test_a_wrong_rule_is_caught():
    """Negative control: the same G-test rejects a verifier that skips one residual update."""
    gen = torch.Generator().manual_seed(7)
    r = torch.tensor([0.05, 0.05, 0.5, 0.2, 0.1, 0.1])
    q = torch.tensor([0.02, 0.02, 0.9, 0.02, 0.02, 0.02])
    t1 = torch.multinomial(q.expand(T, V), 1, replacement=True, generator=gen)
    u = torch.rand(T, 2, generator=gen)
    # the bug: a merged duplicate's second proposal is checked against r, not against the residual
    acc0, _ = verify_proposals(r.expand(T, V), t1, q.expand(T, 1, V), u[:, :1])
    acc1, res1 = verify_proposals(r.expand(T, V), t1, point_masses(t1, V), u[:, 1:])
    corr = torch.multinomial(res1, 1, generator=gen).squeeze(1)
    out = torch.where((acc0 >= 0) | (acc1 >= 0), t1[:, 0], corr)
    assert g_test(Counter(out.tolist()), {t: float(r[t]) for t in range(V)}) < 1e-6


def test_acceptance_probability_is_min_ratio():
    gen = torch.Generator().manual_seed(3)
    r = torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0, 0.0])
    q = torch.tensor([0.2, 0.6, 0.2, 0.0, 0.0, 0.0])
    tokens = torch.full((T, 1), 1)
    _, acc = run(r, q.expand(T, 1, V), tokens, gen)
    rate = (acc >= 0).float().mean().item()
    assert abs(rate - 0.5) < 0.005  # min(1, 0.3 / 0.6)


def test_greedy_point_mass_accepts_with_target_probability():
    gen = torch.Generator().manual_seed(4)
    r = torch.tensor([0.1, 0.6, 0.3, 0.0, 0.0, 0.0])
    tokens = torch.full((T, 1), 2)
    out, acc = run(r, point_masses(tokens, V), tokens, gen)
    assert abs((acc >= 0).float().mean().item() - 0.3) < 0.005
    assert not (out[acc < 0] == 2).any()  # a rejected candidate is zeroed in the residual
