"""Is a predicted final answer equal to the gold answer? The verification policy.

``check(pred, gold) -> Verdict`` is a pure function of two LaTeX strings (the contents of the boxes;
see ``extract.py``). It runs in-process and has no timeout of its own: callers that face model text
use ``verify.verify_batch``, which runs it in killable processes. Nothing here ``eval``s text; LaTeX
is read by latex2sympy2_extended (ANTLR grammar) and compared with sympy.

Policy (each point has cases in ``tests/rewards/cases.py``):

* **Presentation is ignored** (``normalize.py``): ``\\dfrac``/``\\tfrac``, ``\\left``/``\\right``,
  spacing commands, ``$``/``\\$``, font wrappers, ``\\frac12``, ``.5``, thousands separators in all
  forms (``1,000``, ``10{,}000``, ``10,\\!000``, ``10\\,000``), trailing ``\\text{}`` units,
  ``x \\in`` prefixes. If the normalised strings are equal the answer is right (``string``); this is
  also the only comparison for answers the guard refuses (``guard.py``).
* **Numbers are exact**: rationals compare exactly; a decimal is the rational it spells
  (``0.5`` = ``\\frac12``, ``5.0`` = ``5``, but ``0.333`` != ``\\frac13``, ``4.99`` != ``5``, and
  ``3.14`` != ``\\pi``). Irrational constants compare to 50 digits (``\\sqrt8`` = ``2\\sqrt2``);
  expressions with symbols compare symbolically / at random points with symbols positive
  (``(x+1)^2`` = ``x^2+2x+1``, ``\\sqrt{1/n}`` = ``1/\\sqrt n``). Variables must match (``p-q``
  != ``a-b``). Mixed numbers: ``1\\frac45`` = 9/5. See ``scalar.py``.
* **Percent is a value**: ``28\\%`` = 0.28 = ``\\frac{7}{25}``; so ``28\\%`` != ``28`` both ways.
* **Degrees are a unit annotation**: ``90^\\circ`` = ``90`` (both ways); an angle in degrees never
  equals its radian value (``90^\\circ`` != ``\\frac{\\pi}{2}``). A degree mark (like ``%``) may
  only end an item; anywhere else (``1^\\circ29``) the answer is unparseable.
* **Collections keep their kind** (``structure.py``): ordered tuples ``(a,b)`` compare in order;
  sets ``\\{a,b\\}`` and bare lists ``a, b`` (also ``a \\pm b``) compare as sets and are
  interchangeable (a lone answer is a one-element list, so ``\\{3\\}`` = ``3``); intervals compare
  endpoints and open/closed ends (``(1,2]`` != ``(1,2)`` != ``[1,2]``). A tuple never equals a set
  or a bare list. Unions of intervals compare as point sets. An inequality solved for one variable
  (``x > 2``, ``1 < x \\le 3``) is the interval it defines; other inequalities compare as relations
  (same direction, positive multiples: ``a \\le b`` = ``b \\ge a``) and never equal a solved form
  (``2x \\le 6`` != ``x \\le 3``: restating the problem is not solving it).
* **Matrices** compare element-wise after a shape check; the delimiter style (``pmatrix``,
  ``bmatrix``) does not matter; a matrix never equals a tuple.
* **Equations are equations**: two equations are equal when one is a nonzero constant multiple of
  the other (``y = 2x+3`` = ``2x - y + 3 = 0``), never by comparing right-hand sides. An assignment
  to a bare variable (``x = 5``, ``f(x) = ...``, ``x = \\frac{10}{2} = 5``) equals its value, so
  ``x = 5`` = ``5`` both ways, but ``x = 5`` != ``y = 5``, ``x^2 = 4`` != ``4`` and a value is
  not matched by an unsolved equation (``x = 2`` != ``2x = 4``).
* **Words**: a gold written as text (``\\text{Evelyn}``, multiple-choice ``\\text{(C)}``) is
  compared as case-insensitive words without wrappers or parentheses (``C``, ``(C)``, ``\\text{c}``).
* **Base-n numerals**: ``52_8`` = ``52`` (same digits; bases must agree when both are given).
* **Nothing to compare** (empty box, unbalanced braces, unparseable prediction) is wrong.
"""

from __future__ import annotations

import dataclasses
import re

import sympy

from rstar2_jax.rewards import guard
from rstar2_jax.rewards.normalize import normalize
from rstar2_jax.rewards.scalar import ParseError, Refused, proportional, to_sympy, values_equal
from rstar2_jax.rewards.structure import (Based, Bracketed, Equation, Matrix, Node, Relation, Scalar,
                                          StructureError, Union, Unordered, balanced, is_textual,
                                          parse_structure, text_key)

REASONS = ("string", "equivalent", "different", "empty", "unparseable", "gold-unparseable", "refused")
_VARIABLE = re.compile(r"^(?:[a-zA-Z]|\\[a-zA-Z]+)(?:_\{?[a-zA-Z0-9]+\}?)?(?:'*)(?:\([^()]*\))?$")
_INTERVAL_OPS = {"<": (True, "<"), "<=": (False, "<"), ">": (True, ">"), ">=": (False, ">")}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """Outcome of one comparison: ``correct`` and why (one of ``REASONS``)."""

    correct: bool
    reason: str

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"Verdict.reason must be one of {REASONS}, got {self.reason!r}")


def check(pred: str, gold: str) -> Verdict:
    """Compare the predicted answer ``pred`` to ``gold`` (both LaTeX, box contents) by the policy."""
    if len(pred) > 20 * guard.MAX_CHARS:
        return Verdict(correct=False, reason="refused")
    p, g = normalize(pred), normalize(gold)
    if not p:
        return Verdict(correct=False, reason="empty")
    if p == g:
        return Verdict(correct=True, reason="string")
    if not balanced(p):
        return Verdict(correct=False, reason="unparseable")
    if is_textual(g):
        same = text_key(p) == text_key(g)
        return Verdict(correct=same, reason="equivalent" if same else "different")
    for text in (p, g):
        if guard.text_problem(text):
            return Verdict(correct=False, reason="refused")
    try:
        gold_node = parse_structure(g)
    except StructureError:
        return Verdict(correct=False, reason="gold-unparseable")
    try:
        pred_node = parse_structure(p)
    except StructureError:
        return Verdict(correct=False, reason="unparseable")
    try:
        same = nodes_equal(gold_node, pred_node)
    except Refused:
        return Verdict(correct=False, reason="refused")
    except (ParseError, StructureError):
        return Verdict(correct=False, reason=_blame(gold_node))
    return Verdict(correct=same, reason="equivalent" if same else "different")


def _blame(gold_node: Node) -> str:
    """After a ParseError: was it the gold (data problem) or the prediction?"""
    try:
        _leaves(gold_node)
    except ParseError:
        return "gold-unparseable"
    return "unparseable"


def _leaves(node: Node) -> None:
    if isinstance(node, Scalar):
        to_sympy(node.latex)
    for child in getattr(node, "items", ()) or getattr(node, "parts", ()):
        _leaves(child)
    for row in getattr(node, "rows", ()):
        for cell in row:
            _leaves(cell)


def nodes_equal(gold: Node, pred: Node) -> bool:
    """Structural dispatch of the policy (module docstring)."""
    if isinstance(gold, Equation) or isinstance(pred, Equation):
        return _equations_equal(gold, pred)
    gold, pred = _as_interval(gold), _as_interval(pred)
    if isinstance(gold, Relation) or isinstance(pred, Relation):
        return isinstance(gold, Relation) and isinstance(pred, Relation) and _relations_equal(gold, pred)
    if isinstance(gold, Union) or isinstance(pred, Union):
        return _point_sets_equal(gold, pred)
    if isinstance(gold, Unordered) or isinstance(pred, Unordered):
        gold_items = gold.items if isinstance(gold, Unordered) else (gold,)
        pred_items = pred.items if isinstance(pred, Unordered) else (pred,)
        return _same_set(gold_items, pred_items)
    if isinstance(gold, Bracketed) and isinstance(pred, Bracketed):
        return (gold.left, gold.right, len(gold.items)) == (pred.left, pred.right, len(pred.items)) and all(
            nodes_equal(g, p) for g, p in zip(gold.items, pred.items))
    if isinstance(gold, Matrix) and isinstance(pred, Matrix):
        shape = (len(gold.rows), len(gold.rows[0]))
        return shape == (len(pred.rows), len(pred.rows[0])) and all(
            nodes_equal(g, p) for gr, pr in zip(gold.rows, pred.rows) for g, p in zip(gr, pr))
    if isinstance(gold, Based) or isinstance(pred, Based):
        return _based_equal(gold, pred)
    if isinstance(gold, Scalar) and isinstance(pred, Scalar):
        return values_equal(to_sympy(gold.latex), to_sympy(pred.latex))
    return False


def _same_set(gold: tuple[Node, ...], pred: tuple[Node, ...]) -> bool:
    """Equal as sets: every element of each side equals some element of the other."""
    return all(any(nodes_equal(g, p) for p in pred) for g in gold) and all(
        any(nodes_equal(g, p) for g in gold) for p in pred)


def _assignment_value(node: Node) -> Node | None:
    """``x = ... = v`` with a bare variable on the left -> the structure of ``v``."""
    if isinstance(node, Equation) and _VARIABLE.match(node.sides[0]):
        return parse_structure(node.sides[-1])
    return None


def _is_value_assignment(node: Equation) -> bool:
    """``x = 2`` / ``x = \\frac{10}{2} = 5``: a bare variable set to a constant."""
    if not _VARIABLE.match(node.sides[0]):
        return False
    try:
        value = parse_structure(node.sides[-1])
        return isinstance(value, Scalar) and not to_sympy(value.latex).free_symbols
    except (StructureError, ParseError):
        return False


def _equations_equal(gold: Node, pred: Node) -> bool:
    if isinstance(gold, Equation) and isinstance(pred, Equation):
        if _VARIABLE.match(gold.sides[0]) and gold.sides[0] == pred.sides[0]:
            return nodes_equal(parse_structure(gold.sides[-1]), parse_structure(pred.sides[-1]))
        if _is_value_assignment(gold) or _is_value_assignment(pred):
            return False  # x = 2 is a value: 2x = 4 restates the problem, it does not solve it
        if len(gold.sides) != 2 or len(pred.sides) != 2:
            return False
        g = to_sympy(gold.sides[0]) - to_sympy(gold.sides[1])
        p = to_sympy(pred.sides[0]) - to_sympy(pred.sides[1])
        return proportional(g, p, positive=False)
    value = _assignment_value(gold) if isinstance(gold, Equation) else _assignment_value(pred)
    if value is None:
        return False
    return nodes_equal(value, pred) if isinstance(gold, Equation) else nodes_equal(gold, value)


def _as_interval(node: Node) -> Node:
    """A one-variable inequality (``x > 2``, ``1 < x \\le 3``) -> the interval it defines."""
    if not isinstance(node, Relation) or len(node.sides) not in (2, 3):
        return node
    sides, ops = list(node.sides), list(node.ops)
    if len(sides) == 2 and _VARIABLE.match(sides[1]) and not _VARIABLE.match(sides[0]):
        flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<="}
        sides, ops = sides[::-1], [flip[ops[0]]]
    var_index = 0 if len(sides) == 2 else 1
    if not re.fullmatch(r"[a-zA-Z]", sides[var_index]):
        return node
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
    bounds = (parse_structure(lo), parse_structure(hi))
    if not all(isinstance(b, Scalar) and not to_sympy(b.latex).free_symbols for b in bounds):
        return node  # y \le 3 - x is not an interval
    return Bracketed(left="(" if open_lo else "[", right=")" if open_hi else "]", items=bounds)


def _relations_equal(gold: Relation, pred: Relation) -> bool:
    """Same relation: after writing each as ``lhs - rhs (<|<=) 0``, positive multiples of each other."""
    if len(gold.sides) != 2 or len(pred.sides) != 2:
        return False

    def canonical(rel: Relation) -> tuple[str, sympy.Expr]:
        lhs, rhs = to_sympy(rel.sides[0]), to_sympy(rel.sides[1])
        op = rel.ops[0]
        return (op.replace(">", "<"), rhs - lhs) if op.startswith(">") else (op, lhs - rhs)

    (g_op, g), (p_op, p) = canonical(gold), canonical(pred)
    return g_op == p_op and proportional(g, p, positive=True)


def _based_equal(gold: Node, pred: Node) -> bool:
    def digits(node: Node) -> tuple[str, int | None] | None:
        if isinstance(node, Based):
            return node.digits, node.base
        if isinstance(node, Scalar) and re.fullmatch(r"[0-9]+", node.latex):
            return node.latex.lstrip("0") or "0", None
        return None

    g, p = digits(gold), digits(pred)
    if g is None or p is None:
        return False
    return g[0] == p[0] and (g[1] is None or p[1] is None or g[1] == p[1])


def _to_set(node: Node) -> sympy.Set:
    if isinstance(node, Union):
        return sympy.Union(*(_to_set(p) for p in node.parts))
    if isinstance(node, Bracketed) and len(node.items) == 2 and all(isinstance(i, Scalar) for i in node.items):
        lo, hi = (to_sympy(i.latex) for i in node.items)
        if lo.free_symbols or hi.free_symbols:
            raise ParseError("symbolic interval")
        return sympy.Interval(lo, hi, left_open=node.left == "(", right_open=node.right == ")")
    if isinstance(node, Unordered) and all(isinstance(i, Scalar) for i in node.items):
        return sympy.FiniteSet(*(to_sympy(i.latex) for i in node.items))
    raise ParseError("not a set of numbers")


def _point_sets_equal(gold: Node, pred: Node) -> bool:
    try:
        g, p = _to_set(gold), _to_set(pred)
    except ParseError:
        return False
    if g == p:
        return True
    try:
        return bool(g.symmetric_difference(p).is_empty)
    except Exception:
        return False
