"""What the commands read besides their options: the prompts of ``--prompt``, ``--prompt-file`` or
``--prompts-jsonl`` (with a JSONL line's other fields, carried into ``generate``'s records), encoded for the target,
and the static tree of ``--paths``."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Sequence

from .common.prompts import user_turn
from .core.checks import check_prompts_fit, context_note, context_of
from .models.pair import draft_model


def read_paths(value: str | None, tree: str) -> list | None:
    """``--paths``: a JSON list of child-rank paths, or a JSON file holding one (None when not given)."""
    if value is None:
        if tree == "paths":
            raise ValueError("--tree paths needs --paths: its static tree as a JSON list of child-rank paths in "
                             "priority order, e.g. --paths '[[0], [1], [0, 0]]', or a JSON file holding one")
        return None
    text = value if value.lstrip().startswith("[") else Path(value).read_text()  # a JSON list, or a file holding one
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"--paths must be a JSON list of child-rank paths (e.g. '[[0], [1], [0, 0]]') or a JSON file "
                         f"holding one; {value!r} is not JSON: {error}") from None


def read_prompts(args: argparse.Namespace) -> list[str]:
    """``--prompt``, the lines of ``--prompt-file`` (blank lines skipped) or the ``prompt`` fields of
    ``--prompts-jsonl``."""
    return [text for text, _ in read_prompt_lines(args)]


def unescape(line: str) -> str:
    """A ``--prompt-file`` line's text: ``\\n`` a newline, ``\\\\`` one backslash (so code holding ``"\\n"`` is
    written ``"\\\\n"``), any other backslash kept as it is."""
    return re.sub(r"\\([\\n])", lambda m: "\n" if m.group(1) == "n" else "\\", line)


def read_prompt_lines(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """Each prompt with the other fields of its ``--prompts-jsonl`` object (an ``id``, say; ``{}`` for the other
    sources), which ``generate`` carries into the prompt's record under ``"input"``."""
    if getattr(args, "prompt", None) is not None:
        return [(args.prompt, {})]
    if args.prompt_file is not None:
        lines = [(unescape(line), {}) for line in args.prompt_file.read_text().splitlines() if line.strip()]
        where = args.prompt_file
    else:
        where = args.prompts_jsonl
        lines = []
        for n, line in enumerate(where.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                text = record["prompt"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f"{where}, line {n}: expected a JSON object with a \"prompt\" string") from None
            if not isinstance(text, str):
                raise ValueError(f"{where}, line {n}: \"prompt\" must be a string")
            lines.append((text, {k: v for k, v in record.items() if k != "prompt"}))
    if not lines:
        raise ValueError(f"{where} holds no prompt")
    return lines


def encode(tok, text: str, chat: bool) -> list[int]:
    """``text`` in the target's tokens; with ``chat``, as the user's turn in its chat template, ready for the
    assistant's reply (``common.prompts.user_turn``: refused for a tokenizer without a template, a base model's)."""
    return user_turn(tok, text) if chat else tok(text)["input_ids"]


def encode_all(tok, prompts: list[str], chat: bool, numbers: list[int] | None = None,
               total: int | None = None) -> list[list[int]]:
    """Every prompt in the target's tokens; a prompt of no tokens is refused, naming it (``numbers``: each prompt's
    place in the list of ``total`` it was taken from, for a resumed run's remaining prompts)."""
    encoded = [encode(tok, text, chat) for text in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"{_named(i, numbers, total or len(prompts))} is empty in the target's tokens "
                             f"({prompts[i]!r}; this tokenizer adds no BOS token): give it some text, or pass --chat "
                             "to wrap it in the chat template")
    return encoded


def check_context(encoded: list[list[int]], max_new_tokens: int, target: Any, numbers: list[int] | None = None,
                  total: int | None = None, drafts: Sequence[Any] = ()) -> None:
    """Refuse, naming it (as :func:`encode_all`), a prompt whose tokens and ``max_new_tokens`` do not fit the
    ``target``'s context, or reach past a sliding window of the target or a draft model (``drafts``: models, or
    drafts of another tokenizer), or past a draft's context (one of the target's tokenizer): before any prompt runs,
    not when its turn comes."""
    total = total or len(encoded)
    check_prompts_fit([len(ids) for ids in encoded], max_new_tokens, context_of(target),
                      [None if total == 1 else _named(i, numbers, total) for i in range(len(encoded))],
                      context_note(target), [(target, "target")] + [(draft_model(d), "draft", draft_model(d) is d)
                                                                     for d in drafts])


def _named(i: int, numbers: list[int] | None, total: int) -> str:
    """How an error names prompt ``i`` of a run: by its place among the ``total`` prompts given."""
    return "the prompt" if total == 1 else f"prompt {(i if numbers is None else numbers[i]) + 1} of {total}"
