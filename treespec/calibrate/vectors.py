"""Acceptance vectors from files: one written by ``treespec accept``, or the one shipped for the built-in pair."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tree_builders import acceptance_rows


def default_acceptance(path: str | Path | None, temperature: float) -> list:
    """The vector in ``path`` (JSON from ``treespec accept``), else the one shipped for the built-in
    Qwen2.5-Coder pair at this temperature; refused, with the file named, unless it holds
    probabilities in [0, 1] summing to at most 1 (``tree_builders.acceptance_rows``)."""
    if path is None:
        where = f"data/acceptance-qwen2.5-coder-t{0 if temperature == 0 else 1}.json"
        text = resources.files("treespec").joinpath(where).read_text()
    else:
        where = str(path)
        text = Path(path).read_text()
    try:
        vector = json.loads(text)["vector"]
        acceptance_rows(vector)
    except json.JSONDecodeError as error:
        raise ValueError(f"acceptance file {where} is not valid JSON ({error}); write one with `treespec accept`") \
            from error
    except (KeyError, TypeError) as error:
        raise ValueError(f"acceptance file {where} has no \"vector\" entry; write one with `treespec accept`") \
            from error
    except ValueError as error:
        raise ValueError(f"acceptance file {where}: {error}; write one with `treespec accept`") from None
    return vector
