"""Sweeps over every device of a node, or a cluster, through Ray.

Each worker is a Ray actor that owns one device (one GPU on a GPU node; a share of the CPU only when
the user says so), loads the model pair once and runs the points it is handed; the driver stays the
only writer of ``results.jsonl``, so records, resume, the output lock and the config fingerprint
work as in a one-process sweep. Baselines run before treespec points (a point's speedup reads its
baselines' records). A point whose worker dies is handed to a new worker; a killed driver loses
nothing that was written, and a re-run resumes. Ray is optional (``pip install 'treespec[ray]'``)
and imported only here.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections import Counter, deque
from typing import Any, Callable

from ...core.verifiers import NotExactError
from .points import Point, Refused
from .runner import PairError
from .records import meta

#: the live actors of the running distributed sweep (tests kill one to check that no point is lost)
ACTIVE: list[Any] = []


def require_ray():
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError("sweeps over several workers (--workers, --ray-address, run.workers) need Ray, an optional "
                          "extra: pip install 'treespec[ray]' (or pip install ray)") from error
    return ray


def run_here(state: Any, pt: Point) -> dict[str, Any]:
    """Run ``pt`` in this process: ``result`` and ``timing``, or the error; and where it ran (``meta``)."""
    cfg = state.cfg
    specs = {pt.params["target"], pt.params.get("draft") or state.paired_draft(pt.params["target"])}
    state.models.keep_only(specs)
    try:
        outcome = {**state.run_point(pt), "status": "ok"}
    except (KeyboardInterrupt, SystemExit):
        raise
    except PairError as error:  # every point of the pair would fail alike: the sweep stops (``loop``), nothing kept
        outcome = {"status": "error", "error": str(error), "stop": True}
    except Exception as error:  # a failing point is recorded and retried next time
        outcome = {"status": "error", "error": f"{type(error).__name__}: {error}",
                   "traceback": traceback.format_exc(limit=6)}
        if isinstance(error, (NotExactError, Refused)):  # the point's settings refuse it: a re-run fails the same way
            outcome["refused"] = True
    outcome["meta"] = meta(cfg)
    return outcome


class _Worker:
    """One worker: its own sweep state (models loaded once, acceptance files shared through ``out``)."""

    def __init__(self, make_state: Callable[[], Any]) -> None:
        import torch

        self.state = make_state()
        threads = int(self.state.cfg["run"]["threads"])
        if threads > 0:
            torch.set_num_threads(threads)

    def run(self, params: dict[str, Any], key: str) -> dict[str, Any]:
        return run_here(self.state, Point(params, key))


def run_points(state: Any, todo: list[Point], finish: Callable[[Point, dict[str, Any]], None], *, workers: int,
               address: str | None, share_cpu: bool, make_state: Callable[[], Any], bar: Any,
               deadline: float | None = None) -> None:
    """Run ``todo`` on ``workers`` Ray actors (baselines first), calling ``finish(point, outcome)`` in the
    driver as each completes. ``make_state()`` builds a worker's own sweep state (in the worker).
    ``address``: an existing cluster (``ray start --head``), else a local one."""
    ray = require_ray()
    cfg = state.cfg
    on_gpu = str(cfg["run"]["device"]).startswith("cuda")
    if not on_gpu and workers > 1 and not share_cpu:
        raise ValueError(f"{workers} CPU workers would share this machine's cores and distort every timing; give each "
                         "worker a device of its own (run.device = 'cuda' on a GPU node), use one worker, or pass "
                         "--share-cpu to accept it (the records then say shared_cpu)")
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 **({} if address else {"num_cpus": max(workers, 1)}))
    actor = ray.remote(num_gpus=1 if on_gpu else 0, num_cpus=1, max_restarts=0)(_Worker)
    spawn = lambda: actor.remote(make_state)  # noqa: E731
    ACTIVE[:] = [spawn() for _ in range(workers)]
    done = Counter()
    try:
        for phase in ([p for p in todo if p.kind == "baseline"], [p for p in todo if p.kind != "baseline"]):
            _run_phase(ray, phase, spawn, finish, done, bar, share_cpu, deadline)
    finally:
        for a in ACTIVE:
            ray.kill(a)
        ACTIVE.clear()


def _run_phase(ray: Any, points: list[Point], spawn: Callable[[], Any], finish: Callable, done: Counter, bar: Any,
               share_cpu: bool, deadline: float | None) -> None:
    """Keep every worker busy with the next point; a dead worker's point goes to a fresh worker."""
    queue, running = deque(points), {}
    while queue or running:
        if deadline is not None and time.monotonic() >= deadline and queue:
            bar.write("[treespec sweep] time is up: no new point starts; run again to resume", file=sys.stderr)
            queue.clear()
            if not running:
                break
        busy = {i for i, _ in running.values()}
        for i in range(len(ACTIVE)):
            if queue and i not in busy:
                pt = queue.popleft()
                running[ACTIVE[i].run.remote(pt.params, pt.key)] = (i, pt)
        (ref,), _ = ray.wait(list(running), num_returns=1)
        i, pt = running.pop(ref)
        try:
            outcome = ray.get(ref)
        except ray.exceptions.RayActorError:
            print(f"[treespec sweep] worker {i} died running {pt.label}; handing it to a new worker", file=sys.stderr)
            ACTIVE[i] = spawn()
            queue.appendleft(pt)
            continue
        outcome["meta"].update(worker=i, **({"shared_cpu": True} if share_cpu else {}))
        done[i] += 1
        bar.set_postfix_str(" ".join(f"w{w}:{done[w]}" for w in range(len(ACTIVE))))
        finish(pt, outcome)
