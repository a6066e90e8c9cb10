"""The policy table (``rstar2_jax.testing.reward_cases``) through the pure ``check``, plus the structure it relies on."""

from __future__ import annotations

import collections

import pytest

from rstar2_jax.testing.reward_cases import CASES, NEEDS_TIMEOUT
from rstar2_jax.rewards.equivalence import Verdict, check
from rstar2_jax.rewards.normalize import normalize
from rstar2_jax.rewards.structure import Bracketed, Unordered, parse_structure

pytestmark = pytest.mark.fast

_FAST = [c for c in CASES if c.why not in NEEDS_TIMEOUT]


def test_case_table_is_large_and_covers_both_outcomes():
    assert len(CASES) >= 150
    counts = collections.Counter(c.expected for c in CASES)
    assert counts[True] >= 60 and counts[False] >= 60
    assert len({(c.gold, c.pred) for c in CASES}) == len(CASES), "duplicate case"


@pytest.mark.parametrize("case", _FAST, ids=[f"{i}-{c.why}" for i, c in enumerate(_FAST)])
def test_check_follows_policy(case):
    verdict = check(case.pred, case.gold)
    assert verdict.correct is case.expected, (case, verdict)


@pytest.mark.parametrize("gold,pred", [
    ("(1,2)", "\\{1,2\\}"), ("(1,2]", "(1,2)"), ("28", "28\\%"), ("\\pi", "3.14"),
    ("90^\\circ", "\\frac{\\pi}{2}"), ("\\frac{1}{2^{98}}", "\\frac{1}{2^{99}}"),
])
def test_every_trap_is_wrong_in_both_directions(gold, pred):
    assert not check(pred, gold).correct
    assert not check(gold, pred).correct


def test_reasons_say_why():
    assert check("5", "5") == Verdict(correct=True, reason="string")
    assert check("\\sqrt{8}", "2\\sqrt{2}") == Verdict(correct=True, reason="equivalent")
    assert check("6", "5") == Verdict(correct=False, reason="different")
    assert check("", "5") == Verdict(correct=False, reason="empty")
    assert check("\\frac{1}{2", "5") == Verdict(correct=False, reason="unparseable")
    assert check("5^{5^{5^{5^5}}}", "5") == Verdict(correct=False, reason="refused")
    assert check("1" * 10_000, "5").reason == "refused"
    assert check("5", "\\frac{1}{2").reason == "gold-unparseable"


def test_verdict_rejects_unknown_reason():
    with pytest.raises(ValueError, match="reason"):
        Verdict(correct=True, reason="close enough")


@pytest.mark.parametrize("raw,normal", [
    ("\\left( \\frac{3}{2},-13 \\right)", "(\\frac{3}{2}, -13)"),
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("10{,}000", "10000"), ("10,\\!080", "10080"), ("10\\,000", "10000"), ("1,000", "1000"),
    ("1, 000", "1, 000"),  # a list: the space keeps it from being a thousands separator
    (".5", "0.5"), ("90^{\\circ}", "90"), ("5.4 \\text{ cents}", "5.4"), ("\\$18.90", "18.90"),
    ("x \\in [-2,7]", "[-2, 7]"), ("28\\%", "28%"), ("\\frac 59", "\\frac{5}{9}"), ("\\sqrt2", "\\sqrt{2}"),
])
def test_normalize(raw, normal):
    assert normalize(raw) == normal
    assert normalize(normal) == normal  # idempotent


def test_structure_keeps_kinds_apart():
    assert parse_structure("(1,2)") == parse_structure("(1, 2)")
    assert isinstance(parse_structure("(1,2]"), Bracketed)
    assert isinstance(parse_structure("\\{1,2\\}"), Unordered)
    assert isinstance(parse_structure("1,2"), Unordered)
    pm = parse_structure("\\frac{-1\\pm\\sqrt{17}}{2}")
    assert isinstance(pm, Unordered) and len(pm.items) == 2
