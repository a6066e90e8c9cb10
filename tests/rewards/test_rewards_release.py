"""The release's counts (FormatStats.response) and answer extraction (mode="release")."""

from __future__ import annotations

import pytest

from rstar2_jax.rewards import RewardFn
from rstar2_jax.rewards.extract import Extraction, extract_answer
from rstar2_jax.rewards.format import FormatStats, ResponseStats, format_stats, join_response
from rstar2_jax.tags import Tags

SEG = ("<|im_start|>user\n<tool_response>\nTool call failure\nreason: \nstderr: NameError at line 1\n"
       "execution time: 0.01s\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>")
TURNS = ["try <tool_call>x</tool_call><|im_end|>", "ok</reason> <answer>\\boxed{2}</answer><|im_end|>"]


def test_response_counts_cover_tool_text_and_turns_after_the_first():
    stats = format_stats(TURNS, [SEG])
    # paper counts (assistant turns only) are unchanged; response: 1 block with "error", 1 turn inside
    assert (stats.n_answer_pairs, stats.n_turns) == (1, 2)
    assert stats.response == ResponseStats(n_answer_open=1, n_answer_close=1, n_answer_pairs=1, n_turns=1,
                                           n_tool_responses=1, n_tool_response_errors=1)
    full = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<reason>" + \
        join_response(TURNS, [SEG])
    assert format_stats(full).response == stats.response  # the prompt's header is not a turn
    assert format_stats(TURNS).response is None  # appended texts unknown


def test_response_counts_are_the_release_regexes():
    # two "<answer>" but one non-overlapping <answer>.*?</answer> match; a turn never closed is not counted
    stats = format_stats(["<answer><answer>1</answer>"], [])
    assert (stats.response.n_answer_open, stats.response.n_answer_pairs, stats.response.n_turns) == (2, 1, 0)
    assert format_stats(["a", "b"], ["<|im_start|>assistant\n"]).response.n_turns == 0  # "b" has no <|im_end|>


def test_join_response_and_validation():
    assert join_response(["a", "b", "c"], ["1", "2"]) == "a1b2c"
    with pytest.raises(ValueError, match="appended"):
        join_response(["a"], ["1", "2"])
    with pytest.raises(ValueError, match="full text"):
        format_stats("text", [])
    with pytest.raises(ValueError, match="n_tool_response_errors"):
        ResponseStats(n_answer_open=0, n_answer_close=0, n_answer_pairs=0, n_turns=0, n_tool_responses=0,
                      n_tool_response_errors=1)
    with pytest.raises(ValueError, match="distinct"):
        Tags(answer_open="<a>", answer_close="<a>")
    assert FormatStats(n_answer_open=1, n_answer_close=1, n_answer_pairs=1, balanced=True, n_boxed=1,
                       n_turns=1).response is None


@pytest.mark.parametrize("text,status,answer", [
    ("The answer is 42.", "ok", "42."),  # "answer is" -> what follows, stripped
    ("Final answer: \\boxed{\\frac{1}{2}}. Done.", "ok", "\\frac{1}{2}"),
    ("<answer>\\boxed{1}</answer> trailing \\boxed{9}", "ok", "9"),  # strict gives 1: the last box anywhere
    ("stdout: \\boxed{3}\n<answer>3</answer>", "ok", "3"),  # a box in tool output counts
    ("I think x = 12", "ok", "12"),  # no box: the text after the last "="
    ("no idea", "fallback", "no idea"),  # nothing matched, graded anyway
    ("x is big", "fallback", "big"),  # a marker but no digit
    ("\\boxed{}", "fallback", "\\boxed{}"),  # an empty box is not a box
    ("so <|im_end|>\\boxed{7}<|im_end|>", "ok", "7"),  # special chat tokens are dropped first
])
def test_release_extraction(text, status, answer):
    e = extract_answer(text, "release")
    assert (e.status, e.answer) == (status, answer)


def test_strict_stays_default_and_modes_validate():
    assert extract_answer("<answer>\\boxed{1}</answer> trailing \\boxed{9}").answer == "1"
    assert extract_answer("The answer is 42.") == Extraction(answer=None, status="no_box")
    with pytest.raises(ValueError, match="mode"):
        extract_answer("x", "lenient")
    with pytest.raises(ValueError, match="extraction"):
        RewardFn(extraction="lenient")
    assert RewardFn().extraction == "strict"


def test_reward_fn_release_grades_the_whole_response(reward_pool):
    # the answer is only in the tool output and a plain sentence: strict finds no box, release grades "7."
    response = "<reason>compute" + SEG.replace("stderr: NameError at line 1\n", "stdout: 7\n") + "It is 7.<|im_end|>"
    strict, info_s = RewardFn(pool=reward_pool)(response, "7")
    release, info_r = RewardFn(pool=reward_pool, extraction="release")(response, "7")
    assert (strict, info_s["extract_status"]) == (0.0, "no_box")
    assert (release, info_r["answer"]) == (1.0, "7.")  # "is " -> the rest, stripped
