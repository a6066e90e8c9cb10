"""The Math-Verify-style table (``rstar2_jax.testing.mv_style_cases``): our verdict on every case, pure and end to end.

The comparison with math-verify itself (false positives / negatives of both) is in
``experiments/bench_rewards.py``; these tests only hold our verifier to the table.
"""

from __future__ import annotations

import collections

import pytest

from rstar2_jax.testing.mv_style_cases import MV_STYLE
from rstar2_jax.rewards import RewardFn
from rstar2_jax.rewards.equivalence import check
from rstar2_jax.rewards.extract import extract_answer

ISSUE_CLASSES = ("infinity", "time", "boxes", "relation", "worded-list", "units", "text-macro", "percent", "label",
                 "spacing")


def _answer(response: str) -> str | None:
    return extract_answer(response).answer if "\\boxed" in response else response


def test_table_is_large_both_ways_and_covers_every_class_of_issue_14():
    assert len(MV_STYLE) >= 300
    assert len({(c.gold, c.pred) for c in MV_STYLE}) == len(MV_STYLE), "duplicate case"
    counts = collections.Counter(c.expected for c in MV_STYLE)
    assert counts[True] >= 150 and counts[False] >= 100
    for why in ISSUE_CLASSES:
        outcomes = {c.expected for c in MV_STYLE if c.why == why}
        assert outcomes == {True, False}, why  # each class has correct forms and near misses
    assert sum(c.why == "undefined" and not c.expected for c in MV_STYLE) >= 8  # undefined: never equal


@pytest.mark.parametrize("case", MV_STYLE, ids=[f"{i}-{c.why}" for i, c in enumerate(MV_STYLE)])
def test_check_follows_policy_on_mv_style_answers(case):
    answer = _answer(case.pred)
    verdict = check(answer, case.gold) if answer is not None else None
    assert verdict is not None and verdict.correct is case.expected, (case, verdict)


def test_mv_style_table_through_reward_fn(reward_pool):
    responses = [c.pred if "\\boxed" in c.pred else f"<answer>\\boxed{{{c.pred}}}</answer>" for c in MV_STYLE]
    out = RewardFn(timeout_s=3.0, pool=reward_pool).batch(responses, [c.gold for c in MV_STYLE])
    wrong = [(c, info["reason"]) for c, (reward, info) in zip(MV_STYLE, out) if (reward == 1.0) is not c.expected]
    assert not wrong
    assert all(info["status"] == "ok" for _, info in out)


def test_normalize_is_idempotent_on_both_tables():
    from rstar2_jax.testing.reward_cases import CASES
    from rstar2_jax.rewards.normalize import normalize

    texts = {t for c in CASES + MV_STYLE for t in (c.gold, c.pred)}
    assert [t for t in texts if normalize(normalize(t)) != normalize(t)] == []
