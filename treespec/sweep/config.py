"""Sweep configs: TOML (or a dict) with defaults filled in and every value validated; prompt splits."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Sequence

from ..datasets import DATASETS, dataset_prompts, dataset_size
from ..models import DEFAULT_DRAFT, DEFAULT_TARGET
from ..recipes import DTYPES
from ..verifiers import VERIFIERS

BUILDERS = ("sequoia", "kary", "chains", "chain", "dynamic")
DRAFTER_SETS = ("model", "ngram", "both")
BASELINES = ("target", "assisted", "prompt_lookup")
MODEL_MODES = ("auto", "topk", "sample", "sample_without_replacement")
DRAFT_DTYPES = (*DTYPES, "int8")  # int8: dynamic quantisation of a draft's Linear layers (CPU)

#: the least a sweep needs for a figure worth citing: evaluation prompts per point, tokens per prompt,
#: prompt sets (the report flags a sweep below it)
CITABLE = {"prompts": 20, "tokens": 96, "datasets": 2}

DEFAULTS: dict[str, Any] = {
    "name": "sweep",
    "models": {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT, "pairs": []},
    "grid": {"drafters": ["model"], "builders": ["sequoia"], "budgets": [8], "max_depths": ["none"],
             "temperatures": [0.0], "top_p": [1.0], "seeds": [0], "model_mode": "auto",
             "verifiers": ["rrs"]},
    # citable by default: >= 20 evaluation prompts x >= 96 tokens on a code and a prose set
    # (CITABLE), calibration prompts disjoint from evaluation prompts
    "data": {"datasets": ["humaneval", "lee-news"], "calib": "0:100", "eval": "100:132", "max_new_tokens": 96,
             "max_prompt_tokens": 0},
    "acceptance": {"width": 8, "max_new_tokens": 64, "max_depth": 8, "use": "vector"},
    "shapes": {"kary_width": 2, "chains": 4, "dynamic_depth": 6, "dynamic_topk": 8},
    "ngram": {"mode": "ngram", "max_order": 4, "max_tokens": 6, "width": 1, "window": 512},
    "baselines": {"methods": list(BASELINES), "prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2,
                  "assisted": {}},
    "run": {"device": "cpu", "dtype": "float32", "draft_dtype": "same", "warmup_tokens": 4, "threads": 0,
            "compile": False},
}


def _merge(defaults: dict[str, Any], given: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``defaults`` updated with ``given``; unknown keys raise (catches typos in a config)."""
    out = copy.deepcopy(defaults)
    for k, v in given.items():
        if k not in defaults:
            raise ValueError(f"unknown config key {where + k!r}; known: {', '.join(sorted(defaults))}")
        if isinstance(defaults[k], dict) and k != "assisted":  # baselines.assisted: free GenerationConfig kwargs
            if not isinstance(v, dict):
                raise ValueError(f"config key {where}{k!r} must be a table")
            out[k] = _merge(defaults[k], v, f"{where}{k}.")
        else:
            out[k] = v
    return out


def _as_list(x: Any) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def load_config(config: str | os.PathLike | dict[str, Any]) -> dict[str, Any]:
    """Read a TOML config (or take a dict), fill in defaults and validate it.

    ``data`` may hold per-dataset tables (``[data.lee-news] calib = "0:100"``) overriding
    ``calib``/``eval`` for that dataset.
    """
    if isinstance(config, dict):
        raw = copy.deepcopy(config)
    else:
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            try:
                import tomli as tomllib  # type: ignore[no-redef]
            except ModuleNotFoundError as error:
                raise ImportError("reading TOML configs on Python 3.10 needs the tomli package: pip install tomli") \
                    from error
        with open(config, "rb") as f:
            raw = tomllib.load(f)
        raw.setdefault("name", Path(config).stem)
    data = raw.get("data", {})
    splits = dict(data.pop("splits", {}))  # a config already loaded once
    splits.update({k: data.pop(k) for k in list(data) if isinstance(data[k], dict)})
    for name, table in splits.items():
        check(name in DATASETS and set(table) <= {"calib", "eval"},
               f"[data.{name}] must name a dataset ({', '.join(DATASETS)}) and hold only calib/eval")
    cfg = _merge(DEFAULTS, raw)
    cfg["data"]["splits"] = splits
    g = cfg["grid"]
    for key in ("drafters", "builders", "budgets", "max_depths", "temperatures", "top_p", "seeds", "verifiers"):
        g[key] = _as_list(g[key])
    cfg["data"]["datasets"] = _as_list(cfg["data"]["datasets"])
    cfg["baselines"]["methods"] = _as_list(cfg["baselines"]["methods"])
    g["max_depths"] = [None if str(d).lower() in ("none", "0", "") else int(d) for d in g["max_depths"]]
    check(set(g["drafters"]) <= set(DRAFTER_SETS), f"grid.drafters must be among {DRAFTER_SETS}")
    check(set(g["builders"]) <= set(BUILDERS), f"grid.builders must be among {BUILDERS}")
    check(all(isinstance(b, int) and b >= 2 for b in g["budgets"]),
           "grid.budgets must be ints >= 2 (a budget counts the root; 2 = one drafted token)")
    check(all(d is None or d >= 1 for d in g["max_depths"]), "grid.max_depths must be >= 1 or \"none\"")
    check(all(float(t) >= 0 for t in g["temperatures"]), "grid.temperatures must be >= 0")
    check(all(0 < float(p) <= 1 for p in g["top_p"]), "grid.top_p must be in (0, 1]")
    check(set(g["verifiers"]) <= set(VERIFIERS), f"grid.verifiers must be among {tuple(VERIFIERS)}")
    check(isinstance(cfg["run"]["compile"], (bool, str)), "run.compile must be false, true or a torch.compile backend name")
    check(g["model_mode"] in MODEL_MODES, f"grid.model_mode must be one of {MODEL_MODES}")
    check(set(cfg["data"]["datasets"]) <= set(DATASETS), f"data.datasets must be among {DATASETS}")
    check(set(cfg["baselines"]["methods"]) <= set(BASELINES), f"baselines.methods must be among {BASELINES}")
    check(cfg["acceptance"]["use"] in ("vector", "matrix"), "acceptance.use must be \"vector\" or \"matrix\"")
    check(cfg["run"]["dtype"] in DTYPES, f"run.dtype must be one of {tuple(DTYPES)}")
    check(cfg["run"]["draft_dtype"] in ("same", *DRAFT_DTYPES),
          f"run.draft_dtype must be \"same\" (the target's run.dtype) or one of {DRAFT_DTYPES}")
    check(int(cfg["data"]["max_new_tokens"]) >= 1, "data.max_new_tokens must be >= 1")
    for name in cfg["data"]["datasets"]:
        calib, evals = split_ranges(cfg, name)
        if not set(range(*calib)).isdisjoint(range(*evals)):
            raise ValueError(f"dataset {name}: calibration prompts {calib} overlap evaluation prompts {evals}")
    return cfg


def draft_dtype(cfg: dict[str, Any]) -> str:
    """The drafts' precision: ``run.draft_dtype``, or the target's ``run.dtype`` when it is ``"same"``."""
    d = cfg["run"]["draft_dtype"]
    return cfg["run"]["dtype"] if d == "same" else d


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def pairs(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """The (target, draft) pairs of a config: ``models.pairs`` if given, else ``models.target/draft``."""
    given = cfg["models"]["pairs"]
    if given:
        return [(p["target"], p["draft"]) for p in given]
    return [(cfg["models"]["target"], cfg["models"]["draft"])]


def parse_range(spec: str | Sequence[int], size: int) -> tuple[int, int]:
    """``"a:b"`` (either side optional) -> ``(a, b)`` clipped to ``[0, size]``."""
    if isinstance(spec, str):
        lo, _, hi = spec.partition(":")
        a, b = int(lo or 0), int(hi) if hi else size
    else:
        a, b = int(spec[0]), int(spec[1])
    a, b = max(0, min(a, size)), max(0, min(b, size))
    if b <= a:
        raise ValueError(f"prompt range {spec!r} is empty for a dataset of {size} prompts")
    return a, b


def split_ranges(cfg: dict[str, Any], dataset: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Calibration and evaluation ranges of ``dataset`` (per-dataset tables override the defaults)."""
    data = cfg["data"]
    over = data["splits"].get(dataset, {})
    size = dataset_size(dataset)
    return parse_range(over.get("calib", data["calib"]), size), parse_range(over.get("eval", data["eval"]), size)


def calib_eval_prompts(cfg: dict[str, Any], dataset: str) -> tuple[list[str], list[str]]:
    """Calibration and evaluation prompt texts of ``dataset``; asserts they share no prompt."""
    (a, b), (c, d) = split_ranges(cfg, dataset)
    texts = dataset_prompts(dataset)
    calib, evals = list(texts[a:b]), list(texts[c:d])
    shared = set(calib) & set(evals)
    if shared:
        raise ValueError(f"dataset {dataset}: {len(shared)} prompt text(s) occur in both the calibration and the "
                         "evaluation ranges")
    return calib, evals

