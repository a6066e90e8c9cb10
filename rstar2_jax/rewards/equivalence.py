"""Is a predicted final answer equal to the gold answer? The verification policy.

``check(pred, gold) -> Verdict`` is a pure function of two LaTeX strings (the contents of the boxes;
see ``extract.py``). It runs in-process and has no timeout of its own: callers that face model text
use ``verify.verify_batch``, which runs it in killable processes. Nothing here ``eval``s text; LaTeX
is read by latex2sympy2_extended (ANTLR grammar) and compared with sympy. For RL a wrong 0 is as
harmful as a wrong 1 (it teaches the policy to avoid a correct way of writing), so the policy
accepts every spelling of the same answer and nothing else.

Policy (cases: ``rstar2_jax/testing/reward_cases.py``; answers as real models write them, in
Math-Verify's conventions: ``rstar2_jax/testing/mv_style_cases.py``, per class ``test_rewards_classes.py``):

* **Presentation is ignored** (``normalize.py``): ``\\dfrac``/``\\tfrac``, ``\\left``/``\\right``,
  spacing commands, ``$``/``\\$``/``€``, math delimiters ``\\( \\)``, font wrappers, ``\\frac12``,
  ``.5``, thousands separators in all forms (``1,000``, ``10{,}000``, ``10,\\!000``, ``10\\,000``,
  ``1~000``, ``1\\ 000``, ``1 000``), trailing units (``\\text{ cm}``, ``\\textnormal{ miles}``,
  ``\\mathrm{km}``, ``\\operatorname{cm}``, ``125 miles``; not ``\\mathrm{e}``, ``\\mathrm{i}``), text
  macros around math (``\\textbf{5}``, ``\\mbox{5}``), ``x \\in`` prefixes, ASCII and variant
  relations (``>=``, ``=<``, ``!=``, ``\\geqslant``, ``\\neq`` are ``\\ge``, ``\\le``, ``\\ne``). If the
  normalised strings are equal the answer is right (``string``); this is also the only comparison
  for answers the guard refuses (``guard.py``).
* **Numbers are exact**: rationals compare exactly; a decimal is the rational it spells
  (``0.5`` = ``\\frac12``, ``5.0`` = ``5``, but ``0.333`` != ``\\frac13``, ``4.99`` != ``5``, and
  ``3.14`` != ``\\pi``; math-verify rounds, we do not). Irrational constants compare to 50 digits
  (``\\sqrt8`` = ``2\\sqrt2``); expressions with symbols compare symbolically / at random points
  with symbols positive (``(x+1)^2`` = ``x^2+2x+1``, ``\\sqrt{1/n}`` = ``1/\\sqrt n``). Variables
  must match (``p-q`` != ``a-b``). Mixed numbers: ``1\\frac45`` = 9/5. See ``scalar.py``. A decimal
  comma that cannot be a thousands separator (``1000,99``, ``0,111``) matches a decimal written
  with a point (``numerals.py``); ``1, 22`` (comma and space) stays a list. Digits still apart after
  the thousands groups were joined (``1 2 3``, ``4000 00``) are ambiguous, a list or a product:
  such an answer (or gold) is unparseable and only the normalised strings can match.
* **Undefined is never equal**: a value with a zero denominator (``\\frac{3}{0}``, ``7:0``, ``0/0``)
  equals nothing, not even itself; infinity equals only the same signed infinity written as
  infinity (``\\infty`` = ``+\\infty``; != ``-\\infty``, != ``\\frac{1}{0}``). Why: sympy makes every
  such value ``zoo`` and ``zoo == zoo``, so two wrong answers would be "equal".
* **Clock times are times** (``numerals.py``): ``h:mm`` on both sides is a time of day (``2:15``
  != ``6:45``, ``12:00`` != ``1:00``, ``2:30 \\text{ p.m.}`` = ``14:30``); otherwise ``a:b`` is the
  ratio a/b (``7:32`` = ``14:64``).
* **Percent is a value**: ``28\\%`` = 0.28 = ``\\frac{7}{25}``, and ``28 percent``, ``28 pct``,
  ``28 \\text{ percentage}`` are ``28\\%``; so ``28\\%`` != ``28`` both ways (math-verify takes ``28``
  for ``28\\%``; we keep the value).
* **Degrees are a unit annotation**: ``90^\\circ`` = ``90`` (both ways); an angle in degrees never
  equals its radian value (``90^\\circ`` != ``\\frac{\\pi}{2}``). A degree mark (like ``%``) may
  only end an item; anywhere else (``1^\\circ29``) the answer is unparseable.
* **Collections keep their kind** (``structure.py``): ordered tuples ``(a,b)`` compare in order;
  sets ``\\{a,b\\}`` and bare lists ``a, b`` (also ``a \\pm b``) compare as sets and are
  interchangeable (a lone answer is a one-element list, so ``\\{3\\}`` = ``3``). Worded lists are
  lists, in answers and golds (``2, 5, and 7``, ``2, 5 \\text{ and } 7``, ``2 \\text{ or } 5``);
  ``;`` separates groups (``-12; -11``, ``p=5, q=2; p=7, q=2``). Intervals compare endpoints and
  open/closed ends (``(1,2]`` != ``(1,2)`` != ``[1,2]``). A tuple never equals a set or a bare list
  (math-verify reads ``{1,3}`` as the tuple ``(1,3)``; we do not). Unions of intervals compare as
  point sets. An inequality solved for one variable (``x > 2``, ``1 < f(x) \\le 3``, ``x \\ne 3``,
  ``1 \\le |z| \\le 2``) is the set it defines; other inequalities compare as relations (same
  direction, positive multiples: ``a \\le b`` = ``b \\ge a``) and never equal a solved form
  (``2x \\le 6`` != ``x \\le 3`` and ``-x > -1`` != ``x < 1``: restating the problem is not solving
  it). A gold written as a membership, ``x \\in [-2,7]``, asks for the set: ``[-2,7]`` matches it,
  ``-2 \\le x \\le 7`` does not (math-verify's convention); a bare interval gold is matched by the
  inequality that defines it.
* **Matrices** compare element-wise after a shape check; the delimiter style (``pmatrix``,
  ``bmatrix``) does not matter; a matrix expression of literal matrices (``A + B``, ``2A``, ``AB``)
  is the matrix it evaluates to; a matrix never equals a tuple.
* **Equations are equations** (``relations.py``): two equations are equal when one is a nonzero
  constant multiple of the other (``y = 2x+3`` = ``2x - y + 3 = 0``), never by comparing right-hand
  sides. An assignment to a label (``x = 5``, ``f(x) = ...``, ``x = \\frac{10}{2} = 5``) equals its
  value, so ``x = 5`` = ``5`` both ways, but ``x = 5`` != ``y = 5``, ``x^2 = 4`` != ``4``,
  ``2+3 = 5`` != ``5`` and a value is not matched by an unsolved equation (``x = 2`` != ``2x = 4``).
  ``\\approx`` after an exact value only annotates it (``x = \\frac13 \\approx 0.33`` is
  ``x = \\frac13``; ``x \\approx 11`` is ``x = 11``).
* **Labelled answers** (``labels.py``): ``x``, ``f(x)``, ``AB``, ``V_1:V_2``, ``\\frac{NO}{BO}``,
  ``(m,n)`` label the value after ``=``; a function's name ignores case and its argument may be
  renamed (``P(x) = 1`` = ``p(t) = 1``). Assignments to several names are a *record*: ``m=4, n=1``
  = ``(m,n)=(4,1)`` = ``n=1, m=4`` (by name), = the tuple ``(4,1)`` in the order written (so
  ``m=1, n=4`` != ``(4,1)``, and ``n=1, m=4`` != ``(4,1)``: without the question the written order
  is the only order), = the list ``4, 1`` as a set. Only labels make a record: ``(4,1)`` still !=
  ``4, 1``.
* **Several boxes** (``boxes.py``): k different boxes answer a collection gold of k items (a tuple
  in order, a set/list as a set); against a single-value gold, several different boxes are two
  answers to one question, a hedge, and score 0 (reason ``several``; math-verify would take the
  last box when no "and"/"or"/comma joins them). The same box repeated is one answer.
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
from rstar2_jax.rewards.boxes import as_collection, boxes_of
from rstar2_jax.rewards.labels import label_key
from rstar2_jax.rewards.normalize import normalize
from rstar2_jax.rewards.numerals import clock_time, decimal_comma, point_decimal, times_equal
from rstar2_jax.rewards.relations import as_interval, equations_equal, relations_equal
from rstar2_jax.rewards.scalar import ParseError, Refused, matrix_value, to_sympy, values_equal
from rstar2_jax.rewards.structure import (Based, Bracketed, Equation, Matrix, Node, Record, Relation, Scalar,
                                          StructureError, Union, Unordered, balanced, is_textual,
                                          parse_structure, split_top, text_key)

REASONS = ("string", "equivalent", "different", "several", "empty", "unparseable", "gold-unparseable", "refused")
# A zero denominator somewhere: the identical strings may still be undefined (never equal).
_ZERO_DIVISOR = re.compile(r"(?:/|:|\\frac\{[^{}]*\})\s*\{?\s*0+(?:\.0*)?\s*\}?(?![\d.])")
_INFINITY = re.compile(r"([+-]?)\\infty")
_COLON = re.compile(":")
_MEMBERSHIP = re.compile(r"^\s*[a-zA-Z]\s*\\in(?![a-zA-Z])")
_NON_FINITE = (sympy.oo, -sympy.oo, sympy.zoo, sympy.nan)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Verdict:
    """Outcome of one comparison: ``correct`` and why (one of ``REASONS``)."""

    correct: bool
    reason: str

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"Verdict.reason must be one of {REASONS}, got {self.reason!r}")


# digits still apart once normalize() joined the thousands groups (not the base of \log_2 8)
_SPACED_DIGITS = re.compile(r"(?<![\d_^.])\d+\s+\d")


def check(pred: str, gold: str) -> Verdict:
    """Compare the predicted answer ``pred`` to ``gold`` (both LaTeX, box contents) by the policy.

    Either may still hold ``\\boxed{}`` commands (a whole final answer, or several boxes joined by
    ``extract.py``); they are read by the several-boxes rule (``boxes.py``).
    """
    if len(pred) > 20 * guard.MAX_CHARS:
        return Verdict(correct=False, reason="refused")
    gold_boxes = boxes_of(gold)
    if gold_boxes:
        gold = ", ".join(gold_boxes)
    pred_boxes = boxes_of(pred)
    if pred_boxes is not None and len(pred_boxes) > 1:
        return _check_boxes(pred_boxes, gold)
    if pred_boxes:
        pred = pred_boxes[0]
    p, g = normalize(pred), normalize(gold)
    if not p:
        return Verdict(correct=False, reason="empty")
    special = _numeral_verdict(pred, gold, p, g)  # before string equality: 2:30 a.m. vs 2:30 p.m.
    if special is not None:
        return special
    if p == g and not _ZERO_DIVISOR.search(p):
        return Verdict(correct=True, reason="string")
    if not balanced(p):
        return Verdict(correct=False, reason="unparseable")
    for text, blame in ((p, "unparseable"), (g, "gold-unparseable")):
        if _SPACED_DIGITS.search(text):  # "1 2 3", "4000 00": no thousands groups; a list or a product?
            return Verdict(correct=False, reason=blame)
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
    if isinstance(pred_node, Relation) and _MEMBERSHIP.match(gold.replace("$", "")):
        return Verdict(correct=False, reason="different")  # x \\in S asks for the set S
    try:
        same = nodes_equal(gold_node, pred_node)
    except Refused:
        return Verdict(correct=False, reason="refused")
    except (ParseError, StructureError):
        return Verdict(correct=False, reason=_blame(gold_node))
    return Verdict(correct=same, reason="equivalent" if same else "different")


def _check_boxes(boxes: list[str], gold: str) -> Verdict:
    """Several different boxes against ``gold`` (``boxes.py``)."""
    g = normalize(gold)
    if guard.text_problem(g):
        return Verdict(correct=False, reason="refused")
    try:
        gold_node = parse_structure(g)
    except StructureError:
        return Verdict(correct=False, reason="gold-unparseable")
    answer = as_collection(boxes, gold_node)
    if answer is None:
        return Verdict(correct=False, reason="several")
    return check(answer, gold)


def _numeral_verdict(pred: str, gold: str, p: str, g: str) -> Verdict | None:
    """Clock times and decimal commas (``numerals.py``), read from the raw texts; None: not such."""
    p_time, g_time = clock_time(pred, p), clock_time(gold, g)
    if p_time is not None and g_time is not None:
        same = times_equal(g_time, p_time)
        return Verdict(correct=same, reason="equivalent" if same else "different")
    for comma, other in ((decimal_comma(pred), point_decimal(g)), (decimal_comma(gold), point_decimal(p))):
        if comma is not None and other is not None:
            return Verdict(correct=comma == other, reason="equivalent" if comma == other else "different")
    return None


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
    for child in getattr(node, "items", ()) or getattr(node, "parts", ()) or getattr(node, "values", ()):
        _leaves(child)
    for row in getattr(node, "rows", ()):
        for cell in row:
            _leaves(cell)


def nodes_equal(gold: Node, pred: Node) -> bool:
    """Structural dispatch of the policy (module docstring)."""
    if isinstance(gold, Record) or isinstance(pred, Record):
        return _records_equal(gold, pred)
    if isinstance(gold, Equation) or isinstance(pred, Equation):
        return equations_equal(gold, pred, nodes_equal)
    gold, pred = as_interval(gold), as_interval(pred)
    if isinstance(gold, Relation) or isinstance(pred, Relation):
        return isinstance(gold, Relation) and isinstance(pred, Relation) and relations_equal(gold, pred)
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
    if _matrix_expression(gold, pred):
        return _matrix_values_equal(gold, pred)  # A + B, 2A, AB of literal matrices
    if isinstance(gold, Matrix) or isinstance(pred, Matrix):
        return False
    if isinstance(gold, Based) or isinstance(pred, Based):
        return _based_equal(gold, pred)
    if isinstance(gold, Scalar) and isinstance(pred, Scalar):
        return _scalars_equal(gold.latex, pred.latex)
    return False


def _scalars_equal(gold: str, pred: str) -> bool:
    """Values of two leaves; undefined and infinite values only as the policy allows."""
    g_parts, p_parts = split_top(gold, _COLON), split_top(pred, _COLON)
    if len(g_parts) > 2 or len(p_parts) > 2:  # a:b:c is no number: 1:2:3 = 2:4:6 != 2:4:3
        return len(g_parts) == len(p_parts) and _proportional_parts(g_parts, p_parts)
    g, p = to_sympy(gold), to_sympy(pred)
    if g.has(*_NON_FINITE) or p.has(*_NON_FINITE):
        g_inf, p_inf = _INFINITY.fullmatch(gold.strip()), _INFINITY.fullmatch(pred.strip())
        return bool(g_inf and p_inf) and g_inf.group(1).replace("+", "") == p_inf.group(1).replace("+", "")
    return values_equal(g, p)


def _matrix_expression(gold: Node, pred: Node) -> bool:
    """Matrices or scalar leaves on both sides, and a leaf that writes a matrix (``\\begin{...}``)."""
    nodes = (gold, pred)
    return all(isinstance(n, (Matrix, Scalar)) for n in nodes) and any(
        isinstance(n, Scalar) and r"\begin{" in n.latex for n in nodes)


def _matrix_values_equal(gold: Node, pred: Node) -> bool:
    """A matrix (or matrix expression) against a matrix expression, entry by entry."""

    def entries(node: Node) -> sympy.ImmutableMatrix:
        if isinstance(node, Matrix):
            cells = [[to_sympy(c.latex) if isinstance(c, Scalar) else None for c in row] for row in node.rows]
            if any(c is None for row in cells for c in row):
                raise ParseError("matrix of non-scalars")
            return sympy.ImmutableMatrix(cells)
        return matrix_value(node.latex)

    g, p = entries(gold), entries(pred)
    return g.shape == p.shape and all(values_equal(a, b) for a, b in zip(g, p))


def _proportional_parts(gold: list[str], pred: list[str]) -> bool:
    """Ratios ``a:b:c``: the same parts up to one common factor (cross products agree), all finite."""
    g, p = [to_sympy(x) for x in gold], [to_sympy(x) for x in pred]
    if any(v.has(*_NON_FINITE) for v in g + p) or [v == 0 for v in g] != [v == 0 for v in p] or all(v == 0 for v in g):
        return False
    k = next(i for i, v in enumerate(g) if v != 0)
    return all(values_equal(g[i] * p[k], p[i] * g[k]) for i in range(len(g)))


def _same_set(gold: tuple[Node, ...], pred: tuple[Node, ...]) -> bool:
    """Equal as sets: every element of each side equals some element of the other."""
    return all(any(nodes_equal(g, p) for p in pred) for g in gold) and all(
        any(nodes_equal(g, p) for g in gold) for p in pred)


def _records_equal(gold: Node, pred: Node) -> bool:
    """Labelled values: by name against a record, in order against a tuple, as a set against a list."""
    if isinstance(gold, Record) and isinstance(pred, Record):
        g = {label_key(k): v for k, v in zip(gold.labels, gold.values)}
        p = {label_key(k): v for k, v in zip(pred.labels, pred.values)}
        return g.keys() == p.keys() and all(nodes_equal(g[k], p[k]) for k in g)
    if isinstance(gold, Record):
        values, other, flip = gold.values, pred, False
    else:
        values, other, flip = pred.values, gold, True
    if isinstance(other, Bracketed) and other.left + other.right == "()":
        pairs = zip(other.items, values) if flip else zip(values, other.items)
        return len(values) == len(other.items) and all(nodes_equal(a, b) for a, b in pairs)
    if isinstance(other, Unordered):
        return _same_set(other.items, values) if flip else _same_set(values, other.items)
    return False


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
        if lo.free_symbols or hi.free_symbols or lo.has(sympy.zoo, sympy.nan) or hi.has(sympy.zoo, sympy.nan):
            raise ParseError("symbolic or undefined interval")
        return sympy.Interval(lo, hi, left_open=node.left == "(", right_open=node.right == ")")
    if isinstance(node, Unordered) and all(isinstance(i, Scalar) for i in node.items):
        values = [to_sympy(i.latex) for i in node.items]
        if any(v.has(*_NON_FINITE) for v in values):
            raise ParseError("undefined element")
        return sympy.FiniteSet(*values)
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
