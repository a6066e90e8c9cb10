"""Scalar leaves: LaTeX -> sympy (via latex2sympy2_extended) and value comparison.

Order of comparison (``values_equal``), each step decisive where it applies:

1. structural equality of the sympy trees;
2. exact rationals: when both values are rational numbers they are compared exactly. Decimals in
   the LaTeX are rewritten to exact fractions *before* parsing (``0.333`` is 333/1000), so no float
   ever enters and ``1/2^{99}`` vs ``1/2^{98}`` or ``10^{-30}`` vs ``0`` stay distinct;
3. constants (no free symbols): both sides are evaluated to 50 significant digits and must agree to
   a relative 1e-30 (``\\sqrt{8}`` = ``2\\sqrt{2}``, ``\\log_2 8`` = 3). A decimal never equals an
   irrational (``3.14`` != ``\\pi``) because 3.14 is the rational 157/50;
4. expressions with symbols: the same symbols on both sides, then ``expand(a - b) == 0``; a
   nonzero constant difference is different; ratios of polynomials are decided exactly by
   ``cancel``; anything else (radicals, trig, logs) by agreement at several fixed random points
   with every symbol positive (``\\sqrt{1/n}`` = ``1/\\sqrt{n}``), plus agreement at negative
   points wherever both sides are real there (so ``|x|`` != ``x`` and ``\\sqrt{x^2}`` != ``x``).

``i`` is the imaginary unit and ``e`` Euler's number; symbol case is significant.
"""

from __future__ import annotations

import functools
import random
import re

import sympy
from latex2sympy2_extended import latex2sympy
from latex2sympy2_extended.latex2sympy2 import ConversionConfig

from rstar2_jax.rewards import guard

DIGITS = 50  # evaluation precision, significant digits
REL_TOL = sympy.Float("1e-30", DIGITS)
N_POSITIVE, N_NEGATIVE = 4, 3  # random evaluation points

_CONFIG = ConversionConfig(lowercase_symbols=False)
_DECIMAL = re.compile(r"(?<![\w.])(\d+)\.(\d+)(?![\d.])")
_PLAIN_NUMBER = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<dec>\d+(?:\.\d*)?|\.\d+)|\\frac\{(?P<num>\d+)\}\{(?P<den>\d+)\}"
    r"|(?P<snum>\d+)/(?P<sden>\d+))")


class ParseError(ValueError):
    """latex2sympy could not read the leaf, or the guard refused it."""


class Refused(ParseError):
    """The guard judged the leaf too expensive to evaluate."""


def _plain_number(text: str) -> sympy.Rational | None:
    """Integers, decimals and ``\\frac{a}{b}`` / ``a/b`` of integers, read exactly without the parser."""
    match = _PLAIN_NUMBER.fullmatch(text)
    if match is None:
        return None
    sign = -1 if match.group("sign") == "-" else 1
    if match.group("dec") is not None:
        return sign * sympy.Rational(match.group("dec"))
    num, den = match.group("num") or match.group("snum"), match.group("den") or match.group("sden")
    if int(den) == 0:
        return None
    return sign * sympy.Rational(int(num), int(den))


def _exact_decimals(latex: str) -> str:
    return _DECIMAL.sub(
        lambda m: rf"(\frac{{{m.group(1)}{m.group(2)}}}{{1{'0' * len(m.group(2))}}})", latex)


@functools.lru_cache(maxsize=4096)
def to_sympy(latex: str) -> sympy.Basic:
    """Parse one scalar leaf to an evaluated sympy expression (raises ``ParseError``/``Refused``)."""
    text = latex.strip()
    percent = text.endswith("%")
    if percent:
        text = text[:-1].strip()
    if not text or "%" in text or "\\circ" in text:  # percent/degree marks only end an item
        raise ParseError(f"cannot read {latex!r}")
    plain = _plain_number(text) if len(text) <= 200 else None
    if plain is not None:
        return plain * sympy.Rational(1, 100) if percent else plain
    problem = guard.text_problem(text)
    if problem:
        raise Refused(problem)
    try:
        expr = latex2sympy(_exact_decimals(text), normalization_config=None, conversion_config=_CONFIG)
    except Exception as exc:  # the ANTLR parser raises bare Exception
        raise ParseError(f"cannot read {latex!r}: {type(exc).__name__}") from None
    if not isinstance(expr, sympy.Expr):
        raise ParseError(f"{latex!r} is not a scalar ({type(expr).__name__})")
    problem = guard.tree_problem(expr)
    if problem:
        raise Refused(problem)
    expr = expr.replace(lambda e: isinstance(e, sympy.UnevaluatedExpr), lambda e: e.args[0])
    # Plain symbols (the parser attaches assumptions), with ``i`` the imaginary unit.
    renamed = {s: sympy.I if s.name == "i" else sympy.Symbol(s.name)
               for s in expr.free_symbols if isinstance(s, sympy.Symbol)}
    expr = expr.xreplace(renamed).doit()
    if percent:
        expr = expr * sympy.Rational(1, 100)
    return expr


@functools.lru_cache(maxsize=256)
def matrix_value(latex: str) -> sympy.ImmutableMatrix:
    """The explicit matrix that a matrix expression (``A + B``, ``2A``, ``AB`` of literal matrices) denotes."""
    problem = guard.text_problem(latex)
    if problem:
        raise Refused(problem)
    try:
        expr = latex2sympy(_exact_decimals(latex), normalization_config=None, conversion_config=_CONFIG)
    except Exception as exc:  # the ANTLR parser raises bare Exception
        raise ParseError(f"cannot read {latex!r}: {type(exc).__name__}") from None
    if not isinstance(expr, (sympy.MatrixBase, sympy.MatrixExpr)):
        raise ParseError(f"{latex!r} is not a matrix")
    problem = guard.tree_problem(expr)
    if problem:
        raise Refused(problem)
    try:
        value = expr.doit()
    except Exception as exc:  # shape mismatch and the like
        raise ParseError(f"cannot evaluate {latex!r}: {type(exc).__name__}") from None
    if not isinstance(value, sympy.MatrixBase):
        raise ParseError(f"{latex!r} is not an explicit matrix")
    renamed = {s: sympy.I if s.name == "i" else sympy.Symbol(s.name)
               for s in value.free_symbols if isinstance(s, sympy.Symbol)}
    return sympy.ImmutableMatrix(value.xreplace(renamed))


def _symbols(expr: sympy.Basic) -> frozenset[str]:
    return frozenset(s.name for s in expr.free_symbols)


def _number(expr: sympy.Basic) -> sympy.Expr | None:
    """Value to DIGITS digits, or None when it is not a finite number."""
    try:
        value = sympy.N(expr, DIGITS)
    except Exception:
        return None
    if not value.is_number or value.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return None
    return value


def _close(a: sympy.Expr, b: sympy.Expr) -> bool:
    scale = max(abs(a), abs(b))
    return bool(abs(a - b) <= REL_TOL * scale) if scale != 0 else True


def _points(names: frozenset[str], n: int, sign: int) -> list[dict[sympy.Symbol, sympy.Rational]]:
    """Fixed pseudo-random rational points, distinct per symbol (seeded by the symbol names)."""
    rng = random.Random(" ".join(sorted(names)) + str(sign))
    return [{sympy.Symbol(name): sign * sympy.Rational(rng.randint(1300, 4700), rng.choice((997, 1009, 1013)))
             for name in sorted(names)} for _ in range(n)]


def _is_real(value: sympy.Expr) -> bool:
    return abs(sympy.im(value)) <= REL_TOL * max(abs(value), 1)


def _agree_at_points(a: sympy.Expr, b: sympy.Expr, names: frozenset[str], relation) -> bool:
    """``relation(va, vb)`` at every positive point, and at negative points where both are real."""
    valid = 0
    for point in _points(names, N_POSITIVE, 1):
        va, vb = _number(a.xreplace(point)), _number(b.xreplace(point))
        if va is None and vb is None:
            continue
        if va is None or vb is None or not relation(va, vb):
            return False
        valid += 1
    if valid < 2:
        return False
    for point in _points(names, N_NEGATIVE, -1):
        va, vb = _number(a.xreplace(point)), _number(b.xreplace(point))
        if va is None or vb is None or not (_is_real(va) and _is_real(vb)):
            continue
        if not relation(va, vb):
            return False
    return True


def values_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Mathematical equality of two scalar values (module docstring gives the order)."""
    if a == b:
        return True
    if a.is_Rational and b.is_Rational:
        return False  # structurally different rationals are different numbers
    if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return False
    names = _symbols(a)
    if names != _symbols(b):
        return False
    if not names:
        va, vb = _number(a), _number(b)
        if va is None or vb is None:
            return _simplify(a - b) == 0
        # Closeness is necessary; a difference sympy can prove nonzero (pi/10^40 vs
        # pi/(10^40+1)) still rejects, so no tolerance can be fooled by a tiny offset.
        return _close(va, vb) and _simplify(a - b).is_zero is not False
    diff = _expand(a - b)
    if diff == 0:
        return True
    if not diff.free_symbols:
        return False  # a constant offset such as x vs x + 10^{-40}
    if _rational_function(diff):
        return _cancel(diff) == 0  # exact for polynomials and ratios of them
    if a.atoms(sympy.core.function.AppliedUndef) or b.atoms(sympy.core.function.AppliedUndef):
        return _simplify(a - b) == 0
    return _agree_at_points(a, b, names, _close)


def proportional(a: sympy.Expr, b: sympy.Expr, *, positive: bool) -> bool:
    """``a = c * b`` for a constant ``c`` != 0 (``c > 0`` when ``positive``): same equation/relation."""
    names = _symbols(a)
    if names != _symbols(b) or not names:
        return False
    if _expand(a - b) == 0 or (not positive and _expand(a + b) == 0):
        return True
    if _rational_function(a) and _rational_function(b):  # exact: the ratio must cancel to a constant
        ratio = _cancel(a / b)
        return not ratio.free_symbols and ratio != 0 and (not positive or bool(ratio > 0))
    ratios: list[sympy.Expr] = []

    def same_ratio(va: sympy.Expr, vb: sympy.Expr) -> bool:
        if vb == 0 or va == 0:
            return va == vb
        ratio = va / vb
        if positive and not (ratio.is_real and ratio > 0):
            return False
        ratios.append(ratio)
        return _close(ratios[0], ratio)

    return _agree_at_points(a, b, names, same_ratio) and bool(ratios)


def _rational_function(expr: sympy.Expr) -> bool:
    """A ratio of polynomials in the symbols with rational coefficients (no radicals, no pi)."""
    try:
        return bool(expr.is_rational_function()) and not expr.has(sympy.I) and all(
            n.is_Rational for n in expr.atoms(sympy.Number)) and not any(
            p.exp.is_Rational and not p.exp.is_Integer for p in expr.atoms(sympy.Pow))
    except Exception:
        return False


def _cancel(expr: sympy.Expr) -> sympy.Expr:
    try:
        return sympy.cancel(sympy.together(expr))
    except Exception:
        return expr


def _expand(expr: sympy.Expr) -> sympy.Expr:
    try:
        return sympy.expand(expr)
    except Exception:
        return expr


def _simplify(expr: sympy.Expr) -> sympy.Expr:
    try:
        return sympy.simplify(expr)
    except Exception:
        return expr
