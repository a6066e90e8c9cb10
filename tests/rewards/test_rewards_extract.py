"""Final-answer extraction: last box of the final answer, nested braces, no fallback."""

from __future__ import annotations

import pytest

from rstar2_jax.rewards.extract import Extraction, extract_answer, find_boxes

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("text,answer", [
    ("so \\boxed{5}.", "5"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),  # escaped braces do not close the box
    ("\\boxed 5", "5"), ("\\boxed5", "5"), ("\\boxed 42.", "42."), ("\\boxed \\pi", "\\pi"),
    ("\\fbox{7}", "7"),
    ("\\boxed{\\boxed{5}}", "5"), ("\\boxed{ \\boxed{ 5 } }", "5"), ("\\boxed{" * 30 + "5" + "}" * 30, "5"),
    ("\\boxed{5} \\boxed{5}", "5"),  # the same answer twice is one answer
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("first \\boxed{3}\n\nthen \\boxed{4}", "4"),  # the last paragraph's box
    ("<reason>try \\boxed{3}</reason><answer>\\boxed{4}</answer>", "4"),
    ("<answer>\\boxed{3}</answer> trailing \\boxed{9}", "3"),  # inside <answer> when present
    ("<answer>\\boxed{1}</answer>\n<answer>so \\boxed{2}", "2"),  # last (unclosed) answer block
    ("\\boxed{}", ""),  # an empty box is an answer that verifies against nothing
])
def test_extracts_last_box(text, answer):
    extraction = extract_answer(text)
    assert extraction.status == "ok" and extraction.answer == answer


@pytest.mark.parametrize("text", [
    "The answer is 42.", "", "\\boxed{", "\\boxed{5", "\\boxedx{5}", "<answer>42</answer>",
    "<answer>no box here</answer> \\boxed{4}",
])
def test_no_box_is_no_answer(text):
    assert extract_answer(text) == Extraction(answer=None, status="no_box")


@pytest.mark.parametrize("text", [
    "\\boxed{1} and \\boxed{2}", "<answer>\\boxed{1} or maybe \\boxed{2}</answer>",
    "<answer>\\boxed{1}\n\n\\boxed{2}</answer>",
])
def test_different_boxes_in_the_final_answer_are_kept_for_the_several_boxes_rule(text):
    extraction = extract_answer(text)
    assert extraction.status == "several" and extraction.boxes == ("1", "2")
    assert extraction.answer == "\\boxed{1}, \\boxed{2}"  # check() decides by the gold (boxes.py)


def test_find_boxes_skips_unclosed_and_keeps_order():
    assert find_boxes("\\boxed{1} x \\boxed{2 \\boxed{3}") == ["1", "3"]
    assert find_boxes("\\boxed{a{b}c} \\fbox{d}") == ["a{b}c", "d"]


def test_extraction_validates():
    with pytest.raises(ValueError, match="status"):
        Extraction(answer=None, status="maybe")
    with pytest.raises(ValueError, match="answer"):
        Extraction(answer="5", status="no_box")


def test_huge_text_is_fast():
    text = "x " * 200_000 + "\\boxed{" * 1000 + "5" + "}" * 1000
    assert extract_answer(text).answer is not None
