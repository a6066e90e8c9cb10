"""The release grader (``RewardFn(grader="release")``): PRIME's ``math_equal`` (re-implemented in
``prime_equal.py``) OR math-verify on the whole response, in the verifier's hard-time-out calls.

Pure parts (``math_equal``, the in-process release check, validation) are ``fast``; the pool parts pin
where the two graders disagree on the Math-Verify-style table (so a change in either is noticed) and
count the outcomes of adversarial inputs (never timings).
"""

from __future__ import annotations

import collections
import dataclasses
import time

import pytest

from rstar2_jax.rewards import RewardFn, release_grader, verify_batch
from rstar2_jax.rewards.prime_equal import grade_answer, math_equal, prime_grade, strip_string
from rstar2_jax.rewards.release_grader import Grader, release_check
from rstar2_jax.testing.mv_style_cases import MV_STYLE

fast = pytest.mark.fast

# Where grader="release" and grader="strict" disagree on MV_STYLE ((gold, pred); strict extraction for both).
RELEASE_ONLY = [
    ('2000.75', '2000,57'),
    ('18432.50', '18432.49'),
    ('0.35', '35'),
    ('35\\%', '35'),
    ('x < 2', '-x > -2'),
    ('9 = 13a+c', '13a+c'),
    ('x = 4', 'y = 4'),
    ('3', '3 \\text{ or } 8'),
    ('(2,7)', '\\{2, 7\\}'),
    ('(2,7)', '{2,7}'),
    ('(0,5)', '[0,5)'),
    ('[0,2)', '(0, 2)'),
    ('\\frac{4}{0}', '\\frac{9}{0}'),
    ('\\frac{4}{0}', '\\frac{4}{0}'),
    ('5:0', '3:0'),
    ('(1, \\frac{2}{0})', '(1, \\frac{3}{0})'),
    ('1/0', '\\frac{1}{0}'),
    ('3:20', '6:40'),
    ('11:00', '1:00'),
    ('4:45 \\text{ a.m.}', '4:45 \\text{ p.m.}'),
    ('5:18', '10:36'),
    ('5:18', '15:54'),
    ('\\frac{1}{12}', '0.0833333333333333'),
    ('\\sqrt{17}', '4.123105625617661'),
    ('\\frac{1}{7}', '0.142857'),
]
STRICT_ONLY = [
    ('5000', '5\\,000'),
    ('5000', '5~000'),
    ('5000', '5\\ 000'),
    ('5000', '5\\;000'),
    ('250', '250 \\operatorname{cm}'),
    ('3e', '3\\mathrm{e}'),
    ('x \\le 4', 'x =< 4'),
    ('1 = t = 0', '0'),
    ('f(x) = x^3', 'f(t) = t^3'),
    ('(a,b)=(7,3)', 'b=3, a=7'),
    ('a = 3, b = 4 \\quad \\text{and} \\quad a = 5, b = 4', 'a=3,b=4;a=5,b=4'),
    ('V(n) = 2 \\text{ and } V(n) = -2', 'V(x)=2 \\text{ or } V(x)=-2'),
    ('(-\\infty, 1) \\cup (4, \\infty)', '\\boxed{(-\\infty, 1)} \\cup \\boxed{(4, \\infty)}'),
    ('4:45 \\text{ p.m.}', '16:45'),
    ('1 - \\frac{1}{\\mathrm{e}}', '1 - \\frac{1}{e}'),
]


def _response(pred: str) -> str:
    return pred if "\\boxed" in pred else f"<answer>\\boxed{{{pred}}}</answer>"


@fast
@pytest.mark.parametrize("pred, ref, equal", [
    # numbers: relative tolerance 1e-4, commas, percent variants (gold, gold / 100, gold x 100)
    ("5", "5", True), ("5.0", "5", True), ("4.99", "5", False), ("5.00001", "5", True), ("-3", "3", False),
    ("1,000", "1000", True), ("28", "28\\%", True), ("0.28", "28", True), ("2800", "28", True), ("29", "28", False),
    ("15%", "0.15", True), ("\\$5", "5", True),
    # fractions, radicals, symbolic
    ("\\frac{1}{2}", "0.5", True), ("\\frac{2}{4}", "\\frac{1}{2}", True), ("\\frac{1}{3}", "0.3333", True),
    ("\\sqrt{8}", "2\\sqrt{2}", True), ("x^2+2x+1", "(x+1)^2", True), ("2x", "3x", False),
    ("\\frac{1}{12}", "0.0833333333333333", True), ("\\frac{1}{7}", "0.15", False),
    # LaTeX presentation
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\frac{\\pi}{2})", True), ("\\dfrac{3}{4}", "0.75", True), ("\\frac{3}{4}", "\\frac{4}{3}", False),
    # tuples, intervals (ends ignored), sets
    ("(1,2)", "(1,2)", True), ("(1,2)", "(1,3)", False), ("(1,2]", "[1,2)", True), ("[1,2]", "(1,2)", True),
    ("(1, \\frac{1}{2})", "(1, 0.5)", True), ("(1,2,3)", "(1,2)", False), ("\\{1,2\\}", "\\{2,1\\}", True),
    # matrices, cell by cell
    ("\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\begin{bmatrix}1&2\\\\3&4\\end{bmatrix}", True),
    ("\\begin{pmatrix}1&2\\\\3&5\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", False),
    ("\\begin{pmatrix}\\frac{1}{2}\\\\2\\end{pmatrix}", "\\begin{pmatrix}0.5\\\\2\\end{pmatrix}", True),
    # equations, short labels, bases, multiple choice
    ("x=5", "5", True), ("5", "x=5", True), ("y=2x+3", "y-2x=3", True), ("y=2x+3", "y=2x+4", False),
    ("52_8", "42", True), ("52_8", "52", False), ("(B)", "B", True), ("C", "B", False),
    # no answer, unparseable, refused
    ("", "5", False), ("five", "5", False), ("10^{10^{10^{10}}}", "5", False), ("\\infty", "-\\infty", False),
])
def test_math_equal(pred, ref, equal):
    assert math_equal(pred, ref) is equal
    assert math_equal(None, ref) is False


@fast
def test_prime_grade_adds_the_string_test_and_pi_as_3_14():
    assert strip_string("\\dfrac12") == "\\frac{1}{2}" and strip_string("x = 5 \\text{ cm}") == "5"
    assert grade_answer("\\frac12", "\\dfrac{1}{2}") and not grade_answer("", "5")
    assert not math_equal("\\frac12", "\\dfrac{1}{2}") and prime_grade("\\frac12", "\\dfrac{1}{2}")
    assert not math_equal("3.14", "\\pi") and prime_grade("3.14", "\\pi")  # the release's second pi
    assert prime_grade("1.5708", "\\frac{\\pi}{2}") and not prime_grade("1.6", "\\frac{\\pi}{2}")
    assert not prime_grade(None, "5")


@fast
def test_release_check_runs_math_verify_only_after_a_no():
    assert release_check("5", "5", "anything").votes == {"math_equal": True, "math_verify": None}
    v = release_check(None, "\\frac{1}{2}", "so we get $x = \\boxed{0.5}$.")
    assert v.votes == {"math_equal": False, "math_verify": True} and v.correct
    v = release_check("6", "5", "the answer is \\boxed{6}")
    assert v.votes == {"math_equal": False, "math_verify": False} and not v.correct and not v.notes


@fast
def test_a_half_that_runs_out_of_time_votes_no(monkeypatch):
    from rstar2_jax.rewards import worker

    monkeypatch.setattr(release_grader, "prime_grade", lambda pred, gold: time.sleep(30))
    row = worker.run_release_case("5", "5", "so \\boxed{5}", 1.0)  # PRIME's half stalls; math-verify says yes
    assert (row["status"], row["correct"], row["interrupted"]) == ("ok", True, True)
    assert row["votes"] == {"math_equal": False, "math_verify": True}
    row = worker.run_release_case("5", "5", "so \\boxed{6}", 1.0)
    assert (row["status"], row["correct"]) == ("timeout", False) and "math_equal timeout" in row["reason"]


@fast
def test_grader_validates_and_strict_stays_the_default():
    assert RewardFn().grader == "strict" and isinstance(RewardFn().grader, Grader)
    assert RewardFn(grader="release").grader is Grader.RELEASE
    with pytest.raises(ValueError, match="RewardFn.grader must be one of"):
        RewardFn(grader="lenient")
    with pytest.raises(ValueError, match="grader must be one of"):
        verify_batch(["5"], ["5"], grader="loose")
    with pytest.raises(ValueError, match="needs one response per gold"):
        verify_batch(["5"], ["5"], grader="release")


def test_release_grader_through_reward_fn(reward_pool):
    texts = ["<answer>\\boxed{0.28}</answer>", "The answer is 7.", "<answer>\\boxed{6}</answer>",
             "<reason>x</reason>"]
    out = RewardFn(pool=reward_pool, grader="release").batch(texts, ["28\\%", "7", "5", "5"])
    assert [r for r, _ in out] == [1.0, 1.0, 0.0, 0.0]
    assert [info["release_votes"] for _, info in out] == [
        {"math_equal": True, "math_verify": None}, {"math_equal": False, "math_verify": True},
        {"math_equal": False, "math_verify": False}, {"math_equal": False, "math_verify": False}]
    assert out[1][1]["answer"] is None and out[1][1]["extract_status"] == "no_box"  # strict finds no box
    strict = RewardFn(pool=reward_pool).batch(texts, ["28\\%", "7", "5", "5"])
    assert [r for r, _ in strict] == [1.0, 0.0, 0.0, 0.0] and "release_votes" not in strict[0][1]
    both = RewardFn(pool=reward_pool, grader="release", extraction="release")("It is 7.", "7")
    assert both[0] == 1.0 and both[1]["release_votes"]["math_equal"] is True


def _graded(fn: RewardFn, responses: list[str], golds: list[str]) -> list[tuple[float, dict]]:
    """``fn.batch``, with the cases a busy (shared) CPU made run out of time graded once more, alone and
    with a long time-out: the pinned verdicts are the checks' own, not the machine's load."""
    out = fn.batch(responses, golds)
    again = [i for i, (_, info) in enumerate(out) if info["status"] != "ok" or "timeout" in info["reason"]]
    slow = dataclasses.replace(fn, timeout_s=20.0, chunk_size=1)
    for i, result in zip(again, slow.batch([responses[i] for i in again], [golds[i] for i in again])):
        out[i] = result
    return out


def test_disagreements_with_the_strict_grader_on_the_mv_style_table(reward_pool):
    responses, golds = [_response(c.pred) for c in MV_STYLE], [c.gold for c in MV_STYLE]
    strict = _graded(RewardFn(timeout_s=6.0, pool=reward_pool), responses, golds)
    release = _graded(RewardFn(timeout_s=6.0, pool=reward_pool, grader="release"), responses, golds)
    assert [(c.gold, c.pred, info["reason"]) for c, (_, info) in zip(MV_STYLE + MV_STYLE, strict + release)
            if info["status"] != "ok"] == []
    release_only = [(c.gold, c.pred) for c, (s, _), (r, _) in zip(MV_STYLE, strict, release) if r > s]
    strict_only = [(c.gold, c.pred) for c, (s, _), (r, _) in zip(MV_STYLE, strict, release) if s > r]
    assert release_only == RELEASE_ONLY
    assert strict_only == STRICT_ONLY
    assert len(MV_STYLE) - len(RELEASE_ONLY) - len(STRICT_ONLY) == 306  # agree


ADVERSARIAL = [
    ("5", "<answer>\\boxed{9^{9^{9}}}</answer>"),
    ("5", "x = \\boxed{10^{10^{10^{10}}}}"),
    ("5", "so $" + "9^{" * 6 + "9" + "}" * 6 + "$ is the answer"),
    ("2", "<answer>\\boxed{" + "\\sqrt{" * 40 + "2" + "}" * 40 + "}</answer>"),
    ("7", "<answer>\\boxed{" + "\\frac{1}{" * 60 + "5" + "}" * 60 + "}</answer>"),
    ("5", "<answer>\\boxed{" + "\\log(" * 80 + "x" + ")" * 80 + "}</answer>"),
    ("5", "<answer>\\boxed{(10^{100})!}</answer>"),
    ("1", "<answer>\\boxed{(1+x)^{100000}}</answer>"),
    ("5", "The answer is " + "x+" * 3000 + "x"),
    ("5", "<answer>\\boxed{" + "1" * 20000 + "}</answer>"),
    ("6", "$" + "{" * 500 + "5" + "}" * 500 + "$"),
    ("5", "<answer>\\boxed{\\binom{10^{6}}{500000}}</answer>"),
]


def test_adversarial_inputs_finish_within_the_time_out(reward_pool):
    out = RewardFn(timeout_s=1.0, pool=reward_pool, grader="release").batch([r for _, r in ADVERSARIAL],
                                                                           [g for g, _ in ADVERSARIAL])
    assert len(out) == len(ADVERSARIAL)  # every case came back: a hang was killed, never waited for
    statuses = collections.Counter(info["status"] for _, info in out)
    assert set(statuses) <= {"ok", "timeout", "error"} and sum(statuses.values()) == len(ADVERSARIAL)
    assert all(r == 0.0 for r, _ in out)  # every response is wrong (the nested ones by value too)
    for _, info in out:
        assert set(info["release_votes"]) == {"math_equal", "math_verify"}
        assert info["status"] == "ok" or not any(info["release_votes"].values())
