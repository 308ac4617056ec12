"""One ``generate`` call, validated once: what the eager and the compiled loop both run from."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..common.device import dispatched, execution_device
from . import checks, verifiers
from .buffers import Envelope
from .drafting import Drafter
from .sampling import SamplingParams

OnTokens = Callable[[list[int]], None]
#: the verifiers the compiled steps run on the device when sampling (``treespec.core.compiled``)
ON_DEVICE = ("rrs", "block", "traversal")


@dataclass(frozen=True)
class Request:
    """Everything a decoding loop needs, checked: build it with :meth:`checked`.

    ``budget``: tokens per verification pass, root included (None: no cap); ``compile``: False for the
    eager step, else True or a ``torch.compile`` backend name (``treespec.core.compiled``);
    ``max_positions``: the target's context length; ``out_device``: where ``sequences`` is returned;
    ``envelope``: the captured step's tree envelope (None: chosen by the step, ``treespec.core.captured``).
    """

    target: torch.nn.Module
    prompt: list[int]
    drafters: list[Drafter]
    params: SamplingParams
    max_new_tokens: int
    eos: frozenset[int]
    seed: int
    budget: int | None
    on_tokens: OnTokens | None
    verifier: str
    compile: bool | str
    vocab: int
    max_positions: int
    out_device: torch.device
    device: torch.device  # where the target's inputs go (``common.device.execution_device``), read once
    envelope: Envelope | None = None

    @property
    def speculating(self) -> bool:
        """Whether drafters are asked at all (budget 1 leaves no room for a drafted token)."""
        return bool(self.drafters) and self.budget != 1

    def start(self) -> torch.Generator:
        """Reset the drafters for this prompt (each with its own seed) and return the step's generator."""
        for i, d in enumerate(self.drafters):
            d.reset(self.prompt, sampling=self.params.for_draft(), seed=(self.seed * 1_000_003 + i + 1) % 2**63)
        return torch.Generator(self.device).manual_seed(self.seed)

    @classmethod
    def checked(cls, target: torch.nn.Module, input_ids: torch.Tensor | Sequence[int], drafters: Sequence[Drafter],
                max_new_tokens: int, temperature: float, top_k: int, top_p: float,
                eos_token_id: int | Sequence[int] | torch.Tensor | None, seed: int | None, budget: int | None,
                on_tokens: OnTokens | None, verifier: str, compile: bool | str,
                envelope: Envelope | None = None) -> "Request":
        """Validate the arguments of ``treespec.generate`` (see there); each error says how to fix it."""
        params = SamplingParams(temperature, top_k, top_p)
        verifiers.get(verifier)  # an unknown name fails before any work
        compile = checks.check_compile(compile)
        if compile is not False and dispatched(target):
            raise ValueError("compile=... captures the step on one device, but this target is dispatched over several "
                             f"({sorted({str(d) for d in target.hf_device_map.values()})}); use compile=False with a "
                             "device_map, or load the target on one device")
        if compile is not False and verifier not in ON_DEVICE and not params.greedy:
            raise ValueError(f"compile=... verifies on the device with {', '.join(map(repr, ON_DEVICE))}; "
                             f"verifier={verifier!r} runs on the host only. Use one of those with compile, or "
                             "compile=False with this verifier")
        checks.check_model(target)
        vocab = checks.vocab_size(target)
        drafters = checks.check_drafters(drafters, Drafter)
        for d in drafters:
            checks.check_vocab(vocab, d.vocab_size, d.describe())
            if getattr(d, "model", None) is not None:
                checks.check_model(d.model, role="draft")
        max_positions = checks.context_of(target) or 2**62
        if on_tokens is not None:
            checks.check_callback(on_tokens, "on_tokens", "each step's tokens", 1)
        max_new_tokens = checks.check_max_new_tokens(max_new_tokens)
        checks.check_sampling_dtype(target, params.greedy)
        seed = checks.check_seed(seed)
        if envelope is not None and not isinstance(envelope, Envelope):
            raise ValueError(f"envelope must be a treespec.core.buffers.Envelope (e.g. Envelope.padded over the "
                             f"trees to run), got {type(envelope).__name__}")
        shared = cls(
            target=target, prompt=[], drafters=drafters, params=params,
            max_new_tokens=max_new_tokens,
            eos=checks.eos_ids(eos_token_id, vocab), budget=checks.check_budget(budget), on_tokens=on_tokens,
            seed=int.from_bytes(os.urandom(7), "little") if seed is None else seed,
            verifier=verifier, compile=compile, vocab=vocab, max_positions=max_positions,
            out_device=torch.device("cpu"), device=execution_device(target), envelope=envelope,
        )
        return shared.for_prompt(input_ids)

    def for_prompt(self, input_ids: torch.Tensor | Sequence[int], **changes: object) -> "Request":
        """This request for the prompt ``input_ids`` (and the fields in ``changes``: a batch's row has its own copies
        of the checked drafters, and its seed and callback, which the batch checks): the prompt is checked, and that
        it fits the target's context and every model's reach with ``max_new_tokens``; the rest was checked by
        :meth:`checked`, once for a whole batch."""
        prompt = checks.as_prompt(input_ids, self.vocab)
        checks.check_lengths(len(prompt), self.max_new_tokens, self.max_positions, checks.context_note(self.target))
        positions = len(prompt) + self.max_new_tokens
        checks.check_reach(self.target, positions)
        for d in changes.get("drafters", self.drafters):  # a draft of another tokenizer counts in its own tokens
            if getattr(d, "model", None) is not None:
                checks.check_reach(d.model, positions, "draft", d.vocab_size is not None)
        out_device = input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
        return dataclasses.replace(self, prompt=prompt, out_device=out_device, **changes)
