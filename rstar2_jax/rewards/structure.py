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
  ``Equation``: ``a = b (= c)``; ``Relation``: ``a < b \\le c``, ``x \\ne 3``; ``Based``: ``52_8``;
  ``Scalar``: everything else.
* ``Record``: labelled values, ``m = 4, n = 1`` or ``(m, n) = (4, 1)`` (``labels.py``); a flat list
  whose labels repeat (``p=5, q=2, p=7, q=2``) is a list of records, and so is ``p=5,q=2; p=7,q=2``
  (``;`` separates groups, ``,`` and the words *and*/*or* separate items).
* ``\\approx``: after an equation it only annotates (``x = \\frac13 \\approx 0.33`` is ``x = \\frac13``);
  alone it reads as ``=`` (``x \\approx 11`` is ``x = 11``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Union as _U

from rstar2_jax.rewards.labels import is_label, tuple_label
from rstar2_jax.rewards.split import StructureError, split_parts, split_top

__all__ = ["Based", "Bracketed", "Equation", "Matrix", "Node", "Record", "Relation", "Scalar", "StructureError",
           "Union", "Unordered", "balanced", "is_textual", "parse_structure", "split_top", "text_key"]
_MATRIX = re.compile(r"^\\begin\{([pbB]?matrix|array)\}(?:\{[^{}]*\})?((?:(?!\\begin\{|\\end\{).)*)\\end\{\1\}$", re.S)
_BASED = re.compile(r"^(?=[0-9A-Z]*\d)([0-9A-Z]+)_\{?(\d+)\}?$")
# "and"/"or" as words, or glued between a value and the next item (``W(x)=1orW(x)=-1``).
_LIST_WORD = (r"\\text\{,? ?(?:and|or)\}|(?<![a-zA-Z\\])(?:and|or)(?![a-zA-Z])"
              r"|(?<=[\d)}])(?:and|or)(?=[A-Z(\\])")
_ITEM_SEP = re.compile(r", ?(?:" + _LIST_WORD + r")|" + _LIST_WORD + r"|,")  # "2, 5, and 7": one separator
_ANY_SEP = re.compile(_ITEM_SEP.pattern + r"|;")  # inside brackets ``;`` separates items too: (0;1)
_GROUP_SEP = re.compile(r";")
_REL = re.compile(r"\\le(?![a-zA-Z])|\\ge(?![a-zA-Z])|\\lt(?![a-zA-Z])|\\gt(?![a-zA-Z])|\\ne(?![a-zA-Z])|<|>")
_REL_CANON = {r"\le": "<=", r"\ge": ">=", r"\lt": "<", r"\gt": ">", r"\ne": "!=", "<": "<", ">": ">"}
_APPROX = re.compile(r"\\approx(?![a-zA-Z])")
_PM = re.compile(r"\\(?:pm|mp)(?![a-zA-Z])")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textit|textrm|textsf|texttt|textnormal|textup|textsl|mbox|hbox)\s*\{")
_NEVER = re.compile(r"(?!)")
_EQ = re.compile(r"=")
_CUP = re.compile(r"\\cup(?![a-zA-Z])")
MAX_ITEMS = 64


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
    ops: tuple[str, ...]  # "<", "<=", ">", ">=", "!=" between consecutive sides


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Record:
    labels: tuple[str, ...]  # distinct names, in the order written
    values: tuple["Node", ...]


Node = _U[Scalar, Based, Bracketed, Unordered, Union, Matrix, Equation, Relation, Record]


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


def _items(text: str, separators: re.Pattern[str] = _ITEM_SEP) -> list[str]:
    items = [p.strip() for p in split_top(text, separators)]
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
    groups = split_top(text, _GROUP_SEP)
    if len(groups) > 1:
        items = tuple(i for g in groups for n in (parse_structure(g),)
                      for i in (n.items if isinstance(n, Unordered) else (n,)))
        if len(items) > MAX_ITEMS:
            raise StructureError("too many items")
        return Unordered(items=items)
    parts = split_top(text, _CUP)
    if len(parts) > 1:
        return Union(parts=tuple(parse_structure(p) for p in parts))
    items = _items(text)
    if len(items) > 1:
        return _unordered(items)
    return _parse_item(text)


def _unordered(items: list[str]) -> Unordered | Record:
    return _records(tuple(parse_structure(e) for item in items for e in _expand_pm(item)))


def _records(nodes: tuple[Node, ...]) -> Unordered | Record:
    """Assignments to >= 2 distinct names form a record; labels that repeat start the next record."""
    if len(nodes) < 2 or not all(isinstance(n, Equation) and len(n.sides) == 2 and is_label(n.sides[0])
                                 for n in nodes):
        return Unordered(items=nodes)
    runs: list[list[Equation]] = [[]]
    for node in nodes:
        if any(node.sides[0] == other.sides[0] for other in runs[-1]):
            runs.append([])
        runs[-1].append(node)
    if len(runs[0]) < 2 or any({n.sides[0] for n in run} != {n.sides[0] for n in runs[0]} for run in runs):
        return Unordered(items=nodes)  # x = 1, x = 2 is a list of values of x
    records = tuple(Record(labels=tuple(n.sides[0] for n in run),
                           values=tuple(parse_structure(n.sides[1]) for n in run)) for run in runs)
    return records[0] if len(records) == 1 else Unordered(items=records)


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
        inner = _items(text[1:-1], _ANY_SEP)
        if len(inner) > 1:
            return Bracketed(left=text[0], right=text[-1], items=tuple(parse_structure(i) for i in inner))
        if text[0] + text[-1] in ("()", "[]"):
            return _parse_item(text[1:-1].strip())
    approx = split_top(text, _APPROX)
    if len(approx) > 1:  # x = 1/3 \approx 0.33 -> x = 1/3; x \approx 11 -> x = 11; \approx 11 -> 11
        before = approx[0].strip()
        if not before:
            return _parse_item(approx[-1].strip())
        return _parse_item(f"{before}={approx[-1].strip()}" if is_label(before) else before)
    sides = split_top(text, _EQ)
    if len(sides) > 1:
        if any(not s.strip() for s in sides):
            raise StructureError("empty side of an equation")
        names = tuple_label(sides[0]) if len(sides) == 2 else None
        if names:
            value = parse_structure(sides[1])
            if isinstance(value, Bracketed) and value.left + value.right == "()" and len(value.items) == len(names):
                return Record(labels=names, values=value.items)
        return Equation(sides=tuple(s.strip() for s in sides))
    rel_sides, ops = split_parts(text, _REL)
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
