"""Several boxes in one final answer: when they are one answer, and which.

A final answer given as several *different* boxes (``\\boxed{-3} and \\boxed{4}``,
``x=\\boxed{1}, y=\\boxed{2}``) is one answer exactly when the gold is a collection:

* gold a tuple ``(a, b, ...)`` of k items and k boxes: the boxes, in order, are that tuple (boxes
  that are themselves assignments, ``x=1`` and ``y=2``, are a record of labelled values);
* gold a set, list, record or union: the boxes are the list of its elements (compared as the gold's
  kind is compared: a set of k values needs those k values, a union the same points).

Otherwise (a single value, an interval, an equation...) several different boxes are several answers
to one question, a hedge, and score 0 (reason ``several``): one question, one final answer. The
same box repeated is one answer. A gold that is itself written with boxes is the list of its boxes.
"""

from __future__ import annotations

import re

from rstar2_jax.rewards.structure import Bracketed, Node, Record, Union, Unordered

_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")


def boxes_of(text: str) -> list[str] | None:
    """The distinct boxes of ``text`` in order (None when it has no box command at all)."""
    if _BOX.search(text) is None:
        return None
    from rstar2_jax.rewards.extract import find_boxes  # extract.py imports this module

    seen, out = set(), []
    for box in find_boxes(text):
        key = re.sub(r"\s+", "", box)
        if key not in seen:
            seen.add(key)
            out.append(box)
    return out


def join_boxes(boxes: list[str]) -> str:
    """Several boxes written back as one answer text (``check`` reads them with ``boxes_of``)."""
    return ", ".join(f"\\boxed{{{b}}}" for b in boxes)


def as_collection(boxes: list[str], gold: Node) -> str | None:
    """The answer that several boxes give for this gold (module docstring), or None: a hedge."""
    if isinstance(gold, Bracketed) and gold.left + gold.right == "()" and len(gold.items) == len(boxes):
        if all("=" in b for b in boxes):
            return ", ".join(boxes)
        return "(" + ", ".join(boxes) + ")"
    if isinstance(gold, Union):
        return r" \cup ".join(boxes)
    if isinstance(gold, (Unordered, Record)):
        return ", ".join(boxes)
    return None
