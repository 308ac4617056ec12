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
from typing import Any

from tree_builders import acceptance_rows


def _text(path: str | Path | None, temperature: float) -> tuple[str, str]:
    """(where, text) of the acceptance file at ``path``, or of the one shipped for this temperature."""
    if path is None:
        where = f"data/acceptance-qwen2.5-coder-t{0 if temperature == 0 else 1}.json"
        return where, resources.files("treespec").joinpath(where).read_text()
    return str(path), Path(path).read_text()


def calibration_walk(path: str | Path | None, temperature: float) -> Any:
    """The measurement in ``path`` (else the shipped one at this temperature) as a ``MeasuredAcceptance`` when
    it keeps its walk's ranks (what a tuned run's prediction replays, ``treespec.calibrate.tuning.Tuned``);
    None for a file without them (a bare vector, or one written before the ranks were kept)."""
    from .acceptance import MeasuredAcceptance

    _, text = _text(path, temperature)
    try:
        saved = json.loads(text)
        return MeasuredAcceptance.from_dict(saved) if saved.get("ranks") else None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None  # default_acceptance says what is wrong with the file


def default_acceptance(path: str | Path | None, temperature: float, per_depth: bool = True) -> list:
    """The acceptance in ``path`` (JSON from ``treespec accept``), else the one shipped for the built-in
    Qwen2.5-Coder pair at this temperature: its per-depth matrix (row ``d``: acceptance given that the
    walk reached depth ``d + 1``, what the Sequoia DP then sizes trees with), or with ``per_depth=False``
    or in a file without one, its positional vector (Sequoia's published model). Refused, with the file
    named, unless it holds probabilities in [0, 1] whose rows sum to at most 1 (``tree_builders.acceptance_rows``)."""
    where, text = _text(path, temperature)
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
