"""FormatStats: the tag, pair, box and turn counts that feed GRPO-RoC's p_format."""

from __future__ import annotations

import pytest

from rstar2_jax.rewards.format import FormatStats, format_stats, split_turns

pytestmark = pytest.mark.fast


def test_counts_over_turns():
    stats = format_stats(["<reason>call a tool</reason>", "<reason>ok</reason><answer>\\boxed{5}</answer>"])
    assert stats == FormatStats(n_answer_open=1, n_answer_close=1, n_answer_pairs=1, balanced=True,
                                n_boxed=1, n_turns=2)


def test_two_answers_in_three_turns():
    stats = format_stats(["<answer>\\boxed{1}</answer>", "x", "<answer>\\boxed{2}</answer>"])
    assert (stats.n_answer_pairs, stats.balanced, stats.n_boxed, stats.n_turns) == (2, True, 2, 3)


def test_repeated_answers_in_one_turn():
    stats = format_stats(["<answer>a</answer>" * 4])
    assert (stats.n_answer_open, stats.n_answer_close, stats.n_answer_pairs, stats.balanced) == (4, 4, 4, True)


@pytest.mark.parametrize("turns,counts", [
    (["no tags \\boxed{5}"], (0, 0, 0, True)),  # missing: zero pairs
    (["<answer>\\boxed{5}"], (1, 0, 0, False)),  # never closed
    (["</answer>\\boxed{5}<answer>"], (1, 1, 0, False)),  # closed before opened
    (["<answer><answer>5</answer></answer>"], (2, 2, 2, False)),  # nested
    (["<answer>5", "</answer>"], (1, 1, 0, False)),  # a pair split over two turns is not a pair
])
def test_missing_or_unbalanced_tags(turns, counts):
    stats = format_stats(turns)
    assert (stats.n_answer_open, stats.n_answer_close, stats.n_answer_pairs, stats.balanced) == counts


def test_full_text_is_split_at_assistant_turns():
    text = ("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<reason>a"
            "<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<reason>b</reason><answer>\\boxed{1}</answer><|im_end|>\n")
    assert split_turns(text) == ["\n<reason>a", "\n<reason>b</reason><answer>\\boxed{1}</answer>"]
    stats = format_stats(text)
    assert (stats.n_turns, stats.n_answer_pairs, stats.balanced, stats.n_boxed) == (2, 1, True, 1)
    assert format_stats("plain <answer>\\boxed{1}</answer>").n_turns == 1


def test_format_stats_validates():
    with pytest.raises(ValueError, match="n_turns"):
        FormatStats(n_answer_open=0, n_answer_close=0, n_answer_pairs=0, balanced=True, n_boxed=0, n_turns=0)
    with pytest.raises(ValueError, match="n_answer_pairs"):
        FormatStats(n_answer_open=1, n_answer_close=0, n_answer_pairs=1, balanced=True, n_boxed=0, n_turns=1)
