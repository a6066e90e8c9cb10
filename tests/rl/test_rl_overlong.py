"""Overlong handling (``rl.overlong``, DAPO §3.4): the soft length penalty by hand, the filter's mask,
the config's validation and the run spec's check of L_cache against the budgets."""

import numpy as np
import pytest

from rstar2_jax.rl import OverlongConfig, RLConfig
from rstar2_jax.rl.overlong import overlong_trained, shaped_rewards, soft_overlong_penalty

pytestmark = pytest.mark.fast


def test_soft_penalty_hand_computed():
    # L_max = 10, L_cache = 4: no penalty up to 6 tokens, then -1/4 per token, -1 at (and past) the budget
    lengths = np.arange(0, 12)
    want = [0, 0, 0, 0, 0, 0, 0, -0.25, -0.5, -0.75, -1.0, -1.0]
    np.testing.assert_allclose(soft_overlong_penalty(lengths, 10, 4), want, atol=0)
    # per-trajectory budgets (a recipe stage's): each row against its own L_max
    np.testing.assert_allclose(soft_overlong_penalty([4, 5, 5, 9], [6, 6, 12, 10], 2), [0.0, -0.5, 0.0, -0.5])


def test_soft_penalty_refuses_a_cache_that_covers_the_budget():
    with pytest.raises(ValueError, match=r"rl.overlong.cache \(10\) must be smaller than the token budget \(smallest: 10\)"):
        soft_overlong_penalty([3], 10, 10)
    with pytest.raises(ValueError, match="rl.overlong.cache must be >= 1"):
        soft_overlong_penalty([3], 10, 0)


def test_shaped_rewards_and_the_filter_mask():
    r, n, b = np.array([1.0, 0.0, 1.0, 0.0]), np.array([3, 8, 9, 10]), np.full(4, 10)
    for kind in ("none", "filter"):
        assert shaped_rewards(r, n, b, kind, 4).tolist() == r.tolist()  # unchanged: the reward is the outcome's
    np.testing.assert_allclose(shaped_rewards(r, n, b, "soft", 4), [1.0, -0.5, 0.25, -1.0])
    truncated = np.array([False, True, False, True])
    assert overlong_trained(truncated, "filter").tolist() == [True, False, True, False]
    assert overlong_trained(truncated, "none").tolist() == overlong_trained(truncated, "soft").tolist() == [True] * 4


def test_config_validates_and_round_trips():
    with pytest.raises(ValueError, match="kind must be one of"):
        OverlongConfig(kind="cut")
    with pytest.raises(ValueError, match=r"kind 'soft' needs cache \(L_cache, tokens\) >= 1, got 0"):
        OverlongConfig(kind="soft")
    with pytest.raises(ValueError, match="cache must be an int >= 0"):
        OverlongConfig(cache=-1)
    cfg = RLConfig(overlong=OverlongConfig(kind="soft", cache=64))
    assert RLConfig.from_json_dict(cfg.to_json_dict()) == cfg
    old = RLConfig().to_json_dict()
    del old["overlong"]  # a checkpoint written before rl.overlong existed reads back as the default
    assert RLConfig.from_json_dict(old) == RLConfig()


def test_run_spec_reaches_the_learner_and_checks_the_cache_against_the_budgets():
    from rstar2_jax.run.spec import load_spec

    spec = load_spec(preset="demo", sets={"rl.overlong.kind": "soft", "rl.overlong.cache": 32})
    assert spec.rl.overlong == OverlongConfig(kind="soft", cache=32)
    budget = spec.rollout.budget
    with pytest.raises(ValueError, match=rf"rl.overlong.cache \({budget}\) must be smaller than the smallest "
                                         rf"training budget \({budget}"):
        load_spec(preset="demo", sets={"rl.overlong.kind": "soft", "rl.overlong.cache": budget})
    with pytest.raises(ValueError, match="rl.overlong.kind must be one of"):
        load_spec(preset="demo", sets={"rl.overlong.kind": "trim"})
