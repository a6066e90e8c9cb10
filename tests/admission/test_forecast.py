"""Capacity bookkeeping: the length model's survival, usage forecasts, group fitting, the ratio."""


import numpy as np
import pytest

from rstar2_jax.admission.forecast import AdaptiveRatio, LengthModel, fits, forecast

pytestmark = pytest.mark.fast


def usage(model, used, base, budget, page_size):
    """One trajectory's expected pages: ``forecast``'s mean for a single live trajectory."""
    return forecast(model, [used], [base], budget, page_size)[0]


def test_cold_model_expects_the_full_budget():
    m = LengthModel(budget=64, prior_weight=2.0)
    s = m.survival()
    assert s.shape == (65,) and s[0] == 1.0 and s[63] == 1.0 and s[64] == 0.0
    # Alive until the budget: pages grow to the full length, each point counting the page it may
    # reach before the next (ceil((8 + min(x + 16, 64)) / 16) for x = 0, 16, 32, 48).
    np.testing.assert_allclose(usage(m, 0, 8, 64, 16), [2, 3, 4, 5, 0])


def test_survival_counts_observed_lengths_and_the_prior():
    m = LengthModel(budget=64, prior_weight=1.0, lengths=[16, 16, 48])
    s = m.survival()  # lengths 16, 16, 48 and one pseudo at 64
    assert s[15] == 1.0 and s[16] == pytest.approx(0.5) and s[48] == pytest.approx(0.25) and s[64] == 0.0
    # From u = 0 (x = 0, 16, 32, 48, 64 tokens): P(alive) 1, 1/2, 1/2, 1/4, 0 times ceil((x + 16) / 16).
    np.testing.assert_allclose(usage(m, 0, 0, 64, 16), [1, 0.5 * 2, 0.5 * 3, 0.25 * 4, 0])
    # Past 16 tokens it is judged by the survivors only (48 and the prior): x = 20, 36, 52, 64, 64.
    np.testing.assert_allclose(usage(m, 20, 0, 64, 16), [3, 1 * 4, 0.5 * 4, 0, 0])
    assert m.n == 3 and sorted(m.lengths()) == [16, 16, 48]


def test_lengths_are_clipped_to_the_budget():
    m = LengthModel(budget=32, lengths=[100, -3])
    assert m.lengths() == [0, 32]


def test_worst_case_without_a_model():
    np.testing.assert_allclose(usage(None, 10, 5, 64, 16), [5] * 5)  # ceil((5 + 64) / 16) at every tau


def test_fits():
    m = LengthModel(budget=32, prior_weight=1.0, lengths=[16] * 3)  # survival 1/4 beyond 16 tokens
    sample = usage(m, 0, 4, 32, 16)
    np.testing.assert_allclose(sample, [2, 0.25 * 3, 0])
    curve = np.array([6.0, 9.0, 0.0])
    # 6 + 2 + 2k <= 12 and 9 + 2 + 0.75k <= 12 -> k = 1; ratio 2 -> 2 * (9 + 2) > 12: k = 0.
    z = np.zeros(3)
    assert fits(curve, z, (sample, z), 2, 4, 1.0, 0.0, 12) == 1
    assert fits(curve, z, (sample, z), 2, 4, 2.0, 0.0, 12) == 0
    assert fits(z, z, (sample, z), 2, 4, 1.0, 0.0, 12) == 4
    # a correlated group: sd = k * 1 page at tau = Z; sigma 1 -> 9 + 2 + 0.75k + k <= 12 -> k = 0
    assert fits(curve, z, (sample, np.array([0.0, 1.0, 0.0])), 2, 4, 1.0, 1.0, 12) == 0


def test_adaptive_ratio_rises_on_preemption_and_decays():
    r = AdaptiveRatio(1.0, lo=0.5, hi=2.0, up=0.5, decay=0.5)
    r.on_preemption(3)
    assert r.value == 2.0
    r.on_admission()
    r.on_admission()
    r.on_admission()
    assert r.value == 0.5


def test_rejects_bad_model():
    with pytest.raises(ValueError):
        LengthModel(budget=0)


def test_simulator_policy_defaults_match_the_dispatcher():
    import inspect

    from rstar2_jax.admission import AdmissionConfig
    from rstar2_jax.sim import simulate
    from rstar2_jax.rollout.dispatcher import RolloutConfig

    # one config type: the dispatcher's (composed) and the simulator's default are the same value
    assert RolloutConfig().admission == AdmissionConfig() == inspect.signature(simulate).parameters["policy"].default


def test_live_trajectories_correct_the_survivorship_bias():
    # Two short ones finished; two live ones already passed 40 tokens. Without them S(16) would be
    # 1/3 (prior only); with them (Kaplan-Meier) 2 of the 5 at risk at 16 ended there: S(16) = 3/5.
    m = LengthModel(budget=64, prior_weight=1.0, lengths=[16, 16])
    assert m.survival()[16] == pytest.approx(1 / 3)
    m.track(7, 40)
    m.track(8, 45)
    assert m.survival()[16] == pytest.approx(1 - 2 / 5)
    m.track(7, None)
    m.track(8, None)
    assert m.survival()[16] == pytest.approx(1 / 3)
