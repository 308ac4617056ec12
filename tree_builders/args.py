"""The package's one integer check: whole numbers stay whole numbers (no silent coercion).

``treespec.core.checks.check_int`` (which also takes 0-d integer tensors) and every builder here call it.
"""

from __future__ import annotations

import numbers

import numpy as np


def check_int(name: str, value: object, minimum: int | None = None, hint: str = "") -> int:
    """``value`` as a Python int (``>= minimum`` when given); refuses bools, floats (even ``2.0``) and strings,
    never truncates. Accepts Python and numpy integers and 0-d integer arrays."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        value = value.item()
    at_least = "" if minimum is None else f" >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"{name} must be an int{at_least}, got {value!r} ({type(value).__name__}); "
            + (hint or f"pass a whole number such as {name}={max(minimum or 0, 1)}.")
        )
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int{at_least}, got {value}" + (f"; {hint}" if hint else "."))
    return value


def check_count(name: str, value: object, minimum: int, hint: str = "") -> int:
    """An int ``>= minimum`` (:func:`check_int`)."""
    return check_int(name, value, minimum, hint)


def check_optional_count(name: str, value: object, minimum: int, hint: str = "") -> int | None:
    """``None`` (no limit) or an int ``>= minimum`` (:func:`check_int`)."""
    return None if value is None else check_int(name, value, minimum, hint or "or None for no limit")
