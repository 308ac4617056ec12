"""The target alone and HuggingFace's own speculative methods, for side-by-side comparisons."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Sequence

import torch

from ..common.device import execution_device, sync
from ..common.hf_notes import without_hf_notes
from ..core.attention import cache_argument
from ..core.checks import is_batch


#: a constant number of drafted tokens a step, without HF's confidence stop
_CONSTANT = {"num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
#: the settings of HF assisted generation that "at its fastest" tries (``compare.fastest_assisted_method``, a sweep's
#: ``baselines.assisted = "fastest"``): HF's own (up to 20 drafted tokens a step, drafting stopped where the draft's
#: confidence falls under 0.4), and a constant number of drafted tokens. Where a wider verification costs (a CPU),
#: HF's own drafts more than pays: on a Zen 5 host with the int4 pair, 0.69x of the speed of 3 drafted tokens a step
#: (experiments/results/demo-cpu-zen5-assisted)
ASSISTED_SETTINGS: dict[str, dict[str, Any]] = {
    "HF's default": {},
    **{f"{k} drafted token{'s' * (k > 1)}": {"num_assistant_tokens": k, **_CONSTANT} for k in (1, 2, 3, 4, 6)}}


def assisted_setting_name(config: dict[str, Any]) -> str:
    """How reports name a setting of HF assisted generation (``GenerationConfig`` options): its name in
    :data:`ASSISTED_SETTINGS`, or its options written out."""
    for name, known in ASSISTED_SETTINGS.items():
        if dict(config) == known:
            return name
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items()))


def _left_padded(prompts: list[list[int]], pad_token_id: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts left-padded with ``pad_token_id`` to one length, and their attention mask (HF's way of batching)."""
    width = max(map(len, prompts))
    return (torch.tensor([[pad_token_id] * (width - len(p)) + p for p in prompts], device=device),
            torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device))


def hf_generate(model: torch.nn.Module, ids: Sequence[int] | Sequence[Sequence[int]], max_new_tokens: int, *,
                temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                eos_token_id: int | Sequence[int] | None = None, pad_token_id: int = 0, seed: int | None = None,
                assistant_model: torch.nn.Module | None = None, assistant_config: dict[str, Any] | None = None,
                prompt_lookup_num_tokens: int | None = None, max_matching_ngram_size: int | None = None,
                tokenizer: Any = None, assistant_tokenizer: Any = None, static_compiled: bool = False,
                compile_backend: str = "inductor", stopping_criteria: Sequence[Any] = ()
                ) -> tuple[list[int] | list[list[int]], float]:
    """HF ``generate`` with an explicit, neutral ``GenerationConfig``; returns (new tokens, seconds).

    ``ids``: one prompt, or a batch (a list of prompts, left-padded with ``pad_token_id`` and masked, HF's way):
    then the new tokens come back per prompt. Nothing is inherited from the checkpoint's own generation settings (a
    repetition penalty there would change the "target alone" output). ``eos_token_id=None`` never stops early and
    forces exactly ``max_new_tokens`` (``eos_token_id=[]`` to HF: passing None lets HF fill in the model's).
    ``tokenizer`` and ``assistant_tokenizer`` (both or neither) run HF's assisted generation with an
    ``assistant_model`` whose tokenizer differs from the target's ("universal assisted generation").
    ``static_compiled``: HF's fastest plain decoding, a static cache and its ``torch.compile``'d
    forward (on every device; inductor's weight freezing is the caller's ``torch._inductor.config``), compiled
    with ``compile_backend``. ``stopping_criteria``: HF stopping criteria to pass on (``timing.TokenClock`` stamps
    each new token's time).
    The cache is one ``StaticCache`` per model (rows in multiples of 1024), reset before each call
    and reused: HF's own per-call cache (``cache_implementation="static"``) fails under weight
    freezing on a later, shorter prompt (its graphs keep the first call's cache as constants).
    """
    from transformers import GenerationConfig

    if (tokenizer is None) != (assistant_tokenizer is None) or (tokenizer is not None and assistant_model is None):
        raise ValueError("hf_generate: give tokenizer= and assistant_tokenizer= together, with an assistant_model "
                         "whose tokenizer differs from the target's (or none of the three tokenizer arguments)")
    device, batch = execution_device(model), is_batch(ids)
    x, mask = _left_padded([list(p) for p in ids] if batch else [list(ids)], pad_token_id, device)
    width = x.shape[1]
    kw = _generation_settings(max_new_tokens, temperature, top_p, top_k, eos_token_id, pad_token_id,
                              prompt_lookup_num_tokens, max_matching_ngram_size)
    extra: dict[str, Any] = {"stopping_criteria": list(stopping_criteria)} if stopping_criteria else {}
    if static_compiled:
        from transformers import CompileConfig

        kw["compile_config"] = CompileConfig(fullgraph=True, backend=compile_backend)
        kw["compile_config"]._compile_all_devices = True  # HF compiles on accelerators only unless told
        # under the name this transformers version's generate takes (``past_key_values`` is deprecated from 5.2x)
        extra[cache_argument(type(model))] = extra_cache = _static_cache(model, width + max_new_tokens, x.shape[0])
    if assistant_model is not None:
        assistant_model.generation_config = GenerationConfig(**(assistant_config or {}))  # fresh: HF mutates it
        extra.update(assistant_model=assistant_model, **({} if tokenizer is None else dict(
            tokenizer=tokenizer, assistant_tokenizer=assistant_tokenizer)))  # tokenizers: only with an assistant
    if seed is not None:
        torch.manual_seed(seed)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        if static_compiled:
            extra_cache.reset()
        # exact shapes: a graph made dynamic in the batch size would serve another batch size with the cache it
        # froze (``_static_cache``)
        with torch._dynamo.config.patch(automatic_dynamic_shapes=not static_compiled), (
                without_hf_notes("transformers.generation.utils", *ASSISTED_NOTES) if assistant_model is not None
                else contextlib.nullcontext()):
            out = model.generate(x, attention_mask=mask, generation_config=GenerationConfig(**kw), **extra)
    sync(device)
    new = out[:, width:].tolist()
    return new if batch else new[0], time.perf_counter() - t0


#: what transformers' assisted generation logs about its own call of the assistant's ``generate`` (a generation
#: config passed with arguments beside it; the main run's minimum-length processor passed where the assistant's
#: config makes its own): notes on HF's internal call, nothing the caller passed or can change
ASSISTED_NOTES = ("Passing `generation_config` together with generation-related arguments",
                  "has been passed to `.generate()`, but it was also created in `.generate()`")


def _generation_settings(max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                         eos_token_id: int | Sequence[int] | None, pad_token_id: int,
                         prompt_lookup_num_tokens: int | None, max_matching_ngram_size: int | None) -> dict[str, Any]:
    """The ``GenerationConfig`` fields of a plain, sampled or prompt-lookup run (none inherited from the checkpoint)."""
    eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad_token_id,
                              do_sample=temperature > 0)
    if eos_token_id is None:
        kw["min_new_tokens"] = max_new_tokens
    if temperature > 0:
        kw.update(temperature=temperature, top_p=top_p, top_k=top_k)
    if prompt_lookup_num_tokens:
        kw["prompt_lookup_num_tokens"] = prompt_lookup_num_tokens
        if max_matching_ngram_size:
            kw["max_matching_ngram_size"] = max_matching_ngram_size
    return kw


_STATIC_CACHES: dict[tuple[int, int], tuple[int, Any]] = {}  # (id(model), batch size) -> (rows, cache)


def _static_cache(model: torch.nn.Module, length: int, batch: int = 1) -> Any:
    """The model's reusable ``StaticCache`` for ``batch`` prompts of at least ``length`` rows (a longer run
    replaces it). One per batch size: under weight freezing a compiled graph keeps the cache it was compiled
    with as a constant, so each batch size's graphs (compiled for its exact shapes, ``hf_generate``) keep theirs."""
    from transformers import StaticCache

    rows = -(-length // 1024) * 1024
    held = _STATIC_CACHES.get((id(model), batch))
    if held is None or held[0] < rows:
        held = _STATIC_CACHES[id(model), batch] = (rows, StaticCache(config=model.config, max_cache_len=rows))
    return held[1]


def fastest_compile_settings() -> contextlib.AbstractContextManager:
    """The compiler settings of HF's fastest plain decoding (``hf_generate(static_compiled=True)``):
    inductor's weight freezing on every device (with CUDA graphs on CUDA: HF's compile mode ``reduce-overhead``).
    On a CPU freezing packs the weights for oneDNN's products; on an H200 it took HF's compiled decoding from
    224.1 to 247.5 tok/s in one run (``experiments/results/gpu-h200-math``), so a baseline without it is not HF
    at its fastest there either."""
    return torch._inductor.config.patch(freezing=True)
