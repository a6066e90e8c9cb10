"""Trajectories -> train arrays: targets shifted, mask on sampled tokens only, sampler log-probs aligned."""

import numpy as np

from rstar2_jax.rollout.batch import trajectories_to_batch
from rstar2_jax.rollout.trajectory import Trajectory


def test_layout_hand_checked():
    t = Trajectory(uid=0, group_id=0, problem_id="p", gold="1", prompt_tokens=[10, 11, 12], budget=10)
    # 2 sampled tokens, 2 appended tool tokens, 1 sampled token
    t.response_tokens = [20, 21, 30, 31, 22]
    t.loss_mask = [1, 1, 0, 0, 1]
    t.sampler_logprobs = [-0.1, -0.2, 0.0, 0.0, -0.3]
    b = trajectories_to_batch([t], np.array([0.5]), seq_len=10, pad_id=0)
    # full = [10 11 12 20 21 30 31 22]; position t predicts full[t+1]
    np.testing.assert_array_equal(b["tokens"][0], [10, 11, 12, 20, 21, 30, 31, 22, 0, 0])
    np.testing.assert_array_equal(b["targets"][0], [11, 12, 20, 21, 30, 31, 22, 0, 0, 0])
    np.testing.assert_array_equal(b["loss_mask"][0], [0, 0, 1, 1, 0, 0, 1, 0, 0, 0])
    np.testing.assert_allclose(b["old_logp"][0], [0, 0, -0.1, -0.2, 0, 0, -0.3, 0, 0, 0], atol=1e-7)
    assert b["advantages"].tolist() == [0.5]
