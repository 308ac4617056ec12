"""Files written safely: JSON replaced atomically, outputs checked before minutes of work."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def write_json(path: str | os.PathLike, data: Any, **dump_kwargs: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a temporary file in the same directory, then
    ``os.replace``): a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, **{"indent": 1, **dump_kwargs})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json_dict(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from ``path``; ``{}`` when the file is missing, unreadable or damaged (a cache
    that is measured again and rewritten)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


#: what decoding a damaged cached entry raises (a missing key, a list for a dict, a string for a number)
DAMAGED = (KeyError, TypeError, ValueError, AttributeError)


def cached_entry(cache_file: str | os.PathLike | None, key: str, measure: Callable[[], T] | None,
                 decode: Callable[[Any], T], encode: Callable[[T], Any], remeasure: bool = False) -> T | None:
    """The measurement cached under ``key`` in the JSON object ``cache_file`` (``decode``d); else
    ``measure()``, written there (``encode``d) beside the other keys. An entry ``decode`` rejects (an
    older layout, a hand edit: :data:`DAMAGED`) is measured again. ``cache_file`` None: no cache;
    ``measure`` None: None when nothing is cached."""
    saved = {} if cache_file is None else read_json_dict(cache_file)
    if key in saved and not remeasure:
        try:
            return decode(saved[key])
        except DAMAGED:
            pass
    if measure is None:
        return None
    value = measure()
    if cache_file is not None:
        write_json(cache_file, {**saved, key: encode(value)})
    return value


class JSONFile:
    """``save``/``load`` for a class with ``to_dict`` and a ``from_dict`` classmethod."""

    def save(self, path: str | os.PathLike) -> None:
        """Write as JSON (atomically)."""
        write_json(path, self.to_dict())  # type: ignore[attr-defined]

    @classmethod
    def load(cls, path: str | os.PathLike) -> Any:
        """Read a file written by :meth:`save`; a file that is not one (bad JSON, missing or mistyped fields)
        raises ``ValueError`` naming it."""
        with open(path, encoding="utf-8") as f:
            try:
                return cls.from_dict(json.load(f))  # type: ignore[attr-defined]
            except (KeyError, TypeError, ValueError, AttributeError) as error:
                what = f"missing field {error}" if isinstance(error, KeyError) else str(error)
                raise ValueError(f"{path} is not a {cls.__name__} file written by treespec ({what}); give a file "
                                 "that treespec saved, or measure one again") from None


def check_writable(path: str | os.PathLike, option: str = "--out", directory: bool = False) -> Path:
    """Fail now, not after minutes of work, when an output cannot be written; returns ``path``.

    ``directory=False``: ``path`` is a file to (over)write: not a directory, its parent created if
    missing, and an existing file is left as it is. ``directory=True``: ``path`` is a directory,
    created if missing, in which a probe file can be created. Raises ValueError naming ``option``.
    """
    path = Path(path)
    try:
        if directory:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".treespec-write-test"
            probe.touch()
            probe.unlink()
        elif path.is_dir():
            raise ValueError(f"{option} {path} is a directory; give a file name, e.g. {path / 'out.json'}")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            with open(path, "a", encoding="utf-8"):
                pass
            if not existed:
                path.unlink()
    except OSError as error:
        raise ValueError(f"{option} {path} is not writable ({error.strerror or error}); choose another {option}") \
            from None
    return path
