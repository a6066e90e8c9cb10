"""Splitting LaTeX at separators that sit outside every bracket pair (the shape parser's one primitive)."""

from __future__ import annotations

import re

_OPEN, _CLOSE = "{([", "})]"


class StructureError(ValueError):
    """The answer's delimiters do not balance or it has too many parts."""


def split_parts(text: str, separators: re.Pattern[str]) -> tuple[list[str], list[str]]:
    """(parts, separators) of ``text`` split at matches outside every bracket pair.

    ``\\{``/``\\}`` count as brackets; an interval may close with the other kind (``(1,2]``).
    Raises ``StructureError`` when the brackets do not balance.
    """
    parts, seps, depth, start, i = [], [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
            if depth < 0:
                raise StructureError("unbalanced delimiters")
        elif depth == 0:
            match = separators.match(text, i)
            if match and match.end() > i:
                parts.append(text[start:i])
                seps.append(match.group(0))
                start = i = match.end()
                continue
        i += 1
    if depth != 0:
        raise StructureError("unbalanced delimiters")
    parts.append(text[start:])
    return parts, seps


def split_top(text: str, separators: re.Pattern[str]) -> list[str]:
    """Split ``text`` at matches of ``separators`` that sit outside every bracket pair."""
    return split_parts(text, separators)[0]
