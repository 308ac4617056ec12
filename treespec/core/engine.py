"""The speculative loop: draft, merge into a trie, one target forward, verify, commit.

One loop (:func:`decode`) runs every configuration; a *step* (``treespec.core.step``) decides where the
drafting, the target's forward and the acceptance run: :class:`EagerStep` here (a growable cache,
acceptance by the tensor rules of ``treespec.core.rule``, uncompiled); for ``compile=...``,
``treespec.core.captured.CapturedStep`` (one draft model's static tree drafted on the device too)
or ``treespec.core.compiled.CompiledStep`` (host drafters; static shapes, one compiled call per
step, acceptance on the device).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from . import checks
from .batch import BatchOutput, generate_batch
from .buffers import Envelope
from .drafting import Drafter
from .kv import TreeCache, forward_masked, forward_prompt, kept_rows, tree_inputs
from .padded import HostAcceptance
from .request import Request
from .stats import GenerateOutput, Progress
from .step import Clock, HostDrafted, Step
from .tree import FlatTree, TokenTree


class EagerStep(HostDrafted, HostAcceptance):
    """The target's forward on a growable :class:`TreeCache`; the acceptance by the same tensor functions as
    the compiled steps (``padded.HostAcceptance``: ``padded.accept``), unpadded and uncompiled. Only ``spectr``
    walks the trie on the host."""

    name = "eager"

    def __init__(self, req: Request, gen: torch.Generator) -> None:
        self.req, self.gen, self.width = req, gen, req.budget
        self.cache = TreeCache()
        #: the first tree's root logits, from the prefill's forward (None once the first step has used them)
        self.root_logits: torch.Tensor | None = None

    def prefill(self, prompt: list[int], clock: Clock) -> None:
        # The whole prompt, its last token's logits kept for the first step: the first token comes from the
        # prompt's forward, as HF's prefill gives it (the same rows in one forward: where a kernel's numbers depend
        # on the rows it gets, as the int4 target's wide-input twins do, HF's first token and treespec's agree).
        # Plain decoding's first step then runs no forward (N tokens in N target forwards); a tree's first
        # forward takes the nodes below the root.
        self.root_logits = forward_prompt(self.req.target, self.cache, torch.tensor(prompt, device=self.req.device))
        self.prefill_drafters(prompt)

    def verify(self, tree: TokenTree, flat: FlatTree, clock: Clock) -> tuple[list[int], int]:
        held, self.root_logits = self.root_logits, None
        cached, past = held is not None, self.cache.length
        logits = self.forward(flat, clock, root_cached=cached) if len(flat) > cached else None
        if held is not None:
            logits = held if logits is None else torch.cat([held, logits])
        path, extra = self.accept(tree, flat, logits)
        self.cache.keep(past, kept_rows(flat, path, past, cached))
        return path, extra

    def forward(self, flat: FlatTree, clock: Clock, root_cached: bool = False) -> torch.Tensor:
        """The target over the flattened tree (written to the cache, not yet committed): logits ``[n, V]``
        (``root_cached``: of the nodes below the root, ``kv.tree_inputs``)."""
        device = self.req.device
        ids, pos, allowed = tree_inputs(flat, self.cache.length, root_cached)
        clock.charge("overhead")
        logits = forward_masked(self.req.target, self.cache, ids.to(device), pos.to(device), allowed)
        clock.charge("verifying")
        return logits


def decode(req: Request, step: Step) -> GenerateOutput:
    """The speculative loop over ``step``: draft, merge, flatten, verify, commit, record, stream."""
    run = Progress(req, step.name)
    clock = Clock(run.stats, req.device)
    with torch.inference_mode():
        step.prefill(req.prompt, clock)
        clock.charge("prefill")
        while not run.done:
            run.stream(run.take(*step.advance(run.committed, run.remaining, clock)))
            clock.charge("overhead")  # the commit's bookkeeping and the caller's on_tokens
    clock.settle()
    return run.output()


def generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor | Sequence[int] | Sequence[Sequence[int] | torch.Tensor],
    drafters: Sequence[Drafter] = (),
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_token_id: int | Sequence[int] | torch.Tensor | None = None,
    seed: int | Sequence[int] | None = None,
    budget: int | None = None,
    on_tokens: Callable[[list[int]], None] | Callable[[int, list[int]], None] | None = None,
    verifier: str = "rrs",
    compile: bool | str = False,
    envelope: Envelope | None = None,
) -> GenerateOutput | BatchOutput:
    """Generate from ``target`` with tree speculative decoding; the output is exact.

    Greedy (``temperature=0``) output is token-identical to the target's own greedy decoding;
    sampled output is distributed as the target's (after temperature, top-k, top-p). This is the
    low-level call with explicit drafters; ``treespec.run(recipe, ...)`` builds them from settings.

    Args:
        target: a HuggingFace causal LM of a family ``checks.SUPPORTED_FAMILIES`` admits (Llama, Qwen2/2.5/3,
            Mistral, Gemma, Phi-3, ...), in SDPA or eager attention; a sliding window only for runs inside it.
        input_ids: one prompt, ``[1, L]`` tensor or a list of ints; or a batch, a list of such prompts (of
            any lengths): ``treespec.core.batch.generate_batch`` decodes them at once (each row as it
            would decode alone, ``on_tokens(row, tokens)``) and returns a ``BatchOutput``; ``compile`` runs the
            batch's captured step where the drafters allow (every row's levels and tree in one forward each).
        drafters: proposal sources, merged into one token trie in this order.
        max_new_tokens: tokens to generate (fewer only when ``eos_token_id`` is emitted).
        temperature, top_k, top_p: the target distribution to sample from (HF conventions).
        eos_token_id: stop after emitting it: an int, a list of ints or a 0-d/1-d integer tensor
            (as HF); None never stops early.
        seed: same seed and inputs give the same output under one kind of step (the eager and the compiled step
            draw their random numbers differently, each exactly: one seed gives other samples under each); None
            draws a random seed. A batch may take a list of one seed per prompt (each row then decodes as its
            prompt alone with its seed).
        budget: cap on tokens per verification pass, root included; proposals beyond it are
            dropped in proposal order. None means no cap.
        on_tokens: called with each step's committed tokens (for streaming); gets its own list.
        verifier: the exact verification rule for sampled steps (``treespec.core.verifiers.VERIFIERS``):
            ``"rrs"`` (token-level, every tree), ``"block"`` (chains), ``"traversal"`` (every
            tree, leaf to root) or ``"spectr"`` (one drafter's i.i.d. draws); see ``docs/verifiers.md``.
            A tree the verifier is not exact for raises ``treespec.core.verifiers.NotExactError``.
            Greedy decoding ignores it (argmax walk).
        compile: False (eager), True or a ``torch.compile`` backend name: static-shape steps compiled,
            acceptance on the device (``rrs``, ``traversal`` and ``block``; ``spectr`` is refused). One model
            drafter of a static shape (top-k or sampling without replacement; its confidence stop on a CPU
            only) in a precision ``torch.compile`` can trace (float, int4; not torch.ao int8) drafts on the
            device too (``treespec.core.captured``); any other drafters draft on the host and only the
            target's forward is compiled (``treespec.core.compiled``). ``stats.step`` says which ran, and why.
        envelope: for the captured step, the largest tree its compiled graphs serve
            (``treespec.core.buffers.Envelope``; ``Envelope.padded`` over several trees): every tree inside
            one envelope replays the same graphs. None: the tree's own on a CPU, its levels padded to one
            width on CUDA.
    """
    checks.check_not_empty(input_ids)
    if checks.is_batch(input_ids):
        return generate_batch(target, input_ids, drafters, max_new_tokens, temperature, top_k, top_p, eos_token_id,
                              seed, budget, on_tokens, verifier, compile, envelope)
    req = Request.checked(target, input_ids, drafters, max_new_tokens, temperature, top_k, top_p, eos_token_id,
                          seed, budget, on_tokens, verifier, compile, envelope)
    return decode(req, step_for(req, req.start()))


def step_for(req: Request, gen: torch.Generator) -> Step:
    """The request's step: eager; or compiled, captured when its one drafter's tree can be (else why not)."""
    if req.compile is False:
        return EagerStep(req, gen)
    # torch.compile machinery only when asked for
    from .captured import CapturedStep, capturable
    from .compiled import CompiledStep

    spec = capturable(req)
    if isinstance(spec, str):
        step = CompiledStep(req, gen)
        step.name = f"compiled, drafted on the host: {spec}"
        return step
    return CapturedStep(req, gen, spec)
