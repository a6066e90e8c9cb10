"""Labels: what may stand left of ``=`` as the *name* of an answer rather than part of an equation.

``x = 5``, ``f(x) = x^2``, ``AB = 4`` (a segment), ``\\angle A = 30``, ``V_1:V_2 = 11:21`` and
``\\frac{NO}{BO} = \\frac{1}{\\sqrt6}`` (ratios of names) and ``(m, n) = (4, 1)`` (a tuple of names)
all *label* their right-hand side. ``x^2 = 4``, ``2x = 4`` or ``xy = 6`` do not: their left side is
mathematics, and such an answer is an equation (``equivalence.py``). Names are matched textually on
normalised LaTeX (``normalize.py``); nothing here parses.
"""

from __future__ import annotations

import re

from rstar2_jax.rewards.split import StructureError, split_top

# One name: a letter or command with an optional subscript and primes, optionally applied (f(x)),
# or an upper-case point/segment/region name (AB, ABC, S_{MBCN}) possibly with \overline / \angle.
_SUB = r"(?:_\{?[a-zA-Z0-9,]+\}?)?"
VARIABLE = re.compile(r"^(?:[a-zA-Z]|\\[a-zA-Z]+)" + _SUB + r"'*(?:\([^()]*\))?$")
_NAME = re.compile(r"^(?:\\overline\{[A-Z]{2,3}\}|\|[A-Z]{2,3}\||(?:m)?\\angle ?[A-Z]{1,3}|[A-Z]{2,4}" + _SUB + r")$")
_FUNCTION = re.compile(r"^([a-zA-Z])\(([a-zA-Z])\)$")
_RATIO = re.compile(r"^\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_COMMA = re.compile(",")
_COLON = re.compile(":")


def is_name(text: str) -> bool:
    """One name: ``x``, ``a_{37}``, ``f(x)``, ``\\theta``, ``AB``, ``\\angle ABC``."""
    text = text.strip()
    return bool(VARIABLE.match(text) or _NAME.match(text))


def is_label(text: str) -> bool:
    """A name, or a ratio of names (``V_1:V_2``, ``\\frac{NO}{BO}``) labelling a single value."""
    text = text.strip()
    if is_name(text):
        return True
    ratio = _RATIO.match(text)
    if ratio:
        return is_name(ratio.group(1)) and is_name(ratio.group(2))
    try:
        parts = split_top(text, _COLON)
    except StructureError:
        return False
    return len(parts) >= 2 and all(is_name(p) for p in parts)


def tuple_label(text: str) -> tuple[str, ...] | None:
    """``(m, n)`` -> ``("m", "n")`` when every entry is a name (a tuple of labels), else None."""
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        return None
    try:
        names = [p.strip() for p in split_top(text[1:-1], _COMMA)]
    except StructureError:
        return None
    if len(names) < 2 or not all(VARIABLE.match(n) for n in names) or len(set(names)) != len(names):
        return None
    return tuple(names)


def label_key(label: str) -> str:
    """Key under which two spellings of a label are the same name (``P(x)`` and ``p(x)``: one function)."""
    label = re.sub(r"\s+", "", label)
    function = _FUNCTION.match(label)
    return f"{function.group(1).lower()}()" if function else label


def argument_renaming(gold_label: str, pred_label: str) -> tuple[str, str] | None:
    """``f(x)`` vs ``f(t)``: the prediction's argument ``t`` stands for ``x``; None when nothing to rename."""
    g, p = _FUNCTION.match(re.sub(r"\s+", "", gold_label)), _FUNCTION.match(re.sub(r"\s+", "", pred_label))
    if g is None or p is None or g.group(2) == p.group(2):
        return None
    return p.group(2), g.group(2)


def rename(latex: str, old: str, new: str) -> str | None:
    """``latex`` with the single-letter variable ``old`` written ``new`` (None if ``new`` already occurs)."""
    letter = r"(?<![a-zA-Z\\]){}(?![a-zA-Z])"
    if re.search(letter.format(re.escape(new)), latex):
        return None
    return re.sub(letter.format(re.escape(old)), new, latex)
