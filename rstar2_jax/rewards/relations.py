"""Equations, labelled values and inequalities: the ``=``/``<``/``\\ne`` part of the policy.

Called from ``equivalence.nodes_equal`` with that function as ``equal`` (for the values inside).

* An equation whose left side (or any side before the last) is a label (``labels.py``) gives its
  last side as the value: ``x = 5``, ``x = \\frac{10}{2} = 5``, ``1 = y = 0``. Two labelled
  equations compare their values when the labels name the same thing (``f(x) = x^2`` vs
  ``F(t) = t^2``: a function's name ignores case and its argument is renamed); different labels
  with constant values (``x = 5`` vs ``y = 5``) differ. Other equations are equal when one is a
  nonzero constant multiple of the other; a value is never matched by an unsolved equation.
* A one-variable inequality (``x > 2``, ``1 < f(x) \\le 3``, ``x \\ne 3``) is the interval (union)
  it defines; other relations compare as relations (same direction, positive multiples; ``\\ne``
  any nonzero multiple) and never equal a solved form.
"""

from __future__ import annotations

import re
from typing import Callable

import sympy
from sympy.core.function import AppliedUndef

from rstar2_jax.rewards.labels import VARIABLE, argument_renaming, is_label, label_key, rename
from rstar2_jax.rewards.scalar import ParseError, proportional, to_sympy
from rstar2_jax.rewards.structure import (Bracketed, Equation, Node, Relation, Scalar, StructureError, Union,
                                          parse_structure)

Equal = Callable[[Node, Node], bool]
_INTERVAL_OPS = {"<": (True, "<"), "<=": (False, "<"), ">": (True, ">"), ">=": (False, ">")}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}
_UNDEFINED = (sympy.zoo, sympy.nan)
_ABS = re.compile(r"^\|\s*[a-zA-Z]\s*\|$")


def label_of(node: Equation) -> str | None:
    """The label of a labelled equation (the last labelling side before the value), else None."""
    for side in reversed(node.sides[:-1]):
        if is_label(side):
            return side
    return None


def assignment_value(node: Node) -> Node | None:
    """``x = ... = v`` with a label before the last side -> the structure of ``v``."""
    if isinstance(node, Equation) and label_of(node) is not None:
        return parse_structure(node.sides[-1])
    return None


def _is_value_assignment(node: Equation) -> bool:
    """``x = 2`` / ``x = \\frac{10}{2} = 5``: a label set to a constant."""
    if label_of(node) is None:
        return False
    try:
        value = parse_structure(node.sides[-1])
        return isinstance(value, Scalar) and not to_sympy(value.latex).free_symbols
    except (StructureError, ParseError):
        return False


def equations_equal(gold: Node, pred: Node, equal: Equal) -> bool:
    """Equation vs equation, or a labelled equation vs its value (module docstring)."""
    if isinstance(gold, Equation) and isinstance(pred, Equation):
        g_label, p_label = label_of(gold), label_of(pred)
        if g_label is not None and p_label is not None and label_key(g_label) == label_key(p_label):
            value = pred.sides[-1]
            renaming = argument_renaming(g_label, p_label)
            if renaming is not None:
                value = rename(value, *renaming)
                if value is None:
                    return False
            return equal(parse_structure(gold.sides[-1]), parse_structure(value))
        if _is_value_assignment(gold) or _is_value_assignment(pred):
            return False  # x = 2 is a value: 2x = 4 restates the problem, it does not solve it
        if len(gold.sides) != 2 or len(pred.sides) != 2:
            return False
        g = to_sympy(gold.sides[0]) - to_sympy(gold.sides[1])
        p = to_sympy(pred.sides[0]) - to_sympy(pred.sides[1])
        return proportional(g, p, positive=False)
    value = assignment_value(gold) if isinstance(gold, Equation) else assignment_value(pred)
    if value is None:
        return False
    return equal(value, pred) if isinstance(gold, Equation) else equal(gold, value)


def _constant(latex: str) -> bool:
    """A number: no symbols, and no unknown function (``f(3)`` is not a bound)."""
    node = parse_structure(latex)
    if not isinstance(node, Scalar):
        return False
    value = to_sympy(node.latex)
    return not value.free_symbols and not value.atoms(AppliedUndef)


def as_interval(node: Node) -> Node:
    """A one-variable inequality (``x > 2``, ``1 < x \\le 3``, ``x \\ne 3``, ``1 \\le |z| < 2``) -> its set."""
    if not isinstance(node, Relation) or len(node.sides) not in (2, 3):
        return node
    sides, ops = list(node.sides), list(node.ops)
    if len(sides) == 2 and _is_variable(sides[1]) and not _is_variable(sides[0]):
        sides, ops = sides[::-1], [_FLIP[ops[0]]]
    var_index = 0 if len(sides) == 2 else 1
    if not _is_variable(sides[var_index]) or ("!=" in ops and len(sides) != 2):
        return node
    if not all(_constant(s) for i, s in enumerate(sides) if i != var_index):
        return node  # y \le 3 - x is not an interval
    if ops[0] == "!=":
        return _without_point(sides[1]) if VARIABLE.match(sides[0]) else node
    if len(sides) == 3:
        (open_l, dir_l), (open_r, dir_r) = _INTERVAL_OPS[ops[0]], _INTERVAL_OPS[ops[1]]
        if dir_l != dir_r:
            return node
        lo, hi, open_lo, open_hi = sides[0], sides[2], open_l, open_r
        if dir_l == ">":
            lo, hi, open_lo, open_hi = sides[2], sides[0], open_r, open_l
    else:
        is_open, direction = _INTERVAL_OPS[ops[0]]
        if direction == "<":
            lo, hi, open_lo, open_hi = r"-\infty", sides[1], True, is_open
        else:
            lo, hi, open_lo, open_hi = sides[1], r"\infty", is_open, True
    if _ABS.match(sides[var_index]):
        return _absolute(lo, hi, open_lo, open_hi, node)
    return _interval(lo, hi, open_lo, open_hi)


def _is_variable(text: str) -> bool:
    """The variable of a one-variable inequality: ``x``, ``a_n``, ``f(x)`` (not ``f(3)``), ``|z|``."""
    if _ABS.match(text):
        return True
    return bool(VARIABLE.match(text)) and not re.search(r"\([^()]*[^a-zA-Z()\s,][^()]*\)", text)


def _interval(lo: str, hi: str, open_lo: bool, open_hi: bool) -> Bracketed:
    return Bracketed(left="(" if open_lo else "[", right=")" if open_hi else "]",
                     items=(parse_structure(lo), parse_structure(hi)))


def _without_point(point: str) -> Union:
    """``x \\ne c``: the reals without ``c``."""
    return Union(parts=(_interval(r"-\infty", point, True, True), _interval(point, r"\infty", True, True)))


def _absolute(lo: str, hi: str, open_lo: bool, open_hi: bool, node: Node) -> Node:
    """``lo < |z| < hi`` -> ``(-hi, -lo) \\cup (lo, hi)`` (``lo`` a constant >= 0, or no lower bound)."""
    if lo == r"-\infty":
        lo, open_lo = "0", False
    if not bool(to_sympy(lo) >= 0) or to_sympy(hi).has(*_UNDEFINED):
        return node
    negative = _interval(hi if hi == r"\infty" else f"-({hi})", f"-({lo})", open_hi, open_lo)
    if hi == r"\infty":
        negative = _interval(r"-\infty", f"-({lo})", True, open_lo)
    return Union(parts=(negative, _interval(lo, hi, open_lo, open_hi)))


def relations_equal(gold: Relation, pred: Relation) -> bool:
    """Same relation: after writing each as ``lhs - rhs (<|<=|!=) 0``, (positive) multiples of each other."""
    if len(gold.sides) != 2 or len(pred.sides) != 2:
        return False

    def canonical(rel: Relation) -> tuple[str, sympy.Expr]:
        lhs, rhs = to_sympy(rel.sides[0]), to_sympy(rel.sides[1])
        op = rel.ops[0]
        return (op.replace(">", "<"), rhs - lhs) if op.startswith(">") else (op, lhs - rhs)

    (g_op, g), (p_op, p) = canonical(gold), canonical(pred)
    if g.has(*_UNDEFINED) or p.has(*_UNDEFINED):
        return False
    return g_op == p_op and proportional(g, p, positive=g_op != "!=")

