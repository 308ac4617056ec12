"""Files of JSON records, one per line, appended durably as work finishes and read back to resume it: a sweep's
``results.jsonl``, a benchmark's records, ``treespec generate --out``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

#: what a corrupt line's error suggests besides fixing or deleting it (``read_records``' default: the sweep's option)
SKIP_HINT = "skip corrupt lines with --skip-corrupt (treespec sweep / --report)"


class CorruptRecordError(ValueError):
    """A line of a results file that is not a JSON record (named by file and line)."""


def _record(line: str) -> dict[str, Any] | None:
    """The JSON object on ``line``, or None when it is not one."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_records(path: str | os.PathLike, skip_corrupt: bool = False, hint: str = SKIP_HINT,
                 fields: dict[str, type] | None = None) -> list[dict[str, Any]]:
    """All records of a results file, in order (``fields``: the keys each must hold, with their types; a JSON
    object without them is no record of this file's kind: corrupt as a line that is no JSON).

    A torn last line (a crash while writing: no final newline, not JSON) is ignored; a valid last
    record without its newline is kept. A corrupt line anywhere else raises
    :class:`CorruptRecordError` naming the file and line (and ``hint``: what else to do), unless ``skip_corrupt``
    (then it is reported on stderr and skipped). Blank lines are ignored.
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
        missing = [k for k, kind in (fields or {}).items() if not isinstance((record or {}).get(k), kind)]
        if record is not None and not missing:
            out.append(record)
        elif n == len(lines) and not line.endswith("\n"):
            continue  # torn by a crash; repair_tail cuts it before the next append
        else:
            what = "not a JSON record" if record is None else f"a JSON object without {', '.join(missing)}"
            if skip_corrupt:
                print(f"[treespec] {path}, line {n}: {what}; skipped (--skip-corrupt)", file=sys.stderr)
                continue
            raise CorruptRecordError(
                f"{path}, line {n}: {what} ({line.strip()[:60]!r}); fix or delete that line, or {hint}")
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
