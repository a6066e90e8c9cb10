"""Input guard: refuse answers whose parsing or evaluation could be absurdly expensive.

Two layers, both cheap. ``text_problem`` looks at the LaTeX before it reaches the parser (length,
bracket nesting, exponent towers ``a^{b^{c^{d}}}``). ``tree_problem`` walks the parsed sympy tree
*without evaluating it* and bounds the size of every integer it would produce (``10^{10^{10}}``,
``100000!``, ``x^{10^{9}}``). A refused answer is still compared structurally (normalised string
equality, done before any parsing) and otherwise scores 0. The guard is a courtesy that keeps the
common case fast; the hard guarantee is the out-of-process timeout in ``verify.py``.
"""

from __future__ import annotations

import math

import sympy

MAX_CHARS = 1000  # longest answer (after normalisation) that is parsed at all
MAX_DEPTH = 10  # deepest bracket nesting, e.g. \log(\log(\log(...)))
MAX_TOWER = 2  # a^{b^{c}} is the highest exponent tower parsed
MAX_BITS = 100_000  # largest integer (in bits) an answer may denote, about 30k digits
MAX_EXPONENT = 10_000  # largest exponent of a symbolic base (x^{10^9} would stall expand())
MAX_NODES = 2_000  # largest expression tree


def text_problem(latex: str) -> str | None:
    """Why ``latex`` must not be parsed, or None."""
    if len(latex) > MAX_CHARS:
        return f"longer than {MAX_CHARS} characters"
    depth = max_depth = 0
    tower: list[int] = []  # exponent height of each open brace
    height = max_height = 0
    pending_exp = False
    for ch in latex:
        if ch == "^":
            max_height = max(max_height, height + 1)
            pending_exp = True
            continue
        if ch in "{([":
            depth += 1
            max_depth = max(max_depth, depth)
            tower.append(height)
            if ch == "{" and pending_exp:
                height += 1
        elif ch in "})]":
            depth -= 1
            height = tower.pop() if tower else 0
        pending_exp = pending_exp and ch.isspace()
    if max_depth > MAX_DEPTH:
        return f"brackets nested deeper than {MAX_DEPTH}"
    if max_height > MAX_TOWER:
        return f"exponent tower higher than {MAX_TOWER}"
    return None


def _log2_bound(expr: sympy.Basic) -> float:
    """Upper bound on log2|value| of a numeric subtree (0 for symbols); inf when unbounded."""
    if expr.is_Integer:
        return float(abs(int(expr)).bit_length())
    if expr.is_Rational:
        return float(max(abs(expr.p).bit_length(), expr.q.bit_length()))
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        exp_bits = _log2_bound(exp)
        if exp_bits > 64:
            return math.inf
        exp_value = 2.0 ** exp_bits
        if base.free_symbols:
            return math.inf if exp_value > MAX_EXPONENT else 0.0
        return max(_log2_bound(base), 1.0) * exp_value
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.gamma, sympy.subfactorial)):
        arg_bits = _log2_bound(expr.args[0])
        if arg_bits > 64:
            return math.inf
        n = 2.0 ** arg_bits
        return n * max(math.log2(n), 1.0)
    if not expr.args:
        return 0.0
    return sum(_log2_bound(a) for a in expr.args) + len(expr.args)


def tree_problem(expr: sympy.Basic) -> str | None:
    """Why the (unevaluated) sympy tree ``expr`` must not be evaluated, or None."""
    if not isinstance(expr, sympy.Basic):
        return None
    if sum(1 for _ in zip(range(MAX_NODES + 1), sympy.preorder_traversal(expr))) > MAX_NODES:
        return f"more than {MAX_NODES} nodes"
    if _log2_bound(expr) > MAX_BITS:
        return f"denotes a number over {MAX_BITS} bits or a huge power"
    return None
