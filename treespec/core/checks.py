"""Input validation with errors that say what is wrong and how to fix it."""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Callable, Sequence

import numpy as np
import torch

from tree_builders import args as tree_args

#: the model families whose stock forward takes a token tree (a 4D mask, position ids, the cache) and runs it as its own
#: one-token decoding does: each checked greedy-exact against HF on tiny models, eager, batched and captured
#: (``tests/test_families.py``; inductor and int8/int4 drafts too: ``experiments/check_families.py``). Left out:
#: ALiBi (Bloom, MPT, Falcon with ALiBi: the bias is built from a 2D mask), recurrent or state-space layers (Mamba,
#: Jamba, RecurrentGemma, ...: no state to branch or roll back), families whose code tests for the name "sdpa"
#: (Falcon: it takes another softmax path under the engine's attention) or has no SDPA (Gemma 2, Bloom), attention sinks
#: (GPT-OSS); others are not checked yet
SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen3_moe", "gemma", "gemma3_text", "olmo",
                      "olmo2", "olmo3", "granite", "phi", "phi3", "stablelm", "cohere", "gpt_neox", "gptj",
                      "starcoder2", "helium", "glm", "glm4", "smollm3", "exaone4", "nemotron", "arcee", "seed_oss",
                      "persimmon", "apertus", "opt", "gpt_bigcode", "codegen", "gpt2")
#: families that apply a set ``sliding_window`` only in the layers ``layer_types`` (or ``use_sliding_window``) name;
#: the others apply it in every layer whenever it is set (Mistral, Mixtral, Phi-3, Starcoder2, Qwen3-MoE)
LAYER_TYPED_WINDOWS = ("qwen2", "qwen3", "gemma3_text", "olmo3", "exaone4", "smollm3")


def check_model(model: torch.nn.Module, role: str = "target") -> None:
    """Refuse models whose attention cannot express a token tree."""
    config = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"the {role} model family {family!r} is not supported for tree attention; supported: "
            f"{', '.join(SUPPORTED_FAMILIES)} (ALiBi, recurrent or state-space layers cannot take a tree; "
            "others are not checked yet). Use a model of a supported family."
        )
    if role == "target" and has_dynamic_int8(model):
        # one activation scale per forward over all its rows: a tree's rows would change each other's logits
        raise ValueError(
            "the target's Linear layers are dynamic int8 (torch.ao), which quantises a forward's activations with "
            "one scale over all its rows, so a token tree's logits would differ from the model's one-token decoding; "
            "int8 is for drafts only: load the target in float32, bfloat16 or int4 (weight-only)"
        )
    attn = getattr(config, "_attn_implementation", None)
    if attn not in (None, "sdpa", "eager"):
        raise ValueError(
            f"the {role} model uses attn_implementation={attn!r}, which cannot take a tree mask "
            "(FlashAttention cannot express one); load it with attn_implementation='sdpa'."
        )


def sliding_window(model: torch.nn.Module) -> int | None:
    """The sliding window ``model``'s attention applies (its config's ``sliding_window`` where its layers use it:
    whenever set in most families (Mistral, Mixtral, Phi-3, Starcoder2, Qwen3-MoE); in those of
    :data:`LAYER_TYPED_WINDOWS` where ``use_sliding_window`` or its ``layer_types`` name sliding layers: HF builds the
    mask from those, whatever the flag says after loading); None without one."""
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    sliding = (getattr(config, "model_type", None) not in LAYER_TYPED_WINDOWS
               or getattr(config, "use_sliding_window", False)
               or "sliding_attention" in (getattr(config, "layer_types", None) or ()))
    return int(window) if sliding else None


def check_window(model: torch.nn.Module, positions: int, role: str = "target") -> None:
    """Refuse a run of ``positions`` positions (prompt plus new tokens) that a sliding window would reach into: a
    tree's 4D mask replaces the model's windowed one, which equals the causal mask only while every position fits
    the window (then the run is exact)."""
    window = sliding_window(model)
    if window is not None and positions > window:
        raise ValueError(
            f"the {role} model applies a sliding window of {window} positions, which a tree mask does not express: "
            f"runs of prompt plus max_new_tokens up to {window} positions are exact, this one needs {positions}. "
            "Shorten the prompt or lower max_new_tokens, or use a checkpoint without a window."
        )


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the model's logits: the LM head's output size (also for an int8-quantised head)."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    out = getattr(head, "out_features", None)  # a quantised Linear keeps its weight behind a method
    return int(out) if out is not None else int(model.config.vocab_size)


def check_vocab(target_vocab: int, drafter_vocab: int | None, name: str) -> None:
    if drafter_vocab is not None and drafter_vocab != target_vocab:
        raise ValueError(
            f"drafter {name} has a vocabulary of {drafter_vocab} tokens but the target has "
            f"{target_vocab}; a model drafter must share the target's tokenizer and vocabulary. Use a draft "
            "model from the same family and tokenizer as the target, or wrap a draft of another tokenizer in "
            "treespec.CrossTokenizerDrafter (it drafts text, proposed in the target's tokens)."
        )


def check_int(name: str, value: object, minimum: int | None = None, hint: str = "") -> int:
    """``value`` as a Python int (``tree_builders.args.check_int``, the one integer check), also from a 0-d
    integer tensor."""
    if isinstance(value, torch.Tensor) and value.ndim == 0 and _is_int_dtype(value):
        value = value.item()
    return tree_args.check_int(name, value, minimum, hint)


def check_real(name: str, value: object, hint: str) -> float:
    """``value`` as a finite Python float (ints and numpy/0-d tensor numbers accepted); no NaN or inf."""
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__}); {hint}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}; {hint}")
    return float(value)


def _is_int_dtype(x: torch.Tensor | np.ndarray) -> bool:
    if isinstance(x, torch.Tensor):
        return not (x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool)
    return x.dtype.kind in "iu"


def eos_ids(eos_token_id: object, vocab: int | None = None) -> frozenset[int]:
    """The stop tokens, from what HuggingFace accepts: None, an int, a list/tuple of ints, a 0-d or 1-d
    integer tensor or array, numpy ints. Anything else (a string, a float), or an id the target cannot write (not
    below ``vocab``, its logits' width: the run would never stop there), is an error, never ignored."""
    if eos_token_id is None:
        return frozenset()
    hint = ("pass the id as an int (e.g. tokenizer.eos_token_id), a list of ints, or a 0-d/1-d integer "
            "tensor; None never stops early.")
    value = eos_token_id
    if isinstance(value, (torch.Tensor, np.ndarray)):
        if value.ndim > 1 or not _is_int_dtype(value):
            raise ValueError(f"eos_token_id must be an integer tensor of 0 or 1 dimensions, got dtype "
                             f"{value.dtype} and shape {tuple(value.shape)}; {hint}")
        value = value.tolist()
    items = value if isinstance(value, (list, tuple)) else [value]
    out = set()
    for t in items:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise ValueError(f"eos_token_id must hold token ids (ints), got {t!r} ({type(t).__name__}) in "
                             f"{eos_token_id!r}; {hint}")
        if t < 0:
            raise ValueError(f"eos_token_id holds the negative id {int(t)}; token ids are >= 0. {hint}")
        if vocab is not None and t >= vocab:
            raise ValueError(f"eos_token_id holds the id {int(t)}, which the target never writes: its vocabulary has "
                             f"{vocab} ids (0-{vocab - 1}). Pass this target's tokenizer's id (e.g. "
                             "tokenizer.eos_token_id)")
        out.add(int(t))
    return frozenset(out)


def check_seed(seed: object) -> int | None:
    """None, or an int in ``[0, 2**64)`` (the range ``torch.Generator.manual_seed`` takes; a CPU generator draws
    from the low 32 bits alone, so seeds that differ only above them give the same samples there)."""
    if seed is None:
        return None
    seed = check_int("seed", seed, 0, "pass a whole number in [0, 2**64), or None for a random seed.")
    if seed >= 2**64:
        raise ValueError(f"seed must be < 2**64, got {seed}; pass a whole number in [0, 2**64), or None.")
    return seed


def check_not_empty(input_ids: object) -> None:
    """Refuse an empty list as input, before any work (a run that tunes its tree would measure first): ``[]`` is
    neither a prompt (no token) nor a batch (no prompt)."""
    if isinstance(input_ids, (list, tuple)) and not input_ids:
        raise ValueError("input_ids is empty: give a prompt of at least one token id (e.g. the BOS token), or a "
                         "non-empty list of prompts")


def is_batch(input_ids: object) -> bool:
    """Whether ``input_ids`` is several prompts: a list (or tuple) of token lists or tensors (not of 0-d ones: the
    tokens of one prompt, as ``list(tensor)`` gives them)."""
    first = input_ids[0] if isinstance(input_ids, (list, tuple)) and len(input_ids) > 0 else None
    return isinstance(first, (list, tuple)) or (isinstance(first, (torch.Tensor, np.ndarray)) and first.ndim > 0)


def checked_prompts(target: torch.nn.Module, input_ids: object, max_new_tokens: object,
                    drafts: Sequence[tuple[torch.nn.Module, bool]] = ()) -> list[list[int]]:
    """The prompts of ``input_ids`` (one, or a batch's), each checked against the target's vocabulary, context and
    sliding window for ``max_new_tokens`` as a run checks it, and the reach of each draft model of ``drafts``
    (model, counts in the target's tokens: :func:`check_reach`), a batch's named by its place: what a run that
    tunes its tree checks before measuring anything."""
    check_not_empty(input_ids)
    batch = is_batch(input_ids)
    vocab, context, note = vocab_size(target), context_of(target) or 2**62, context_note(target)
    prompts = []
    for r, ids in enumerate(input_ids if batch else [input_ids]):  # type: ignore[union-attr]
        try:
            prompts.append(as_prompt(ids, vocab))
            positions = len(prompts[-1]) + check_lengths(len(prompts[-1]), max_new_tokens, context, note)
            check_reach(target, positions)
            for model, own_tokens in drafts:
                check_reach(model, positions, "draft", own_tokens)
        except ValueError as e:
            raise ValueError(f"prompt {r} of the batch: {e}" if batch else str(e)) from None
    return prompts


def as_prompt(input_ids: torch.Tensor | Sequence[int], vocab: int | None = None) -> list[int]:
    """The single prompt of a batch-of-one ``[1, L]`` tensor (or a list of ints), checked against ``vocab``."""
    if isinstance(input_ids, (torch.Tensor, np.ndarray)):
        if not _is_int_dtype(input_ids):
            raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}; "
                             "pass the tokenizer's ids (e.g. tokenizer(text, return_tensors='pt').input_ids).")
        if input_ids.ndim == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(
                    f"input_ids of shape {tuple(input_ids.shape)}: a tensor holds one prompt ([1, L]); pass several "
                    "prompts as a list of token lists (or of [1, L] tensors) and generate runs them as a batch."
                )
            input_ids = input_ids[0]
        elif input_ids.ndim != 1:
            raise ValueError(f"input_ids must have shape [1, L] or [L], got {tuple(input_ids.shape)}")
        prompt = input_ids.tolist()
    elif isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Sequence):
        raise ValueError(f"input_ids must be a [1, L] tensor or a list of token ids, got {type(input_ids).__name__}; "
                         "tokenize text first (e.g. tokenizer(text).input_ids).")
    else:
        prompt = [check_int(f"input_ids[{i}]", t, hint="token ids are whole numbers.") for i, t in enumerate(input_ids)]
    if not prompt:
        raise ValueError("the prompt is empty: give at least one token (e.g. the BOS token)")
    if vocab is not None:
        lo, hi = min(prompt), max(prompt)
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(
                f"input_ids holds token id {bad} at position {prompt.index(bad)}, outside the model's "
                f"vocabulary [0, {vocab}); tokenize with the model's own tokenizer."
            )
    return prompt


def check_max_new_tokens(max_new_tokens: object) -> int:
    """``max_new_tokens`` as an int >= 1."""
    return check_int("max_new_tokens", max_new_tokens, 1, "it is the number of tokens to generate.")


def check_lengths(prompt_len: int, max_new_tokens: object, max_positions: int | None, note: str = "") -> int:
    """``max_new_tokens`` as an int >= 1 that fits the model's context after the prompt (``note``: why the context
    is what it is, :func:`context_note`)."""
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    if max_positions is not None and prompt_len + max_new_tokens > max_positions:
        raise ValueError(
            f"the prompt ({prompt_len} tokens) plus max_new_tokens ({max_new_tokens}) exceeds the model's "
            f"context of {max_positions} positions{note}; shorten the prompt or lower max_new_tokens."
        )
    return max_new_tokens


def check_reach(model: torch.nn.Module, positions: int, role: str = "target", own_tokens: bool = True) -> None:
    """:func:`check_window` of ``model`` for a run of ``positions`` positions, and for a draft counting in the
    target's tokens its context too (a target's is :func:`check_lengths`'; a draft of another tokenizer counts in
    its own and stops drafting at its context: ``CrossTokenizerDrafter``): a draft with a table of learned positions
    (GPT-2, OPT, GPT-BigCode) has no embedding past it, and a rotary one drafts past its trained range."""
    check_window(model, positions, role)
    context = context_of(model) if role == "draft" and own_tokens else None
    if context is not None and positions > context:
        raise ValueError(
            f"the draft model's context is {context} positions{context_note(model)} and this run needs {positions} "
            "(the prompt plus max_new_tokens); use a draft with a longer context, or shorten the prompt or lower "
            "max_new_tokens."
        )


def _longrope_limit(config: object) -> int | None:
    """A LongRoPE model's ``original_max_position_embeddings``: HF switches the whole forward to the long factors
    once its last position reaches it, so a tree forward, whose deepest node reaches it before the tokens one-token
    decoding would switch at, rotates its accepted tokens otherwise than the model's own decoding does."""
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type") != "longrope":
        return None
    limit = rope.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", None)
    return int(limit) if limit else None


def context_of(model: object) -> int | None:
    """The positions ``model`` takes exactly under a tree: its config's ``max_position_embeddings``, or a LongRoPE
    model's short-factor range (:func:`_longrope_limit`); None where it does not say."""
    config = getattr(model, "config", None)
    most = getattr(config, "max_position_embeddings", None)
    limit = _longrope_limit(config)
    return most if limit is None or most is None else min(most, limit)


def context_note(model: object) -> str:
    """Why :func:`context_of` is below the config's positions, said in a length error ("" where it is not)."""
    config = getattr(model, "config", None)
    limit = _longrope_limit(config)
    if limit is None or limit >= (getattr(config, "max_position_embeddings", None) or limit):
        return ""
    return (f" (its LongRoPE switches to long factors past {limit} positions for a whole forward, which a tree "
            "forward reaches at other tokens than one-token decoding: the output would part from the model's)")


def check_prompts_fit(lengths: Sequence[int], max_new_tokens: int, max_positions: int | None,
                      names: Sequence[str | None], note: str = "",
                      reaching: Sequence[tuple[torch.nn.Module, str] | tuple[torch.nn.Module, str, bool]] = ()
                      ) -> None:
    """:func:`check_lengths` of each prompt (``lengths``), and :func:`check_reach` of each of the ``reaching``
    (model, role[, own_tokens]) entries, all before any runs; the error of one that does not fit starts with its
    name (``names[i]``; None: the error as it is)."""
    for length, name in zip(lengths, names):
        try:
            check_lengths(length, max_new_tokens, max_positions, note)
            for model, role, *own_tokens in reaching:
                check_reach(model, length + int(max_new_tokens), role, *own_tokens)
        except ValueError as error:
            if name is None:
                raise
            raise ValueError(f"{name}: {error}") from None


def check_budget(budget: object) -> int | None:
    """None (no cap), or the tokens per verification pass as an int >= 1."""
    if budget is None:
        return None
    return check_int("budget", budget, 1, "it counts the tokens of one verification pass, root included; "
                     "budget=1 verifies the root alone (plain decoding), None means no cap.")


def check_probability(name: str, value: object) -> float | None:
    """None, or a probability in [0, 1] as a float."""
    if value is None:
        return None
    p = check_real(name, value, "give a probability in [0, 1], or None.")
    if not 0 <= p <= 1:
        raise ValueError(f"{name} must be a probability in [0, 1] or None, got {value!r}")
    return p


def check_list(items: object, kinds: type | tuple[type, ...], name: str, plural: str, one: str,
               item: Callable[[object], str]) -> list:
    """``items`` as a list whose every item is one of ``kinds``, refused saying what to pass: ``one`` when a single
    such item stands where the list belongs (the usual slip), ``item(x)`` after the type of an item ``x`` that is not
    one. ``name`` names the argument and ``plural`` what it holds."""
    if isinstance(items, kinds):
        raise ValueError(f"{name} must be a list of {plural}, got one {type(items).__name__}: {one}")
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise ValueError(f"{name} must be a list of {plural}, got {type(items).__name__}")
    for i, x in enumerate(items):
        if not isinstance(x, kinds):
            raise ValueError(f"{name}[{i}] is a {type(x).__name__}, {item(x)}")
    return list(items)


def _not_a_drafter(x: object) -> str:
    model = ("; a draft model drafts through treespec.ModelDrafter(model, ...), or pass it to "
             "treespec.run(recipe, target, [model], ...)") if hasattr(x, "forward") else ""
    return f"not a treespec Drafter; subclass treespec.Drafter (propose(context) -> DraftProposals){model}."


def check_drafters(drafters: object, drafter_cls: type) -> list:
    """A list of distinct ``Drafter`` instances (one object twice would share its state between slots)."""
    drafters = check_list(drafters, drafter_cls, "drafters", "drafters", "pass drafters=[d] for a single one.",
                          _not_a_drafter)
    for i, d in enumerate(drafters):
        if any(d is e for e in drafters[:i]):
            raise ValueError(f"drafters[{i}] is the same object as an earlier drafter; each slot needs its "
                             "own instance (its state is per generation), e.g. create a second drafter.")
    return drafters


def check_sampling_dtype(model: torch.nn.Module, greedy: bool, role: str = "target") -> None:
    """Refuse sampling from a float16 model: its activations overflow to inf/NaN, and NaN
    probabilities reaching CUDA ``multinomial`` trip a device-side assert that kills the process."""
    if not greedy and next(model.parameters()).dtype == torch.float16:
        raise ValueError(
            f"sampling (temperature > 0) from a float16 {role} model is not supported: float16 logits can "
            "overflow to NaN. Load the model in bfloat16 or float32 (torch_dtype=torch.bfloat16), or decode greedily."
        )


def check_compile(compile: object) -> bool | str:
    """``False`` (eager steps), ``True``, the name of a ``torch.compile`` backend (``treespec.core.compiled``) or
    ``"uncompiled"`` (the compiled steps' functions run as plain PyTorch: ``treespec.core.compiling``)."""
    if compile is False or compile is True:
        return compile
    if isinstance(compile, str) and compile:
        if compile != "uncompiled":  # compiling.UNCOMPILED (core.compiling imports this module)
            from torch._dynamo import list_backends

            if compile not in list_backends(exclude_tags=()):
                raise ValueError(f"compile={compile!r} names no torch.compile backend here; pass True (inductor), "
                                 "'uncompiled' (the compiled steps run as plain PyTorch), or a backend name such as "
                                 "'aot_eager' (torch._dynamo.list_backends() lists them)")
        return compile
    raise ValueError(f"compile must be False, True, the name of a torch.compile backend (e.g. 'inductor', "
                     f"'aot_eager') or 'uncompiled', got {compile!r}")


def has_dynamic_int8(model: torch.nn.Module) -> bool:
    """Whether ``model``'s Linear layers are int8 through ``torch.ao``'s dynamic quantisation (packed
    weights: fast on a CPU, not traceable by ``torch.compile``)."""
    return any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in model.modules())


def check_callback(fn: object, name: str, args: str, count: int) -> None:
    """Refuse ``fn`` unless it is callable with ``count`` positional arguments (``args`` says which, for the
    message), before any work: not at the first step, after the prefill. A callable whose signature Python cannot
    read (some builtins) is taken as it is."""
    if not callable(fn):
        raise ValueError(f"{name} must be callable (it gets {args}), got {type(fn).__name__}")
    try:
        inspect.signature(fn).bind(*range(count))
    except ValueError:  # no signature to read
        return
    except TypeError:
        raise ValueError(f"{name} is called with {count} argument{'s' if count > 1 else ''} ({args}); "
                         f"{getattr(fn, '__name__', 'it')} cannot take that: give a function of {args}") from None
