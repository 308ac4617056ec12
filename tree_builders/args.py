"""Argument checks shared by the builders: whole numbers stay whole numbers (no silent coercion)."""

from __future__ import annotations

import numbers


def check_count(name: str, value: object, minimum: int, hint: str = "") -> int:
    """``value`` as an int ``>= minimum``; refuses bools, floats (even ``2.0``) and strings.

    Python and numpy integers are accepted.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be >= {minimum} and an int, got {value!r} ({type(value).__name__})"
                         + (f"; {hint}" if hint else ""))
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum} (an int), got {int(value)}" + (f"; {hint}" if hint else ""))
    return int(value)


def check_optional_count(name: str, value: object, minimum: int, hint: str = "") -> int | None:
    """``None`` (no limit) or an int ``>= minimum`` (see :func:`check_count`)."""
    return None if value is None else check_count(name, value, minimum, hint or "or None for no limit")
