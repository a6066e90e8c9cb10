"""Group-normalised outcome advantages (GRPO / Dr.GRPO) on hand-computed groups."""

import numpy as np
import pytest

from rstar2_jax.rl.advantages import group_advantages, token_advantages


def test_grpo_advantage_unbiased_std():
    # group 0: r = [1,0,0,0], mean 0.25, unbiased var = (0.75² + 3·0.25²)/3 = 0.75/3 = 0.25, std 0.5
    #   -> (1-0.25)/0.5 = 1.5 ; (0-0.25)/0.5 = -0.5
    # group 1 (interleaved): r = [1,1,0], mean 2/3, var = (2·(1/3)² + (2/3)²)/2 = (6/9)/2 = 1/3
    #   std = 0.57735 -> (1/3)/0.57735 = 0.57735 ; (-2/3)/0.57735 = -1.1547
    r = np.array([1, 1, 0, 0, 1, 0, 0])
    g = np.array([0, 1, 0, 0, 1, 1, 0])
    got = group_advantages(r, g, eps=0.0)
    np.testing.assert_allclose(got, [1.5, 0.57735, -0.5, -0.5, 0.57735, -1.1547, -0.5], atol=1e-4)


def test_population_std_and_eps():
    # r = [1,0], mean 0.5, population std 0.5, eps 0.5 -> ±0.5 / (0.5 + 0.5) = ±0.5
    np.testing.assert_allclose(group_advantages([1, 0], [3, 3], ddof=0, eps=0.5), [0.5, -0.5])


def test_dr_grpo_no_std():
    # r = [1,0,0,0] -> r - 0.25
    np.testing.assert_allclose(group_advantages([1, 0, 0, 0], [0] * 4, scale_by_std=False),
                               [0.75, -0.25, -0.25, -0.25])


def test_equal_rewards_and_singletons_give_zero():
    np.testing.assert_allclose(group_advantages([1, 1, 0], [0, 0, 1]), [0, 0, 0])


def test_token_advantages_broadcast_with_mask():
    adv = np.array([2.0, -1.0])
    mask = np.array([[0, 1, 1], [1, 1, 0]], np.float32)
    np.testing.assert_allclose(token_advantages(adv, mask), [[0, 2, 2], [-1, -1, 0]])
    with pytest.raises(ValueError):
        token_advantages(adv, mask[:1])
