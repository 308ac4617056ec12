"""The points of a sweep grid, their keys, and the recipe of a treespec point."""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, fields
from typing import Any

from tree_builders import TreeShape

from ...core.captured import MODES as CAPTURED_MODES
from ...core.constructions import of_static_shape
from ...core.request import ON_DEVICE
from ...core.verifiers import NotExactError, check_exact
from ...drafters.model import STATIC_MODES
from ...recipes import NGramSettings, Recipe, draft_mode, plan
from ..baselines import assisted_setting_name
from .config import assisted_settings, baseline_methods, draft_dtype, padded_envelope, pairs, run_compile, \
    split_ranges, static_trees


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
        batch = batch_note(batch_size(p))
        if p["kind"] == "baseline":
            return f"{p['dataset']} T={p['temperature']} {baseline_label(p)}{batch}"
        depth = "" if p["max_depth"] is None else f" d<={p['max_depth']}"
        verifier = f" {p['verifier']}" if "verifier" in p else ""
        return (f"{p['dataset']} T={p['temperature']} {p['drafters']}/{tree_label(p)} B={p['budget']}{depth}{verifier}"
                f"{batch}")


def baseline_label(params: dict[str, Any]) -> str:
    """A baseline point's method as reports name it: HF assisted generation and prompt lookup with their setting
    (``assisted (3 drafted tokens)``, ``prompt_lookup (4 tokens)``), the others by their method."""
    if params["method"] == "assisted" and "assisted" in params:
        return f"assisted ({assisted_setting_name(params['assisted'])})"
    if params["method"] == "prompt_lookup" and "prompt_lookup_num_tokens" in params:
        return f"prompt_lookup ({params['prompt_lookup_num_tokens']} tokens)"
    return params["method"]


def tree_label(params: dict[str, Any]) -> str:
    """A treespec point's tree as reports name it: its builder, or ``paths:<name>`` for a named static tree (the
    points of two static trees are never pooled)."""
    name = params.get("paths_name")
    return f"paths:{name}" if name else params["builder"]


def point_key(params: dict[str, Any]) -> str:
    """A stable hash of a point's full parameters."""
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def acceptance_params(cfg: dict[str, Any], target: str, draft: str, dataset: str, mode: str,
                      temperature: float, top_p: float) -> dict[str, Any]:
    """Everything an acceptance measurement depends on (its cache key)."""
    calib, _ = split_ranges(cfg, dataset)
    a = cfg["acceptance"]
    return {"target": target, "draft": draft, "dataset": dataset, "calib": list(calib),
            "max_prompt_tokens": int(cfg["data"]["max_prompt_tokens"]), "mode": mode,
            "temperature": float(temperature), "top_p": float(top_p), "width": int(a["width"]),
            "max_new_tokens": int(cfg["data"]["max_new_tokens"] if a["max_new_tokens"] == "eval"
                                  else a["max_new_tokens"]),
            "max_depth": int(a["max_depth"]),
            "device": cfg["run"]["device"], "dtype": cfg["run"]["dtype"], **_draft_precision(cfg)}


def _draft_precision(cfg: dict[str, Any]) -> dict[str, str]:
    """``{"draft_dtype": ...}`` when drafts run in another precision than the target, else ``{}``
    (so the keys of points and acceptance files from before the setting existed stay valid)."""
    d = draft_dtype(cfg)
    return {} if d == cfg["run"]["dtype"] else {"draft_dtype": d}


def enumerate_points(cfg: dict[str, Any]) -> list[Point]:
    """Every point of the grid, in run order: per pair, temperature, dataset, top-p and seed, the
    baselines first (treespec points read their timings), then the treespec points. Temperatures
    outermost, so a sweep run in slices finishes every prompt set at the first temperature before
    the next temperature starts."""
    g, run = cfg["grid"], cfg["run"]
    points: list[Point] = []
    seen: set[str] = set()

    def add(params: dict[str, Any]) -> None:
        key = point_key(params)
        if key not in seen:
            seen.add(key)
            points.append(Point(params, key))

    for target, draft in pairs(cfg):
        for temperature in g["temperatures"]:
            for dataset in cfg["data"]["datasets"]:
                _, evals = split_ranges(cfg, dataset)
                for top_p in g["top_p"]:
                    for seed, batch in itertools.product(g["seeds"], g["batch_sizes"]):
                        common = {"target": target, "dataset": dataset, "eval": list(evals),
                                  "max_new_tokens": int(cfg["data"]["max_new_tokens"]),
                                  "max_prompt_tokens": int(cfg["data"]["max_prompt_tokens"]),
                                  "temperature": float(temperature), "top_p": float(top_p), "seed": int(seed),
                                  "device": run["device"], "dtype": run["dtype"],
                                  # recorded only above 1, so the keys of earlier records stay valid
                                  **({"batch_size": int(batch)} if batch > 1 else {})}
                        for method in baseline_methods(cfg):
                            if batch == 1 or method in BATCHED_METHODS:
                                for params in baseline_params(cfg, common, method, draft):
                                    add(params)
                        for drafters in g["drafters"]:
                            for builder in (["ngram"] if drafters == "ngram" else g["builders"]):
                                trees = static_trees(cfg) if builder == "paths" else [(None, None)]
                                for (name, tree), max_depth, budget, verifier in itertools.product(
                                        trees, g["max_depths"], g["budgets"], verifiers_at(cfg, temperature)):
                                    params = treespec_params(cfg, common, draft, drafters, builder, budget,
                                                             max_depth, verifier)
                                    if tree is not None and drafters in ("model", "both"):  # a model drafts it
                                        params.update(paths=[list(t) for t in tree],
                                                      **({"paths_name": name} if name else {}))
                                    add(params)
    return points


def verifiers_at(cfg: dict[str, Any], temperature: float) -> list[str]:
    """The verifiers of ``grid.verifiers`` a treespec point at ``temperature`` runs under: each of them when it
    samples, one at T=0, where acceptance is the target's argmax whatever the verifier (``rule.greedy_path``; no
    step calls or checks a verifier then): ``rrs`` where the grid has it, else the grid's first (the keys such
    points always had)."""
    given = cfg["grid"]["verifiers"]
    return list(given) if temperature > 0 else ["rrs" if "rrs" in given else given[0]]


def measure_key(params: dict[str, Any]) -> str:
    """The key of what a point of ``params`` measures: its own key, or for a greedy treespec point the key of its
    parameters without the verifier (acceptance at T=0 is the target's argmax whatever the verifier: the greedy
    points of two verifiers, such as those written before a greedy point ran once, measure the same)."""
    if params.get("kind") == "treespec" and params["temperature"] == 0:
        return point_key({k: v for k, v in params.items() if k != "verifier"})
    return point_key(params)


def finished(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The finished (status ok) records of a results file, the latest one per point, by :func:`measure_key`: what
    stands for a grid point ``pt`` is ``finished(records).get(measure_key(pt.params))`` (the sweep's loop, its
    ``--dry-run``, the output lock and the report all read finished points by this one rule)."""
    return {measure_key(r["params"]): r for r in records if r.get("status") == "ok"}


def verifier_refusal(params: dict[str, Any]) -> str | None:
    """Why treespec point ``params`` fails whatever the models: its verifier is not exact for its tree (the
    ``treespec.core.verifiers.NotExactError`` its first step would raise). Told from the point alone where it fixes
    the tree's construction, as the captured step tells it (``captured.construction``): one model drafter's static
    tree other than sequoia's (whose shape needs the acceptance), drafted by top-k or without replacement, at T > 0
    and with a step that drafts (2 tokens or more); None there for an exact verifier, and elsewhere (a run tells:
    i.i.d. draws merge duplicates, and the n-gram drafter's proposals depend on the text)."""
    p = params
    if (p["kind"] != "treespec" or p["temperature"] == 0 or p["drafters"] != "model" or p["builder"] == "sequoia"
            or p.get("mode") not in CAPTURED_MODES or p["max_new_tokens"] < 2):
        return None
    shape = plan(point_recipe(p), max_new_tokens=p["max_new_tokens"]).shape  # capped as the first step's tree
    chain = all(rank == 0 for path in shape.paths for rank in path)
    try:
        check_exact(p.get("verifier", "rrs"), of_static_shape(p["mode"], chain))
    except NotExactError as error:
        return str(error)
    return None


class Refused(ValueError):
    """A point its settings refuse whatever the models, for another reason than its verifier's exactness
    (``NotExactError``): :func:`compile_refusal`. A re-run fails the same way."""


def compile_refusal(params: dict[str, Any]) -> str | None:
    """Why treespec point ``params`` fails whatever the models under ``run.compile``: a compiled step verifies a
    sampled step on the device, with the verifiers of ``treespec.core.request.ON_DEVICE`` alone (``Request.checked``
    refuses the others, as this says); None otherwise (a greedy step calls no verifier)."""
    p, verifier = params, params.get("verifier", "rrs")
    if p["kind"] != "treespec" or not p.get("compile") or p["temperature"] == 0 or verifier in ON_DEVICE:
        return None
    return (f"compile={p['compile']!r} verifies on the device with {', '.join(map(repr, ON_DEVICE))}; "
            f"verifier={verifier!r} runs on the host only (take it out of grid.verifiers, or set run.compile = false)")


#: the baselines that run a batch of prompts at once (HF ``generate`` on the batch, left-padded); HF's assisted
#: generation and prompt lookup take one prompt, so a point of batch size > 1 has no such baseline
BATCHED_METHODS = ("target", "target_compiled")


def model_specs(points: list[Point]) -> set[str]:
    """The models ``points`` load: each one's target, and its draft where it has one (a model drafter, assisted
    generation)."""
    return {spec for pt in points for spec in (pt.params["target"], pt.params.get("draft")) if spec}


def batch_size(params: dict[str, Any]) -> int:
    """The prompts a point decodes at once (``grid.batch_sizes``; 1 where the point does not say)."""
    return int(params.get("batch_size", 1))


def batch_note(batch: int) -> str:
    """How a point of batch size ``batch`` > 1 is named after its other settings (labels, report tables)."""
    return f" (batch {batch})" if batch > 1 else ""


def verifier_note(params: dict[str, Any]) -> str:
    """How a treespec point verified by another rule than ``rrs`` (the default, which its params leave out) is named
    after its tree (plot legends, report tables): `` [block]``."""
    return f" [{params['verifier']}]" if "verifier" in params else ""


def baseline_params(cfg: dict[str, Any], common: dict[str, Any], method: str, draft: str) -> list[dict[str, Any]]:
    """The points of baseline ``method`` on ``common``'s prompts and settings: one, or one per setting for HF assisted
    generation (``baselines.assisted``, ``config.assisted_settings``) and prompt lookup (its tokens a step,
    ``baselines.prompt_lookup_num_tokens``): comparisons take the fastest (``figures.baseline_of``)."""
    b = cfg["baselines"]
    if method == "assisted":
        return [{"kind": "baseline", "method": method, **common, "draft": draft, "assisted": setting,
                 **_draft_precision(cfg)} for setting in assisted_settings(cfg)]
    if method == "prompt_lookup":
        return [{"kind": "baseline", "method": method, **common, "prompt_lookup_num_tokens": int(n),
                 "max_matching_ngram_size": int(b["max_matching_ngram_size"])} for n in b["prompt_lookup_num_tokens"]]
    params = {"kind": "baseline", "method": method, **common}
    if method == "target_compiled" and isinstance(run_compile(cfg), str):
        params["backend"] = run_compile(cfg)  # the backend the treespec points name (recorded only when named)
    return [params]


def treespec_params(cfg: dict[str, Any], common: dict[str, Any], draft: str, drafters: str, builder: str,
                     budget: int, max_depth: int | None, verifier: str = "rrs") -> dict[str, Any]:
    params: dict[str, Any] = {"kind": "treespec", **common, "drafters": drafters, "builder": builder,
                              "budget": int(budget), "max_depth": max_depth}
    # recorded in the point only when not the default, so the keys of earlier records stay valid
    if verifier != "rrs":
        params["verifier"] = verifier
    if run_compile(cfg):  # a batch compiled runs the captured batched step (treespec.core.captured)
        params["compile"] = run_compile(cfg)
    if drafters in ("ngram", "both"):
        params["ngram"] = dict(cfg["ngram"])
    if drafters in ("model", "both"):
        params["draft"] = draft
        params.update(_draft_precision(cfg))
        model_mode = cfg["grid"]["model_mode"]
        params["mode"] = draft_mode(builder, common["temperature"], None if model_mode == "auto" else model_mode)
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


#: a treespec point's parameters that set a :class:`Recipe` field of another name (points keep their names: a
#: point's key is the hash of its parameters, and a sweep finds its finished points again by their keys)
RECIPE_NAMES = {"builder": "tree", "max_depth": "depth"}
#: point parameters that name Recipe fields but hold something else (the acceptance's measurement settings,
#: the model drafter's mode by the point's rule, the n-gram's options as a table)
_OWN = ("acceptance", "mode", "ngram")
_RECIPE_FIELDS = {f.name for f in fields(Recipe)}


def point_recipe(p: dict[str, Any], acceptance: Any = None) -> Recipe:
    """The recipe of treespec point ``p`` (``acceptance``: the vector or matrix its sequoia tree needs): the point's
    parameters that are recipe fields, by :data:`RECIPE_NAMES`; what a point leaves out is the recipe's default."""
    settings = {RECIPE_NAMES.get(k, k): v for k, v in p.items()
                if RECIPE_NAMES.get(k, k) in _RECIPE_FIELDS and k not in _OWN}
    n = p.get("ngram")
    return Recipe(**{**settings, "tree": "chain" if p["builder"] == "ngram" else p["builder"],
                     "draft_mode": p["mode"] if p.get("mode") in STATIC_MODES else None,
                     "ngram": None if n is None else NGramSettings(**n), "acceptance": acceptance,
                     "target_dtype": p["dtype"], "draft_dtype": p.get("draft_dtype", p["dtype"])})


def shape_record(shape: TreeShape) -> dict[str, Any]:
    """A tree as a record stores it."""
    return {"paths": [list(p) for p in shape.paths], "size": shape.size, "depth": shape.depth,
            "widths": list(shape.widths)}


def compile_plan(cfg: dict[str, Any], points: list[Point]) -> list[str]:
    """What a sweep's compiled ``points`` (those a run does not refuse) will compile (``--dry-run``): which points
    capture their tree on the device and in which envelopes, which draft on the host, the graphs to expect, and the
    HF static cache + torch.compile baselines, which compile whether or not treespec's points do.
    Sequoia trees are known only once their acceptance is measured, so a padded envelope is stated by what bounds
    it."""
    hf = [pt for pt in points if pt.kind == "baseline" and pt.params["method"] == "target_compiled"]
    hf_lines = [f"  {len(hf)} HF static cache + torch.compile baseline point(s) (backend "
                f"{', '.join(sorted({pt.params.get('backend', 'inductor') for pt in hf}))}): each compiles HF's "
                "decoding in its warm-up call, timed apart from its measured calls"] if hf else []
    compiled = [pt for pt in points if pt.kind == "treespec" and pt.params.get("compile")]
    if not compiled:
        return ["compile plan: no treespec point compiles " + (
            "(each that would is refused)" if run_compile(cfg) else "(run.compile is off for this device): eager "
            "steps")] + hf_lines
    captured = [pt for pt in compiled if pt.params["drafters"] == "model" and pt.params["builder"] != "dynamic"
                and pt.params.get("mode") in ("topk", "sample_without_replacement")]
    host = [pt for pt in compiled if pt not in captured]
    settings = sorted({(pt.params["temperature"], pt.params["top_p"], pt.params.get("verifier", "rrs"))
                       for pt in captured})
    lines = [f"compile plan: {len(compiled)} compiled points ({cfg['run']['device']}, "
             f"compile={compiled[0].params['compile']})"]
    if captured:
        budgets = sorted({pt.params["budget"] for pt in captured})
        if padded_envelope(cfg):
            lines.append(f"  {len(captured)} points capture their tree in ONE padded envelope (run.envelope): made "
                         f"at the first compiled point from every tree of the sweep, at most {max(budgets)} nodes")
        else:
            trees = {(tree_label(pt.params), pt.params["budget"], pt.params["max_depth"], pt.params["dataset"]
                      if pt.params["builder"] == "sequoia" else "") for pt in captured}
            lines.append(f"  {len(captured)} points capture their tree, each in its own envelope (run.envelope: no "
                         f"padding): up to {len(trees)} envelopes, one per distinct tree")
        levels = ("1 draft level per drafting setting" if padded_envelope(cfg) else
                  "1 draft level per distinct row count of the tree's levels and drafting setting (a chain's: 2, "
                  "level 0 holding the pending row too)")
        lines.append(f"  graphs per envelope: 2 prefill chunks (target, draft), {levels}, "
                     f"1 verification per sampling setting and verifier ({len(settings)}: "
                     + ", ".join(f"T={t:g} top-p={p:g} {v}" for t, p, v in settings) + ")")
        lines.append("  cache capacity: each point's warm-up runs its longest prompt, whose runner serves every "
                     "shorter one (a dataset of longer prompts compiles its set in its first warm-up; no timed call "
                     "compiles)")
    if host:
        widths = sorted({pt.params["budget"] for pt in host})
        lines.append(f"  {len(host)} points draft on the host (n-gram, several drafters, i.i.d. sampling or dynamic "
                     f"trees): one compiled verification per budget ({widths}) and sampling setting")
    return lines + hf_lines
