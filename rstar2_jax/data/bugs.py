"""First attempts that fail, for the SFT traces of the noisy-tools regime (docs/design.md §10.1).

Real models' first programs fail in a few recurring ways; ``realistic_bug`` writes one of them for a
toy problem's correct one-line program, and ``naive_code`` writes the "obvious" program that is
correct but fails on some inputs. Every bug below was checked to fail in the real sandbox
(``tests/data/test_data_bugs.py``); what the sandbox answers (the traceback's last line) is what the
SFT trace shows as the tool response.

Bug classes (``BUG_CLASSES``):

* ``name_error``: a misspelt builtin (``pritn``) or a dropped ``import math`` -> NameError;
* ``wrong_name``: a function or method that does not exist (``math.gdc``, ``powmod``, ``xrange``,
  ``str.digits``) -> AttributeError / NameError;
* ``wrong_import``: a module that is not there (``import maths``, ``import sympy.digits``) ->
  ModuleNotFoundError (not ``from m import name``: its ImportError names the host's file path);
* ``off_by_one``: an index bound one too far (``range(len(s) + 1)``, ``range(1, n + 1)`` over a list of
  n items) -> IndexError; only kinds whose program indexes (digitsum, sumsq); others draw another class;
* ``syntax_error``: the closing parenthesis dropped -> SyntaxError.

Naive programs: ``sumsq`` as a recursive lambda, which exceeds the sandbox's recursion limit
(``SandboxLimits.recursion_limit``, 4000 by default) for large ``n`` and is correct below it.
"""

from __future__ import annotations

import dataclasses
import random
import re

from rstar2_jax.data.toy import ToyProblem

BUG_CLASSES = ("name_error", "wrong_name", "wrong_import", "off_by_one", "syntax_error")

_WRONG_NAMES = {  # kind -> (correct fragment, wrong fragment)
    "powmod": ("print(pow(", "print(powmod("),
    "gcd": ("math.gcd(", "math.gdc("),
    "lcm": ("math.lcm(", "math.lcd("),
    "sumsq": (" in range(", " in xrange("),
    "factmod": ("math.factorial(", "math.factorail("),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Bug:
    code: str  # the broken program (one line)
    bug_class: str  # one of BUG_CLASSES


def _sumsq_n(code: str) -> int:
    m = re.search(r"range\(1, (\d+)\+1\)", code)
    if m is None:
        raise ValueError(f"not a sumsq program: {code!r}")
    return int(m.group(1))


def _digitsum_power(code: str) -> str:
    m = re.search(r"str\((\d+\*\*\d+)\)", code)
    if m is None:
        raise ValueError(f"not a digitsum program: {code!r}")
    return m.group(1)


def _wrong_name(p: ToyProblem) -> str:
    if p.kind == "mul":  # print(a*b) -> math.mul(a, b)
        a, b = re.fullmatch(r"print\((\d+)\*(\d+)\)", p.code).groups()
        return f"import math; print(math.mul({a}, {b}))"
    if p.kind == "digitsum":  # a str method that does not exist
        power = _digitsum_power(p.code)
        return p.code.replace(f"str({power})", f"str({power}).digits()", 1)
    good, bad = _WRONG_NAMES[p.kind]
    if good not in p.code:
        raise ValueError(f"{p.kind} program {p.code!r} lacks {good!r}")
    return p.code.replace(good, bad, 1)


def _wrong_import(p: ToyProblem) -> str:
    if p.code.startswith("import math; "):
        return "import maths; " + p.code[len("import math; "):].replace("math.", "maths.")
    return "import sympy.digits; " + p.code  # ImportErrors with a path in the message would leak the host's


def _off_by_one(p: ToyProblem) -> str:
    if p.kind == "digitsum":
        return f"s = str({_digitsum_power(p.code)}); print(sum(int(s[i]) for i in range(len(s) + 1)))"
    n = _sumsq_n(p.code)
    return f"sq = [k*k for k in range(1, {n}+1)]; print(sum(sq[i] for i in range(1, {n}+1)))"


def _name_error(p: ToyProblem, rng: random.Random) -> str:
    options = [p.code.replace("print(", "pritn(", 1)]
    if p.code.startswith("import math; "):
        options.append(p.code[len("import math; "):])
    return rng.choice(options)


def realistic_bug(p: ToyProblem, rng: random.Random) -> Bug:
    """A failing first attempt at ``p``: a bug class drawn uniformly among those that apply to its kind."""
    classes = [c for c in BUG_CLASSES if c != "off_by_one" or p.kind in ("digitsum", "sumsq")]
    cls = rng.choice(classes)
    if cls == "name_error":
        code = _name_error(p, rng)
    elif cls == "wrong_name":
        code = _wrong_name(p)
    elif cls == "wrong_import":
        code = _wrong_import(p)
    elif cls == "off_by_one":
        code = _off_by_one(p)
    else:
        code = p.code[:-1]  # SyntaxError: '(' was never closed
    return Bug(code=code, bug_class=cls)


def naive_code(p: ToyProblem) -> str | None:
    """The obvious program for ``p`` that fails on some inputs, or None when its kind has none."""
    if p.kind == "sumsq":
        return f"f = lambda n: n*n + f(n-1) if n else 0; print(f({_sumsq_n(p.code)}))"
    return None
