"""Acceptance rows from files: one written by ``treespec accept``, or the one shipped for the built-in pair.

The shipped files (``treespec/data/acceptance-qwen2.5-coder-t{0,1}.json``) are walked measurements
(``treespec.calibrate.acceptance``, ``context="walk"``) of the built-in pair on 40 HumanEval prompts
drawn at random from 0-99 (the evaluations use prompts from 100 on), 96 tokens each, bfloat16 target
and int8 draft, 8 proposals per position (``experiments/calibrate_default.py``).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tree_builders import acceptance_rows


def default_acceptance(path: str | Path | None, temperature: float, per_depth: bool = True) -> list:
    """The acceptance in ``path`` (JSON from ``treespec accept``), else the one shipped for the built-in
    Qwen2.5-Coder pair at this temperature: its per-depth matrix (row ``d``: acceptance given that the
    walk reached depth ``d + 1``, what the Sequoia DP then sizes trees with), or with ``per_depth=False``
    or in a file without one, its positional vector (Sequoia's published model). Refused, with the file
    named, unless it holds probabilities in [0, 1] whose rows sum to at most 1 (``tree_builders.acceptance_rows``)."""
    if path is None:
        where = f"data/acceptance-qwen2.5-coder-t{0 if temperature == 0 else 1}.json"
        text = resources.files("treespec").joinpath(where).read_text()
    else:
        where = str(path)
        text = Path(path).read_text()
    try:
        saved = json.loads(text)
        rows = saved["matrix"] if per_depth and "matrix" in saved else saved["vector"]
        acceptance_rows(rows)
    except json.JSONDecodeError as error:
        raise ValueError(f"acceptance file {where} is not valid JSON ({error}); write one with `treespec accept`") \
            from error
    except (KeyError, TypeError) as error:
        raise ValueError(f"acceptance file {where} has no \"vector\" entry; write one with `treespec accept`") \
            from error
    except ValueError as error:
        raise ValueError(f"acceptance file {where}: {error}; write one with `treespec accept`") from None
    return rows
