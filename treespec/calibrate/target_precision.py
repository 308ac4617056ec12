"""A GGUF target's precision, chosen by how fast its own tuned tree is predicted to decode here.

A GGUF file's target can run in bfloat16 (the file dequantised; or float32, whichever one forward measures faster:
``precision.auto_precision``) or in ``int4`` on the file's own 4-bit blocks (``treespec.models.gguf_blocks``): two
renderings of the same file, both within 0.0007 nats per token of its float32 dequantisation
(``experiments/results/gguf-fidelity-cpu``). They want different trees: the int4 kernel's cost grows with every
four rows while bfloat16's forward is nearly flat up to 16 (``experiments/linear_kernels_by_rows.py``), so on the
Zen 4 host the tuner gives the int4 target a depth-3 chain and the bfloat16 one a depth-8 chain. One forward's
timing (what ``auto_precision`` compares) cannot say which pair of (precision, tree) is faster; the tuner's
prediction for each precision's own tree can (:func:`seconds_per_token`: its profile and the pilot's correction,
both cached, as ``treespec generate`` would run it), and the faster is kept.

A run whose tree size is set (``--budget``, a static tree; budget 1, plain decoding; the n-gram drafter alone, whose
largest tree is its size) has no tree to tune: its draft's part of a step is the same in either rendering, so the
target that forwards that many tokens faster is kept (:func:`load_pair_sized`). For plain decoding that is int4: a
one-token forward 69 ms against bfloat16's 222 ms on the Zen 4 host. A chain or k-ary tree without a ``--budget``
is tuned as the Sequoia tree is (``options.TUNED_TREES``: that builder's tree sized in each rendering). A run whose
tree a pilot sizes (no ``--budget``: the n-gram drafter, alone or beside the draft, independent chains, the dynamic
tree) runs that pilot in each
rendering and keeps the one whose choice, speculation or plain decoding, is predicted to decode faster
(:func:`load_pair_piloted`).

The decision is cached in ``<cache root>/precision.json`` under a key naming the target, the draft, the
temperature, the prompts' kind (code or chat), the shipped walks the predictions replay (a digest of their
contents) and this machine (or the target, the tree size and this machine), so later runs load only the kept
precision.
"""

from __future__ import annotations

import datetime
import gc
import hashlib
import weakref
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from ..common.files import DAMAGED, read_json_dict, write_json
from ..common.machine import measurement_key
from ..models.loading import PRECISION_DECISIONS, has_file_blocks, load
from ..models.packaged import cache_root, log
from ..models.pair import CrossDraft, load_pair
from ..models.precision import PRECISIONS, precision_of
from ..models.timing import measure_latency
from ..recipes import Recipe, plan_depth
from .choices import resolve
from .vectors import acceptance_for_draft, shipped_digest

#: the int4 rendering: the file's own 4-bit blocks (the precision's name for ``load``)
INT4 = "int4"


@dataclass(frozen=True)
class Candidate:
    """One precision of the target, as the tuner sizes it: predicted seconds per token and why."""

    precision: str
    seconds_per_token: float
    tree: str


def applies(target: str, drafts: Sequence[str], device: str, dtype: str | None) -> bool:
    """Whether ``treespec``'s commands choose ``target``'s precision by tuning: ``auto`` (or no dtype) on a CPU, a
    target with a GGUF file's 4-bit blocks behind it, one draft model or none (the n-gram drafter alone)."""
    return (dtype in (None, "auto") and str(device) == "cpu" and len(drafts) <= 1
            and has_file_blocks(target))


def seconds_per_token(target: torch.nn.Module, draft: torch.nn.Module, tokenizer: Any, temperature: float,
                      chat: bool = False, tree: Recipe | None = None) -> Candidate:
    """What ``treespec generate`` would run for this pair (the default Sequoia recipe, or ``tree``'s builder, tuned:
    ``choices.resolve`` with the shipped acceptance of the draft's precision, chat's for prompts in the chat
    template) and its predicted seconds per token: a step's seconds over its tokens, or the target alone's seconds
    per token where speculation is not predicted to pay."""
    acceptance, walk = acceptance_for_draft(None, temperature, draft, chat=chat)
    recipe = Recipe() if tree is None else replace(tree, budget=None, target_dtype=None, draft_dtype=None,
                                                   compile=False)
    resolved = resolve(replace(recipe, acceptance=acceptance, temperature=temperature), target, [draft],
                       tokenizer=tokenizer, walk=walk)
    tuned = resolved.tuned
    p, shape = tuned.prediction, tuned.choice.shape
    if resolved.recipe.budget == 1:
        return Candidate(precision_of(target), p.plain_seconds, "plain decoding")
    return Candidate(precision_of(target), p.step_seconds / p.tau,
                     f"budget {shape.size}, depth {shape.depth}: tau {p.tau:.2f}, {p.step_seconds:.3f} s per step")


def _key(target: str, draft: str, draft_dtype: str | None, temperature: float, chat: bool,
         tree: Recipe | None = None) -> str:
    # -v3: decisions made since the walk's replay keeps a run's last steps at its end of text (-v2: since an int4
    # GGUF target's other tensors run int8 and a tree is charged the draft's prefill); the ones made before are made
    # again, as are those made from other shipped walks than these (``walks=``: the predictions replay them)
    return measurement_key("tuned-target-v3", target, f"draft={draft}", f"draft_dtype={draft_dtype or 'auto'}",
                           f"T={float(temperature):g}", *(["chat"] if chat else []), *_tree_tag(tree),
                           f"walks={shipped_digest()}", device="cpu")


def _tree_tag(tree: Recipe | None) -> list[str]:
    """The key's part naming a tuned tree other than the default Sequoia one (none for it: its decisions stand), or
    the Sequoia tree's depth limit where one is given."""
    if tree is None or (tree.tree == "sequoia" and tree.depth is None):
        return []
    width = f"(kary_width={tree.kary_width})" if tree.tree == "kary" else ""
    return [f"tree={tree.tree}{width}", f"depth={tree.depth}"]


def cached_choice(target: str, draft: str, *, draft_dtype: str | None = None, temperature: float = 0.0,
                  chat: bool = False, tree: Recipe | None = None) -> dict[str, Any] | None:
    """The decision :func:`load_pair_tuned` cached for this pair on this machine (None: not decided yet)."""
    return _cached(_key(target, draft, draft_dtype, temperature, chat, tree))


def _cached(key: str) -> dict[str, Any] | None:
    """The decision cached under ``key`` (None: none, or a damaged one: not a precision, or one :func:`describe`
    cannot read)."""
    record = read_json_dict(cache_root() / PRECISION_DECISIONS).get(key)
    ok = isinstance(record, dict) and isinstance(record.get("candidates"), dict) and record.get("precision") in \
        PRECISIONS and record["precision"] in record["candidates"]
    try:
        return record if ok and describe(record) else None
    except DAMAGED:
        return None


def describe(record: dict[str, Any]) -> str:
    """One line: the precision kept and the predictions (or, for a set tree size, the timings) it was kept on."""
    how = "cached decision" if record.get("cached") else "measured now"
    if str(record.get("key", "")).startswith("piloted-target"):
        options = "; ".join(f"{p}: {c['seconds_per_token'] * 1e3:.0f} ms per token ({c['tree']})"
                            for p, c in record["candidates"].items())
        return f"{record['precision']}, its pilot's choice predicted fastest here ({how}; {options})"
    if str(record.get("key", "")).startswith("sized-target"):
        what = next(iter(record["candidates"].values()))["tree"]
        options = ", ".join(f"{p} {c['seconds_per_token'] * 1e3:.0f} ms" for p, c in record["candidates"].items())
        return f"{record['precision']}, the faster {what} here ({how}; {options})"
    options = "; ".join(f"{p}: {c['seconds_per_token'] * 1e3:.0f} ms per token ({c['tree']})"
                        for p, c in record["candidates"].items())
    return f"{record['precision']}, its tuned tree predicted fastest here ({how}; {options})"


def load_pair_tuned(target: str, draft: str, *, draft_dtype: str | None = None, compile: bool | str = False,
                    temperature: float = 0.0, chat: bool = False, tree: Recipe | None = None,
                    rate: Callable[..., Candidate] = seconds_per_token) -> tuple[torch.nn.Module, Any, list[Any]]:
    """``load_pair(target, [draft])`` with the target in the precision (its floating ``auto`` choice, or int4 on
    its file's own blocks) whose tuned tree ``rate`` predicts fastest here (module doc), for prompts in the chat
    template with ``chat`` (their tree is sized from chat's acceptance); the decision cached. ``tree``: a recipe of
    another tuned builder (a chain, a k-ary tree; its depth limit kept), whose tree is tuned instead
    of the default Sequoia one, or a Sequoia recipe with a depth limit (the tree tuned under it). A draft of another
    tokenizer leaves the target in its floating ``auto`` precision (no tuned tree to compare)."""
    tree = None if tree is None or (tree.tree == "sequoia" and tree.depth is None) else tree
    return _load_faster(target, draft, _key(target, draft, draft_dtype, temperature, chat, tree),
                        lambda model, drafts, tok: rate(model, drafts[0], tok, temperature, chat=chat, tree=tree),
                        draft_dtype=draft_dtype, compile=compile)


def forward_seconds(model: torch.nn.Module, tokens: int) -> float:
    """Seconds of one eager tree forward of ``tokens`` tokens after 128 cached ones (``measure_latency``)."""
    return measure_latency(model, [tokens])[tokens]


def load_pair_sized(target: str, draft: str | None, *, tree_size: int, draft_dtype: str | None = None,
                    compile: bool | str = False, timer: Callable[[torch.nn.Module, int], float] = forward_seconds
                    ) -> tuple[torch.nn.Module, Any, list[Any]]:
    """``load_pair(target, [draft])`` (``[]`` for None: the n-gram drafter alone) for a run whose tree size is set
    (``--budget``, a static tree; 1: plain decoding; the n-gram drafter's largest tree), with the target in the
    rendering whose forward over ``tree_size`` tokens ``timer`` measures faster
    here: the draft's part of a step is the same either way, so the faster verification makes the faster step.
    For plain decoding on the Zen 4 host that is int4 (a one-token forward 69 ms against bfloat16's 222), where the
    floating ``auto`` choice, which the other commands keep, decoded chat at 5.0-5.6 tok/s against 12.7. The
    decision is cached per target and size."""
    key = measurement_key("sized-target", target, f"tokens={int(tree_size)}", device="cpu")

    def rate(model: torch.nn.Module, drafts: list[Any], tok: Any) -> Candidate:
        return Candidate(precision_of(model), timer(model, tree_size), f"one forward over {tree_size} tokens")

    return _load_faster(target, draft, key, rate, draft_dtype=draft_dtype, compile=compile)


def piloted_seconds_per_token(target: torch.nn.Module, drafts: list[Any], tokenizer: Any,
                              recipe: Recipe) -> Candidate:
    """``recipe`` (its budget left to a pilot) resolved for this target by its pilot (``choices.resolve``: the depth
    predicted fastest, or plain decoding), and that choice's predicted seconds per new token."""
    resolved = resolve(replace(recipe, target_dtype=None, draft_dtype=None), target, drafts, tokenizer=tokenizer)
    budget = resolved.recipe.budget
    tree = "plain decoding" if budget == 1 else f"budget {budget}, depth {plan_depth(resolved.recipe, bool(drafts))}"
    if resolved.pilot_seconds_per_token is None:  # nothing for a pilot to measure: no prediction to compare
        return Candidate(precision_of(target), float("inf"), "not measured")
    return Candidate(precision_of(target), resolved.pilot_seconds_per_token, tree)


def load_pair_piloted(target: str, draft: str | None, recipe: Recipe, *, draft_dtype: str | None = None,
                      compile: bool | str = False,
                      rate: Callable[[torch.nn.Module, list[Any], Any, Recipe], Candidate] = piloted_seconds_per_token
                      ) -> tuple[torch.nn.Module, Any, list[Any]]:
    """``load_pair(target, [draft])`` (``[]`` for None: the n-gram drafter alone) for a run whose tree a pilot sizes
    (``recipe`` without a budget, not the tuner's: the n-gram drafter, independent chains, a dynamic or path tree), with
    the target in the rendering whose pilot choice ``rate`` predicts faster here: the pilot may decline speculation,
    and plain decoding wants the rendering with the faster one-token forward (int4 on the Zen 4 host, 3x
    bfloat16's), where a tree's verification may want another. Cached per target, draft and recipe."""
    fields = replace(recipe, target_dtype=None, draft_dtype=None, compile=False)
    fingerprint = hashlib.sha256(repr(fields).encode()).hexdigest()[:16]
    key = measurement_key("piloted-target", target, f"draft={draft}", f"draft_dtype={draft_dtype or 'auto'}",
                          f"recipe={fingerprint}", device="cpu")
    return _load_faster(target, draft, key, lambda model, drafts, tok: rate(model, drafts, tok, recipe),
                        draft_dtype=draft_dtype, compile=compile)


def _load_faster(target: str, draft: str | None, key: str, rate: Callable[[torch.nn.Module, list[Any], Any], Candidate],
                 *, draft_dtype: str | None, compile: bool | str) -> tuple[torch.nn.Module, Any, list[Any]]:
    """The pair with the target in whichever rendering ``rate`` gives the fewer seconds (its floating ``auto``
    precision, or int4 on the file's own blocks where the file holds them), the decision cached under ``key``."""
    path, record, names = cache_root() / PRECISION_DECISIONS, _cached(key), [] if draft is None else [draft]
    if record is not None:
        model, tok, drafts = load_pair(target, names, target_dtype=record["precision"], draft_dtype=draft_dtype,
                                       compile=compile)
        return _marked(model, target, {**record, "cached": True}), tok, drafts
    model, tok, drafts = load_pair(target, names, target_dtype="auto", draft_dtype=draft_dtype, compile=compile)
    if drafts and isinstance(drafts[0], CrossDraft):
        return model, tok, drafts
    best = rate(model, drafts, tok)
    candidates = {best.precision: best}
    other, _ = load(target, dtype=INT4, role="target")
    if other.treespec_precision.get("file_blocks", {}).get("exact", 0):  # the file holds 4-bit blocks
        rated = rate(other, drafts, tok)
        candidates[rated.precision] = rated
        if rated.seconds_per_token < best.seconds_per_token:
            model, best = other, rated
    left = weakref.ref(other)
    del other
    if left() is not None:  # kept alive by a reference cycle: collected now (a full collection scans the whole heap)
        gc.collect()
    record = {"precision": best.precision, "key": key,
              "candidates": {p: {"seconds_per_token": c.seconds_per_token, "tree": c.tree}
                             for p, c in candidates.items()},
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_json(path, {**read_json_dict(path), key: record}, sort_keys=True)
    return _marked(model, target, {**record, "cached": False}), tok, drafts


def _marked(model: torch.nn.Module, name: str, record: dict[str, Any]) -> torch.nn.Module:
    """``model`` carrying the tuned choice in its ``treespec_precision`` record, logged."""
    log(f"{name} (target) precision: {describe(record)}")
    model.treespec_precision = {**getattr(model, "treespec_precision", {}), "tuned_choice": record}
    return model
