"""Outcome advantages of every kind (GRPO, Dr.GRPO, RLOO, REINFORCE++) on hand-computed groups."""

import numpy as np
import pytest

from rstar2_jax.rl.advantages import compute_advantages, group_advantages
from rstar2_jax.rl.config import AdvantageConfig, AdvantageKind, RLConfig

pytestmark = pytest.mark.fast


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


def test_rloo_leave_one_out():
    # group 0: r = [1,0,0,0]: 1 - (0+0+0)/3 = 1 ; 0 - (1+0+0)/3 = -1/3 (= 4/3 · (r - 0.25))
    # group 1: r = [1,1] -> 0 ; group 2: one rollout -> 0
    got = compute_advantages([1, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 2], AdvantageConfig(kind="rloo"))
    np.testing.assert_allclose(got, [1, -1 / 3, -1 / 3, -1 / 3, 0, 0, 0], atol=1e-7)


def test_reinforce_pp_group_centred_batch_normalised():
    # centred: group 0 r = [1,0,0,0] -> [0.75, -0.25, -0.25, -0.25]; group 1 r = [1,0] -> [0.5, -0.5]
    # batch mean 0; unbiased var = (0.5625 + 3·0.0625 + 2·0.25) / 5 = 1.25 / 5 = 0.25, std 0.5
    # -> [1.5, -0.5, -0.5, -0.5, 1, -1]
    got = compute_advantages([1, 0, 0, 0, 1, 0], [7, 7, 7, 7, 3, 3], AdvantageConfig(kind="reinforce_pp", eps=0.0))
    np.testing.assert_allclose(got, [1.5, -0.5, -0.5, -0.5, 1.0, -1.0], atol=1e-6)
    assert np.all(compute_advantages([1.0], [0], AdvantageConfig(kind="reinforce_pp")) == 0)


def test_kinds_dispatch_and_defaults():
    r, g = np.array([1, 0, 0, 1, 1, 0]), np.array([0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(compute_advantages(r, g), group_advantages(r, g))  # the default is GRPO
    np.testing.assert_array_equal(compute_advantages(r, g, AdvantageConfig(kind="dr_grpo")),
                                  group_advantages(r, g, scale_by_std=False))
    for kind in AdvantageKind:  # every kind: zero-sum within each group, float32 [N]
        a = compute_advantages(r, g, AdvantageConfig(kind=kind))
        assert a.dtype == np.float32 and a.shape == (6,)
        np.testing.assert_allclose([a[:3].sum(), a[3:].sum()], 0, atol=1e-6)
    with pytest.raises(ValueError, match="kind"):
        AdvantageConfig(kind="ppo")
    # a config saved before AdvantageConfig.kind (scale_by_std) still loads
    d = RLConfig().to_json_dict()
    d["advantage"] = {"scale_by_std": False, "eps": 1e-6, "ddof": 1}
    assert RLConfig.from_json_dict(d).advantage.kind is AdvantageKind.DR_GRPO
