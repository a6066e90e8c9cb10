"""``rollout.score``: the release's grading gets the whole response (tool output included), the strict one
the assistant turns; the choice is the reward function's (``RewardFn.whole_response``)."""

from __future__ import annotations

import pytest

from rstar2_jax.rewards.reward_fn import RewardFn
from rstar2_jax.rollout.score import score
from rstar2_jax.rollout.trajectory import Trajectory

pytestmark = pytest.mark.fast


class _Recorder:
    def __init__(self, whole: bool) -> None:
        self.whole_response, self.seen = whole, []

    def batch(self, texts, golds):
        self.seen.extend(texts)
        return [(0.0, {}) for _ in texts]


def _traj() -> Trajectory:
    t = Trajectory(uid=0, group_id=0, problem_id="p", gold="4", prompt_tokens=[1], budget=10)
    t.turns, t.appended_texts = ["<tool_call>x</tool_call>", "<answer>\\boxed{4}</answer>"], ["<tool_response>4"]
    t.done_reason = "answer"
    return t


@pytest.mark.parametrize("whole", [False, True])
def test_the_reward_function_picks_what_it_reads(whole):
    rec, t = _Recorder(whole), _traj()
    score([t], rec.batch)
    assert rec.seen == [t.response_text if whole else t.turns]
    rec.seen.clear()
    score([t], rec.batch, whole_response=not whole)  # an explicit choice wins
    assert rec.seen == [t.turns if whole else t.response_text]


def test_reward_fn_wants_the_whole_response_for_the_release_rules():
    assert not RewardFn().whole_response
    assert RewardFn(grader="release").whole_response and RewardFn(extraction="release").whole_response
