"""The results file of a sweep: one JSON record per finished point, appended durably."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from ...common.machine import device_name, machine

RESULTS = "results.jsonl"

#: fields of a record that depend on the clock or the machine's state, not on the computation
TIMING_FIELDS = ("timing", "speedup", "meta")


class CorruptRecordError(ValueError):
    """A line of a results file that is not a JSON record (named by file and line)."""


def _record(line: str) -> dict[str, Any] | None:
    """The JSON object on ``line``, or None when it is not one."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_records(path: str | os.PathLike, skip_corrupt: bool = False) -> list[dict[str, Any]]:
    """All records of a results file, in order.

    A torn last line (a crash while writing: no final newline, not JSON) is ignored; a valid last
    record without its newline is kept. A corrupt line anywhere else raises
    :class:`CorruptRecordError` naming the file and line, unless ``skip_corrupt`` (then it is
    reported on stderr and skipped). Blank lines are ignored.
    """
    path = Path(path)
    if not path.exists():
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _record(line)
        if record is not None:
            out.append(record)
        elif n == len(lines) and not line.endswith("\n"):
            continue  # torn by a crash; repair_tail cuts it before the next append
        elif skip_corrupt:
            print(f"[treespec] {path}, line {n}: not a JSON record; skipped (--skip-corrupt)", file=sys.stderr)
        else:
            raise CorruptRecordError(
                f"{path}, line {n}: not a JSON record ({line.strip()[:60]!r}); fix or delete that line, or skip "
                "corrupt lines with --skip-corrupt (treespec sweep / --report)")
    return out


def repair_tail(path: Path) -> None:
    """Make the file end with a newline before the next append: a valid last record that lost only its
    newline is kept (the newline is added); a torn partial line (a crash while writing) is cut."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        if _record(data[start:].decode("utf-8", errors="replace")) is not None:
            f.write(b"\n")
        else:
            f.truncate(start)
        f.flush()
        os.fsync(f.fileno())


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line and make it durable (flush + fsync)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def machine_of(record: dict[str, Any]) -> str:
    """The machine a record was measured on (``meta.machine``; records older than that field: "not recorded")."""
    return (record.get("meta") or {}).get("machine") or "not recorded"


def meta(cfg: dict[str, Any]) -> dict[str, Any]:
    """Where and when a record was made (others' load skews timings)."""
    device = cfg["run"]["device"]
    return {"config": cfg["name"], "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "host": platform.node(), "device_name": device_name(device), "machine": machine(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}  # others' load skews timings


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its timing- and machine-dependent fields (for comparing two runs)."""
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}

