"""The shape of a normalised answer: what kind of object it is, before any value is computed.

``parse_structure(text)`` turns a normalised answer (``normalize.py``) into a small tree of frozen
nodes. It reads only delimiters, top-level separators and relation signs; the scalar leaves stay
LaTeX strings that ``scalar.py`` parses with latex2sympy. Keeping the shape ourselves is what keeps
ordered tuples, unordered sets and intervals apart (sympy's parser reads ``(1,2)`` as an open
interval and ``1,2`` as a set):

* ``Bracketed``: ``(a,b)``, ``[a,b]``, ``(a,b]`` ... with >= 2 items; equal only to the same
  delimiters, item by item, in order (a tuple and an open interval are written alike and compare
  alike; open != closed).
* ``Unordered``: ``\\{a,b\\}`` or a bare list ``a, b`` (also ``a \\text{ and } b``, ``a \\pm b``); a
  lone answer is a one-item list. Compared as sets.
* ``Union``: ``A \\cup B``; ``Matrix``: ``\\begin{pmatrix}..\\end{pmatrix}`` (also ``bmatrix``,
  ``Bmatrix``, ``matrix``, ``array``; a ``vmatrix`` is a determinant, i.e. a scalar);
  ``Equation``: ``a = b (= c)``; ``Relation``: ``a < b \\le c``; ``Based``: ``52_8``;
  ``Scalar``: everything else.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Union as _U

_OPEN, _CLOSE = "{([", "})]"
_MATRIX = re.compile(r"^\\begin\{([pbB]?matrix|array)\}(?:\{[^{}]*\})?(.*)\\end\{\1\}$", re.S)
_BASED = re.compile(r"^(?=[0-9A-Z]*\d)([0-9A-Z]+)_\{?(\d+)\}?$")
_LIST_WORD = re.compile(r"\\text\{(?:and|or)\}|(?<![a-zA-Z\\])(?:and|or)(?![a-zA-Z])")
_ITEM_SEP = re.compile(r",|;|" + _LIST_WORD.pattern)
_REL = re.compile(r"\\le(?![a-z])|\\ge(?![a-z])|\\lt(?![a-z])|\\gt(?![a-z])|<|>")
_REL_CANON = {r"\le": "<=", r"\ge": ">=", r"\lt": "<", r"\gt": ">", "<": "<", ">": ">"}
_PM = re.compile(r"\\(?:pm|mp)(?![a-zA-Z])")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|texttt|mbox|hbox)\s*\{")
_NEVER = re.compile(r"(?!)")
_EQ = re.compile(r"=")
_CUP = re.compile(r"\\cup(?![a-zA-Z])")
MAX_ITEMS = 64


class StructureError(ValueError):
    """The answer's delimiters do not balance or it has too many parts."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Scalar:
    latex: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Based:
    digits: str  # upper-case, leading zeros removed
    base: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Bracketed:
    left: str  # "(" or "["
    right: str  # ")" or "]"
    items: tuple["Node", ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Unordered:
    items: tuple["Node", ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Union:
    parts: tuple["Node", ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Matrix:
    rows: tuple[tuple["Node", ...], ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Equation:
    sides: tuple[str, ...]  # LaTeX of each side of ``a = b (= c ...)``


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Relation:
    sides: tuple[str, ...]
    ops: tuple[str, ...]  # "<", "<=", ">", ">=" between consecutive sides


Node = _U[Scalar, Based, Bracketed, Unordered, Union, Matrix, Equation, Relation]


def _split_top(text: str, separators: re.Pattern[str]) -> tuple[list[str], list[str]]:
    """(parts, separators) of ``text`` split at matches outside every bracket pair."""
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
    return _split_top(text, separators)[0]


def balanced(text: str) -> bool:
    """Every bracket and brace of ``text`` closes (interval ends may mix ``(`` with ``]``)."""
    try:
        split_top(text, _NEVER)
    except StructureError:
        return False
    return True


def _enclosed(text: str, left: str, right: str) -> bool:
    """``text`` starts with ``left``, ends with ``right`` and the first bracket closes at the end."""
    if not (text.startswith(left) and text.endswith(right)) or len(text) < len(left) + len(right):
        return False
    try:
        return len(split_top(text[len(left):len(text) - len(right)], _NEVER)) == 1
    except StructureError:
        return False


def is_textual(text: str) -> bool:
    """An answer that is words, not math: ``\\text{Evelyn}``, ``\\text{(C)}``, ``(C)``, ``C``."""
    if re.fullmatch(r"\(?[A-Z]\)?", text):
        return True
    return bool(_TEXT_WRAP.match(text)) and bool(re.fullmatch(r"[a-z' ()\-.]*[a-z][a-z' ()\-.]*",
                                                              text_key(text)))


def text_key(text: str) -> str:
    """Lower-cased words with ``\\text{}`` wrappers, braces, outer parentheses and spaces removed."""
    key = _TEXT_WRAP.sub("", text).replace("{", "").replace("}", "").lower()
    key = re.sub(r"\s+", " ", key).strip().rstrip(".")
    while key.startswith("(") and key.endswith(")"):
        key = key[1:-1].strip()
    return key


def _expand_pm(item: str) -> list[str]:
    """``a \\pm b`` -> ``[a+b, a-b]``; every ``\\pm`` takes the same sign and ``\\mp`` the other."""
    if _PM.search(item) is None:
        return [item]
    return [_PM.sub(lambda m, s=sign: s if m.group(0) == r"\pm" else "+-".replace(s, ""), item)
            for sign in "+-"]


def _items(text: str) -> list[str]:
    items = [p.strip() for p in split_top(text, _ITEM_SEP)]
    if len(items) > MAX_ITEMS:
        raise StructureError("too many items")
    return items


def parse_structure(text: str) -> Node:
    """Shape of a normalised answer; raises ``StructureError`` on unbalanced or empty parts."""
    text = text.strip()
    if not text:
        raise StructureError("empty")
    if text in (r"\emptyset", r"\{\}"):
        return Unordered(items=())
    if text == r"\mathbb{R}":
        return Bracketed(left="(", right=")", items=(Scalar(latex=r"-\infty"), Scalar(latex=r"\infty")))
    parts = split_top(text, _CUP)
    if len(parts) > 1:
        return Union(parts=tuple(parse_structure(p) for p in parts))
    items = _items(text)
    if len(items) > 1:
        return _unordered(items)
    return _parse_item(text)


def _unordered(items: list[str]) -> Unordered:
    return Unordered(items=tuple(parse_structure(e) for item in items for e in _expand_pm(item)))


def _parse_item(text: str) -> Node:
    if not text:
        raise StructureError("empty item")
    matrix = _MATRIX.match(text)
    if matrix:
        rows = [r for r in re.split(r"\\\\", matrix.group(2)) if r.strip()]
        cells = tuple(tuple(parse_structure(c.strip()) for c in row.split("&")) for row in rows)
        if not cells or len({len(r) for r in cells}) != 1:
            raise StructureError("ragged matrix")
        return Matrix(rows=cells)
    if _enclosed(text, r"\{", r"\}"):
        inner = text[2:-2].strip()
        return _unordered(_items(inner)) if inner else Unordered(items=())
    if text[0] in "([" and text[-1] in ")]" and _enclosed(text, text[0], text[-1]):
        inner = _items(text[1:-1])
        if len(inner) > 1:
            return Bracketed(left=text[0], right=text[-1], items=tuple(parse_structure(i) for i in inner))
        if text[0] + text[-1] in ("()", "[]"):
            return _parse_item(text[1:-1].strip())
    sides = split_top(text, _EQ)
    if len(sides) > 1:
        if any(not s.strip() for s in sides):
            raise StructureError("empty side of an equation")
        return Equation(sides=tuple(s.strip() for s in sides))
    rel_sides, ops = _split_top(text, _REL)
    ops = [_REL_CANON[op] for op in ops]
    if ops:
        if any(not s.strip() for s in rel_sides):
            raise StructureError("empty side of a relation")
        return Relation(sides=tuple(s.strip() for s in rel_sides), ops=tuple(ops))
    based = _BASED.match(text)
    if based:
        return Based(digits=based.group(1).lstrip("0") or "0", base=int(based.group(2)))
    if _PM.search(text):
        return _unordered([text])
    return Scalar(latex=text)
