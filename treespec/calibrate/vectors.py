"""Acceptance rows from files: one written by ``treespec accept``, or the one shipped for the built-in pair.

The shipped files (``treespec/data/acceptance-qwen2.5-coder-t{0,1}.json``) are walked measurements
(``treespec.calibrate.acceptance``, ``context="walk"``) of the built-in pair on 40 HumanEval prompts
drawn at random from 0-99 (the evaluations use prompts from 100 on), up to 96 tokens each (a continuation ends at
the target's end of text, where a run stops), bfloat16 target
and int8 draft, 8 proposals per position (``experiments/calibrate_default.py``); beside them, the same walks
with the int4 draft (``...-t0-int4.json``, ``...-t1-int4.json``), which runs drafting in int4 are sized and
predicted with. The ``...-chat-t{0,1}[-int4].json`` files are the same walks over 40 ShareGPT first turns in the
chat template (drawn from turns 1000-1099; ``experiments/calibrate_default.py --dataset sharegpt``): what runs
of prompts in the chat template (``treespec generate --chat``) are sized and predicted with. A chat reply accepts
less than code, and a tree sized from code's rows speculates where chat does not pay.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from tree_builders import acceptance_rows


def shipped_file(temperature: float, draft_precision: str | None = None, chat: bool = False) -> str:
    """The shipped acceptance for this temperature (a path inside the package): the walk with the draft in
    ``draft_precision`` where one was shipped (``...-t0-int4.json``: the draft precision changes what the draft
    proposes, hence the tau a tree gets), else the int8 draft's. ``chat``: the walks over chat prompts in the chat
    template (``...-chat-t0.json``), in the draft's precision where shipped, else the int8 draft's (the prompts
    change the tau far more than the draft's precision), else code's."""
    files = resources.files("treespec")
    t = 0 if temperature == 0 else 1
    own = draft_precision and draft_precision != "int8"
    candidates = [f"data/acceptance-qwen2.5-coder-{kind}t{t}{suffix}.json"
                  for kind in (("chat-", "") if chat else ("",))
                  for suffix in ((f"-{draft_precision}", "") if own else ("",))]
    return next((c for c in candidates if files.joinpath(c).is_file()), candidates[-1])


@cache
def shipped_digest() -> str:
    """A short digest of every shipped acceptance file's contents: what a decision made from them is keyed by, so
    that walks made again make it again (``treespec.calibrate.target_precision``)."""
    h = hashlib.sha256()
    for f in sorted((f for f in resources.files("treespec").joinpath("data").iterdir()
                     if f.name.startswith("acceptance-")), key=lambda f: f.name):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def _text(path: str | Path | None, temperature: float, draft_precision: str | None = None,
          chat: bool = False) -> tuple[str, str]:
    """(where, text) of the acceptance file at ``path``, or of the one shipped for this temperature, draft
    precision and prompts (:func:`shipped_file`)."""
    if path is None:
        where = shipped_file(temperature, draft_precision, chat)
        return where, resources.files("treespec").joinpath(where).read_text()
    return str(path), Path(path).read_text()


def calibration_walk(path: str | Path | None, temperature: float, draft_precision: str | None = None,
                     chat: bool = False) -> Any:
    """The measurement in ``path`` (else the one shipped for this temperature, draft precision and prompts,
    :func:`shipped_file`) as a ``MeasuredAcceptance`` when it keeps its walk's ranks (what a tuned run's prediction
    replays, ``treespec.calibrate.tuning.Tuned``); None for a file without them (a bare vector, or one written
    before the ranks were kept)."""
    try:
        where, text = _text(path, temperature, draft_precision, chat)
        saved = _parsed(where, text)
    except ValueError:
        return None  # default_acceptance says what is wrong with the file
    return _walk(saved, where)


def _parsed(where: str, text: str) -> Any:
    """The JSON in ``text`` (the file ``where``)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"acceptance file {where} is not valid JSON ({error}); write one with `treespec accept`") \
            from error


def _walk(saved: Any, where: str) -> Any:
    """:func:`calibration_walk` of the parsed file ``where``; refused where its proposal probabilities (the
    confidence stop's input) do not cover its ranks: each prompt's positions, each with a probability per rank of
    the file's width (the replay would index past them)."""
    from .acceptance import MeasuredAcceptance

    try:
        walk = MeasuredAcceptance.from_dict(saved) if saved.get("ranks") else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # default_acceptance says what is wrong with the file
    limit = walk.meta.get("max_new_tokens") if walk is not None else None
    if limit is not None and not (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1):
        raise ValueError(f"acceptance file {where}: its meta \"max_new_tokens\" is {limit!r}, not a count of tokens "
                         "(where a continuation shorter than it ended at the end of text); write it again with "
                         "`treespec accept`")
    if walk is None or not walk.confidence:
        return walk
    width = len(walk.vector)
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    covered = len(walk.confidence) == len(walk.ranks) and all(
        isinstance(probs, list) and len(probs) >= len(ranks) and all(
            isinstance(row, list) and len(row) >= width and all(map(number, row)) for row in probs[:len(ranks)])
        for ranks, probs in zip(walk.ranks, walk.confidence))
    if not covered:
        raise ValueError(f"acceptance file {where}: its \"confidence\" does not cover its \"ranks\" (one list per "
                         f"prompt and position, {width} probabilities (numbers) each, for {len(walk.ranks)} prompts); "
                         "write it again with `treespec accept`")
    return walk


def default_acceptance(path: str | Path | None, temperature: float, per_depth: bool = True,
                       draft_precision: str | None = None, chat: bool = False) -> list:
    """The acceptance in ``path`` (JSON from ``treespec accept``), else the one shipped for the built-in
    Qwen2.5-Coder pair at this temperature and draft precision, code's or, with ``chat``, chat's
    (:func:`shipped_file`): its per-depth matrix
    (row ``d``: acceptance given that the walk reached depth ``d + 1``, what the Sequoia DP then sizes trees
    with), or with ``per_depth=False`` or in a file without one, its positional vector (Sequoia's published
    model). Refused, with the file named, unless it holds probabilities in [0, 1] whose rows sum to at most 1
    (``tree_builders.acceptance_rows``)."""
    where, text = _text(path, temperature, draft_precision, chat)
    return _rows(where, _parsed(where, text), per_depth)


def _rows(where: str, saved: Any, per_depth: bool) -> list:
    """:func:`default_acceptance` of the parsed file ``where``."""
    try:
        rows = saved["matrix"] if per_depth and "matrix" in saved else saved["vector"]
        acceptance_rows(rows)
    except (KeyError, TypeError) as error:
        raise ValueError(f"acceptance file {where} has no \"vector\" entry; write one with `treespec accept`") \
            from error
    except ValueError as error:
        raise ValueError(f"acceptance file {where}: {error}; write one with `treespec accept`") from None
    return rows


def acceptance_for_draft(path: str | Path | None, temperature: float, draft: Any,
                         per_depth: bool = True, chat: bool = False) -> tuple[list, Any]:
    """What a run drafting with ``draft`` is sized and predicted with: the acceptance rows
    (:func:`default_acceptance`) and the calibration walk (:func:`calibration_walk`) in ``path``, else the
    shipped ones of the draft's precision (a draft of another tokenizer, not a model: the int8 draft's), chat's
    for prompts in the chat template (``chat``)."""
    import torch

    from ..models.precision import precision_of

    precision = precision_of(draft) if isinstance(draft, torch.nn.Module) else None
    where, text = _text(path, temperature, precision, chat)
    saved = _parsed(where, text)  # one read and parse for both
    return _rows(where, saved, per_depth), _walk(saved, where)
