"""Numerals that are not plain numbers: clock times and decimal commas (read from the raw answer).

* ``h:mm`` or ``h:mm:ss`` (``2:15``, ``12:00 \\text{ p.m.}``) is a clock time when both sides of a
  comparison are written so: times are equal when they name the same time of day (``2:30 \\text{ PM}`` = ``14:30``;
  a time without a.m./p.m. matches either reading). A time is never read as the ratio ``h/mm``
  (``2:15`` != ``6:45``, ``12:00`` != ``1:00``); when only one side is time-shaped, both are ratios.
* ``1000,99`` / ``0,111``: a comma that cannot be a thousands separator (not groups of three, or a
  leading 0) is a decimal comma when the other side is a decimal written with a point.
"""

from __future__ import annotations

import re

import sympy

_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::([0-5]\d))?(?:\s*[aApP]\.?\s*[mM]\.?)?$")
_HALF = re.compile(r"(?<![a-zA-Z])([aApP])\.?\s*[mM](?![a-zA-Z])")  # a.m., PM, pm
_DECIMAL_COMMA = re.compile(r"^\s*\$?\s*([+-]?\d+),(\d+)\s*\$?\s*$")
_THOUSANDS = re.compile(r"^[+-]?[1-9]\d{0,2}$")
_POINT_DECIMAL = re.compile(r"^[+-]?\d*\.\d+$")


Time = tuple[int, int, int, str | None]  # hours, minutes, seconds, "a"/"p"/None


def clock_time(raw: str, normalized: str) -> Time | None:
    """``"2:15 \\text{ p.m.}"`` (normalised ``"2:15"``) -> ``(2, 15, 0, "p")``; None unless a time of day."""
    match = _CLOCK.match(normalized)
    if match is None:
        return None
    half = _HALF.search(raw[raw.rfind(":"):])
    hours, minutes, seconds = int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
    half = half.group(1).lower() if half else None
    if minutes > 59 or hours > (12 if half else 24):
        return None
    return hours, minutes, seconds, half


def _readings(time: Time) -> set[tuple[int, int, int]]:
    hours, minutes, seconds, half = time
    if half is None:
        return {(hours % 24, minutes, seconds)} | ({((hours + 12) % 24, minutes, seconds)} if hours <= 12 else set())
    return {((hours % 12) + (12 if half == "p" else 0), minutes, seconds)}


def times_equal(a: Time, b: Time) -> bool:
    """The same time of day under some reading of each (a missing a.m./p.m. allows both)."""
    if a[3] is None and b[3] is None:
        return (a[0] % 24, a[1], a[2]) == (b[0] % 24, b[1], b[2])
    return bool(_readings(a) & _readings(b))


def decimal_comma(raw: str) -> sympy.Rational | None:
    """``"1000,99"`` -> 100099/100; None when the comma may be a list or thousands separator."""
    match = _DECIMAL_COMMA.match(raw)
    if match is None or (_THOUSANDS.match(match.group(1)) and len(match.group(2)) == 3):
        return None
    return sympy.Rational(f"{match.group(1)}.{match.group(2)}")


def point_decimal(normalized: str) -> sympy.Rational | None:
    """``"1.22"`` -> 61/50 for a plain decimal written with a point (normalised text), else None."""
    return sympy.Rational(normalized) if _POINT_DECIMAL.match(normalized) else None
