"""The speculative loop: draft, merge into a trie, one target forward, verify, commit."""

from __future__ import annotations

import os
import time
from typing import Callable, Sequence

import torch

from . import checks
from .drafting import Drafter, propose_all
from .kv import TreeCache, causal_allowed, forward_masked
from .sampling import SamplingParams
from .stats import DrafterStats, GenerateOutput, Stats, emitted_tokens, record_step
from .tree import FlatTree, TokenTree, flatten
from . import verifiers


class _Clock:
    """Wall-clock sections; synchronises CUDA so GPU work is charged to the right section."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.t = time.perf_counter()

    def lap(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt


def _walk_greedy(tree: TokenTree, flat: FlatTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Follow the child equal to the target's argmax; the extra token is the argmax where it stops."""
    best = logits.argmax(-1).tolist()
    path, node = [0], 0
    while (child := tree.children[node].get(best[flat.index[node]])) is not None:
        node = child
        path.append(node)
    return path, best[flat.index[node]]


def _walk_sampled(tree: TokenTree, flat: FlatTree, logits: torch.Tensor, params: SamplingParams,
                  verifier: str, coins: verifiers.Coins) -> tuple[list[int], int]:
    """Run the chosen exact verifier (``treespec.core.verifiers``) on the tree's target distributions."""
    probs: dict[int, torch.Tensor] = {}

    def target(node: int) -> torch.Tensor:
        if node not in probs:
            probs[node] = params.probs(logits[flat.index[node]]).to(verifiers.DTYPE)
        return probs[node]

    return verifiers.get(verifier).verify(tree, target, coins)


def generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor | Sequence[int],
    drafters: Sequence[Drafter] = (),
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
    budget: int | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
    verifier: str = "rrs",
    compile: bool | str = False,
) -> GenerateOutput:
    """Generate from ``target`` with tree speculative decoding; the output is exact.

    Greedy (``temperature=0``) output is token-identical to the target's own greedy decoding;
    sampled output is distributed as the target's (after temperature, top-k, top-p).

    Args:
        target: a HuggingFace causal LM (Llama, Qwen2/2.5/3, Mistral without a window).
        input_ids: one prompt, ``[1, L]`` tensor or a list of ints.
        drafters: proposal sources, merged into one token trie in this order.
        max_new_tokens: tokens to generate (fewer only when ``eos_token_id`` is emitted).
        temperature, top_k, top_p: the target distribution to sample from (HF conventions).
        eos_token_id: stop after emitting it: an int, a list of ints or a 0-d/1-d integer tensor
            (as HF); None never stops early.
        seed: same seed and inputs give the same output; None draws a random seed.
        budget: cap on tokens per verification pass, root included; proposals beyond it are
            dropped in proposal order. None means no cap.
        on_tokens: called with each step's committed tokens (for streaming); gets its own list.
        verifier: the exact verification rule for sampled steps: ``"rrs"`` (token-level, every
            tree), ``"block"`` (chains) or ``"traversal"`` (trees drafted in the ways it is exact
            for); see ``docs/verifiers.md``. A tree the verifier is not exact for raises
            ``treespec.core.verifiers.NotExactError``. Greedy decoding ignores it (argmax walk).
        compile: False (eager), True or a ``torch.compile`` backend name: static-shape steps with a
            compiled target forward and acceptance on the device (``treespec.core.compiled``).
    """
    params = SamplingParams(temperature, top_k, top_p)
    verifiers.get(verifier)  # an unknown name fails before any work
    checks.check_model(target)
    budget = checks.check_budget(budget)
    drafters = checks.check_drafters(drafters, Drafter)
    vocab = checks.vocab_size(target)
    prompt = checks.as_prompt(input_ids, vocab)
    max_positions = getattr(target.config, "max_position_embeddings", None) or 2**62
    max_new_tokens = checks.check_lengths(len(prompt), max_new_tokens, max_positions)
    for d in drafters:
        checks.check_vocab(vocab, d.vocab_size, d.describe())
        if getattr(d, "model", None) is not None:
            checks.check_model(d.model, role="draft")
    eos = checks.eos_ids(eos_token_id)
    seed = checks.check_seed(seed)
    if on_tokens is not None and not callable(on_tokens):
        raise ValueError(f"on_tokens must be callable (it gets each step's tokens), got {type(on_tokens).__name__}")
    device = next(target.parameters()).device
    seed = int.from_bytes(os.urandom(7), "little") if seed is None else seed
    gen = torch.Generator(device).manual_seed(seed)
    for i, d in enumerate(drafters):
        d.reset(prompt, sampling=params.for_draft(), seed=(seed * 1_000_003 + i + 1) % 2**63)
    checks.check_sampling_dtype(target, params.greedy)
    if compile is not False:
        from .compiled import generate_static

        if verifier != "rrs" and not params.greedy:
            raise ValueError(f"compile=... runs the token-level verifier only; got verifier={verifier!r}. "
                             "Use verifier='rrs' with compile, or compile=False with this verifier")

        out_device = input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
        return generate_static(target, prompt, drafters, params, max_new_tokens, eos, gen, budget, on_tokens,
                               compile, out_device)

    stats = Stats(drafters=[DrafterStats(d.describe()) for d in drafters], verifier=verifier)
    coins = verifiers.TorchCoins(gen)
    clock = _Clock(device)
    committed = list(prompt)
    new: list[int] = []
    cache = TreeCache()
    with torch.inference_mode():
        if len(prompt) > 1:
            ids = torch.tensor(prompt[:-1], device=device)
            forward_masked(target, cache, ids, torch.arange(len(ids), device=device),
                           causal_allowed(0, len(ids), device), logits_to_keep=1)
        stats.prefill_seconds = clock.lap()
        while len(new) < max_new_tokens:
            # A path of depth d commits d + 1 tokens (the bonus on top) and its last node sits at
            # position len(committed) - 1 + d: deeper proposals can never be emitted. Dropping them
            # looks at depth only, never at a token, so the output stays exact (TokenTree.merge).
            max_depth = min(max_new_tokens - len(new) - 1, max_positions - len(committed))
            drafting = bool(drafters) and budget != 1  # budget 1 leaves no room for a drafted token
            # With no drafted token wanted, drafters are not called; they see the tokens at their next propose().
            drafts = propose_all(drafters, committed, vocab) if drafting and max_depth >= 1 else []
            stats.drafting_seconds += clock.lap()

            tree = TokenTree.rooted_at(committed[-1])
            too_deep = tree.merge(drafts, budget, max_depth)
            capped = too_deep > 0 or (drafting and max_depth < 1)
            if not params.greedy and tree.size > 1:  # refuse, before the forward, a tree the verifier is not exact for
                # only the budget's cut counts as truncation: the depth cap drops whole levels, never siblings
                kept = sum(len(props) for props in tree.proposals)
                verifiers.check_tree(verifier, tree, truncated=kept + too_deep < sum(len(d) for d in drafts))
            flat = flatten(tree)
            past = cache.length
            allowed = torch.ones(len(flat), past + len(flat), dtype=torch.bool)
            allowed[:, past:] = torch.from_numpy(flat.ancestors)
            ids = torch.from_numpy(flat.tokens).to(device)
            pos = torch.from_numpy(past + flat.depth).to(device)
            stats.overhead_seconds += clock.lap()

            logits = forward_masked(target, cache, ids, pos, allowed)
            stats.verifying_seconds += clock.lap()

            if params.greedy:
                path, extra = _walk_greedy(tree, flat, logits)
            else:
                path, extra = _walk_sampled(tree, flat, logits, params, verifier, coins)
            cache.keep(past, past + flat.index[path])
            step_tokens = emitted_tokens([tree.tokens[v] for v in path[1:]] + [extra], max_new_tokens - len(new), eos)
            committed += step_tokens
            new += step_tokens
            record_step(stats, tree, path, len(step_tokens), capped or len(step_tokens) < len(path))
            stats.overhead_seconds += clock.lap()
            if on_tokens is not None:
                on_tokens(list(step_tokens))
            if step_tokens[-1] in eos:
                break
    stats.new_tokens = len(new)
    out_device = input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
    sequences = torch.tensor([committed], dtype=torch.long, device=out_device)
    return GenerateOutput(sequences, new, stats)
