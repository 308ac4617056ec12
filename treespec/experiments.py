"""Tree-budget sweeps and comparisons: the research harness behind ``treespec sweep``.

A sweep runs a grid of *points* described by a TOML config (``experiments/configs/*.toml``) and
appends one JSON record per finished point to ``<out>/results.jsonl``. A point is either

* a **treespec** point: ``treespec.generate`` over every evaluation prompt with one drafter set
  (``model``, ``ngram`` or ``both``), one tree builder and one budget, depth limit, temperature,
  top-p and seed; or
* a **baseline** point: HuggingFace ``generate`` on the same prompts: the target alone
  (``target``), assisted generation with the same draft (``assisted``, ``assistant_model=``) or
  prompt lookup (``prompt_lookup``, ``prompt_lookup_num_tokens=``).

Fair comparisons. Every method generates exactly ``max_new_tokens`` tokens per prompt: treespec
runs with ``eos_token_id=None`` and HF with ``min_new_tokens=max_new_tokens`` and an empty
``eos_token_id`` list (HF would otherwise merge in the model's eos and *suppress* it, which changes
greedy outputs). Each model's own ``generation_config`` is replaced by a neutral one, so no
repetition penalty, top-k or other default of a checkpoint leaks into a baseline. The counts are
checked; a speedup is recorded only when every prompt of both methods has the full count.
Each point starts with an untimed warm-up (``run.warmup_tokens`` tokens after the last 32 tokens of
the first evaluation prompt); every timed call is wrapped in ``torch.cuda.synchronize()`` on CUDA.
Speedup over a baseline is its total wall time divided by the point's, for the same prompts, token
counts, temperature, top-p and seed. Records keep the machine's load average: on a shared CPU,
other processes skew every timing (and so every speedup). Greedy points also record how many
prompts produced exactly the target baseline's tokens (an exactness check; in bf16/fp16 near-ties
can legitimately differ).

How a builder becomes a tree at budget ``B`` (tokens per verification pass, root included) and
depth limit ``D`` (``"none"`` = no limit):

* ``sequoia``: ``tree_builders.sequoia(a, B, max_depth=D)`` with ``a`` the acceptance vector (or
  per-depth matrix, ``acceptance.use``) measured on the calibration prompts;
* ``chain``: ``chain(min(B - 1, D))``;
* ``chains``: ``k = min(shapes.chains, B - 1)`` independent chains of ``min((B - 1) // k, D)`` tokens;
* ``kary``: levels of ``shapes.kary_width`` children per node while a full level fits in ``B``;
  the first level that does not fit gets the largest width that does, then the tree stops (also at
  depth ``D``); e.g. width 2: B=4 -> (2,), B=8 -> (2, 2), B=16 -> (2, 2, 2);
* ``dynamic``: ``ModelDrafter(mode="dynamic", depth=min(shapes.dynamic_depth, D, B - 1),
  topk=shapes.dynamic_topk, nodes=B - 1)`` (EAGLE-2, point masses).

Static shapes draw children with ``grid.model_mode``; ``"auto"`` means ``topk`` at temperature 0
and ``sample_without_replacement`` (Sequoia) otherwise. The n-gram drafter (``ngram`` table) runs
with ``max_tokens = min(ngram.max_tokens, B - 1, D)`` and ``max_nodes = B - 1``. In ``both`` the
model's tree keeps its budget ``B`` and the n-gram's guesses come on top, merged *after* it: the
step's cap is ``B + max_tokens`` (guesses that agree with the model's tree add no node). For
``drafters = "ngram"`` the builder axis does not apply (builder ``"ngram"``).

Acceptance vectors (``treespec.acceptance.measure``) are measured once per (pair, dataset, mode,
temperature, top-p) on the calibration prompts, cached as ``acceptance-<hash>.json`` in the output
directory, and always read back from that file. Static-shape points record the tau the vector
predicts (``TreeShape.expected_tokens``) beside the measured tau.

Datasets: ``humaneval`` (``treespec.models.humaneval_prompts``, 164 code prompts) and
``lee-news`` (the Lee news articles shipped in the PyPI package ``gensim``, read as a data file
without importing gensim; a prompt is an article's leading sentences, at least 48 words; the 300
articles hold 290 distinct leads, duplicates dropped).
Calibration and evaluation ranges (``"start:stop"``) must be disjoint: overlapping ranges or a
shared prompt text raise. Prompts are fed raw, without a chat template (both models are treated as
text continuers, which is what HumanEval prompts are written for); ``data.max_prompt_tokens`` keeps
the last tokens of longer prompts.

Resuming: a point's key is a hash of all its parameters (device and dtype included; timings and
warm-up excluded). Re-running a config skips points already in ``results.jsonl``; records are
written with flush + fsync as each point finishes, so Ctrl-C or a crash loses only the point in
progress. A point that raises is written with ``"status": "error"`` and retried on the next run.

Model names: anything ``treespec.models.load`` accepts, or an in-process tiny random model for tests:
``"tiny:llama:seed=0"`` / ``"tiny:qwen2:seed=0:vocab=64:hidden=32:layers=2:scale=4"``, and a draft
correlated with it ``"tiny:llama:seed=0:noise=0.3"`` (the same model plus Gaussian weight noise,
``noise_seed`` 1 by default). Tiny models read text as UTF-8 bytes modulo their vocabulary.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

import tree_builders
from tree_builders import TreeShape

from . import models as _models
from .baselines import hf_generate, sync
from .engine import generate
from .model_drafter import ModelDrafter
from .ngram import NGramDrafter
from .sampling import spread_seed

BUILDERS = ("sequoia", "kary", "chains", "chain", "dynamic")
STATIC_BUILDERS = tree_builders.STATIC_BUILDERS
DRAFTER_SETS = ("model", "ngram", "both")
BASELINES = ("target", "assisted", "prompt_lookup")
MODEL_MODES = ("auto", "topk", "sample", "sample_without_replacement")
DATASETS = ("humaneval", "lee-news")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RESULTS = "results.jsonl"

DEFAULTS: dict[str, Any] = {
    "name": "sweep",
    "models": {"target": _models.DEFAULT_TARGET, "draft": _models.DEFAULT_DRAFT, "pairs": []},
    "grid": {"drafters": ["model"], "builders": ["sequoia"], "budgets": [8], "max_depths": ["none"],
             "temperatures": [0.0], "top_p": [1.0], "seeds": [0], "model_mode": "auto"},
    "data": {"datasets": ["humaneval"], "calib": "0:100", "eval": "100:164", "max_new_tokens": 64,
             "max_prompt_tokens": 0},
    "acceptance": {"width": 8, "max_new_tokens": 64, "max_depth": 8, "use": "vector"},
    "shapes": {"kary_width": 2, "chains": 4, "dynamic_depth": 6, "dynamic_topk": 8},
    "ngram": {"mode": "ngram", "max_order": 4, "max_tokens": 6, "width": 1, "window": 512},
    "baselines": {"methods": list(BASELINES), "prompt_lookup_num_tokens": 10, "max_matching_ngram_size": 2,
                  "assisted": {}},
    "run": {"device": "cpu", "dtype": "float32", "warmup_tokens": 4, "threads": 0},
}

# Fields of a record that depend on the clock or the machine's state, not on the computation.
TIMING_FIELDS = ("timing", "speedup", "meta")

Measure = Callable[..., Any]


# ---------------------------------------------------------------------------------------------
# Config


def _merge(defaults: dict[str, Any], given: dict[str, Any], where: str = "") -> dict[str, Any]:
    """``defaults`` updated with ``given``; unknown keys raise (catches typos in a config)."""
    out = copy.deepcopy(defaults)
    for k, v in given.items():
        if k not in defaults:
            raise ValueError(f"unknown config key {where}{k!r}; known: {', '.join(sorted(defaults))}")
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
        _check(name in DATASETS and set(table) <= {"calib", "eval"},
               f"[data.{name}] must name a dataset ({', '.join(DATASETS)}) and hold only calib/eval")
    cfg = _merge(DEFAULTS, raw)
    cfg["data"]["splits"] = splits
    g = cfg["grid"]
    for key in ("drafters", "builders", "budgets", "max_depths", "temperatures", "top_p", "seeds"):
        g[key] = _as_list(g[key])
    cfg["data"]["datasets"] = _as_list(cfg["data"]["datasets"])
    cfg["baselines"]["methods"] = _as_list(cfg["baselines"]["methods"])
    g["max_depths"] = [None if str(d).lower() in ("none", "0", "") else int(d) for d in g["max_depths"]]
    _check(set(g["drafters"]) <= set(DRAFTER_SETS), f"grid.drafters must be among {DRAFTER_SETS}")
    _check(set(g["builders"]) <= set(BUILDERS), f"grid.builders must be among {BUILDERS}")
    _check(all(isinstance(b, int) and b >= 2 for b in g["budgets"]),
           "grid.budgets must be ints >= 2 (a budget counts the root; 2 = one drafted token)")
    _check(all(d is None or d >= 1 for d in g["max_depths"]), "grid.max_depths must be >= 1 or \"none\"")
    _check(all(float(t) >= 0 for t in g["temperatures"]), "grid.temperatures must be >= 0")
    _check(all(0 < float(p) <= 1 for p in g["top_p"]), "grid.top_p must be in (0, 1]")
    _check(g["model_mode"] in MODEL_MODES, f"grid.model_mode must be one of {MODEL_MODES}")
    _check(set(cfg["data"]["datasets"]) <= set(DATASETS), f"data.datasets must be among {DATASETS}")
    _check(set(cfg["baselines"]["methods"]) <= set(BASELINES), f"baselines.methods must be among {BASELINES}")
    _check(cfg["acceptance"]["use"] in ("vector", "matrix"), "acceptance.use must be \"vector\" or \"matrix\"")
    _check(cfg["run"]["dtype"] in DTYPES, f"run.dtype must be one of {tuple(DTYPES)}")
    _check(int(cfg["data"]["max_new_tokens"]) >= 1, "data.max_new_tokens must be >= 1")
    for name in cfg["data"]["datasets"]:
        calib, evals = split_ranges(cfg, name)
        if not set(range(*calib)).isdisjoint(range(*evals)):
            raise ValueError(f"dataset {name}: calibration prompts {calib} overlap evaluation prompts {evals}")
    return cfg


def _check(ok: bool, message: str) -> None:
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


# ---------------------------------------------------------------------------------------------
# Datasets


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
        return tuple(_models.humaneval_prompts())
    if name == "lee-news":  # the corpus repeats some articles: keep each lead once, first occurrence
        return tuple(dict.fromkeys(_lead(a) for a in _lee_articles()))
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def dataset_size(name: str) -> int:
    return len(dataset_prompts(name))


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


# ---------------------------------------------------------------------------------------------
# Models


class ByteTokenizer:
    """Text -> UTF-8 bytes modulo ``vocab``: the tokenizer of the in-process tiny models."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.pad_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab for b in text.encode("utf-8")] or [0]


def tiny_model(spec: str) -> torch.nn.Module:
    """A tiny random Llama/Qwen2 from ``"tiny:FAMILY[:key=value]..."`` (keys: seed, vocab, hidden,
    layers, scale, noise, noise_seed); ``noise > 0`` perturbs every weight by that fraction of its
    tensor's std, giving a draft correlated with the ``noise=0`` model of the same seed."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    parts = spec.split(":")
    if len(parts) < 2 or parts[0] != "tiny":
        raise ValueError(f"a tiny model spec looks like 'tiny:llama:seed=0', got {spec!r}")
    families = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if parts[1] not in families:
        raise ValueError(f"tiny model family must be one of {', '.join(families)}, got {parts[1]!r}")
    opts: dict[str, float] = {"seed": 0, "vocab": 64, "hidden": 32, "layers": 2, "scale": 1.0, "noise": 0.0,
                              "noise_seed": 1}
    for kv in (p for part in parts[2:] for p in part.split(",") if p):
        k, _, v = kv.partition("=")
        if k not in opts:
            raise ValueError(f"unknown tiny model option {k!r} in {spec!r}; known: {', '.join(opts)}")
        opts[k] = float(v)
    config_cls, model_cls = families[parts[1]]
    hidden = int(opts["hidden"])
    config = config_cls(vocab_size=int(opts["vocab"]), hidden_size=hidden, intermediate_size=2 * hidden,
                        num_hidden_layers=int(opts["layers"]), num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=4096, tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(int(opts["seed"]))
    model = model_cls(config).eval().float()
    model.config._name_or_path = spec
    with torch.no_grad():
        if opts["scale"] != 1.0:
            model.lm_head.weight.mul_(opts["scale"])
        if opts["noise"] > 0:
            g = torch.Generator().manual_seed(int(opts["noise_seed"]))
            for p in model.parameters():
                p.add_(opts["noise"] * p.std().nan_to_num(0.0) * torch.randn(p.shape, generator=g))
    model.requires_grad_(False)
    return model


def load_model(spec: str, device: str, dtype: str) -> tuple[torch.nn.Module, Any]:
    """Load a model by name (``treespec.models.load``) or build a tiny one; returns (model, tokenizer).

    The model's ``generation_config`` is replaced by a neutral one (every baseline sets its
    sampling explicitly, and no checkpoint default may leak in).
    """
    from transformers import GenerationConfig

    if spec.startswith("tiny:"):
        model = tiny_model(spec).to(device=device, dtype=DTYPES[dtype])
        tokenizer: Any = ByteTokenizer(model.config.vocab_size)
    else:
        model, tokenizer = _models.load(spec, device=device, dtype=DTYPES[dtype])
    model.generation_config = GenerationConfig()
    return model, tokenizer


def encode(tokenizer: Any, text: str, max_tokens: int = 0) -> list[int]:
    """Raw text -> ids (no chat template); keeps the last ``max_tokens`` ids when ``max_tokens > 0``."""
    ids = tokenizer.encode(text) if isinstance(tokenizer, ByteTokenizer) else list(tokenizer(text).input_ids)
    return ids[-max_tokens:] if max_tokens > 0 else ids


def _pad_id(tokenizer: Any) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    return 0 if pad is None else int(pad)


# ---------------------------------------------------------------------------------------------
# Points


@dataclass(frozen=True)
class Point:
    """One grid point: its parameters (JSON values) and the key that identifies it."""

    params: dict[str, Any]
    key: str

    @property
    def kind(self) -> str:
        return self.params["kind"]

    @property
    def label(self) -> str:
        p = self.params
        if p["kind"] == "baseline":
            return f"{p['dataset']} T={p['temperature']} {p['method']}"
        depth = "" if p["max_depth"] is None else f" d<={p['max_depth']}"
        return f"{p['dataset']} T={p['temperature']} {p['drafters']}/{p['builder']} B={p['budget']}{depth}"


def point_key(params: dict[str, Any]) -> str:
    """A stable hash of a point's full parameters."""
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def draft_mode(cfg: dict[str, Any], builder: str, temperature: float) -> str:
    """How the model drafter proposes children for ``builder`` at ``temperature``."""
    if builder == "dynamic":
        return "dynamic"
    mode = cfg["grid"]["model_mode"]
    if mode == "auto":
        return "topk" if float(temperature) == 0 else "sample_without_replacement"
    return mode


def acceptance_params(cfg: dict[str, Any], target: str, draft: str, dataset: str, mode: str,
                      temperature: float, top_p: float) -> dict[str, Any]:
    """Everything an acceptance measurement depends on (its cache key)."""
    calib, _ = split_ranges(cfg, dataset)
    a = cfg["acceptance"]
    return {"target": target, "draft": draft, "dataset": dataset, "calib": list(calib),
            "max_prompt_tokens": int(cfg["data"]["max_prompt_tokens"]), "mode": mode,
            "temperature": float(temperature), "top_p": float(top_p), "width": int(a["width"]),
            "max_new_tokens": int(a["max_new_tokens"]), "max_depth": int(a["max_depth"]),
            "device": cfg["run"]["device"], "dtype": cfg["run"]["dtype"]}


def enumerate_points(cfg: dict[str, Any]) -> list[Point]:
    """Every point of the grid, in run order: per pair, dataset, temperature, top-p and seed, the
    baselines first (treespec points read their timings), then the treespec points."""
    g, run = cfg["grid"], cfg["run"]
    points: list[Point] = []
    seen: set[str] = set()

    def add(params: dict[str, Any]) -> None:
        key = point_key(params)
        if key not in seen:
            seen.add(key)
            points.append(Point(params, key))

    for target, draft in pairs(cfg):
        for dataset in cfg["data"]["datasets"]:
            _, evals = split_ranges(cfg, dataset)
            for temperature in g["temperatures"]:
                for top_p in g["top_p"]:
                    for seed in g["seeds"]:
                        common = {"target": target, "dataset": dataset, "eval": list(evals),
                                  "max_new_tokens": int(cfg["data"]["max_new_tokens"]),
                                  "max_prompt_tokens": int(cfg["data"]["max_prompt_tokens"]),
                                  "temperature": float(temperature), "top_p": float(top_p), "seed": int(seed),
                                  "device": run["device"], "dtype": run["dtype"]}
                        for method in cfg["baselines"]["methods"]:
                            add(_baseline_params(cfg, common, method, draft))
                        for drafters in g["drafters"]:
                            for builder in (["ngram"] if drafters == "ngram" else g["builders"]):
                                for max_depth in g["max_depths"]:
                                    for budget in g["budgets"]:
                                        add(_treespec_params(cfg, common, draft, drafters, builder, budget, max_depth))
    return points


def _baseline_params(cfg: dict[str, Any], common: dict[str, Any], method: str, draft: str) -> dict[str, Any]:
    b = cfg["baselines"]
    params = {"kind": "baseline", "method": method, **common}
    if method == "assisted":
        params.update(draft=draft, assisted=dict(sorted(b["assisted"].items())))
    if method == "prompt_lookup":
        params.update(prompt_lookup_num_tokens=int(b["prompt_lookup_num_tokens"]),
                      max_matching_ngram_size=int(b["max_matching_ngram_size"]))
    return params


def _treespec_params(cfg: dict[str, Any], common: dict[str, Any], draft: str, drafters: str, builder: str,
                     budget: int, max_depth: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"kind": "treespec", **common, "drafters": drafters, "builder": builder,
                              "budget": int(budget), "max_depth": max_depth}
    if drafters in ("ngram", "both"):
        params["ngram"] = dict(cfg["ngram"])
    if drafters in ("model", "both"):
        params["draft"] = draft
        params["mode"] = draft_mode(cfg, builder, common["temperature"])
        s = cfg["shapes"]
        if builder == "kary":
            params["kary_width"] = int(s["kary_width"])
        elif builder == "chains":
            params["chains"] = int(s["chains"])
        elif builder == "dynamic":
            params.update(dynamic_depth=int(s["dynamic_depth"]), dynamic_topk=int(s["dynamic_topk"]))
        elif builder == "sequoia":
            params["acceptance"] = acceptance_params(cfg, common["target"], draft, common["dataset"], params["mode"],
                                                     common["temperature"], common["top_p"])
            params["acceptance_use"] = cfg["acceptance"]["use"]
    return params


# ---------------------------------------------------------------------------------------------
# Shapes


def static_shape(builder: str, budget: int, max_depth: int | None, params: dict[str, Any],
                 acceptance: Any = None) -> TreeShape:
    """The tree shape of a static builder at ``budget`` (``tree_builders.for_budget``, with the point's options)."""
    return tree_builders.for_budget(builder, budget, acceptance, max_depth,
                                    kary_width=int(params.get("kary_width", 2)), chains=params.get("chains"))


def _shape_record(shape: TreeShape) -> dict[str, Any]:
    return {"paths": [list(p) for p in shape.paths], "size": shape.size, "depth": shape.depth,
            "widths": list(shape.widths)}


# ---------------------------------------------------------------------------------------------
# Running


def _add_hist(a: list[int], b: list[int]) -> list[int]:
    """Elementwise sum of two histograms of different lengths."""
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(max(len(a), len(b)))]


def _digest(tokens: Sequence[int]) -> str:
    return hashlib.sha1(json.dumps([int(t) for t in tokens]).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' per-call generation warnings (restored afterwards)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


class _Models:
    """Models of the current pair, loaded once and kept while the pair's points run."""

    def __init__(self, device: str, dtype: str) -> None:
        self.device, self.dtype = device, dtype
        self.loaded: dict[str, tuple[torch.nn.Module, Any]] = {}

    def get(self, spec: str) -> tuple[torch.nn.Module, Any]:
        if spec not in self.loaded:
            self.loaded[spec] = load_model(spec, self.device, self.dtype)
        return self.loaded[spec]

    def keep_only(self, specs: set[str]) -> None:
        for spec in list(self.loaded):
            if spec not in specs:
                del self.loaded[spec]


class Sweep:
    """State of one sweep run: the config, the output files, loaded models and cached acceptances."""

    def __init__(self, cfg: dict[str, Any], out_dir: Path, progress: bool, measure: Measure | None) -> None:
        self.cfg = cfg
        self.out = out_dir
        self.results = out_dir / RESULTS
        self.progress = progress
        self._measure = measure
        self.models = _Models(cfg["run"]["device"], cfg["run"]["dtype"])
        self.records: dict[str, dict[str, Any]] = {}
        self.prompts: dict[tuple[str, str, str], list[list[int]]] = {}
        self.checked_pairs: set[tuple[str, str]] = set()

    def draft_model(self, target: str, draft: str) -> torch.nn.Module:
        """The draft, after checking once that it shares the target's tokenizer (real models)."""
        model, tokenizer = self.models.get(draft)
        if (target, draft) not in self.checked_pairs:
            target_tok = self.models.get(target)[1]
            if not isinstance(tokenizer, ByteTokenizer) and not isinstance(target_tok, ByteTokenizer):
                _models.check_tokenizers(target_tok, tokenizer)
            self.checked_pairs.add((target, draft))
        return model

    # -- inputs ---------------------------------------------------------------------------------
    def token_prompts(self, spec: str, dataset: str, which: str) -> list[list[int]]:
        """Tokenised calibration (``which="calib"``) or evaluation prompts for ``spec``'s tokenizer."""
        key = (spec, dataset, which)
        if key not in self.prompts:
            _, tokenizer = self.models.get(spec)
            calib, evals = calib_eval_prompts(self.cfg, dataset)
            max_tokens = int(self.cfg["data"]["max_prompt_tokens"])
            self.prompts[key] = [encode(tokenizer, t, max_tokens) for t in (calib if which == "calib" else evals)]
        return self.prompts[key]

    def acceptance(self, params: dict[str, Any]) -> tuple[Any, str]:
        """The acceptance measured for ``params`` (see :func:`acceptance_params`), from its JSON cache."""
        from .acceptance import Acceptance

        path = self.out / f"acceptance-{point_key(params)}.json"
        if not path.exists():
            measure = self._measure
            if measure is None:
                from .acceptance import measure
            target, _ = self.models.get(params["target"])
            draft = self.draft_model(params["target"], params["draft"])
            calib = self.token_prompts(params["target"], params["dataset"], "calib")
            acc = measure(target, draft, calib, width=params["width"], mode=params["mode"],
                          temperature=params["temperature"], top_p=params["top_p"],
                          max_new_tokens=params["max_new_tokens"], max_depth=params["max_depth"],
                          progress=self.progress, prompts_label=f"{params['dataset']}[{params['calib'][0]}:"
                                                                 f"{params['calib'][1]}]")
            tmp = path.with_suffix(".tmp")
            acc.save(tmp)
            os.replace(tmp, path)
        return Acceptance.load(path), path.name

    # -- one point ------------------------------------------------------------------------------
    def run_point(self, point: Point) -> dict[str, Any]:
        p = point.params
        target, tokenizer = self.models.get(p["target"])
        prompts = self.token_prompts(p["target"], p["dataset"], "eval")
        if p["kind"] == "baseline":
            draft = self.draft_model(p["target"], p["draft"]) if p["method"] == "assisted" else None
            return self._run_baseline(p, target, draft, prompts, _pad_id(tokenizer))
        return self._run_treespec(p, target, prompts)

    def _drafters(self, p: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """The drafters of a treespec point, and what the record says about its tree."""
        info: dict[str, Any] = {}
        drafters: list[Any] = []
        budget, max_depth = p["budget"], p["max_depth"]
        if p["drafters"] in ("model", "both"):
            draft = self.draft_model(p["target"], p["draft"])
            if p["builder"] == "dynamic":
                depth = min(p["dynamic_depth"], budget - 1, max_depth or budget)
                drafters.append(ModelDrafter(draft, mode="dynamic", depth=depth, topk=p["dynamic_topk"],
                                             nodes=budget - 1))
            else:
                acc = None
                if p["builder"] == "sequoia" or p["drafters"] == "model":  # sequoia needs it; else a prediction
                    acc_params = p.get("acceptance") or acceptance_params(
                        self.cfg, p["target"], p["draft"], p["dataset"], p["mode"], p["temperature"], p["top_p"])
                    acceptance, name = self.acceptance(acc_params)
                    use = p.get("acceptance_use", self.cfg["acceptance"]["use"])
                    acc = acceptance.matrix if use == "matrix" else acceptance.vector
                    info["acceptance"] = {"file": name, "mode": p["mode"], "use": use,
                                          "vector": [float(x) for x in acceptance.vector],
                                          "beta": float(acceptance.beta)}
                shape = static_shape(p["builder"], budget, max_depth, p, acc if p["builder"] == "sequoia" else None)
                info["tree"] = _shape_record(shape)
                if acc is not None and p["drafters"] == "model":
                    info["predicted_tau"] = shape.expected_tokens(acc)
                drafters.append(ModelDrafter(draft, shape, mode=p["mode"]))
        info["cap"] = budget
        if p["drafters"] in ("ngram", "both"):
            n = p["ngram"]
            depth = min(int(n["max_tokens"]), budget - 1, max_depth or budget)
            drafters.append(NGramDrafter(max_order=int(n["max_order"]), max_tokens=depth, width=int(n["width"]),
                                         window=int(n["window"]), mode=n["mode"], max_nodes=budget - 1))
            if p["drafters"] == "both":
                info["cap"] = budget + depth
        return drafters, info

    def _run_treespec(self, p: dict[str, Any], target: torch.nn.Module, prompts: list[list[int]]) -> dict[str, Any]:
        drafters, info = self._drafters(p)
        device = next(target.parameters()).device
        n = p["max_new_tokens"]

        def call(ids: list[int], tokens: int, seed: int):
            return generate(target, ids, drafters, max_new_tokens=tokens, temperature=p["temperature"],
                            top_p=p["top_p"], eos_token_id=None, seed=seed, budget=info["cap"])

        outs, walls = self._timed(call, prompts, n, p["seed"], device)
        counts, digests, tree_sizes = [], [], []
        hist: list[int] = []
        parts = dict(prefill_seconds=0.0, drafting_seconds=0.0, verifying_seconds=0.0, overhead_seconds=0.0)
        steps = 0
        per_drafter: list[dict[str, Any]] = []
        for out in outs:
            s = out.stats
            counts.append(len(out.new_tokens))
            digests.append(_digest(out.new_tokens))
            steps += s.steps
            tree_sizes += s.tree_sizes
            hist = _add_hist(hist, s.accepted_hist)
            for k in parts:
                parts[k] += getattr(s, k)
            if not per_drafter:
                per_drafter = [{"name": d.name, "proposed": 0, "accepted": 0} for d in s.drafters]
            for acc, d in zip(per_drafter, s.drafters):
                acc["proposed"] += d.proposed
                acc["accepted"] += d.accepted
        total = sum(counts)
        wall = sum(walls)
        result = {"prompts": len(prompts), "prompt_tokens": [len(x) for x in prompts], "tokens_per_prompt": counts,
                  "new_tokens": total, "complete": all(c == n for c in counts), "steps": steps,
                  "tau": total / steps if steps else 0.0, "accepted_hist": hist,
                  "mean_tree_size": float(np.mean(tree_sizes)) if tree_sizes else 0.0, "drafters": per_drafter,
                  "output_digests": digests, **info}
        timing = {"wall_seconds": wall, "per_prompt_seconds": walls,
                  "tokens_per_second": total / wall if wall else 0.0, **parts}
        return {"result": result, "timing": timing}

    def _timed(self, call: Callable[[list[int], int, int], Any], prompts: list[list[int]], n: int, seed: int,
               device: torch.device) -> tuple[list[Any], list[float]]:
        """One warm-up call, then ``call(ids, n, seed_i)`` per prompt, each timed with GPU synchronisation."""
        warm = int(self.cfg["run"]["warmup_tokens"])
        if warm > 0:
            call(prompts[0][-32:], min(warm, n), spread_seed("sweep", seed, -1))
        outs, walls = [], []
        for i, ids in enumerate(prompts):
            sync(device)
            t0 = time.perf_counter()
            outs.append(call(ids, n, spread_seed("sweep", seed, i)))
            sync(device)
            walls.append(time.perf_counter() - t0)
        return outs, walls

    def _run_baseline(self, p: dict[str, Any], target: torch.nn.Module, draft: torch.nn.Module | None,
                      prompts: list[list[int]], pad_id: int) -> dict[str, Any]:
        device = next(target.parameters()).device
        n = p["max_new_tokens"]

        def call(ids: list[int], tokens: int, seed: int) -> list[int]:
            lookup = p["method"] == "prompt_lookup"
            with _quiet_transformers():
                new, _ = hf_generate(target, ids, tokens, temperature=p["temperature"], top_p=p["top_p"],
                                     pad_token_id=pad_id, seed=seed, assistant_model=draft,
                                     assistant_config=p.get("assisted"),
                                     prompt_lookup_num_tokens=p["prompt_lookup_num_tokens"] if lookup else None,
                                     max_matching_ngram_size=p["max_matching_ngram_size"] if lookup else None)
            return new

        outs, walls = self._timed(call, prompts, n, p["seed"], device)
        counts = [len(new) for new in outs]
        digests = [_digest(new) for new in outs]
        total, wall = sum(counts), sum(walls)
        result = {"prompts": len(prompts), "prompt_tokens": [len(x) for x in prompts], "tokens_per_prompt": counts,
                  "new_tokens": total, "complete": all(c == n for c in counts), "output_digests": digests}
        timing = {"wall_seconds": wall, "per_prompt_seconds": walls, "tokens_per_second": total / wall if wall else 0.0}
        return {"result": result, "timing": timing}

    # -- comparisons ----------------------------------------------------------------------------
    def baselines_for(self, p: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """Finished baseline records measured on the same prompts and settings as treespec point ``p``."""
        common = {k: p[k] for k in ("target", "dataset", "eval", "max_new_tokens", "max_prompt_tokens",
                                    "temperature", "top_p", "seed", "device", "dtype")}
        out: dict[str, dict[str, Any]] = {}
        for method in self.cfg["baselines"]["methods"]:
            draft = p.get("draft") or pairs_draft(self.cfg, p["target"])
            rec = self.records.get(point_key(_baseline_params(self.cfg, common, method, draft)))
            if rec is not None and rec.get("status") == "ok":
                out[method] = rec
        return out

    def compare(self, p: dict[str, Any], record: dict[str, Any]) -> None:
        """Fill ``record["speedup"]`` and ``record["checks"]`` against the point's baselines."""
        speedup: dict[str, float | None] = {}
        refused: dict[str, str] = {}
        checks: dict[str, Any] = {}
        mine = record["result"]
        for method, base in self.baselines_for(p).items():
            theirs = base["result"]
            same_counts = mine["tokens_per_prompt"] == theirs["tokens_per_prompt"]
            if not (mine["complete"] and theirs["complete"] and same_counts):
                speedup[method] = None
                refused[method] = (f"token counts differ: treespec {mine['tokens_per_prompt']} vs {method} "
                                   f"{theirs['tokens_per_prompt']} (expected {p['max_new_tokens']} each)")
                continue
            speedup[method] = base["timing"]["wall_seconds"] / record["timing"]["wall_seconds"]
            if method == "target" and p["temperature"] == 0:
                same = sum(a == b for a, b in zip(mine["output_digests"], theirs["output_digests"]))
                checks["greedy_same_as_target"] = f"{same}/{len(mine['output_digests'])}"
        record["speedup"] = speedup
        if refused:
            record["speedup_refused"] = refused
        record["checks"] = checks


def pairs_draft(cfg: dict[str, Any], target: str) -> str:
    """The draft paired with ``target`` in the config (for the assisted baseline of n-gram points)."""
    for t, d in pairs(cfg):
        if t == target:
            return d
    raise KeyError(target)


# ---------------------------------------------------------------------------------------------
# Results file


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a results file (a torn last line from a crash is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n") and line.strip():
                out.append(json.loads(line))
    return out


def _repair_tail(path: Path) -> None:
    """Cut a torn last line (a crash while writing) so the next record starts on its own line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and make it durable (flush + fsync)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _meta(cfg: dict[str, Any]) -> dict[str, Any]:
    device = cfg["run"]["device"]
    name = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else platform.processor() or "cpu"
    return {"config": cfg["name"], "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "host": platform.node(), "device_name": name, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}  # others' load skews timings


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its timing- and machine-dependent fields (for comparing two runs)."""
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}


# ---------------------------------------------------------------------------------------------
# Sweep


def sweep(config: str | os.PathLike | dict[str, Any], out_dir: str | os.PathLike | None = None,
          progress: bool = True, *, device: str | None = None, dtype: str | None = None,
          on_point: Callable[[dict[str, Any]], None] | None = None, measure: Measure | None = None,
          make_report: bool = True) -> Path:
    """Run (or resume) the sweep of ``config``; returns the path of its ``results.jsonl``.

    Args:
        config: a TOML path or a config dict (see ``experiments/configs/`` and the module doc).
        out_dir: where results, acceptance caches, plots and README.md go (default
            ``experiments/results/<name>``).
        progress: show a tqdm bar (points done, time left).
        device, dtype: override ``run.device`` / ``run.dtype``.
        on_point: called with each record right after it is written (tests, live monitoring).
        measure: the acceptance measurement (default ``treespec.acceptance.measure``).
        make_report: write plots and README.md when the sweep completes.
    """
    cfg = load_config(config)
    if device is not None:
        cfg["run"]["device"] = device
    if dtype is not None:
        _check(dtype in DTYPES, f"dtype must be one of {tuple(DTYPES)}")
        cfg["run"]["dtype"] = dtype
    out = Path(out_dir) if out_dir is not None else Path("experiments") / "results" / cfg["name"]
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    if int(cfg["run"]["threads"]) > 0:  # tiny models on a busy CPU run far faster on one thread
        torch.set_num_threads(int(cfg["run"]["threads"]))
    try:
        results = _run_sweep(cfg, out, progress, on_point, measure)
    finally:
        torch.set_num_threads(threads)
    if make_report:
        report(results)
    return results


def _run_sweep(cfg: dict[str, Any], out: Path, progress: bool, on_point: Callable[[dict[str, Any]], None] | None,
               measure: Measure | None) -> Path:
    """The loop of :func:`sweep`: every unfinished point, one record each."""
    state = Sweep(cfg, out, progress, measure)
    _repair_tail(state.results)
    for rec in read_records(state.results):
        if rec.get("status") == "ok":
            state.records[rec["key"]] = rec
    points = enumerate_points(cfg)
    todo = [pt for pt in points if pt.key not in state.records]
    from tqdm.auto import tqdm

    bar = tqdm(total=len(points), initial=len(points) - len(todo), unit="point", desc=cfg["name"],
               disable=not progress, dynamic_ncols=True)
    try:
        for pt in todo:
            bar.set_postfix_str(pt.label)
            specs = {pt.params["target"], pt.params.get("draft") or pairs_draft(cfg, pt.params["target"])}
            state.models.keep_only(specs)
            record: dict[str, Any] = {"key": pt.key, "kind": pt.kind, "params": pt.params}
            try:
                record.update(state.run_point(pt), status="ok")
                if pt.kind == "treespec":
                    state.compare(pt.params, record)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as error:  # a failing point is recorded and retried next time
                record.update(status="error", error=f"{type(error).__name__}: {error}",
                              traceback=traceback.format_exc(limit=6))
                bar.write(f"[treespec sweep] point {pt.label} failed: {record['error']}", file=sys.stderr)
            record["meta"] = _meta(cfg)
            append_record(state.results, record)
            if record["status"] == "ok":
                state.records[pt.key] = record
            bar.update(1)
            if on_point is not None:
                on_point(record)
    finally:
        bar.close()
    return state.results


# ---------------------------------------------------------------------------------------------
# Report


def _figure(ncols: int, nrows: int = 1, width: float = 5.0, height: float = 3.8, legend_space: float = 0.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols + legend_space, height * nrows))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(nrows * ncols)]
    return fig, axes


def _panel(p: dict[str, Any]) -> tuple:
    return (p["target"], p["dataset"], p["temperature"], p["top_p"])


def _panel_title(panel: tuple, multi_target: bool) -> str:
    target, dataset, t, top_p = panel
    head = f"{target.split('/')[-1]}\n" if multi_target else ""
    return f"{head}{dataset}, T={t:g}" + (f", top-p={top_p:g}" if top_p < 1 else "")


def _line(p: dict[str, Any], multi_depth: bool) -> str:
    name = "ngram" if p["drafters"] == "ngram" else (p["builder"] if p["drafters"] == "model"
                                                     else f"both/{p['builder']}")
    if multi_depth:
        name += f" d<={p['max_depth'] if p['max_depth'] is not None else 'none'}"
    return name


_BUILDER_COLOR = {"sequoia": "C0", "kary": "C1", "chains": "C2", "chain": "C3", "dynamic": "C4", "ngram": "C5"}


def _style(line: str) -> dict[str, Any]:
    """Colour by builder, line style by drafter set (solid: model, dashed: both, dotted: n-gram)."""
    name = line.split(" ")[0]
    builder = name.split("/")[-1]
    dash = "--" if name.startswith("both/") else ":" if builder == "ngram" else "-"
    marker = "o" if " d<=" not in line or line.endswith("none") else "s"  # square: a depth limit
    return {"color": _BUILDER_COLOR.get(builder, "k"), "linestyle": dash, "marker": marker, "label": line}


def _baseline_speedup(r: dict[str, Any], bases: list[dict[str, Any]]) -> float | None:
    """Speedup of baseline record ``r`` over the target-alone record of the same prompts and settings."""
    if not r["result"]["complete"]:
        return None
    p = {k: v for k, v in r["params"].items()
         if k not in ("draft", "assisted", "prompt_lookup_num_tokens", "max_matching_ngram_size")}
    key = point_key(dict(p, method="target"))
    ref = next((b for b in bases if b["key"] == key and b["result"]["complete"]), None)
    if ref is None or ref["result"]["tokens_per_prompt"] != r["result"]["tokens_per_prompt"]:
        return None
    return ref["timing"]["wall_seconds"] / r["timing"]["wall_seconds"]


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def report(results_jsonl: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """Write plots (PNG) and a Markdown summary (``README.md``) beside ``results_jsonl``; returns README.md.

    Plots: tau vs budget and speedup over the target baseline vs budget (one panel per target,
    dataset, temperature and top-p; one line per builder; seeds averaged), predicted vs measured
    tau, the acceptance vectors, and every static tree used (``trees/``).
    """
    path = Path(results_jsonl)
    out = Path(out_dir) if out_dir is not None else path.parent
    out.mkdir(parents=True, exist_ok=True)
    everything = read_records(path)
    records = [r for r in everything if r.get("status") == "ok"]
    finished = {r["key"] for r in records}
    errors = [r for r in everything if r.get("status") == "error" and r["key"] not in finished]
    tres = [r for r in records if r["kind"] == "treespec"]
    bases = [r for r in records if r["kind"] == "baseline"]
    multi_target = len({r["params"]["target"] for r in records}) > 1
    multi_depth = len({r["params"]["max_depth"] for r in tres}) > 1
    panels = sorted({_panel(r["params"]) for r in tres}, key=str)
    images: list[tuple[str, str]] = []

    def curves(value: Callable[[dict[str, Any]], float | None]) -> dict[tuple, dict[str, list[tuple[int, float]]]]:
        acc: dict[tuple, dict[str, dict[int, list[float]]]] = {}
        for r in tres:
            v = value(r)
            if v is None:
                continue
            acc.setdefault(_panel(r["params"]), {}).setdefault(_line(r["params"], multi_depth), {}).setdefault(
                r["params"]["budget"], []).append(v)
        return {pn: {ln: sorted((b, float(np.mean(vs))) for b, vs in pts.items()) for ln, pts in lines.items()}
                for pn, lines in acc.items()}

    def budget_plot(name: str, ylabel: str, data: dict, hlines: Callable[[tuple], dict[str, float]] | None) -> None:
        if not panels:
            return
        fig, axes = _figure(len(panels), legend_space=1.8)
        handles: dict[str, Any] = {}
        for ax, pn in zip(axes, panels):
            for ln, pts in sorted(data.get(pn, {}).items()):
                (h,) = ax.plot([b for b, _ in pts], [v for _, v in pts], markersize=4, **_style(ln))
                handles.setdefault(ln, h)
            if hlines is not None:
                for i, (label, y) in enumerate(sorted(hlines(pn).items())):
                    handles.setdefault(label, ax.axhline(y, color=("0.1", "0.45", "0.7")[i % 3], linestyle=(0, (4, 2)),
                                                         linewidth=1.2))
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget B (tokens per verification, root included)")
            ax.set_ylabel(ylabel)
            ax.set_title(_panel_title(pn, multi_target), fontsize=9)
            ax.grid(alpha=0.3)
        fig.legend(list(handles.values()), list(handles), loc="center right", fontsize=8)
        fig.tight_layout(rect=(0, 0, 1 - 1.8 / fig.get_figwidth(), 1))
        fig.savefig(out / name, dpi=100)
        images.append((ylabel, name))

    budget_plot("tau_vs_budget.png", "tau (tokens per step)", curves(lambda r: r["result"]["tau"]), None)

    def base_speedups(pn: tuple) -> dict[str, float]:
        lines: dict[str, list[float]] = {}
        for r in bases:
            if _panel(r["params"]) == pn and r["params"]["method"] != "target":
                v = _baseline_speedup(r, bases)
                if v is not None:
                    lines.setdefault(f"HF {r['params']['method']}", []).append(v)
        out_lines = {k: float(np.mean(v)) for k, v in lines.items()}
        out_lines["target alone"] = 1.0
        return out_lines

    budget_plot("speedup_vs_budget.png", "speedup over the target alone",
                curves(lambda r: r.get("speedup", {}).get("target")), base_speedups)

    predicted = [r for r in tres if r["result"].get("predicted_tau") is not None]
    if predicted:
        fig, (ax,) = _figure(1, width=5.5, height=5.0)
        builders = sorted({r["params"]["builder"] for r in predicted})
        for i, b in enumerate(builders):
            rs = [r for r in predicted if r["params"]["builder"] == b]
            ax.scatter([r["result"]["predicted_tau"] for r in rs], [r["result"]["tau"] for r in rs], label=b,
                       color=f"C{i}", s=22)
        hi = max(max(r["result"]["predicted_tau"], r["result"]["tau"]) for r in predicted) * 1.05
        ax.plot([1, hi], [1, hi], color="0.5", linestyle="--", linewidth=1, label="measured = predicted")
        ax.set_xlabel("predicted tau (acceptance vector, calibration prompts)")
        ax.set_ylabel("measured tau (evaluation prompts)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "predicted_vs_measured_tau.png", dpi=100)
        images.append(("predicted vs measured tau", "predicted_vs_measured_tau.png"))

    accs: dict[str, dict[str, Any]] = {}
    for r in tres:
        a = r["result"].get("acceptance")
        if a is not None and a["file"] not in accs:
            accs[a["file"]] = {**a, "dataset": r["params"]["dataset"], "temperature": r["params"]["temperature"],
                               "top_p": r["params"]["top_p"], "target": r["params"]["target"]}
    if accs:
        fig, (ax,) = _figure(1, width=7.0, height=4.0)
        n = len(accs)
        for i, a in enumerate(sorted(accs.values(), key=lambda a: (a["dataset"], a["temperature"], a["mode"]))):
            xs = np.arange(len(a["vector"])) + (i - (n - 1) / 2) * 0.8 / n
            ax.bar(xs, a["vector"], width=0.8 / n,
                   label=f"{a['dataset']} T={a['temperature']:g} {a['mode']} (beta {a['beta']:.2f})")
        ax.set_xlabel("child rank k")
        ax.set_ylabel("a_k = P(rank k is the accepted child)")
        ax.set_title("positional acceptance vectors (calibration prompts)", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "acceptance.png", dpi=100)
        images.append(("acceptance vectors", "acceptance.png"))

    trees: list[tuple[str, str]] = []
    for r in tres:
        tree = r["result"].get("tree")
        if tree is None:
            continue
        p = r["params"]
        depth = "none" if p["max_depth"] is None else p["max_depth"]
        a = r["result"].get("acceptance")
        tag = f"-{a['file'][len('acceptance-'):-len('.json')]}" if (a and p["builder"] == "sequoia") else ""
        name = f"trees/{p['builder']}-B{p['budget']}-d{depth}{tag}.png"
        if any(name == seen for _, seen in trees):
            continue
        (out / "trees").mkdir(exist_ok=True)
        shape = TreeShape(tuple(x) for x in tree["paths"])
        title = f"{p['builder']} B={p['budget']} depth<={depth}" + (
            f" ({p['dataset']}, T={p['temperature']:g})" if tag else "")
        shape.draw(str(out / name), acceptance=a["vector"] if a else None, title=title)
        trees.append((title, name))

    readme = out / "README.md"
    readme.write_text(_markdown(path, records, tres, bases, errors, images, trees, multi_depth), encoding="utf-8")
    return readme


def _load_note(records: list[dict[str, Any]]) -> str:
    """The range of 1-minute load averages seen when points finished (timings are only as good as that)."""
    metas = [r["meta"] for r in records if (r.get("meta") or {}).get("loadavg")]
    if not metas:
        return ""
    loads = [m["loadavg"][0] for m in metas]
    return (f" 1-minute load average when points finished: {min(loads):.1f} to {max(loads):.1f} on "
            f"{metas[0].get('cpus', '?')} cores, the sweep's own {metas[0].get('threads', '?')} threads included "
            "(CPU timings are only trustworthy when nothing else runs).")


def _markdown(path: Path, records: list, tres: list, bases: list, errors: list, images: list, trees: list,
              multi_depth: bool) -> str:
    configs = sorted({r.get("meta", {}).get("config", "?") for r in records})
    devices = sorted({f"{r['params']['device']} ({r.get('meta', {}).get('device_name', '?')}), {r['params']['dtype']}"
                      for r in records})
    lines = [f"# treespec sweep: {', '.join(configs) or path.parent.name}", "",
             f"Results: `{path.name}` ({len(records)} finished points"
             + (f", {len(errors)} errors" if errors else "") + f"). Device: {'; '.join(devices) or '-'}."
             + _load_note(records), "",
             "tau = tokens committed per target forward (bonus token included); speedup = baseline wall time / "
             "treespec wall time on the same prompts, same token counts (every method generates exactly "
             "max_new_tokens per prompt), same temperature, top-p and seed.", ""]
    for title, name in images:
        lines += [f"![{title}]({name})", ""]
    if bases:
        lines += ["## Baselines (HuggingFace generate)", "",
                  "| target | dataset | T | top-p | seed | method | prompts | tokens | tok/s | wall s | vs target |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(bases, key=lambda r: (str(_panel(r["params"])), r["params"]["seed"], r["params"]["method"])):
            p, res, t = r["params"], r["result"], r["timing"]
            lines.append(f"| {p['target']} | {p['dataset']} | {p['temperature']:g} | {p['top_p']:g} | {p['seed']} | "
                         f"{p['method']} | {res['prompts']} | {res['new_tokens']}"
                         f"{'' if res['complete'] else ' (short!)'} | {t['tokens_per_second']:.2f} | "
                         f"{t['wall_seconds']:.3g} | {_fmt(_baseline_speedup(r, bases))} |")
        lines.append("")
    if tres:
        lines += ["## Treespec points", "",
                  "| dataset | T | top-p | seed | drafters | builder | B | depth | tree size | tau | predicted tau | "
                  "tok/s | vs target | vs assisted | vs prompt lookup | drafting s | verifying s | overhead s | "
                  "greedy = target |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        def order(r: dict[str, Any]) -> tuple:
            p = r["params"]
            return (str(_panel(p)), p["seed"], p["drafters"], p["builder"], str(p["max_depth"]), p["budget"])

        for r in sorted(tres, key=order):
            p, res, t, s = r["params"], r["result"], r["timing"], r.get("speedup", {})
            lines.append(
                f"| {p['dataset']} | {p['temperature']:g} | {p['top_p']:g} | {p['seed']} | {p['drafters']} | "
                f"{p['builder']} | {p['budget']} | {_fmt(p['max_depth'])} | {res['mean_tree_size']:.1f} | "
                f"{res['tau']:.2f} | {_fmt(res.get('predicted_tau'))} | {t['tokens_per_second']:.2f} | "
                f"{_fmt(s.get('target'))} | {_fmt(s.get('assisted'))} | {_fmt(s.get('prompt_lookup'))} | "
                f"{t['drafting_seconds']:.3g} | {t['verifying_seconds']:.3g} | {t['overhead_seconds']:.3g} | "
                f"{r.get('checks', {}).get('greedy_same_as_target', '-')} |")
        lines.append("")
        refused = [r for r in tres if r.get("speedup_refused")]
        if refused:
            lines += ["Speedups refused (token counts differ):", ""]
            lines += [f"- {r['key']}: {r['speedup_refused']}" for r in refused]
            lines.append("")
    if trees:
        lines += ["## Trees", ""] + [f"- [{title}]({name})" for title, name in trees] + [""]
    if errors:
        lines += ["## Errors (retried on the next run)", ""]
        lines += [f"- `{r['key']}` {r['params'].get('builder', r['params'].get('method'))}: {r['error']}"
                  for r in errors]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``treespec sweep --config experiments/configs/NAME.toml [--out DIR] [--device D] [--dtype T]``
    or ``treespec sweep --report results.jsonl``."""
    ap = argparse.ArgumentParser(
        prog="treespec sweep",
        description="Run (or resume) a tree-budget sweep from a TOML config, with HF baselines measured in the same "
                    "run, and write results.jsonl, plots and README.md. Re-running skips finished points.")
    ap.add_argument("--config", type=Path, help="TOML config, e.g. experiments/configs/cpu-qwen-coder.toml")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default experiments/results/<name>)")
    ap.add_argument("--device", default=None,
                    help="torch device for both models, e.g. cpu or cuda (overrides run.device)")
    ap.add_argument("--dtype", choices=tuple(DTYPES), default=None, help="model dtype (overrides run.dtype)")
    ap.add_argument("--report", type=Path, default=None, metavar="RESULTS_JSONL",
                    help="only write plots and README.md for an existing results.jsonl")
    ap.add_argument("--dry-run", action="store_true", help="list the points (and which are finished) and exit")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.report is not None:
        print(report(args.report))
        return 0
    if args.config is None:
        ap.error("give --config CONFIG.toml (or --report RESULTS_JSONL)")
    if args.dry_run:
        cfg = load_config(args.config)
        if args.device:
            cfg["run"]["device"] = args.device
        if args.dtype:
            cfg["run"]["dtype"] = args.dtype
        out = args.out or Path("experiments") / "results" / cfg["name"]
        done = {r["key"] for r in read_records(out / RESULTS) if r.get("status") == "ok"}
        points = enumerate_points(cfg)
        for pt in points:
            print(f"{'done' if pt.key in done else 'todo'}  {pt.key}  {pt.label}")
        kinds = {k: sum(pt.kind == k for pt in points) for k in ("baseline", "treespec")}
        print(f"{len(points)} points ({kinds['baseline']} baselines, {kinds['treespec']} treespec), "
              f"{sum(pt.key in done for pt in points)} finished")
        return 0
    results = sweep(args.config, args.out, progress=not args.no_progress, device=args.device, dtype=args.dtype)
    print(results)
    print(results.parent / "README.md")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
