"""String normalisation of a LaTeX final answer (no parsing, no sympy).

``normalize(latex)`` rewrites notation that carries no mathematical content into one canonical
spelling, so equal answers written differently become equal strings and the structural parser
(``structure.py``) sees one form. What it removes or rewrites is the policy's "presentation" part:

* ``$``, ``\\$`` (currency), ``\\displaystyle``, ``\\left``/``\\right`` (and ``\\bigl`` ...), outer
  TeX grouping braces (``{5}`` is 5; a set is written ``\\{5\\}``),
  spacing commands (``\\,`` ``\\;`` ``\\:`` ``\\!`` ``\\quad`` ``~`` ``\\ ``), font wrappers around
  math (``\\mathrm{x}`` -> ``x``, ``\\boldsymbol``), ``\\dfrac``/``\\tfrac``/``\\cfrac`` -> ``\\frac``,
  ``\\frac12`` -> ``\\frac{1}{2}``, ``\\sqrt2`` -> ``\\sqrt{2}``, ``\\le``/``\\leq``/``\\leqslant``.
* thousands separators between digit groups: ``10{,}000``, ``10,\\!000``, ``10\\,000``, ``10\\ 000``
  (and a bare ``1,000`` when the whole item is such a number; see ``strip_thousands``).
* ``.5`` -> ``0.5``; a trailing sentence period; unicode minus/times/pi/infinity.
* degree marks (``^\\circ``, ``^{\\circ}``, ``°``, ``\\text{ degrees}``) are dropped (policy: the
  degree sign annotates the unit the question asked for; it never converts to radians).
* trailing unit text (``5.4 \\text{ cents}``, ``864 \\mbox{ inches}^2``) is dropped; a percent sign
  is kept as ``%`` (it changes the value: ``28%`` is ``0.28``).
* ``x \\in [a, b]`` -> ``[a, b]`` (the membership prefix names the variable, not the answer).
* math delimiters ``\\( \\)`` ``\\[ \\]``; ASCII and variant relations (``>=``, ``=<``, ``!=``,
  ``\\geqslant``, ``\\neq``) -> ``\\ge``/``\\le``/``\\ne``; ``percent``/``pct``/``percentage``
  after a number -> ``%``; text macros around a number (``\\textbf{5}``, ``\\mbox{5}``) are
  unwrapped; a plain space between digit groups (``1 000 000``) is a thousands separator;
  ``\\operatorname{sin}``/``\\mathrm{lcm}`` are the functions ``\\sin``/``\\lcm``.
"""

from __future__ import annotations

import re

_FONT = r"\\(?:mathrm|mathbf|mathit|mathsf|mathtt|mathnormal|boldsymbol|bm)"
_TEXT = r"\\(?:text|textrm|textbf|textit|textsf|texttt|textnormal|textup|textsl|textmd|mbox|hbox)"

_SIMPLE_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("\u2212", "-"), ("\u2013", "-"), ("\u00d7", r"\times "), ("\u00b7", r"\cdot "),
    ("\u03c0", r"\pi "), ("\u221e", r"\infty "), ("\u2264", r"\le "), ("\u2265", r"\ge "),
    ("\u00b0", r"^\circ"), ("\u221a", r"\sqrt"), ("\u222a", r"\cup "), ("\u2260", r"\ne "),
    (r"\dfrac", r"\frac"), (r"\tfrac", r"\frac"), (r"\cfrac", r"\frac"),
    (r"\dbinom", r"\binom"), (r"\tbinom", r"\binom"),
    (r"\geqq", r"\ge "), (r"\leqq", r"\le "), (r"\leqslant", r"\le "), (r"\geqslant", r"\ge "),
    (r"\leq", r"\le "), (r"\geq", r"\ge "),
    (r"\neq", r"\ne "), (r"\lbrace", r"\{"), (r"\rbrace", r"\}"), (r"\lbrack", "["), (r"\rbrack", "]"),
    (r"\varnothing", r"\emptyset"), (r"\infinity", r"\infty"), (r"\displaystyle", ""),
    (r"\textstyle", ""), (r"\scriptstyle", ""),
    (r"\lvert", "|"), (r"\rvert", "|"), (r"\vert", "|"), (r"\mid", "|"),
    ("\u2a7d", r"\le "), ("\u2a7e", r"\ge "), ("\u00b2", "^2"), ("\u00b3", "^3"),
    (r"\not=", r"\ne "), (r"\not =", r"\ne "),
)
_MATH_DELIM = re.compile(r"(?<!\\)\\[()\[\]]")
_INFINITY_WORD = re.compile(r"(?<![a-zA-Z\\])infinity(?![a-zA-Z])")
# \operatorname{sin}, \mathrm{lcm}: a function written as an operator name is the function.
_NAMED_FUNCTION = re.compile(r"\\(?:operatorname|mathrm)\s*\{\s*(sin|cos|tan|cot|sec|csc|arcsin|arccos"
                             r"|arctan|sinh|cosh|tanh|log|ln|exp|lcm|gcd|max|min|det)\s*\}")
# ASCII relations; ``!=`` after a digit or a closing bracket is a factorial followed by ``=``.
_ASCII_REL = ((re.compile(r">="), r"\\ge "), (re.compile(r"<=|=<"), r"\\le "),
              (re.compile(r"(?<![\d)}!])!="), r"\\ne "))
_SIZED_DELIM = re.compile(r"\\(?:left|right|[bB]igg?[lr]?|middle)\s*(\\[{}|]|[()\[\]|.]|\\[lr]angle)")
_OPEN_DELIM_DOT = re.compile(r"\\(?:left|right|[bB]igg?[lr]?|middle)\s*\.$")  # "\right." is no period
_THOUSANDS_LATEX = re.compile(r"(?<=\d)(?:\s*\{\s*,\s*\}\s*|,\s*\\!\s*|\\[,;: ]\s*|~)(?=\d{3}(?!\d))")
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad\b|~")
# A degree mark only where a unit can stand: after a number/closing group, before the end of an item.
_DEGREE = re.compile(
    r"(?<=[\w}).])\s*(?:\^\s*\{?\s*\\circ\s*\}?|\\circ\b|\\degree\b|" + _TEXT
    + r"\{\s*(?:degrees?|deg)\s*\})(?=\s*(?:$|[,;)\]]|\\\}|\\cup\b|" + _TEXT + r"\{))"
)
_PERCENT_WORD = r"(?:percent(?:age)?|per\s?cent|pct)"
_PERCENT = re.compile(r"\\%|" + _TEXT + r"\{\s*(?:" + _PERCENT_WORD + r"|\\%|%)\s*\}|(?<=[\d}])\s*"
                      + _PERCENT_WORD + r"(?![a-zA-Z])")
_TEXT_OPEN = re.compile(_TEXT + r"\s*\{")
_TEXT_WORD = re.compile(_TEXT + r"\s*\{\s*(,?)\s*(and|or)\s*\}")  # \textrm{ and } -> \text{and}
# A unit: trailing text after some math, optionally squared/cubed (``\mbox{ cm}^2``).
_TRAILING_UNIT = re.compile(_TEXT + r"\{[^{}]*\}(?:\s*\^\s*\{?\d\}?)?\s*$")
# ... or a unit word in a math font (``5\mathrm{km}``, ``\operatorname{cm}^2``; not the constants e, i).
_MATH_UNIT = re.compile(r"(?<=[\d}.\s])\s*\\(?:mathrm|operatorname)\s*\{\s*~?\s*(?:[a-zA-Z]{2,}|[mgsLhKNJWVA])"
                        r"[a-zA-Z ./]*\}(?:\s*\^\s*\{?\d\}?)?\s*$")  # one letter: an SI symbol only
# ... or a plain unit word of two or more letters after a number (``125 miles``, ``3 cm^2``).
_PLAIN_UNIT = re.compile(
    r"(?<=[\d}])\s*(?:cm|mm|km|kg|mg|ft|mph|kmh|km/h|m/s|sq units|square units|units?|miles?|feet|foot"
    r"|inch(?:es)?|yards?|meters?|metres?|grams?|liters?|litres?|seconds?|minutes?|hours?|days?|weeks?"
    r"|months?|years?|dollars?|cents?|yuan|euros?|points?|degrees?)(?:\s*\^\s*\{?\d\}?)?\s*$")
_FRAC_SHORT = (
    (re.compile(r"\\frac\s*(\d)\s*(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac\s*(\d)\s*\{"), r"\\frac{\1}{"),
    (re.compile(r"\\frac\s*\{([^{}]*)\}\s*(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac\s*([a-zA-Z])\s*([a-zA-Z0-9])"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\sqrt\s*(\d|[a-zA-Z](?![a-zA-Z]))"), r"\\sqrt{\1}"),
)
_LEADING_DOT = re.compile(r"(?<![\d}])\.(\d)")
_MEMBERSHIP = re.compile(r"^\s*[a-zA-Z]\s*\\in(?![a-zA-Z])\s*")
_WS = re.compile(r"\s+")
_COMMA_NUMBER = re.compile(r"^[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")  # 0,111 is no thousands
_SPACE_THOUSANDS = re.compile(r"(?<![\w.,^_])\d{1,3}(?: \d{3})+(?![\d])")


def matching_braces(text: str) -> dict[int, int]:
    """Index of each ``{`` -> index of its ``}``, in one pass (escaped ``\\{``/``\\}`` are skipped)."""
    pairs, stack, i = {}, [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2
            continue
        if text[i] == "{":
            stack.append(i)
        elif text[i] == "}" and stack:
            pairs[stack.pop()] = i
        i += 1
    return pairs


def _unwrap_command(text: str, command: str) -> str:
    """Replace every ``<command>{body}`` by ``body`` (an unclosed one and what follows stay)."""
    pattern = re.compile(command + r"\s*\{")
    while True:
        match = pattern.search(text)
        end = matching_braces(text).get(match.end() - 1) if match else None
        if end is None:
            return text
        text = text[:match.start()] + text[match.end():end] + text[end + 1:]


def _unwrap_text_math(text: str) -> str:
    """``\\textbf{5}``, ``\\mbox{\\frac{3}{4}}`` -> the math inside (a text macro without words in it)."""
    start = 0
    for _ in range(64):  # a handful in any real answer; the guard refuses long ones later
        match = _TEXT_OPEN.search(text, start)
        if match is None:
            return text
        end = matching_braces(text).get(match.end() - 1)
        if end is None:
            return text
        body = text[match.end():end]
        if body.strip() and not re.search(r"[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", body)):
            text = text[:match.start()] + body + text[end + 1:]
            start = match.start()
        else:
            start = match.end()
    return text


def strip_thousands(item: str) -> str:
    """``1,000`` / ``-12,345.5`` -> digits, when the whole item is one comma-grouped number.

    A comma followed by a space (``1, 000``) is a list separator, never a thousands separator.
    """
    return item.replace(",", "") if _COMMA_NUMBER.match(item) else item


def strip_units(text: str) -> str:
    """Drop trailing unit annotations (``\\text{...}``, ``\\mathrm{km}``, ``miles``) that follow some math."""
    while True:
        match = _TRAILING_UNIT.search(text) or _MATH_UNIT.search(text) or _PLAIN_UNIT.search(text)
        before = text[:match.start()].rstrip() if match else ""
        if not before or before.endswith((",", ";")):  # a unit follows some math, not a comma
            return text
        text = text[:match.start()].rstrip()


def normalize(latex: str) -> str:
    """Canonical spelling of a final answer (see module docstring); idempotent."""
    text = latex.replace("\n", " ").replace("\t", " ").strip()
    text = text.replace(r"\$", "").replace("$", "").replace("\u20ac", "").replace("\u00a3", "")  # $, euro, pound
    text = _MATH_DELIM.sub(" ", text).strip()
    if text.endswith(".") and not _OPEN_DELIM_DOT.search(text):
        text = text[:-1].rstrip()  # sentence period
    if text.endswith((",", ";")) and not text.endswith(("\\,", "\\;")):
        text = text[:-1].rstrip()  # sentence punctuation
    for old, new in _SIMPLE_REPLACEMENTS:
        text = text.replace(old, new)
    for pattern, repl in _ASCII_REL:
        text = pattern.sub(repl, text)
    text = _NAMED_FUNCTION.sub(lambda m: f"\\{m.group(1)} ", text)
    text = _INFINITY_WORD.sub(r"\\infty ", text)
    text = _strip_group(text.strip())
    text = _SIZED_DELIM.sub(lambda m: "" if m.group(1) == "." else m.group(1), text)
    text = text.replace(r"\left.", "").replace(r"\right.", "")
    text = _THOUSANDS_LATEX.sub("", text)
    text = _SPACING.sub(" ", text)
    text = _DEGREE.sub("", text)
    text = _PERCENT.sub("%", text)
    text = _TEXT_WORD.sub(lambda m: rf" \text{{{m.group(1)}{m.group(2)}}} ", text)
    text = _unwrap_text_math(text)
    text = strip_units(text)
    text = _unwrap_command(text, _FONT)
    for pattern, repl in _FRAC_SHORT:
        text = pattern.sub(repl, text)
    text = _LEADING_DOT.sub(r"0.\1", text)
    text = _MEMBERSHIP.sub("", text)
    text = _WS.sub(" ", text).strip()
    text = _SPACE_THOUSANDS.sub(lambda m: m.group(0).replace(" ", ""), text)
    text = strip_thousands(text)
    text = re.sub(r"\s*([=+\-^_{}()\[\]!])\s*", r"\1", text)
    text = re.sub(r"\s*,\s*", ", ", text).strip()  # the space keeps "1, 000" a list
    return _strip_group(text)


def _strip_group(text: str) -> str:
    """``{5}`` -> ``5``: outer TeX grouping braces, not a set (a set is written ``\\{5\\}``)."""
    for _ in range(32):  # deeper nesting is refused by the guard anyway
        if not (text.startswith("{") and matching_braces(text).get(0) == len(text) - 1):
            break
        text = text[1:-1].strip()
    return text
