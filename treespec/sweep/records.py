"""The results file of a sweep: one JSON record per finished point, appended durably."""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

RESULTS = "results.jsonl"

#: fields of a record that depend on the clock or the machine's state, not on the computation
TIMING_FIELDS = ("timing", "speedup", "meta")


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All complete records of a results file (a torn last line from a crash is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if line.endswith("\n") and line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}, line {n}: not a JSON record; fix or delete that line to resume") \
                        from None
    return out


def repair_tail(path: Path) -> None:
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


def meta(cfg: dict[str, Any]) -> dict[str, Any]:
    """Where and when a record was made (others' load skews timings)."""
    device = cfg["run"]["device"]
    name = torch.cuda.get_device_name(device) if str(device).startswith("cuda") else platform.processor() or "cpu"
    return {"config": cfg["name"], "finished_at": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "host": platform.node(), "device_name": name, "torch": torch.__version__,
        "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}  # others' load skews timings


def comparable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its timing- and machine-dependent fields (for comparing two runs)."""
    return {k: v for k, v in record.items() if k not in TIMING_FIELDS}

