"""PRIME's answer grader (``math_equal``), re-implemented from its published description; no JAX.

The released rStar2-Agent reward (``grader="release"``, docs/design.md §4, §9) calls a response right
if PRIME's grader accepts the extracted answer *or* math-verify accepts the whole response
(``release_grader.py``). This module is the first half. ``prime_grade(pred, gold)`` is what the
release runs on the answer ``match_answer`` extracted: a normalised string comparison (PRIME's
``grade_answer``), then ``math_equal``, once more with π read as 3.14 when either side has ``\\pi``.

``math_equal(pred, ref)``, in order (the first stage that says yes decides; the numeric stage also
decides no):

1. *Light normalisation* of both sides: ``$5`` -> ``5``, ``15%`` / ``15\\%`` -> ``15`` (only a bare
   number with a percent sign), a subscript base ``101_2`` -> its decimal value ``5``, ``\\pi`` -> its
   numeric value (``pi``, 3.14159... or 3.14). Then equal strings (case- and space-insensitive) -> yes.
2. *Multiple choice*: a gold that is one letter A-E matches a prediction whose last capital A-E is it.
3. *Numbers*: both sides plain numbers (commas removed, a trailing ``%`` divides by 100) -> equal iff
   the prediction is within relative tolerance 1e-4 of gold, gold / 100 or gold x 100 (so ``28`` =
   ``0.28`` = ``2800`` against gold 28, and ``5.00001`` = ``5``); not equal otherwise.
4. *Structures*: a ``pmatrix`` prediction against a ``{a, b}`` gold turns the gold into a column
   ``pmatrix``; ``[...]`` against ``(...)`` compares with the brackets dropped; two bracketed lists
   compare element by element (so intervals ignore open/closed ends: ``(1,2]`` = ``[1,2)``); two
   ``pmatrix``/``bmatrix`` compare cell by cell after a shape check.
5. *Equations*: two equations ``a = b`` compare ``a - b`` symbolically, up to sign; ``x = 5`` against
   ``5`` (a name of at most two characters) compares the right-hand side, both ways.
6. *Symbolic*: both sides parsed as LaTeX; equal if the parsed expressions are identical, their
   difference simplifies to 0, both are equations with equal ``|lhs - rhs|``, their numeric values
   agree within relative tolerance 1e-4, or they are matrices equal after rounding to 3 decimals.

Departures from the original (kept deliberately small):

* No time-outs here: the release wraps the symbolic stage in its own time-out; here the whole check
  runs inside the verifier's worker (``worker.py``), which gives this half its share of the case's
  soft alarm and the pool's hard wall limit (a check stuck in C code is killed; it scores 0).
* Nothing is ``eval``'d: the original falls back to ``sympy.parse_expr`` (Python ``eval``) on text the
  LaTeX parser rejects; here such a side is compared as a string only. LaTeX is read by
  latex2sympy2_extended (the parser math-verify and ``equivalence.py`` use), not sympy's own.
* Answers the input guard refuses (``guard.py``: exponent towers, huge integers, deep nesting) skip
  the symbolic stage and are not equal (the original would usually time out: the same 0).
* ``grade_answer`` (PRIME's first test, from PRM800K) is approximated by the MATH-style string
  normalisation (``strip_string``) and equal strings; its own sympy-on-plain-text test is covered by
  the symbolic stage of ``math_equal``.
* Lists split on top-level commas (the original splits on every comma), and a list must both start
  and end with a bracket.
"""

from __future__ import annotations

import math
import re

import sympy

from rstar2_jax.rewards import guard

REL_TOL = 1e-4  # the original's relative tolerance for numbers
PI_VALUES = (math.pi, 3.14)  # the release grades answers with \pi twice: exact pi, then pi = 3.14
MAX_LEN = 1000  # the original cuts longer predictions to this many characters
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_BASE = re.compile(r"^\s*([0-9A-Za-z]+)_\{?(\d+)\}?\s*$")
_PI = re.compile(r"\\pi(?![a-zA-Z])")
_MATRIX = re.compile(r"^\\begin\{([pb]matrix)\}(.*)\\end\{\1\}$", re.S)


# --- PRIME's first test: MATH-style normalisation, then equal strings ------------------------------------------
def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, rest = part[0], part[1:]
        if rest.startswith("{"):
            out += "{" + a + "}" + rest
        else:
            out += "{" + a + "}{" + rest[0] + "}" + rest[1:]
    return out


def _fix_slash(s: str) -> str:
    m = re.fullmatch(r"(-?\d+)/(\d+)", s)
    return f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}" if m else s


def strip_string(s: str) -> str:
    """The MATH benchmark's answer normalisation (as PRIME and qwen2.5-math use it), re-written."""
    s = str(s).replace("\n", "").rstrip(".").replace("\\!", "")
    s = s.replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    units = s.rfind("\\text{ ")
    if units > 0:  # "5 \\text{ cm}" -> "5 "
        s = s[:units]
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    if s.count("=") == 1 and len(s.split("=")[0].strip()) <= 2:  # "k = 5" -> "5"
        s = s.split("=")[1]
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_slash(s)


def grade_answer(pred: str, gold: str) -> bool:
    """PRIME's first, string-level test (approximated: module docstring)."""
    if not pred or not gold:
        return False
    p, g = strip_string(pred), strip_string(gold)
    if p == g:
        return True
    pi, gi = _bracketed_items(p), _bracketed_items(g)
    return pi is not None and gi is not None and p[0] + p[-1] == g[0] + g[-1] and len(pi) == len(gi) and all(
        strip_string(a) == strip_string(b) for a, b in zip(pi, gi))


# --- math_equal -------------------------------------------------------------------------------------------------
def _number(s: str) -> float | None:
    """A plain number (commas dropped, a trailing % divides by 100), else None."""
    s = s.strip().replace(",", "")
    percent = s.endswith("%")
    if percent:
        s = s[:-1].rstrip("\\").strip()
    if not _NUMBER.fullmatch(s):
        return None
    try:
        value = float(s)
    except (ValueError, OverflowError):
        return None
    if not math.isfinite(value):
        return None
    return value / 100 if percent else value


def _from_base(digits: str, base: int) -> str | None:
    if not 2 <= base <= 36:
        return None
    try:
        return str(int(digits, base))
    except ValueError:
        return None


def _light_normalize(s: str, pi: float) -> str:
    s = s.strip()
    if re.match(r"\$\d+(\.\d+)?", s):
        return s[1:]
    if re.fullmatch(r"\d+(\.\d+)?\\?%", s):
        return s.replace("\\%", "").replace("%", "")
    m = _BASE.match(s)
    if m:
        converted = _from_base(m.group(1), int(m.group(2)))
        if converted is not None:
            s = converted
    if _PI.search(s):
        s = re.sub(r"(?<=[\d}\)])\s*\\pi(?![a-zA-Z])", r"\\cdot \\pi", s)
        s = _PI.sub(f"{{{pi!r}}}", s)
    return s


def _choice(pred: str) -> str | None:
    letters = re.findall(r"(?<![A-Za-z])([A-E])(?![A-Za-z])", pred.upper().rstrip(".").strip("/"))
    return letters[-1] if letters else None


def _split_top(s: str, sep: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            out.append(s[start:i])
            start = i + len(sep)
    out.append(s[start:])
    return out


def _bracketed_items(s: str) -> list[str] | None:
    s = s.strip()
    if len(s) < 2 or s[0] not in "([" or s[-1] not in ")]":
        return None
    return [x.strip() for x in _split_top(s[1:-1], ",")]


def _matrix_cells(s: str) -> list[list[str]] | None:
    m = _MATRIX.match(s.strip())
    if not m:
        return None
    rows = [r for r in (x.strip() for x in m.group(2).split("\\\\")) if r]
    return [[c.strip() for c in r.split("&")] for r in rows]


def _to_pmatrix(s: str) -> str:
    """``{a, b}`` -> a column ``pmatrix`` (the original's conversion of a brace vector)."""
    m = re.fullmatch(r"\s*\\?\{(.*,.*)\\?\}\s*", s, re.S)
    if not m:
        return s
    return "\\begin{pmatrix}" + "\\\\".join(x.strip() for x in _split_top(m.group(1), ",")) + "\\end{pmatrix}"


def math_equal(pred: str | None, ref: str | None, *, include_percentage: bool = True,
               tolerance: float = REL_TOL, pi: float = math.pi) -> bool:
    """PRIME / qwen2.5-math ``math_equal`` (module docstring); never raises on odd input text."""
    if pred is None or ref is None:
        return False
    pred, ref = _light_normalize(str(pred)[:MAX_LEN], pi), _light_normalize(str(ref), pi)
    if pred.strip().lower() == ref.strip().lower() or pred.replace(" ", "") == ref.replace(" ", ""):
        return True
    if ref.strip() in ("A", "B", "C", "D", "E") and _choice(pred) == ref.strip():
        return True
    p_num, r_num = _number(pred), _number(ref)
    if p_num is not None and r_num is not None:
        targets = (r_num / 100, r_num, r_num * 100) if include_percentage else (r_num,)
        return any(math.isclose(t, p_num, rel_tol=tolerance) for t in targets)
    if not ref.strip() or not pred.strip():
        return False
    pred, ref = pred.strip(), ref.strip()
    if "pmatrix" in pred and "pmatrix" not in ref:
        ref = _to_pmatrix(ref)
    p_s, r_s = pred, ref
    if (p_s[:1] == "[" and p_s[-1:] == "]" and r_s[:1] == "(" and r_s[-1:] == ")") or \
            (p_s[:1] == "(" and p_s[-1:] == ")" and r_s[:1] == "[" and r_s[-1:] == "]"):
        p_s, r_s = p_s.strip("[]()"), r_s.strip("[]()")
    for ch in "{}()":
        p_s, r_s = p_s.replace(ch, ""), r_s.replace(ch, "")
    if p_s.lower() == r_s.lower():
        return True
    kw = {"include_percentage": include_percentage, "tolerance": tolerance, "pi": pi}
    p_items, r_items = _bracketed_items(pred), _bracketed_items(ref)
    if p_items is not None and r_items is not None and len(p_items) == len(r_items) and len(p_items) > 1:
        if all(math_equal(a, b, **kw) for a, b in zip(p_items, r_items)):
            return True
    p_cells, r_cells = _matrix_cells(pred), _matrix_cells(ref)
    if p_cells is not None and r_cells is not None:
        if [len(r) for r in p_cells] == [len(r) for r in r_cells] and all(
                math_equal(a, b, **kw) for pr, rr in zip(p_cells, r_cells) for a, b in zip(pr, rr)):
            return True
    if pred.count("=") == 1 and ref.count("=") == 1:
        p_l, p_r = pred.split("=")
        r_l, r_r = ref.split("=")
        p_expr, r_expr = f"{p_l.strip()} - ({p_r.strip()})", f"{r_l.strip()} - ({r_r.strip()})"
        if symbolic_equal(p_expr, r_expr, tolerance) or symbolic_equal(f"-({p_expr})", r_expr, tolerance):
            return True
    elif pred.count("=") == 1 and len(pred.split("=")[0].strip()) <= 2 and "=" not in ref:
        if math_equal(pred.split("=")[1], ref, **kw):
            return True
    elif ref.count("=") == 1 and len(ref.split("=")[0].strip()) <= 2 and "=" not in pred:
        if math_equal(pred, ref.split("=")[1], **kw):
            return True
    return symbolic_equal(pred, ref, tolerance)


def _parse(s: str) -> sympy.Basic | None:
    """LaTeX -> sympy (latex2sympy2_extended), or None (unparseable or refused by the guard)."""
    from latex2sympy2_extended import latex2sympy

    s = s.replace("\\\\", "\\")
    if guard.text_problem(s):
        return None
    try:
        expr = latex2sympy(s)
    except Exception:  # noqa: BLE001 - an unreadable side is compared as a string only
        return None
    if not isinstance(expr, sympy.Basic) or guard.tree_problem(expr):
        return None
    return expr


def _close(a: sympy.Basic, b: sympy.Basic, tolerance: float) -> bool:
    try:
        x, y = complex(sympy.N(a)), complex(sympy.N(b))
    except (TypeError, ValueError, AttributeError, OverflowError, ZeroDivisionError):
        return False
    if not all(map(math.isfinite, (x.real, x.imag, y.real, y.imag))):
        return False
    return abs(x - y) <= tolerance * max(abs(x), abs(y)) or x == y


def symbolic_equal(a: str, b: str, tolerance: float = REL_TOL) -> bool:
    """The original's last stage: both sides parsed as LaTeX, then the tests of the module docstring."""
    ea, eb = _parse(a), _parse(b)
    if ea is None or eb is None:
        return False
    tests = (
        lambda: ea == eb or str(ea) == str(eb),
        lambda: bool(ea.equals(eb)) or sympy.simplify(ea - eb) == 0,
        lambda: isinstance(ea, sympy.Eq) and isinstance(eb, sympy.Eq) and bool(
            sympy.Abs(ea.lhs - ea.rhs).equals(sympy.Abs(eb.lhs - eb.rhs))),
        lambda: _close(ea, eb, tolerance),
        lambda: isinstance(ea, sympy.MatrixBase) and isinstance(eb, sympy.MatrixBase) and ea.shape == eb.shape
        and bool(ea.applyfunc(lambda x: sympy.Float(x).round(3) if x.is_number else x).equals(
            eb.applyfunc(lambda x: sympy.Float(x).round(3) if x.is_number else x))),
    )
    for test in tests:
        try:
            if test():
                return True
        except Exception:  # noqa: BLE001 - the original tries each test and moves on
            continue
    return False


def prime_grade(pred: str | None, gold: str) -> bool:
    """The release's PRIME half on an extracted answer: ``grade_answer``, then ``math_equal``
    (with \\pi as pi and as 3.14 when either side has ``\\pi``)."""
    if pred is None:
        return False
    if grade_answer(pred, gold):
        return True
    pis = PI_VALUES if "\\pi" in pred or "\\pi" in gold else (math.pi,)
    return any(math_equal(pred, gold, pi=pi) for pi in pis)
