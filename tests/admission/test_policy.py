"""The one admit loop (``admission.admit``) and the policy units behind ``AdmissionPolicy``."""

from collections import deque

import pytest

from rstar2_jax.admission import AdmissionConfig, EngineShape, Placement, admit, new_ledger
from rstar2_jax.admission.capacity import CapacityPolicy
from rstar2_jax.admission.dynamic import DynamicPolicy
from rstar2_jax.admission.static import StaticPolicy, static_split

pytestmark = pytest.mark.fast


class _G:
    """A pending group of ``size`` samples (``admission.PendingGroup``)."""

    def __init__(self, name, size, prompt_len=20):
        self.name, self.size, self.prompt_len, self.problem = name, size, prompt_len, name

    def split(self, k):
        return _G(self.name + "a", k, self.prompt_len), _G(self.name + "b", self.size - k, self.prompt_len)


class _Ledger:
    """Places from a script: each call pops the next answer."""

    def __init__(self, answers):
        self.answers = list(answers)

    def place(self, prompt_len, n, key):
        return self.answers.pop(0)


def test_admit_splits_the_head_when_only_part_fits_and_stops_at_the_first_wait():
    # g0 (4 samples): 3 fit engine 1 -> "g0a" (3) goes, "g0b" (1) stays at the head, then fits engine 0;
    # g1 waits: nothing after it is tried.
    pending = deque([_G("g0", 4), _G("g1", 2), _G("g2", 2)])
    sent = []
    admit(_Ledger([Placement(1, 3), Placement(0, 1), None]), pending, lambda g, e: sent.append((g.name, g.size, e)))
    assert sent == [("g0a", 3, 1), ("g0b", 1, 0)]
    assert [g.name for g in pending] == ["g1", "g2"]


def test_each_policy_is_a_unit_chosen_by_the_config():
    shapes = [EngineShape(16, 63, 4, 8)] * 3
    for name, cls in (("static", StaticPolicy), ("capacity", CapacityPolicy), ("dynamic", DynamicPolicy)):
        ledger = new_ledger(AdmissionConfig(policy=name), 64, shapes)
        assert type(ledger.policy) is cls
    # static: the i-th placement of a batch is group i of an even contiguous split, whole, never waiting
    ledger = new_ledger(AdmissionConfig(policy="static"), 64, shapes)
    assert ledger.order(["a", "b", "c", "d", "e"]) == [0, 1, 2, 3, 4]
    assert [ledger.place(20, 4, k).engine for k in "abcde"] == static_split(3, 5) == [0, 0, 1, 1, 2]
    assert not ledger.policy.forecasts and ledger.migration(0, "m", 10, [1.0] * 3) is None


def test_ledger_keeps_the_one_record_of_engine_speeds():
    ledger = new_ledger(AdmissionConfig(), 64, [EngineShape(16, 63)] * 2)
    assert not ledger.speeds_known and ledger.measured_step_s() == [0.0, 0.0]
    ledger.observe_step_s(0, 0.2)  # first measurement: taken as is
    ledger.observe_step_s(0, 0.4)  # then a moving average: 0.9 * 0.2 + 0.1 * 0.4 = 0.22
    ledger.set_step_s(1, 0.1)
    assert ledger.speeds_known and ledger.measured_step_s() == pytest.approx([0.22, 0.1])
