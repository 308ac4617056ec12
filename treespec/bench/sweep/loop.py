"""The resumable loop of a sweep: every unfinished point, one record appended each, here or on Ray workers."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from ...common.options import TARGET_PRECISIONS
from .config import check, check_cpu_precisions, check_device_available, load_config
from .distributed import run_here, run_points
from .lock import claim, exclusive
from .models import check_specs
from .points import Point, enumerate_points, finished, measure_key, model_specs
from .records import RESULTS, append_record, machine_of, read_records, repair_tail
from .report import report
from .runner import Measure, PairError, Sweep


def sweep(config: str | os.PathLike | dict[str, Any], out_dir: str | os.PathLike | None = None,
          progress: bool = True, *, device: str | None = None, dtype: str | None = None,
          on_point: Callable[[dict[str, Any]], None] | None = None, measure: Measure | None = None,
          make_report: bool = True, max_minutes: float | None = None, new: bool = False,
          skip_corrupt: bool = False, workers: int | None = None, ray_address: str | None = None,
          share_cpu: bool = False) -> Path:
    """Run (or resume) the sweep of ``config``; returns the path of its ``results.jsonl``.

    Args:
        config: a TOML path or a config dict (see ``experiments/configs/`` and the module doc).
        out_dir: where results, acceptance caches, plots and README.md go (default
            ``experiments/results/<name>``).
        progress: show a tqdm bar (points done, time left).
        device, dtype: override ``run.device`` / ``run.dtype``.
        on_point: called with each record right after it is written (tests, live monitoring).
        measure: the acceptance measurement (default ``treespec.calibrate.acceptance.measure``).
        make_report: write plots and README.md when the sweep completes.
        max_minutes: start no new point after this many minutes (run a long sweep in slices;
            the next run resumes where this one stopped).
        new: start over when ``out_dir`` holds another config's results (they move into
            ``out_dir/replaced-<time>/``); without it such a directory is refused (``treespec.bench.sweep.lock``).
        skip_corrupt: skip (and name) corrupt lines of ``results.jsonl`` instead of refusing.
        workers: run the points on this many Ray workers, one device each (default ``run.workers``;
            0: in this process); ``ray_address``: join that Ray cluster (one worker if ``workers`` is not
            given); ``share_cpu``: allow several CPU workers on one machine (their timings interfere; the
            records say ``shared_cpu``). See ``treespec.bench.sweep.distributed``.

    Only one sweep at a time writes ``out_dir``: a second one is refused with the first one's pid,
    host and start time (:class:`treespec.bench.sweep.lock.OutputDirError`). The models the unfinished points
    load are looked up before the first of them runs (``treespec.bench.sweep.models.check_specs``; not with
    ``ray_address``, whose workers find their models on their own machines): a name that cannot load is refused
    there, not once per point after the baselines ran. A point that fails is recorded with its error (``on_point``
    sees it) and retried by the next run.
    """
    cfg = load_config(config)
    if device is not None:
        cfg["run"]["device"] = device
    if dtype is not None:
        check(dtype in TARGET_PRECISIONS, f"dtype must be one of {TARGET_PRECISIONS}")
        cfg["run"]["dtype"] = dtype
    check_cpu_precisions(cfg)
    check_device_available(cfg["run"]["device"])
    out = Path(out_dir) if out_dir is not None else Path("experiments") / "results" / cfg["name"]
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    if int(cfg["run"]["threads"]) > 0:  # tiny models on a busy CPU run far faster on one thread
        torch.set_num_threads(int(cfg["run"]["threads"]))
    try:
        with exclusive(out):
            claim(out, cfg, new)
            spread = {"workers": int(cfg["run"]["workers"]) if workers is None else int(workers),
                      "address": ray_address, "share_cpu": share_cpu}
            if spread["address"] and not spread["workers"]:
                spread["workers"] = 1
            results = _run_sweep(cfg, out, progress, on_point, measure, max_minutes, skip_corrupt, spread)
            if make_report:
                report(results, skip_corrupt=skip_corrupt)
    finally:
        torch.set_num_threads(threads)
    return results


def _run_sweep(cfg: dict[str, Any], out: Path, progress: bool, on_point: Callable[[dict[str, Any]], None] | None,
               measure: Measure | None, max_minutes: float | None = None, skip_corrupt: bool = False,
               spread: dict[str, Any] | None = None) -> Path:
    """The loop of :func:`sweep`: every unfinished point, one record each, here or on Ray workers."""
    deadline = None if max_minutes is None else time.monotonic() + 60.0 * max_minutes
    state = Sweep(cfg, out, progress, measure)
    repair_tail(state.results)
    everything = read_records(state.results, skip_corrupt)
    done = finished(everything)
    # a point refused before for the same reason is not recorded again (its settings refuse it on every run)
    refused_before = {r["key"]: r.get("error") for r in everything if r.get("refused")}
    state.records.update((rec["key"], rec) for rec in done.values())
    points = enumerate_points(cfg)
    todo = [pt for pt in points if measure_key(pt.params) not in done]
    if not (spread and spread["address"]):  # a cluster's workers find their models on their own machines
        check_specs(model_specs(todo))
    elsewhere = sorted({machine_of(r) for r in state.records.values()} - {state.machine})
    if todo and elsewhere:
        print(f"[treespec sweep] {out / RESULTS} holds points measured on other machines ({'; '.join(elsewhere)}), "
              f"and this is {state.machine}: speedups pair only points and baselines of one machine, so a new "
              "point whose baselines ran elsewhere gets none (move that panel's records out to re-measure it here)",
              file=sys.stderr)
    from tqdm.auto import tqdm

    bar = tqdm(total=len(points), initial=len(points) - len(todo), unit="point", desc=cfg["name"],
               disable=not progress, dynamic_ncols=True)

    def finish(pt: Point, outcome: dict[str, Any]) -> None:
        if outcome.get("stop"):  # a model or prompt set that fails every point of its pair: nothing to record
            raise PairError(outcome["error"])
        record: dict[str, Any] = {"key": pt.key, "kind": pt.kind, "params": pt.params, **outcome}
        if record["status"] != "ok":
            bar.write(f"[treespec sweep] point {pt.label} failed: {record['error']}", file=sys.stderr)
        elif pt.kind == "treespec":
            state.compare(pt.params, record)
        if not (record.get("refused") and refused_before.get(pt.key) == record.get("error")):
            append_record(state.results, record)
        if record["status"] == "ok":
            state.records[pt.key] = record
        bar.update(1)
        if on_point is not None:
            on_point(record)

    try:
        if spread and spread["workers"]:
            run_points(state, todo, finish, workers=spread["workers"], address=spread["address"],
                       share_cpu=spread["share_cpu"], make_state=functools.partial(Sweep, cfg, out, False, measure),
                       bar=bar, deadline=deadline)
        for pt in [] if spread and spread["workers"] else todo:
            if deadline is not None and time.monotonic() >= deadline:
                bar.write(f"[treespec sweep] stopped after {max_minutes:g} min; run again to resume", file=sys.stderr)
                break
            bar.set_postfix_str(pt.label)
            finish(pt, run_here(state, pt))
    finally:
        bar.close()
    return state.results
