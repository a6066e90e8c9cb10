"""``metrics``: per-trajectory statistics in named columns and their reductions, hand-checked."""

import math

import numpy as np
import pytest

from rstar2_jax.train.stats import COL, STATS, error_rate, rollout_metrics, trajectory_stats
from rstar2_jax.rollout.trajectory import DECODE_ERROR, ToolRecord, Trajectory, tool_calls_per_traj, tool_errors

pytestmark = pytest.mark.fast


def _traj(reward, statuses, n_tokens, reason="answer"):
    t = Trajectory(uid=0, group_id=0, problem_id="p", gold="1", prompt_tokens=[1], budget=64)
    t.tools = [ToolRecord(s, 0.1) for s in statuses]
    t.response_tokens, t.reward, t.done_reason = [0] * n_tokens, reward, reason
    return t


def test_rollout_metrics_hand_computed():
    trajs = [_traj(1.0, ["ok", "timeout"], 10), _traj(0.0, [DECODE_ERROR], 20, "budget"), _traj(1.0, [], 30)]
    st = trajectory_stats(trajs, p_format=np.array([0.0, np.nan, 0.5]))
    assert st.shape == (3, len(STATS)) and list(st[:, COL["tool_errors"]]) == [1, 1, 0]
    m = rollout_metrics(st)
    # 3 calls over 3 trajectories; the undecodable one never ran; positives: 1 error in 2 calls
    assert m["tool_calls_per_traj"] == 1.0 and m["tool_calls_executed"] == 2
    assert m["tool_error_rate_pos"] == 0.5 and m["truncation_rate"] == pytest.approx(1 / 3)
    assert m["response_len"] == 20.0 and m["reward"] == pytest.approx(2 / 3)
    assert m["p_format_pos"] == 0.25  # mean over the positives' p_format: (0 + 0.5) / 2
    assert tool_calls_per_traj(trajs) == 1.0 and [tool_errors(t) for t in trajs] == [1, 1, 0]


def test_error_rate_without_calls():
    assert math.isnan(error_rate(0, 0)) and error_rate(0, 0, empty=0.0) == 0.0 and error_rate(1, 4) == 0.25
