"""The answer forms of issue 14, class by class, each in both directions: the correct form verifies,
and a near miss (other value, other count of answers, swapped tuple) does not."""

from __future__ import annotations

import itertools

import pytest

from rstar2_jax.rewards.equivalence import check
from rstar2_jax.rewards.extract import extract_answer
from rstar2_jax.rewards.normalize import normalize

pytestmark = pytest.mark.fast


def _both(a: str, b: str) -> tuple[bool, bool]:
    return check(a, b).correct, check(b, a).correct


def _equal_all(forms: list[str]) -> list[tuple[str, str]]:
    """Pairs of ``forms`` that do not verify against each other (should be none)."""
    return [(a, b) for a, b in itertools.permutations(forms, 2) if not check(a, b).correct]


def _graded(response: str, gold: str):
    extraction = extract_answer(response)
    assert extraction.answer is not None, response
    return check(extraction.answer, gold)


# --- 1. undefined values and clock times ---------------------------------------------------------

@pytest.mark.parametrize("a,b", [
    ("\\frac{3}{0}", "\\frac{5}{0}"), ("7:0", "2:0"), ("\\frac{3}{0}", "\\frac{3}{0}"), ("0/0", "0/0"),
    ("\\frac{1}{0}", "\\infty"), ("\\frac{-1}{0}", "-\\infty"), ("5", "\\frac{5}{0}"), ("3/0", "\\frac{6}{0}"),
    ("(1, \\frac{1}{0})", "(1, \\frac{2}{0})"), ("\\frac{x}{0}", "\\frac{y}{0}"),
    ("x < \\frac{1}{0}", "x < \\frac{2}{0}"),
    ("(0, \\frac{1}{0})", "(0, \\infty)"), ("\\{\\frac{1}{0}\\}", "\\{\\frac{2}{0}\\}"),
])
def test_undefined_values_never_equal(a, b):
    assert _both(a, b) == (False, False)


def test_infinity_equals_only_the_same_infinity():
    assert _equal_all(["\\infty", "+\\infty", "\\infty."]) == []
    assert _both("\\infty", "-\\infty") == (False, False)
    assert _both("(-\\infty, 2)", "(-\\infty, 2)") == (True, True)


@pytest.mark.parametrize("a,b", [
    ("2:15", "2:15"), ("09:05", "9:05"), ("2:30 \\text{ p.m.}", "14:30"), ("12:00 \\text{ a.m.}", "0:00"),
    ("7:45 \\text{ PM}", "7:45 \\text{ pm}"), ("7:45", "7:45 \\text{ p.m.}"), ("4:05 PM", "16:05"),
    ("12:00 \\text{ noon}", "12:00"), ("1:02:03", "01:02:03"),
])
def test_clock_times_equal_as_times(a, b):
    assert _both(a, b) == (True, True)


@pytest.mark.parametrize("a,b", [
    ("2:15", "6:45"), ("12:00", "1:00"), ("2:30 \\text{ a.m.}", "2:30 \\text{ p.m.}"), ("2:30", "2:31"),
    ("10:00", "5:00"), ("3:20", "1:40"), ("1:02:03", "1:02:04"), ("4:05 \\text{ a.m.}", "16:05"),
])
def test_clock_times_are_not_ratios(a, b):
    assert _both(a, b) == (False, False)


@pytest.mark.parametrize("a,b,same", [
    ("7:32", "14:64", True), ("3:4", "6:8", True), ("3:4", "\\frac{3}{4}", True), ("3:4", "4:3", False),
    ("1:2:3", "1:2:3", True), ("1:2:3", "2:4:6", True), ("1:2:3", "2:4:3", False), ("1:2:3", "1:2", False),
    ("\\sqrt{2}:2", "1:\\sqrt{2}", True), ("7:0", "14:0", False),
])
def test_ratios_that_are_no_times_compare_as_ratios(a, b, same):
    assert _both(a, b) == (same, same)


# --- 2. several boxes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("gold,response", [
    ("-3, 4", "so $x=\\boxed{-3}$ and $x=\\boxed{4}$"), ("-3, 4", "\\boxed{-3} and \\boxed{4}"),
    ("\\{-3, 4\\}", "\\boxed{4}, \\boxed{-3}"), ("4, -3", "\\boxed{-3} \\text{ or } \\boxed{4}"),
    ("(1,2)", "x=\\boxed{1}, y=\\boxed{2}"), ("(1,2)", "\\boxed{x=1}, \\boxed{y=2}"),
    ("(1, 2), (3, 4)", "\\boxed{(1,2)} and \\boxed{(3,4)}"), ("x = 1, y = 2", "\\boxed{x = 1}, \\boxed{y = 2}"),
    ("(-\\infty, 0) \\cup (1, \\infty)", "\\boxed{(-\\infty, 0)} \\cup \\boxed{(1, \\infty)}"),
    ("5", "\\boxed{5}, so again \\boxed{5}"),  # one answer, repeated
])
def test_k_boxes_answer_a_collection_of_k(gold, response):
    assert _graded(response, gold).correct


@pytest.mark.parametrize("gold,response", [
    ("-3, 4", "\\boxed{-3} and \\boxed{5}"), ("-3, 4", "\\boxed{-3}, \\boxed{4} and \\boxed{7}"),
    ("-3, 4, 7", "\\boxed{-3} and \\boxed{4}"), ("(1,2)", "x=\\boxed{2}, y=\\boxed{1}"),
    ("(1,2)", "\\boxed{1}, \\boxed{2}, \\boxed{3}"), ("(1,2,3)", "\\boxed{1}, \\boxed{2}"),
    ("(1,2)", "\\boxed{y=2}, \\boxed{x=1}, \\boxed{z=3}"), ("(1, 2), (3, 4)", "\\boxed{(2,1)} and \\boxed{(3,4)}"),
])
def test_k_boxes_near_misses_do_not_verify(gold, response):
    assert not _graded(response, gold).correct


@pytest.mark.parametrize("gold,response", [
    ("4", "\\boxed{-3} and \\boxed{4}"), ("143", "$$\\boxed{20}$$ \\boxed{143}"),
    ("[1, 4]", "\\boxed{1} to \\boxed{4}"),
    ("x = 5", "\\boxed{x = 5} or \\boxed{x = 6}"), ("\\frac{1}{2}", "\\boxed{\\frac12}, \\boxed{0.5}?"),
])
def test_several_boxes_for_one_value_are_a_hedge(gold, response):
    verdict = _graded(response, gold)
    assert (verdict.correct, verdict.reason) == (False, "several")


def test_a_gold_written_with_boxes_is_the_list_of_its_boxes():
    assert _both("\\boxed{1}\\boxed{2}", "1, 2") == (True, True)
    assert check("\\boxed{2,1}", "\\(\\boxed{1}\\) and \\(\\boxed{2}\\).").correct
    assert not check("\\boxed{1}", "\\(\\boxed{1}\\) and \\(\\boxed{2}\\).").correct


# --- 3. ASCII and variant relations ----------------------------------------------------------------

def test_every_spelling_of_a_relation_is_the_same_relation():
    assert _equal_all(["x \\ge 5", "x >= 5", "x \\geq 5", "x \\geqslant 5", "x \\geqq 5", "5 <= x", "5 =< x",
                       "5 \\le x", "x \u2265 5", "[5, \\infty)"]) == []
    assert _equal_all(["x \\le 2", "x <= 2", "x =< 2", "x \\leqslant 2", "x \\leq 2", "2 >= x"]) == []
    assert _equal_all(["x \\ne 3", "x \\neq 3", "x != 3", "3 \\ne x", "x \\not= 3", "x \u2260 3",
                       "(-\\infty, 3) \\cup (3, \\infty)"]) == []
    assert _equal_all(["y \\ge 2x", "y >= 2x", "2x <= y", "2x =< y"]) == []


@pytest.mark.parametrize("a,b", [
    ("x >= 5", "x > 5"), ("x >= 5", "x <= 5"), ("x >= 5", "x >= 6"), ("x =< 2", "x < 2"), ("x != 3", "x != -3"),
    ("x != 3", "x = 3"), ("x \\neq 3", "x > 3"), ("y >= 2x", "y <= 2x"), ("x \\ne 3", "x \\ne 3, x \\ne 4"),
])
def test_relation_near_misses(a, b):
    assert _both(a, b) == (False, False)


def test_factorial_before_equals_is_no_inequation():
    assert normalize("3!=6") == "3!=6" and check("3! = 6", "3!=6").correct


# --- 4. worded lists (answers and golds) -------------------------------------------------------------------

def test_worded_lists_are_lists():
    assert _equal_all(["2, 5, and 7", "2, 5 and 7", "2, 5 \\text{ and } 7", "2, 5, \\text{and } 7",
                       "2 \\text{ and } 5 \\text{ and } 7", "7, 5, 2", "\\{2, 5, 7\\}", "2 and 5 and 7",
                       "2,\\ 5, \\text{ and }\\ 7", "2, 5 \\textrm{ and } 7"]) == []
    assert _equal_all(["2 \\text{ or } 5", "2, 5", "2 or 5", "5 \\text{ or } 2"]) == []


@pytest.mark.parametrize("gold,pred", [
    ("2, 5, and 7", "2, 5"), ("2, 5, and 7", "2, 5, and 8"), ("2, 5, and 7", "2, 5, 7, and 9"),
    ("2, 5, and 7", "(2, 5, 7)"), ("2 \\text{ or } 5", "2"), ("2", "2 \\text{ or } 5"),
])
def test_worded_list_near_misses(gold, pred):
    assert _both(gold, pred) == (False, False)


# --- 5. text and unit macros, percent words ------------------------------------------------------------------

@pytest.mark.parametrize("a,b", [
    ("125 \\text{ miles}", "125\\textnormal{ miles}"), ("125", "125\\textnormal{ miles}"), ("5", "5 \\mathrm{km}"),
    ("5", "5\\,\\mathrm{km}^2"), ("5", "\\textbf{5}"), ("5", "\\mbox{5}"), ("5", "5 \\operatorname{cm}"),
    ("\\frac{3}{4}", "\\textbf{\\frac{3}{4}}"), ("12", "12 \\textup{ units}"), ("7.5", "7.5 \\mbox{ m}"),
    ("125", "125 miles"), ("2e", "2\\mathrm{e}"), ("3i", "3\\mathrm{i}"), ("\\sin x", "\\operatorname{sin} x"),
    ("12", "\\mathrm{lcm}(4, 6)"), ("\\frac{\\pi}{4}", "\\operatorname{arctan} 1"),
])
def test_text_and_unit_macros_are_presentation(a, b):
    assert _both(a, b) == (True, True)


@pytest.mark.parametrize("a,b", [
    ("5", "\\textbf{6}"), ("5", "50 \\mathrm{km}"), ("125", "152\\textnormal{ miles}"), ("2", "2\\mathrm{e}"),
    ("3", "3\\mathrm{i}"), ("5", "\\mbox{5}6"),
])
def test_text_and_unit_macro_near_misses(a, b):
    assert _both(a, b) == (False, False)


def test_percent_words_are_the_percent_sign():
    assert _equal_all(["28\\%", "28 percent", "28 pct", "28 percentage", "28\\text{ percent}", "28 \\mbox{pct}",
                       "28 \\%", "0.28", "\\frac{7}{25}"]) == []
    assert _both("28\\%", "29 percent") == (False, False)
    assert _both("28\\%", "28") == (False, False)  # percent is a value: 28% is 0.28 (kept)


# --- 6. labelled answers -----------------------------------------------------------------------------------------

def test_labelled_answers_equal_their_values():
    assert _equal_all(["(m,n)=(4,1)", "m=4, n=1", "n=1, m=4", "(n,m)=(1,4)", "m = 4 \\text{ and } n = 1"]) == []
    for labelled in ["(m,n)=(4,1)", "m=4, n=1", "m=4,\\ n=1"]:
        assert _both("(4,1)", labelled) == (True, True), labelled
    assert _both("4, 1", "m=4, n=1") == (True, True)  # as a list of values: a set
    assert _both("AB=4, CD=5", "4, 5") == (True, True)
    assert _both("V_1:V_2=11:21", "11:21") == (True, True)
    assert _both("\\frac{NO}{BO}=\\frac{1}{\\sqrt{6}}", "\\frac{\\sqrt{6}}{6}") == (True, True)
    assert _both("p=5,q=2;p=7,q=2", "(5,2),(7,2)") == (True, True)
    assert _both("p = 5, q = 2 \\text{ and } p = 7, q = 2", "(7,2), (5,2)") == (True, True)


@pytest.mark.parametrize("a,b", [
    ("(4,1)", "(m,n)=(1,4)"), ("(4,1)", "m=1, n=4"), ("(4,1)", "n=1, m=4"),  # written order is the tuple's
    ("(4,1)", "m=4"), ("(4,1)", "m=4, n=1, k=2"), ("(m,n)=(4,1)", "m=4, k=1"), ("(m,n)=(4,1)", "(m,n)=(4,2)"),
    ("\\{4, 1\\}", "(4, 1)"), ("4, 1", "(m,n)=(1,5)"), ("p=5,q=2;p=7,q=2", "(5,2),(2,7)"), ("x = 5", "y = 5"),
])
def test_labelled_near_misses(a, b):
    assert _both(a, b) == (False, False)


# --- 7. number spacing ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b", [
    ("1000", "1\\,000"), ("1000", "1~000"), ("1000", "1\\ 000"), ("1000", "1 000"), ("1000000", "1 000 000"),
    ("12345.5", "12 345.5"), ("1000000", "1\\,000\\,000"), ("2500", "2{,}500"), ("14916", "14 {, }916"),
])
def test_thousands_separated_by_spaces(a, b):
    assert _both(a, b) == (True, True)


@pytest.mark.parametrize("a,b", [
    ("1000", "1 00"), ("1000", "10 000"), ("1000", "1, 000"), ("100000", "1 000"), ("1000", "1 0000"),
    # digits apart that are no thousands groups are ambiguous (a list? a product?): never a value
    ("6", "1 2 3"), ("0", "4 000 00"), ("12", "3 4"), ("0", "1 = t = 0 0"),
])
def test_spacing_near_misses(a, b):
    assert _both(a, b) == (False, False)


@pytest.mark.parametrize("a,b,same", [
    ("1000.99", "1000,99", True), ("1.22", "1,22", True), ("0.111", "0,111", True), ("1.22", "1,23", False),
    ("1222", "1,222", True), ("1.222", "1,222", False),  # three digits after the comma: thousands
    ("1.22", "1, 22", False),
])
def test_decimal_commas(a, b, same):
    assert _both(a, b) == (same, same)
