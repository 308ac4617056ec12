"""Guarding a sweep's output directory: one writer at a time, one config per directory.

* **Lock.** A sweep holds an exclusive, non-blocking ``flock`` on ``<out>/.treespec-sweep.lock``
  while it runs; the file names the holder (pid, host, start time). A second sweep into the same
  directory is refused with that name instead of interleaving its records. The kernel releases
  the lock when the process exits, crashes or is killed, so a stale lock file never blocks.
* **Config fingerprint.** ``<out>/config.json`` keeps the config the results were computed with
  (minus :data:`IGNORED` keys, which do not change results). A different config into the same
  directory is refused, naming what changed, unless ``new=True`` (``--new``, which starts over
  with any config): the old contents are then moved aside into ``<out>/replaced-<UTC time>/``
  (nothing is deleted). The same config without ``--new`` resumes.
* **Growing or trimming the grid.** The :data:`AXES` (budgets, builders, temperatures, prompt sets and
  their ranges, baselines...) only choose which points run, and every point's key holds its own values of
  them; changing them alone is accepted as long as every finished record stays a point of the new
  grid. New points then run and finished ones are kept; dropping a finished point is refused,
  naming it.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterator

from ...common.files import write_json
from .config import DEFAULTS, padded_envelope, run_compile
from .paths import FINGERPRINT, LOCK, REPLACED
from .points import baseline_label, enumerate_points, finished, measure_key
from .records import RESULTS, read_records

#: config keys that do not change any result (the name only labels the run and its default directory)
IGNORED = ("name",)

#: config keys that only say where points run: no result depends on them
PLACEMENT = frozenset(["run.workers"])

#: config keys that only choose which points run: a point's key holds its own value of each, so
#: changing them adds or drops points without touching what a finished point measured
AXES = frozenset([*(f"grid.{k}" for k in ("drafters", "builders", "budgets", "max_depths", "temperatures", "top_p",
                                         "seeds", "verifiers")), "data.datasets", "baselines.methods",
                   # HF assisted generation's settings and prompt lookup's tokens a step: each is its own point,
                   # its setting in its key
                   "baselines.assisted", "baselines.prompt_lookup_num_tokens",
                   # prompt ranges: every point's key holds its set's evaluation range, and a treespec point's its
                   # calibration range, so a range changed drops the points it changes (refused when finished)
                   "data.calib", "data.eval"])


def is_axis(key: str) -> bool:
    """Whether config key ``key`` (a leaf of :func:`changes`) only chooses which points run: :data:`AXES`, a
    prompt set's own ranges (``[data.<set>]``, kept under ``data.splits``), or an option of HF assisted generation's
    one setting (``baselines.assisted.<option>``)."""
    return key in AXES or key == "data.splits" or key.startswith(("data.splits.", "baselines.assisted."))


class OutputDirError(ValueError):
    """The output directory cannot take this run: another sweep writes it, or it holds another config's results."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _holder(fd: int) -> str:
    """Who holds the lock, from what the holder wrote into the lock file."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown: the lock file names none yet"


@contextlib.contextmanager
def exclusive(out: Path) -> Iterator[None]:
    """Hold the output directory's lock for the block; refuse at once if another process holds it."""
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputDirError(
                f"{out} is in use by another sweep ({_holder(fd)}); wait for it to finish (a killed sweep "
                "releases it at once), or write to another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": platform.node(), "started": _now()}).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


def canonical(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config as stored and compared: JSON values, without the :data:`IGNORED` keys."""
    return json.loads(json.dumps({k: v for k, v in cfg.items() if k not in IGNORED}, sort_keys=True))


def _leaves(tree: Any, where: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        return {k2: v2 for k, v in tree.items() for k2, v2 in _leaves(v, f"{where}{k}.").items()}
    return {where.rstrip("."): tree}


def _resolved(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with its "auto" settings that its device decides (``run.compile``, ``run.envelope``) as that device
    takes them: "auto" on a CPU compiles nothing, as false does (a stored config from before "auto" was the
    default says false)."""
    run = cfg.get("run")
    if not isinstance(run, dict) or "device" not in run:
        return cfg
    fixed = dict(run)
    if "compile" in run:
        fixed["compile"] = run_compile(cfg)
    if run.get("envelope") == "auto":
        fixed["envelope"] = "padded" if padded_envelope(cfg) else "exact"
    return {**cfg, "run": fixed}


def changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, str]:
    """``{key: "key: old -> new"}`` for every setting that differs, in key order. A key the old config
    lacks counts as unchanged when the new value is its default (a setting added to treespec later, at
    its old behaviour); settings its device decides are compared as the device takes them (:func:`_resolved`)."""
    a, b, given = _leaves(_resolved(old)), _leaves(_resolved(new)), _leaves(new)
    defaults = _leaves(canonical(DEFAULTS))
    out = {}
    for key in sorted(set(a) | set(b)):
        if key in PLACEMENT or (key not in a and key in defaults and given.get(key) == defaults[key]):
            continue
        if a.get(key, "(absent)") != b.get(key, "(absent)"):
            out[key] = f"{key}: {json.dumps(a.get(key, '(absent)'))} -> {json.dumps(b.get(key, '(absent)'))}"
    return out


def stored_changes(out: Path, cfg: dict[str, Any]) -> dict[str, str] | None:
    """What differs between ``cfg`` and the config stored in ``out`` (None: none stored), as :func:`changes`."""
    path = out / FINGERPRINT
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))["config"]
    except (ValueError, KeyError, TypeError):
        raise OutputDirError(f"{path} is not a sweep's config record; move it away or use another --out") from None
    return changes(stored, canonical(cfg))


def _move_aside(out: Path) -> Path:
    """Move everything in ``out`` but the lock and earlier ``replaced-*`` folders into a new ``replaced-*``."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    dest = out / f"{REPLACED}{stamp}"
    n = 1
    while dest.exists():
        n += 1
        dest = out / f"{REPLACED}{stamp}-{n}"
    dest.mkdir()
    for entry in out.iterdir():
        if entry.name != LOCK and not entry.name.startswith(REPLACED):
            entry.rename(dest / entry.name)
    return dest


def refusal(out: Path, cfg: dict[str, Any]) -> str | None:
    """Why ``out`` cannot take ``cfg``'s results without ``--new`` (None: it can: no config stored, the
    same config, only the grid's :data:`AXES` changed and every finished record is still a point, or no point
    finished: a run that failed, on a misspelt model say, leaves nothing to keep apart)."""
    diff = stored_changes(out, cfg)
    if not diff or not _finished(out):
        return None
    redo = f"re-run with --new to move them aside into {out}/{REPLACED}<time>/ and start over, or choose another --out"
    if not all(map(is_axis, diff)):
        lines = [line for key, line in diff.items() if not is_axis(key)]
        shown = "; ".join(lines[:6]) + (f"; and {len(lines) - 6} more" if len(lines) > 6 else "")
        return (f"{out} holds the results of a different config ({shown}). {redo[0].upper()}{redo[1:]}. (A change "
                "of the grid's axes alone - budgets, builders, temperatures, prompt sets and their ranges, "
                "baselines - resumes.)")
    # the finished points, once each (a failed or refused record drops nothing; a greedy record under another
    # verifier stands for the greedy point the grid keeps: points.finished)
    keys = {measure_key(p.params) for p in enumerate_points(cfg)}
    dropped = [r for key, r in finished(read_records(out / RESULTS, skip_corrupt=True)).items() if key not in keys]
    if not dropped:
        return None
    names = ", ".join(_label(r) for r in dropped[:4]) + (f" and {len(dropped) - 4} more" if len(dropped) > 4 else "")
    return (f"{out}: the grid changed ({'; '.join(diff.values())}) and drops {len(dropped)} finished point(s) "
            f"({names}). Keep them in the grid, or {redo}.")


def _finished(out: Path) -> bool:
    """Whether ``out``'s results hold a finished point."""
    return bool(finished(read_records(out / RESULTS, skip_corrupt=True)))


def _label(record: dict[str, Any]) -> str:
    p = record.get("params", {})
    what = baseline_label(p) if p.get("kind") == "baseline" else f"{p.get('builder')} B={p.get('budget')}"
    return f"{p.get('dataset')} T={p.get('temperature')} {what}"


def claim(out: Path, cfg: dict[str, Any], new: bool = False) -> None:
    """Check that ``out`` may take ``cfg``'s results (call while holding :func:`exclusive`) and record ``cfg``.

    Raises :class:`OutputDirError` when ``out`` holds another config's results and ``new`` is False.
    With ``new``, when a sweep wrote ``out`` before (``config.json`` or ``results.jsonl``), its
    contents move into ``out/replaced-<UTC time>/`` and the sweep starts over; so do those of another config that
    finished no point (its errors are not mixed into this config's report), without ``new``.
    """
    diff = stored_changes(out, cfg)
    if not new:
        why = refusal(out, cfg)
        if why:
            raise OutputDirError(why)
        if diff and not _finished(out):  # another config's attempt that finished no point: its errors (if it
            new = (out / RESULTS).exists()  # left any) moved aside, not mixed into this config's report
        elif diff:
            print(f"[treespec sweep] {out}: the grid changed ({'; '.join(diff.values())}); every finished point is "
                  "still in it, resuming", file=sys.stderr)
    earlier = diff is not None or (out / RESULTS).exists()  # a sweep wrote here (files of others stay put)
    if new and earlier:
        print(f"[treespec sweep] earlier contents of {out} moved to {_move_aside(out)}", file=sys.stderr)
    elif diff is None and earlier:
        print(f"[treespec sweep] {out} has no {FINGERPRINT} (a sweep from before it was kept); adopting it for this "
              "config", file=sys.stderr)
    stored = canonical(cfg)
    blob = json.dumps(stored, sort_keys=True, separators=(",", ":"))
    record = {"fingerprint": hashlib.sha256(blob.encode()).hexdigest()[:16], "written_at": _now(), "config": stored}
    write_json(out / FINGERPRINT, record, sort_keys=True)
