"""Running a sweep's points: models of the current pair, each point's drafters and timed calls, and the
comparison of a treespec point with its baselines (the resumable loop over the points: ``loop``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from ...common.device import sync
from ...core.buffers import Envelope
from ...core.captured import MODES as CAPTURED_MODES
from ...core.checks import check_model, check_prompts_fit, context_note, context_of
from ...core.compiling import graphs_compiled
from ...core.sampling import spread_seed
from ...core.stats import SECTIONS, Stats
from ...core.verifiers import NotExactError
from ...models import check_tokenizers
from ...models.tiny import ByteTokenizer
from ...recipes import Recipe, plan, run
from ..baselines import fastest_compile_settings, hf_generate
from .config import baseline_methods, calib_eval_prompts, draft_dtype, padded_envelope, \
    pairs, split_ranges
from .points import BATCHED_METHODS, Point, Refused, acceptance_params, baseline_params, batch_size, \
    compile_refusal, enumerate_points, point_key, point_recipe, shape_record, verifier_refusal
from .models import SweepModels, encode, pad_id
from .records import RESULTS, fastest, machine, machine_of

#: the acceptance measurement (``treespec.calibrate.acceptance.measure`` or a stand-in with its signature)
Measure = Callable[..., Any]


class PairError(ValueError):
    """A model, its tokenizer or a prompt set's evaluation prompts that every point of theirs would fail on the same
    way (a family not admitted, a draft of another tokenizer, a directory without a tokenizer, a prompt past the
    context): the sweep stops, naming it, instead of recording each point as a failure to retry."""


def _hf_compile_settings(method: str) -> contextlib.AbstractContextManager:
    """HF's fastest plain decoding (``target_compiled``) compiles with ``baselines.fastest_compile_settings``."""
    return fastest_compile_settings() if method == "target_compiled" else contextlib.nullcontext()


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


class Sweep:
    """State of one sweep run: the config, the output files, loaded models and cached acceptances."""

    def __init__(self, cfg: dict[str, Any], out_dir: Path, progress: bool, measure: Measure | None) -> None:
        self.cfg = cfg
        self.out = out_dir
        self.results = out_dir / RESULTS
        self.progress = progress
        self._measure = measure
        self.models = SweepModels(cfg["run"]["device"], cfg["run"]["dtype"])
        self.machine = machine(cfg["run"]["device"])  # what meta() will record for this run's points
        self.records: dict[str, dict[str, Any]] = {}
        self.prompts: dict[tuple[str, str, str], list[list[int]]] = {}
        self.checked_pairs: set[tuple[str, str]] = set()
        self.checked_inputs: set[tuple[str, str, str]] = set()  # (target, draft, dataset) passed check_inputs
        self._envelope: Envelope | None = None  # the sweep's padded envelope, made at its first compiled point
        self._acceptances: dict[str, Any] = {}  # acceptance file name -> its MeasuredAcceptance, read once

    def draft_model(self, target: str, draft: str) -> torch.nn.Module:
        """The draft in the run's draft precision, loaded as a draft (its int8 or int4 a draft's, as ``treespec
        generate`` loads it), after checking once that it shares the target's tokenizer (real models)."""
        model, tokenizer = self.models.get(draft, draft_dtype(self.cfg), role="draft")
        if (target, draft) not in self.checked_pairs:
            target_tok = self.models.get(target)[1]
            if not isinstance(tokenizer, ByteTokenizer) and not isinstance(target_tok, ByteTokenizer):
                check_tokenizers(target_tok, tokenizer)
            self.checked_pairs.add((target, draft))
        return model

    # -- inputs ---------------------------------------------------------------------------------
    def check_inputs(self, p: dict[str, Any]) -> None:
        """Raise :class:`PairError` if point ``p``'s target, its paired draft or its evaluation prompts would fail
        every point of theirs: models that do not load or are not admitted (``checks.check_model``), a draft of
        another tokenizer, a prompt that with ``max_new_tokens`` does not fit the target's context or either
        model's reach (``checks.check_prompts_fit``). Once per (target, draft, prompt set)."""
        key = (p["target"], p.get("draft") or self.paired_draft(p["target"]), p["dataset"])
        if key in self.checked_inputs:
            return
        role = "target"
        try:
            target, _ = self.models.get(key[0])
            check_model(target)
            role = "draft"
            draft = self.draft_model(key[0], key[1])
            check_model(draft, "draft")
        except (OSError, ValueError, ImportError) as error:
            spec = key[0] if role == "target" else key[1]
            raise PairError(f"the {role} {spec!r} fails every point of its pair: {error}") from None
        prompts = self.token_prompts(key[0], key[2], "eval")
        try:
            check_prompts_fit([len(ids) for ids in prompts], int(p["max_new_tokens"]), context_of(target),
                              [f"{key[2]} evaluation prompt {i}" for i in range(len(prompts))], context_note(target),
                              [(target, "target"), (draft, "draft")])
        except ValueError as error:
            raise PairError(f"{error} (data.max_prompt_tokens keeps each prompt's last tokens; data.max_new_tokens "
                            "sets the tokens generated)") from None
        self.checked_inputs.add(key)

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
        from ...calibrate.acceptance import MeasuredAcceptance

        path = self.out / f"acceptance-{point_key(params)}.json"
        if not path.exists():
            measure = self._measure
            if measure is None:
                from ...calibrate.acceptance import measure
            target, _ = self.models.get(params["target"])
            draft = self.draft_model(params["target"], params["draft"])
            calib = self.token_prompts(params["target"], params["dataset"], "calib")
            acc = measure(target, draft, calib, width=params["width"], mode=params["mode"],
                          temperature=params["temperature"], top_p=params["top_p"],
                          max_new_tokens=params["max_new_tokens"], max_depth=params["max_depth"],
                          progress=self.progress, prompts_label=f"{params['dataset']}[{params['calib'][0]}:"
                                                                 f"{params['calib'][1]}]")
            acc.save(path)  # atomic: a half-written file is never read back
        if path.name not in self._acceptances:
            self._acceptances[path.name] = MeasuredAcceptance.load(path)
        return self._acceptances[path.name], path.name

    # -- one point ------------------------------------------------------------------------------
    def run_point(self, point: Point) -> dict[str, Any]:
        """Run one point; returns its ``result`` and ``timing`` (the result records the prompt split). A treespec
        point whose verifier does not run compiled raises :class:`points.Refused` (:func:`points.compile_refusal`),
        and one whose verifier is not exact for its tree ``NotExactError``, before any model loads where the point
        alone tells (:func:`points.verifier_refusal`), else at its first step."""
        p = point.params
        why = compile_refusal(p)
        if why:
            raise Refused(why)
        why = verifier_refusal(p)
        if why:
            raise NotExactError(why)
        self.check_inputs(p)
        target, tokenizer = self.models.get(p["target"])
        prompts = self.token_prompts(p["target"], p["dataset"], "eval")
        if p["kind"] == "baseline":
            draft = self.draft_model(p["target"], p["draft"]) if p["method"] == "assisted" else None
            out = self._run_baseline(p, target, draft, prompts, pad_id(tokenizer))
        else:
            out = self._run_treespec(p, target, prompts)
        calib, evals = split_ranges(self.cfg, p["dataset"])
        out["result"]["split"] = {"dataset": p["dataset"], "calib": list(calib), "eval": list(evals)}
        return out

    def recipe_of(self, p: dict[str, Any]) -> tuple[Recipe, list[torch.nn.Module], dict[str, Any]]:
        """The recipe of a treespec point (``treespec.recipes``), its draft models, and what the record
        says about its tree."""
        info: dict[str, Any] = {}
        with_model = p["drafters"] in ("model", "both")
        acc = None
        if with_model and p["builder"] != "dynamic" and (p["builder"] == "sequoia" or p["drafters"] == "model"):
            # sequoia needs the acceptance; for the other static trees it gives a prediction
            acc_params = p.get("acceptance") or acceptance_params(
                self.cfg, p["target"], p["draft"], p["dataset"], p["mode"], p["temperature"], p["top_p"])
            acceptance, name = self.acceptance(acc_params)
            use = p.get("acceptance_use", self.cfg["acceptance"]["use"])
            acc = acceptance.matrix if use == "matrix" else acceptance.vector
            info["acceptance"] = {"file": name, "mode": p["mode"], "use": use,
                                  "vector": [float(x) for x in acceptance.vector], "beta": float(acceptance.beta)}
        recipe = point_recipe(p, acc if p["builder"] == "sequoia" else None)
        drafts = [self.draft_model(p["target"], p["draft"])] if with_model else []
        the_plan = plan(recipe, with_model=with_model, max_new_tokens=p["max_new_tokens"])
        if the_plan.shape is not None:
            info["tree"] = shape_record(the_plan.shape)
            if acc is not None and p["drafters"] == "model":
                info["predicted_tau"] = the_plan.shape.expected_tokens(acc)
                info["predicted_depth_acceptance"] = the_plan.shape.depth_acceptance(acc)
                if acceptance.ranks:
                    # the tree run over the walk's ranks (MeasuredAcceptance.replayed_tau); None where it cannot
                    # be (a node wider than the measurement drew, or no whole step fits)
                    try:
                        info["replayed_tau"] = acceptance.replayed_tau(the_plan.shape)
                    except ValueError:
                        info["replayed_tau"] = None
        info["cap"] = recipe.budget
        return recipe, drafts, info

    def envelope(self) -> Envelope:
        """One padded envelope for every tree the sweep's points capture (``run.envelope``), so that the compiled
        graphs of the first point serve all of them; made once, from the trees of every point of the config."""
        if self._envelope is None:
            shapes = []
            for pt in enumerate_points(self.cfg):
                q = pt.params
                if q["kind"] == "treespec" and q["drafters"] == "model" and q["builder"] != "dynamic":
                    recipe, _, _ = self.recipe_of(q)
                    shape = plan(recipe, max_new_tokens=q["max_new_tokens"]).shape
                    if shape is not None and recipe.mode in CAPTURED_MODES:
                        shapes.append(shape)
            self._envelope = Envelope.for_shapes(shapes) if shapes else Envelope(2, (2,), 1)
        return self._envelope

    def _run_treespec(self, p: dict[str, Any], target: torch.nn.Module, prompts: list[list[int]]) -> dict[str, Any]:
        recipe, drafts, info = self.recipe_of(p)
        n = p["max_new_tokens"]
        envelope = self.envelope() if recipe.compile and padded_envelope(self.cfg) else None

        def call(ids: list[int], tokens: int, seed: int):
            return run(recipe, target, drafts, ids, max_new_tokens=tokens, seed=seed, eos_token_id=None,
                       envelope=envelope)

        graphs = graphs_compiled()
        # a compiled step's warm-up runs the measured tree (the depth cap follows max_new_tokens): it compiles it
        batches, walls = self._timed(call, prompts, n, p["seed"], next(target.parameters()).device,
                                     full_warmup=bool(recipe.compile), batch=batch_size(p))
        outs = [row for out in batches for row in out.rows] if batch_size(p) > 1 else batches
        if recipe.compile:  # the warm-up call compiles what this point needs first (CPU: the tree's own envelope)
            info["compile"] = {"graphs": graphs_compiled() - graphs, "seconds": self.warmup_seconds,
                               "envelope": envelope.describe() if envelope is not None else "the tree's own"}
        s = Stats.combined([out.stats for out in batches])  # a batch's stats: its rows' counts, its seconds
        counts = [len(out.new_tokens) for out in outs]
        uncut_steps = [o.stats.steps - o.stats.cut_steps for o in outs]
        uncut_tokens = [sum(k for k, cut in zip(o.stats.step_tokens, o.stats.step_cut) if not cut) for o in outs]
        result = {"prompts": len(prompts), "prompt_tokens": [len(x) for x in prompts], "tokens_per_prompt": counts,
                  "new_tokens": s.new_tokens, "complete": all(c == n for c in counts), "steps": s.steps,
                  "tau": s.tau, "steps_per_prompt": [o.stats.steps for o in outs], "tau_uncut": s.tau_uncut,
                  "uncut_tokens_per_prompt": uncut_tokens, "uncut_steps_per_prompt": uncut_steps,
                  "depth_tried": s.depth_tried, "depth_accepted": s.depth_accepted, "accepted_hist": s.accepted_hist,
                  "mean_tree_size": s.mean_tree_size, "drafters": [asdict(d) for d in s.drafters],
                  "output_digests": [_digest(out.new_tokens) for out in outs], "step": s.step, **info}
        wall = sum(walls)
        timing = {"wall_seconds": wall, "per_prompt_seconds": walls,
                  "tokens_per_second": s.new_tokens / wall if wall else 0.0,
                  "warmup_seconds": self.warmup_seconds, **{k: getattr(s, k) for k in SECTIONS}}
        if batch_size(p) > 1:  # per row: when it finished in its batch (what that prompt's user waited)
            _per_batch(result, timing, [[len(r.new_tokens) for r in out.rows] for out in batches],
                       [list(out.row_seconds) for out in batches])
        return {"result": result, "timing": timing}

    def _timed(self, call: Callable[[Any, int, int], Any], prompts: list[list[int]], n: int, seed: int,
               device: torch.device, full_warmup: bool = False, batch: int = 1) -> tuple[list[Any], list[float]]:
        """One warm-up call (the same for every method: it pays a compile where there is one; its seconds are kept
        in ``self.warmup_seconds``, apart from the timed ones), then ``call(ids, n, seed_i)`` per prompt, each timed
        with GPU synchronisation. The warm-up runs the longest prompt: the caches it compiles for hold every
        prompt, so no timed call compiles (a compiled step's runner of a larger capacity serves shorter prompts;
        HF's static cache is reused when it fits). ``full_warmup``: the warm-up generates all ``n`` tokens (a
        compiled treespec point: its tree, capped by the tokens left, is then the measured one). ``batch`` > 1:
        ``call`` takes a list of that many prompts (the last batch may hold fewer) and each batch is timed as one
        call."""
        warm = n if full_warmup else int(self.cfg["run"]["warmup_tokens"])
        self.warmup_seconds = 0.0
        if warm > 0:
            sync(device)
            t0 = time.perf_counter()
            first = max(prompts, key=len)
            call(first if batch == 1 else [first] * batch, min(warm, n), spread_seed("sweep", seed, -1))
            sync(device)
            self.warmup_seconds = time.perf_counter() - t0
        outs, walls = [], []
        units = prompts if batch == 1 else [prompts[i : i + batch] for i in range(0, len(prompts), batch)]
        for i, ids in enumerate(units):
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

        def call(ids: list[int] | list[list[int]], tokens: int, seed: int) -> list[int] | list[list[int]]:
            lookup = p["method"] == "prompt_lookup"
            with _quiet_transformers(), _hf_compile_settings(p["method"]):
                new, _ = hf_generate(target, ids, tokens, temperature=p["temperature"], top_p=p["top_p"],
                                     pad_token_id=pad_id, seed=seed, assistant_model=draft,
                                     assistant_config=p.get("assisted"),
                                     prompt_lookup_num_tokens=p["prompt_lookup_num_tokens"] if lookup else None,
                                     max_matching_ngram_size=p["max_matching_ngram_size"] if lookup else None,
                                     static_compiled=p["method"] == "target_compiled",
                                     compile_backend=p.get("backend", "inductor"))
            return new

        batches, walls = self._timed(call, prompts, n, p["seed"], device, batch=batch_size(p))
        outs = [row for rows in batches for row in rows] if batch_size(p) > 1 else batches
        counts = [len(new) for new in outs]
        digests = [_digest(new) for new in outs]
        total, wall = sum(counts), sum(walls)
        result = {"prompts": len(prompts), "prompt_tokens": [len(x) for x in prompts], "tokens_per_prompt": counts,
                  "new_tokens": total, "complete": all(c == n for c in counts), "output_digests": digests}
        timing = {"wall_seconds": wall, "per_prompt_seconds": walls, "tokens_per_second": total / wall if wall else 0.0,
                  "warmup_seconds": self.warmup_seconds}
        if batch_size(p) > 1:  # HF returns a batch's rows together: each row waited the whole batch
            _per_batch(result, timing, [[len(row) for row in rows] for rows in batches],
                       [[w] * len(rows) for rows, w in zip(batches, walls)])
        return {"result": result, "timing": timing}

    # -- comparisons ----------------------------------------------------------------------------
    def paired_draft(self, target: str) -> str:
        """The draft paired with ``target`` in the config (for the assisted baseline of n-gram points)."""
        return pairs_draft(self.cfg, target)

    def baselines_for(self, p: dict[str, Any], machine: str) -> dict[str, dict[str, Any]]:
        """Finished baseline records measured on the same prompts and settings as treespec point ``p``,
        on ``machine`` (a speedup across machines measures the machines), one per method: of the settings of HF
        assisted generation or prompt lookup the fastest (``records.fastest``)."""
        common = {k: p[k] for k in ("target", "dataset", "eval", "max_new_tokens", "max_prompt_tokens",
                                    "temperature", "top_p", "seed", "device", "dtype", "batch_size") if k in p}
        out: dict[str, dict[str, Any]] = {}
        for method in baseline_methods(self.cfg):
            if batch_size(p) > 1 and method not in BATCHED_METHODS:
                continue
            draft = p.get("draft") or pairs_draft(self.cfg, p["target"])
            found = [rec for params in baseline_params(self.cfg, common, method, draft)
                     if (rec := self.records.get(point_key(params))) is not None and rec.get("status") == "ok"
                     and machine_of(rec) == machine]
            if (best := fastest(found)) is not None:  # HF assisted, prompt lookup: the fastest of their settings
                out[method] = best
        return out

    def compare(self, p: dict[str, Any], record: dict[str, Any]) -> None:
        """Fill ``record["speedup"]`` and ``record["checks"]`` against the point's baselines."""
        speedup: dict[str, float | None] = {}
        refused: dict[str, str] = {}
        checks: dict[str, Any] = {}
        mine = record["result"]
        for method, base in self.baselines_for(p, machine_of(record)).items():
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


def _per_batch(result: dict[str, Any], timing: dict[str, Any], tokens: list[list[int]],
               row_seconds: list[list[float]]) -> None:
    """A batch point's figures: the tokens and seconds of each batch (its timed unit, ``figures._units``), and each
    prompt's seconds as when its row finished (``per_prompt_seconds``: its latency, not a share of the batch)."""
    result["tokens_per_batch"] = [sum(t) for t in tokens]
    timing["per_batch_seconds"] = timing["per_prompt_seconds"]
    timing["per_prompt_seconds"] = [s for rows in row_seconds for s in rows]


def pairs_draft(cfg: dict[str, Any], target: str) -> str:
    """The draft paired with ``target`` in the config (for the assisted baseline of n-gram points)."""
    for t, d in pairs(cfg):
        if t == target:
            return d
    raise KeyError(target)
