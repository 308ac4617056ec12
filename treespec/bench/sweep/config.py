"""Sweep configs: TOML (or a dict) with defaults filled in and every value validated; prompt splits."""

from __future__ import annotations

import copy
import math
import numbers
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import tree_builders
from tree_builders.sequoia import MAX_BUDGET

from ...core.verifiers import VERIFIERS
from ...drafters.model import STATIC_MODES
from ...recipes import NGramSettings, Recipe
from ...models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET
from ...common.options import PRECISIONS, TARGET_PRECISIONS
from ..baselines import ASSISTED_SETTINGS
from ..datasets import DATASETS, dataset_prompts, dataset_size, prompt_range

BUILDERS = ("sequoia", "kary", "chains", "chain", "dynamic", "paths")
DRAFTER_SETS = ("model", "ngram", "both")
#: HF generate: eager ("target"), with a static cache + torch.compile ("target_compiled": inductor's weight freezing,
#: and CUDA graphs on CUDA: HF's fastest plain decoding; compiled with the backend ``run.compile`` names,
#: inductor otherwise), assisted by the pair's draft, prompt lookup
BASELINES = ("target", "target_compiled", "assisted", "prompt_lookup")
#: run.envelope: the captured steps' envelopes (``treespec.core.buffers``): one padded envelope for every tree of
#: the sweep ("padded": one set of graphs), each tree's own ("exact": no padding, a compile per tree), or "auto":
#: padded on CUDA (width is nearly free there), exact on a CPU (padding would cost every step)
ENVELOPES = ("auto", "padded", "exact")
#: ``grid.model_mode``: "auto" (the recipe's rule) or a static drafting mode
MODEL_MODES = ("auto", *STATIC_MODES)

#: the least a sweep needs for a figure worth citing: evaluation prompts per point, tokens per prompt,
#: prompt sets (the report flags a sweep below it)
CITABLE = {"prompts": 20, "tokens": 96, "datasets": 2}

#: the recipe's own defaults (``treespec.recipes.Recipe``, ``NGramSettings``): one home for them
_RECIPE, _NGRAM = Recipe(), NGramSettings()

DEFAULTS: dict[str, Any] = {
    "name": "sweep",
    "models": {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT, "pairs": []},
    "grid": {"drafters": ["model"], "builders": ["sequoia"], "budgets": [8], "max_depths": ["none"],
             "temperatures": [0.0], "top_p": [1.0], "seeds": [0], "model_mode": "auto",
             "verifiers": [_RECIPE.verifier], "batch_sizes": [1]},
    # citable by default: >= 20 evaluation prompts x >= 96 tokens on a code and a prose set
    # (CITABLE), calibration prompts disjoint from evaluation prompts
    "data": {"datasets": ["humaneval", "lee-news"], "calib": "0:100", "eval": "100:132", "max_new_tokens": 96,
             "max_prompt_tokens": 0},
    # the calibration continues each prompt as far as the evaluation does ("eval": data.max_new_tokens) and
    # the DP uses acceptance given the depth reached ("matrix"): measured on the CPU sweep's prose panel,
    # 48-token calibrations underrated 96-token runs by up to 47% (experiments/results/acceptance-fit)
    "acceptance": {"width": 8, "max_new_tokens": "eval", "max_depth": 8, "use": "matrix"},
    # the sweep's own choices: 4 independent chains at every budget (the recipe's default is 2 up to budget
    # 16), and 6 n-gram tokens (the recipe's 4); the rest are the recipe's defaults
    # shapes.paths: the static tree of builder "paths" (child-rank paths in priority order; [] when none is swept)
    "shapes": {"kary_width": _RECIPE.kary_width, "chains": 4, "dynamic_depth": _RECIPE.dynamic_depth,
               "dynamic_topk": _RECIPE.dynamic_topk, "paths": []},
    "ngram": {"mode": _NGRAM.mode, "max_order": _NGRAM.max_order, "max_tokens": 6, "width": _NGRAM.width,
              "window": _NGRAM.window},
    # baselines.assisted: HF assisted generation at its fastest ("fastest": each of ASSISTED_SETTINGS, compared
    # with the fastest of them), one setting (a table of GenerationConfig options) or several (an array of tables);
    # baselines.prompt_lookup_num_tokens: HF prompt lookup's tokens a step, each a point, compared with the fastest
    "baselines": {"methods": "auto", "prompt_lookup_num_tokens": [2, 4, 10],
                  "max_matching_ngram_size": 2,
                  "assisted": "fastest"},
    "run": {"device": "auto", "dtype": "float32", "draft_dtype": "same", "warmup_tokens": 4, "threads": 0,
            "compile": "auto", "envelope": "auto", "workers": 0},
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
    ``calib``/``eval`` for that dataset. Every value is type-checked without coercion
    (:func:`check_types`); a list key also takes a single value. What depends on the device (int8/int4 on a CPU
    only: :func:`check_cpu_precisions`; the device present: :func:`check_device_available`) is checked by the
    sweep and its dry run after the command line's ``--device`` / ``--dtype`` have replaced the config's.
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
            try:
                raw = tomllib.load(f)
            except tomllib.TOMLDecodeError as error:
                raise ValueError(f"{config} is not valid TOML: {error}") from None
            except UnicodeDecodeError as error:
                raise ValueError(f"{config} is not UTF-8 text, as TOML must be ({error.reason} at byte "
                                 f"{error.start}); save it as UTF-8") from None
        raw.setdefault("name", Path(config).stem)
    data = raw.get("data", {})
    check(isinstance(data, dict), f"config key 'data' must be a table, got {data!r}")
    # data.splits: where a loaded config keeps its [data.<set>] tables (a dict passed in again), no key of a file's
    check("splits" not in data or (isinstance(config, dict) and isinstance(data["splits"], dict)),
          "config key data.splits is not a config key: give a prompt set's own ranges as a table [data.<set>] "
          f"(a set of {', '.join(DATASETS)}) holding calib and/or eval")
    splits = dict(data.pop("splits", {}))
    splits.update({k: data.pop(k) for k in list(data) if isinstance(data[k], dict)})
    for name, table in splits.items():
        check(name in DATASETS and set(table) <= {"calib", "eval"},
               f"[data.{name}] must name a dataset ({', '.join(DATASETS)}) and hold only calib/eval")
    cfg = _merge(DEFAULTS, raw)
    cfg["data"]["splits"] = splits
    check_types(cfg)
    g = cfg["grid"]
    for key in ("drafters", "builders", "budgets", "max_depths", "temperatures", "top_p", "seeds", "verifiers",
                "batch_sizes"):
        g[key] = _as_list(g[key])
    cfg["data"]["datasets"] = _as_list(cfg["data"]["datasets"])
    cfg["baselines"]["methods"] = _as_list(cfg["baselines"]["methods"])
    cfg["baselines"]["prompt_lookup_num_tokens"] = _as_list(cfg["baselines"]["prompt_lookup_num_tokens"])
    if cfg["run"]["device"] == "auto":  # the CLI's default: CUDA where there is one
        from ...common.device import default_device

        cfg["run"]["device"] = default_device()
    g["max_depths"] = [None if isinstance(d, str) else d for d in g["max_depths"]]  # "none" (checked above)
    check("paths" not in g["builders"] or bool(static_trees(cfg)),
          "grid.builders has \"paths\": give its static tree as shapes.paths, child-rank paths in priority order, "
          "e.g. [shapes] paths = [[0], [1], [0, 0]]")
    for name in cfg["data"]["datasets"]:
        calib, evals = split_ranges(cfg, name)
        if not set(range(*calib)).isdisjoint(range(*evals)):
            raise ValueError(f"dataset {name}: calibration prompts {calib} overlap evaluation prompts {evals}")
    return cfg


def check_cpu_precisions(cfg: dict[str, Any]) -> None:
    """Refuse int8 and int4 (``run.dtype``, ``run.draft_dtype``) on a device other than the CPU: their kernels are
    the CPU's (``treespec.models.precision.CPU_ONLY``)."""
    from ...models.precision import CPU_ONLY

    device = str(cfg["run"]["device"])
    for key, value in (("run.dtype", cfg["run"]["dtype"]), ("run.draft_dtype", draft_dtype(cfg))):
        check(value not in CPU_ONLY or device == "cpu" or device.startswith("cpu:"),
              f"{key} = {value!r} runs on a CPU only (its kernels are the CPU's), and this sweep's device is "
              f"{device!r}: use bfloat16 there, or run.device = \"cpu\"")


def draft_dtype(cfg: dict[str, Any]) -> str:
    """The drafts' precision: ``run.draft_dtype``, or the target's ``run.dtype`` when it is ``"same"``."""
    d = cfg["run"]["draft_dtype"]
    return cfg["run"]["dtype"] if d == "same" else d


def check(ok: bool, message: str) -> None:
    """Raise ValueError(``message``) unless ``ok``."""
    if not ok:
        raise ValueError(message)


def pairs(cfg: dict[str, Any]) -> list[tuple[str, str]]:
    """The (target, draft) pairs of a config: ``models.pairs`` if given, else ``models.target/draft``."""
    given = cfg["models"]["pairs"]
    if given:
        return [(p["target"], p["draft"]) for p in given]
    return [(cfg["models"]["target"], cfg["models"]["draft"])]


def split_ranges(cfg: dict[str, Any], dataset: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Calibration and evaluation ranges of ``dataset`` (per-dataset tables override the defaults)."""
    data = cfg["data"]
    over = data["splits"].get(dataset, {})
    size = dataset_size(dataset)
    return (prompt_range(over.get("calib", data["calib"]), size, f"data.calib of {dataset}"),
            prompt_range(over.get("eval", data["eval"]), size, f"data.eval of {dataset}"))


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


# -- strict types: every key of DEFAULTS checked, nothing coerced -------------------------------------

#: a checker takes (the key's dotted name, its value) and raises ValueError naming what is expected
Checker = Callable[[str, Any], None]


def _refuse(where: str, value: Any, expected: str) -> None:
    raise ValueError(f"config key {where} must be {expected}, got {value!r} ({type(value).__name__})")


def _int(minimum: int) -> Checker:
    def check_value(where: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
            _refuse(where, value, f"an integer >= {minimum} (no quotes, no decimals)")
    return check_value


def _int_or_eval(where: str, value: Any) -> None:
    if value != "eval" and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
        _refuse(where, value, 'an integer >= 1, or "eval" (as many tokens as the evaluation generates)')


def _real(ok: Callable[[float], bool], expected: str) -> Checker:
    def check_value(where: str, value: Any) -> None:
        if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
                or not ok(value)):
            _refuse(where, value, f"a number {expected}")
    return check_value


def _budget(where: str, value: Any) -> None:
    """A tree budget: 2 (a root and one drafted token) to the Sequoia DP's largest."""
    _int(2)(where, value)
    if value > MAX_BUDGET:
        _refuse(where, value, f"at most {MAX_BUDGET} (the Sequoia DP's largest budget; a "
                              "verification pass holds tens to hundreds of tokens)")


def _choice(options: Sequence[str]) -> Checker:
    def check_value(where: str, value: Any) -> None:
        if not isinstance(value, str) or value not in options:
            _refuse(where, value, "one of " + ", ".join(f'"{o}"' for o in options))
    return check_value


def _text(where: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        _refuse(where, value, "a non-empty string")


def _depth(where: str, value: Any) -> None:
    if value is None:  # "none" in a config loaded before
        return
    is_none = isinstance(value, str) and value.lower() == "none"
    is_depth = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1
    if not (is_none or is_depth):
        _refuse(where, value, 'an integer >= 1 or "none" (no depth limit)')


def _methods(where: str, value: Any) -> None:
    if value == "auto" or value == ["auto"]:
        return
    _list(_choice(BASELINES), allow_empty=True)(where, value)


def _device(where: str, value: Any) -> None:
    import torch

    if value == "auto":
        return
    try:
        torch.device(value)
    except (RuntimeError, TypeError, ValueError):
        _refuse(where, value, 'a torch device name such as "cpu", "cuda" or "cuda:1"')


def check_device_available(device: str) -> None:
    """Refuse a device this machine does not have, e.g. CUDA without one (before any model loads)."""
    from ...common.device import check_device

    _device("run.device", device)
    check_device(device)


def _compile(where: str, value: Any) -> None:
    if not isinstance(value, bool) and not (isinstance(value, str) and value.strip()):
        _refuse(where, value, "false, true, \"auto\" (compiled on CUDA) or a torch.compile backend name")
    if isinstance(value, str) and value != "auto":
        from ...core.checks import check_compile

        try:
            check_compile(value)
        except ValueError:
            _refuse(where, value, "false, true, \"auto\" (compiled on CUDA), \"uncompiled\" or a torch.compile "
                    "backend name (torch._dynamo.list_backends() lists them)")


#: ``baselines.methods = "auto"``: each alternative a user would run, on every device: HF ``generate`` eager and with a
#: static cache + ``torch.compile`` (inductor's weight freezing; CUDA graphs on CUDA), assisted generation and prompt
#: lookup, each at its fastest (their settings: ``baselines.assisted``, ``baselines.prompt_lookup_num_tokens``).
#: Which is fastest depends on the machine and precision: on a Zen 5 CPU static + compile ran bfloat16 1.29x faster
#: than eager (experiments/results/cpu-fastest-zen5) and int4 0.89x as fast (demo-cpu-zen5-assisted), so both run
AUTO_BASELINES = ("target", "target_compiled", "assisted", "prompt_lookup")


def baseline_methods(cfg: dict[str, Any]) -> list[str]:
    """The HF baselines a sweep runs: ``baselines.methods``, where "auto" is :data:`AUTO_BASELINES`."""
    methods = cfg["baselines"]["methods"]
    return list(AUTO_BASELINES) if methods == ["auto"] else list(methods)


def run_compile(cfg: dict[str, Any]) -> bool | str:
    """``run.compile`` for the run's device: "auto" compiles on CUDA (what a GPU user runs) and not on a CPU."""
    c = cfg["run"]["compile"]
    return ("cuda" in str(cfg["run"]["device"])) if c == "auto" else c


def padded_envelope(cfg: dict[str, Any]) -> bool:
    """Whether the sweep's compiled trees share one padded envelope (``run.envelope``; "auto": on CUDA)."""
    e = cfg["run"]["envelope"]
    return ("cuda" in str(cfg["run"]["device"])) if e == "auto" else e == "padded"


def _range(where: str, value: Any) -> None:
    if isinstance(value, str):
        if not re.fullmatch(r"\d*:\d*", value.strip()):
            _refuse(where, value, 'a prompt range "START:STOP" (either side optional, e.g. "0:100")')
    elif not (isinstance(value, list) and len(value) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value)):
        _refuse(where, value, 'a prompt range "START:STOP" or [START, STOP] with integers >= 0')


def _list(item: Checker, allow_empty: bool = False) -> Checker:
    """A list of items (a single item stands for a list of one)."""
    def check_value(where: str, value: Any) -> None:
        items = value if isinstance(value, (list, tuple)) else [value]
        if not items and not allow_empty:
            raise ValueError(f"config key {where} is an empty list; give at least one value (or leave the key out "
                             "for its default)")
        for i, x in enumerate(items):
            item(f"{where}[{i}]" if isinstance(value, (list, tuple)) else where, x)
    return check_value


def _static_tree(where: str, value: Any) -> None:
    """A static tree (``tree_builders.priority_paths``), [] for none, or a table of named ones."""
    if isinstance(value, dict):
        for name, tree in value.items():
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,40}", name):
                _refuse(f"{where}.{name}", name, "a tree's name: 1 to 40 letters, digits, '_', '.' or '-' (it names "
                                                 "the tree in the report and its picture's file)")
            check(isinstance(tree, list) and bool(tree), f"config key {where}.{name} must be a non-empty list of "
                                                         "child-rank paths in priority order, e.g. [[0], [1], [0, 0]]")
            _static_tree(f"{where}.{name}", tree)
        return
    if not isinstance(value, list):
        _refuse(where, value, "a list of child-rank paths in priority order, e.g. [[0], [1], [0, 0]], or a table "
                              "of named ones ([shapes.paths] mine = [[0], [1]])")
    try:
        tree_builders.priority_paths(value)
    except (TypeError, ValueError) as error:
        raise ValueError(f"config key {where}: {error}") from None


def static_trees(cfg: dict[str, Any]) -> list[tuple[str | None, list]]:
    """The static trees of builder ``"paths"`` (``shapes.paths``): ``(name, paths)``, the name None for a single
    unnamed tree (so its points' keys hold no name)."""
    given = cfg["shapes"]["paths"]
    if isinstance(given, dict):
        return [(name, tree) for name, tree in given.items()]
    return [(None, given)] if given else []


def _table(where: str, value: Any) -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        _refuse(where, value, "a table of GenerationConfig options (e.g. {num_assistant_tokens = 4})")


#: the kinds of value of the GenerationConfig options that steer assisted generation (their defaults are None in
#: transformers 5, so no type can be read off them); other options are checked by name only
ASSISTED_KINDS = {"num_assistant_tokens": "int", "assistant_lookbehind": "int", "assistant_early_exit": "int",
                  "assistant_confidence_threshold": "number", "assistant_ensemble_weight": "number",
                  "num_assistant_tokens_schedule": ("heuristic", "heuristic_transient", "constant")}
#: ``baselines.assisted``'s word for :data:`ASSISTED_SETTINGS`: HF assisted generation at its fastest
FASTEST = "fastest"


def _assisted(where: str, value: Any) -> None:
    """``baselines.assisted``: ``"fastest"``, or one setting of HF assisted generation (a table) or several (an array
    of tables), each a table of HF ``GenerationConfig`` options by name (HF keeps an unknown name as an attribute it
    never reads: a misspelt option ran with HF's default), those of :data:`ASSISTED_KINDS` of their kind (HF checks
    none of them)."""
    expected = (f'"{FASTEST}" (HF\'s default and a constant 1, 2, 3, 4 or 6 drafted tokens, the fastest compared), '
                "a table of GenerationConfig options (e.g. {num_assistant_tokens = 4}) or an array of such tables")
    if isinstance(value, str):
        if value != FASTEST:
            _refuse(where, value, expected)
        return
    if isinstance(value, list):
        if not value:
            _refuse(where, value, expected)
        for i, setting in enumerate(value):
            _assisted_setting(f"{where}[{i}]", setting)
        if len({repr(sorted(s.items())) for s in value}) < len(value):
            raise ValueError(f"config key {where} names a setting twice: {value!r}")
        return
    if not isinstance(value, dict):
        _refuse(where, value, expected)
    _assisted_setting(where, value)


def _assisted_setting(where: str, value: Any) -> None:
    """One setting of ``baselines.assisted``: a table of known ``GenerationConfig`` options of their kinds."""
    import difflib

    from transformers import GenerationConfig

    _table(where, value)
    known = {k for k in vars(GenerationConfig()) if not k.startswith("_")}
    for key, given in value.items():
        if key not in known:
            near = difflib.get_close_matches(key, known, 1)
            raise ValueError(f"config key {where}.{key} is not a GenerationConfig option"
                             + (f"; did you mean {near[0]}?" if near else ""))
        kind = ASSISTED_KINDS.get(key)
        if kind == "int":
            _int(0)(f"{where}.{key}", given)
        elif kind == "number":
            _real(lambda x: x >= 0, ">= 0")(f"{where}.{key}", given)
        elif kind is not None:
            _choice(kind)(f"{where}.{key}", given)


def assisted_settings(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The settings of HF assisted generation a sweep runs as baselines (``baselines.assisted``), each its own point;
    the speedups "vs assisted" are over the fastest of them on the same prompts (``figures.baseline_of``)."""
    given = cfg["baselines"]["assisted"]
    settings = list(ASSISTED_SETTINGS.values()) if given == FASTEST else given if isinstance(given, list) else [given]
    # a whole number where GenerationConfig takes a fraction (0 for 0.0) names the same setting: one point, one key
    return [{k: float(v) if k in _FRACTIONS and isinstance(v, int) and not isinstance(v, bool) else v
             for k, v in sorted(s.items())} for s in settings]


#: HF assisted generation's options that are fractions (``GenerationConfig``)
_FRACTIONS = ("assistant_confidence_threshold",)


def _pairs(where: str, value: Any) -> None:
    if not isinstance(value, list):
        _refuse(where, value, 'a list of tables {target = "...", draft = "..."}')
    for i, pair in enumerate(value):
        if not isinstance(pair, dict) or set(pair) != {"target", "draft"}:
            _refuse(f"{where}[{i}]", pair, 'a table with exactly the keys target and draft')
        for k in ("target", "draft"):
            _text(f"{where}[{i}].{k}", pair[k])


def _name(where: str, value: Any) -> None:
    """The sweep's name names its default output directory: one plain directory name, never a path."""
    if (not isinstance(value, str) or not value.strip() or value in (".", "..") or value.startswith(".")
            or any(c in value for c in '/\\:\0') or len(value) > 200):
        _refuse(where, value, "one plain directory name (not empty, no '/', '\\\\' or ':', not starting with '.'): "
                              "it names the default output directory experiments/results/<name>")


#: the checker of every key of DEFAULTS (a key added to DEFAULTS must get one: see check_types)
TYPES: dict[str, Checker] = {
    "name": _name,
    "models.target": _text, "models.draft": _text, "models.pairs": _pairs,
    "grid.drafters": _list(_choice(DRAFTER_SETS)), "grid.builders": _list(_choice(BUILDERS)),
    "grid.budgets": _list(_budget), "grid.max_depths": _list(_depth), "grid.batch_sizes": _list(_int(1)),
    "grid.temperatures": _list(_real(lambda t: t >= 0, ">= 0 (0 is greedy)")),
    "grid.top_p": _list(_real(lambda p: 0 < p <= 1, "in (0, 1]")), "grid.seeds": _list(_int(0)),
    "grid.model_mode": _choice(MODEL_MODES), "grid.verifiers": _list(_choice(tuple(VERIFIERS))),
    "data.datasets": _list(_choice(DATASETS)), "data.calib": _range, "data.eval": _range,
    "data.max_new_tokens": _int(1), "data.max_prompt_tokens": _int(0),
    "acceptance.width": _int(1), "acceptance.max_new_tokens": _int_or_eval, "acceptance.max_depth": _int(1),
    "acceptance.use": _choice(("vector", "matrix")),
    "shapes.kary_width": _int(1), "shapes.chains": _int(1), "shapes.dynamic_depth": _int(1),
    "shapes.dynamic_topk": _int(1), "shapes.paths": _static_tree,
    "ngram.mode": _choice(("ngram", "prompt_lookup")), "ngram.max_order": _int(2), "ngram.max_tokens": _int(1),
    "ngram.width": _int(1), "ngram.window": _int(1),
    "baselines.methods": _methods,
    "baselines.prompt_lookup_num_tokens": _list(_int(1)), "baselines.max_matching_ngram_size": _int(1),
    "baselines.assisted": _assisted,
    # run.dtype: the target's precision ("auto" would name no precision in a point's key)
    "run.device": _device, "run.dtype": _choice(TARGET_PRECISIONS), "run.draft_dtype": _choice(("same", *PRECISIONS)),
    "run.warmup_tokens": _int(0), "run.threads": _int(0), "run.compile": _compile, "run.envelope": _choice(ENVELOPES),
    "run.workers": _int(0),
}


def _leaves(tree: dict[str, Any], where: str = "") -> list[str]:
    return [k2 for k, v in tree.items() for k2 in
            (_leaves(v, f"{where}{k}.") if isinstance(v, dict) and k != "assisted" else [where + k])]


def check_types(cfg: dict[str, Any]) -> None:
    """Refuse any value of the wrong type or range, with the key and what it must be: no silent coercion
    (``1.5`` is not an int, ``"4"`` is not a number, ``true`` is not 1, ``[]`` is not a grid).

    Also checks the per-dataset ``calib``/``eval`` overrides in ``cfg["data"]["splits"]``.
    """
    for key in _leaves(DEFAULTS):
        table, _, leaf = key.rpartition(".")
        value = cfg[table][leaf] if table else cfg[leaf]
        if key not in TYPES:  # a key added to DEFAULTS without a checker: the developer's error
            raise KeyError(f"sweep config key {key} has no type check in treespec.bench.sweep.config.TYPES")
        TYPES[key](key, value)
    for dataset, table in cfg["data"].get("splits", {}).items():
        for k, v in table.items():
            _range(f"data.{dataset}.{k}", v)
