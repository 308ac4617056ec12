"""The results file of a sweep: one JSON record per finished point, appended durably."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

import torch

from ...common import jsonl
from ...common.jsonl import CorruptRecordError, append_record, repair_tail
from ...common.machine import device_name, machine
from .paths import RESULTS

__all__ = ["RESULTS", "TIMING_FIELDS", "CorruptRecordError", "append_record", "comparable", "fastest", "machine_of",
           "meta", "read_records", "repair_tail"]

#: fields of a record that depend on the clock or the machine's state, not on the computation
TIMING_FIELDS = ("timing", "speedup", "meta")


#: what every record of a sweep's results file holds (a JSON object without them is another file's, or damaged)
FIELDS = {"key": str, "status": str, "params": dict}


def read_records(path: str | os.PathLike, skip_corrupt: bool = False) -> list[dict[str, Any]]:
    """A sweep's records (``common.jsonl.read_records``), each holding :data:`FIELDS`: a line that does not is
    corrupt (named; skipped with ``skip_corrupt``)."""
    return jsonl.read_records(path, skip_corrupt, fields=FIELDS)


def machine_of(record: dict[str, Any]) -> str:
    """The machine a record was measured on (``meta.machine``; records older than that field: "not recorded")."""
    return (record.get("meta") or {}).get("machine") or "not recorded"


def fastest(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest of several finished runs of one baseline on the same prompts (HF assisted generation's settings,
    ``baselines.assisted``; prompt lookup's lengths, ``baselines.prompt_lookup_num_tokens``): complete runs first,
    then the least wall time; None when there are none. Chosen on the prompts it is compared on, which favours the
    baseline: a speedup over it can only be understated."""
    return min(records, key=lambda r: (not r["result"]["complete"], r["timing"]["wall_seconds"]), default=None)


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

