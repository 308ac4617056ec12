"""experiments/bench_trimmed_head.py's TrimmedHead: the kept rows' logits are the full head's, every other
token is -inf (never proposed: q is zero there), and a draft with it still gives the target's greedy output."""

import runpy
from pathlib import Path

import torch

import treespec
from treespec.models.tiny import greedy_reference, perturbed_copy, tiny_model

bench = runpy.run_path(str(Path(__file__).resolve().parents[1] / "experiments" / "bench_trimmed_head.py"))
TrimmedHead, kept_tokens = bench["TrimmedHead"], bench["kept_tokens"]


def test_kept_rows_are_the_full_heads_and_the_rest_is_minus_infinity():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 20, bias=False)
    keep = torch.tensor([0, 3, 4, 11, 19])
    hidden = torch.randn(2, 3, 8)
    full, trimmed = head(hidden), TrimmedHead(head, keep)(hidden)
    assert trimmed.shape == full.shape
    assert torch.allclose(trimmed[..., keep], full[..., keep])
    others = torch.ones(20, dtype=torch.bool)
    others[keep] = False
    assert torch.isneginf(trimmed[..., others]).all()
    assert torch.softmax(trimmed, -1)[..., others].eq(0).all()


def test_kept_tokens_are_the_most_frequent_then_the_lowest_ids():
    from collections import Counter

    assert kept_tokens(Counter({7: 5, 2: 3, 9: 1}), 2, 10).tolist() == [2, 7]
    assert kept_tokens(Counter({7: 5, 2: 3, 9: 1}), 5, 10).tolist() == [0, 1, 2, 7, 9]


def test_a_trimmed_draft_keeps_greedy_output_exact():
    target = tiny_model(seed=0)
    draft = perturbed_copy(target, 0.05, seed=1)
    vocab = draft.lm_head.out_features
    draft.lm_head = TrimmedHead(draft.lm_head, torch.arange(0, vocab, 2))  # half the vocabulary
    prompt = [1, 2, 3]
    out = treespec.generate(target, prompt, [treespec.ModelDrafter(draft, [(0,), (0, 0), (1,)])], max_new_tokens=30)
    assert out.new_tokens == greedy_reference(target, prompt, 30)
    assert out.stats.tau > 1.0  # the trimmed draft is still accepted
