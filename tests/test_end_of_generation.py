"""The last steps of a generation: depth cap, skipped drafting, stats of emitted tokens only, on_tokens."""

import pytest

import treespec
from treespec.models.tiny import greedy_reference, tiny_model

from conftest import counted_forwards

CHAIN = [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)]  # 4 drafted tokens + the bonus: 5 tokens a step


class Counting(treespec.Drafter):
    """Wraps a drafter and counts its ``propose`` calls and the deepest proposal it made."""

    def __init__(self, inner):
        self.inner, self.calls, self.vocab_size = inner, 0, inner.vocab_size

    def reset(self, prompt, *, sampling, seed):
        self.inner.reset(prompt, sampling=sampling, seed=seed)

    def propose(self, context):
        self.calls += 1
        return self.inner.propose(context)


@pytest.fixture(scope="module")
def target():
    # the target drafts for itself: every step accepts the whole chain (4 drafted + 1 bonus)
    return tiny_model("llama", vocab=64, hidden=64, scale=6)


def test_eos_inside_the_accepted_path_counts_only_emitted(target):
    prompt = [5, 9, 20]
    free = greedy_reference(target, prompt, 30)
    # the first occurrence of a token that is a drafted token (not the bonus) of a later step
    k = next(i for i in range(5, 30) if i % 5 != 4 and free[i] not in free[:i])
    out = treespec.generate(target, prompt, drafters=[treespec.ModelDrafter(target, CHAIN)], max_new_tokens=30,
                            eos_token_id=free[k])
    s = out.stats
    assert out.new_tokens == free[: k + 1]
    steps = k // 5 + 1
    emitted_last = k % 5 + 1  # all drafted: the step's accepted path went on past EOS
    hist = [0] * 5
    hist[4] = steps - 1
    hist[emitted_last] += 1
    assert s.accepted_hist[: 5] == hist and sum(s.accepted_hist) == steps
    assert s.drafters[0].accepted == 4 * (steps - 1) + emitted_last == sum(k * n for k, n in enumerate(s.accepted_hist))
    assert s.step_tokens == [5] * (steps - 1) + [emitted_last] and sum(s.step_tokens) == s.new_tokens
    assert s.step_cut == [False] * (steps - 1) + [True] and s.cut_steps == 1
    assert s.tau_uncut == 5.0 and s.tau == (k + 1) / steps


def test_depth_capped_by_tokens_still_wanted(target):
    counting = Counting(treespec.ModelDrafter(target, CHAIN))
    out = treespec.generate(target, [1, 2, 3], drafters=[counting], max_new_tokens=43)
    s = out.stats
    assert out.new_tokens == greedy_reference(target, [1, 2, 3], 43)
    # 8 full steps (40 tokens), then 3 wanted: the tree is cut to depth 2 before the target forward
    assert s.tree_sizes == [5] * 8 + [3] and s.accepted_hist == [0, 0, 1, 0, 8]
    assert s.step_cut == [False] * 8 + [True] and s.tau_uncut == 5.0
    assert s.drafters[0].accepted == 34 and s.drafters[0].proposed == 4 * 8 + 2
    assert counting.calls == 9


def test_no_drafting_when_nothing_beyond_the_bonus_is_wanted(target):
    counting = Counting(treespec.ModelDrafter(target, CHAIN))
    out = treespec.generate(target, [1, 2, 3], drafters=[counting], max_new_tokens=1)
    assert counting.calls == 0 and out.stats.tree_sizes == [1] and out.stats.step_cut == [True]
    assert out.new_tokens == greedy_reference(target, [1, 2, 3], 1)
    counting = Counting(treespec.ModelDrafter(target, CHAIN))
    out = treespec.generate(target, [1, 2, 3], drafters=[counting], max_new_tokens=6, budget=1)
    assert counting.calls == 0 and out.stats.tree_sizes == [1] * 6 and not any(out.stats.step_cut)
    assert out.new_tokens == greedy_reference(target, [1, 2, 3], 6)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_decoding_forwards_the_target_once_per_token(target, temperature):
    """Plain decoding's prefill takes the prompt's last token and its logits give the first token, as HF's do: N
    tokens in N target forwards, prefill included. Control: a speculating run's every tree needs a forward (the
    first one's of the nodes below the root), so its target runs the prefill and one forward per step."""
    draft = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=3)
    with counted_forwards(target) as calls:
        out = treespec.generate(target, [1, 2, 3], max_new_tokens=6, temperature=temperature, seed=0)
        plain = len(calls)
        calls.clear()
        spec = treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(draft, CHAIN)], max_new_tokens=6,
                                 temperature=temperature, seed=0)
    assert plain == 6 and out.stats.tree_sizes == [1] * 6 and len(out.new_tokens) == 6
    assert len(calls) == 1 + spec.stats.steps
    if temperature == 0.0:
        assert out.new_tokens == greedy_reference(target, [1, 2, 3], 6) == spec.new_tokens


def test_a_one_token_prompt_decodes_plainly(target):
    out = treespec.generate(target, [7], max_new_tokens=5)
    assert out.new_tokens == greedy_reference(target, [7], 5)


def test_a_drafter_skipped_for_a_step_catches_up():
    """ModelDrafter's cache stays right when it did not see a step (reused across generate calls)."""
    draft = tiny_model("llama", vocab=64, hidden=64, scale=6, seed=3)
    drafter = treespec.ModelDrafter(draft, CHAIN)
    drafter.reset([1, 2, 3], sampling=treespec.SamplingParams(1.0), seed=0)
    first = drafter.propose([1, 2, 3])
    skipped = [1, 2, 3] + [first.tokens[0], 9, 11]  # commits beyond what it proposed, one step not seen
    later = drafter.propose(skipped)
    fresh = treespec.ModelDrafter(draft, CHAIN)
    fresh.reset([1, 2, 3], sampling=treespec.SamplingParams(1.0), seed=0)
    assert later.tokens == fresh.propose(skipped).tokens


def test_on_tokens_gets_its_own_copy(target):
    seen = []

    def vandal(tokens):
        seen.append(list(tokens))
        tokens.clear()  # the engine's own list used to be passed: it crashed on the next line

    out = treespec.generate(target, [1, 2, 3], drafters=[treespec.ModelDrafter(target, CHAIN)], max_new_tokens=12,
                            on_tokens=vandal)
    assert out.new_tokens == greedy_reference(target, [1, 2, 3], 12)
    assert [t for step in seen for t in step] == out.new_tokens
