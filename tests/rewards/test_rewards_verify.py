"""verify_batch: the whole case table under hard timeouts, chunk re-runs, and the no-JAX rule."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rstar2_jax.testing.reward_cases import CASES, NEEDS_TIMEOUT
from rstar2_jax.rewards.verify import VerifyResult, verify_batch
from rstar2_jax.sandbox import SandboxLimits

_SLOW = "\\binom{10^{6}}{500000}"  # the parser evaluates it in a Python loop: minutes


def test_case_table_through_verify_batch(reward_pool):
    start = time.monotonic()
    results = verify_batch([c.pred for c in CASES], [c.gold for c in CASES], 3.0, pool=reward_pool)
    elapsed = time.monotonic() - start
    wrong = [(c, r) for c, r in zip(CASES, results) if r.correct is not c.expected]
    assert not wrong
    for case, result in zip(CASES, results):
        assert result.status == ("timeout" if case.why in NEEDS_TIMEOUT else "ok"), (case, result)
    assert elapsed < 60, elapsed  # ~10 s on 2 cores; a hang would be unbounded


def test_slow_check_times_out_without_stalling_the_batch(reward_pool):
    preds = ["5", _SLOW, "6", _SLOW, "\\frac{10}{2}"]
    start = time.monotonic()
    results = verify_batch(preds, ["5"] * 5, 1.0, pool=reward_pool)
    # a bound far from the failure it guards against (the parser alone takes minutes), not from the machine's
    # pace: the statuses below show the 1 s limit killed each slow check
    assert time.monotonic() - start < 60
    assert [r.correct for r in results] == [True, False, False, False, True]
    assert [r.status for r in results] == ["ok", "timeout", "ok", "timeout", "ok"]


def test_chunk_stops_at_a_timeout_and_the_rest_rerun_alone(reward_pool):
    # One chunk of 5: case 1 hits the soft alarm, the chunk stops there (its process may hold
    # half-written caches), and cases 2-4 are re-run one per fresh call; case 2 times out again.
    preds = ["5", _SLOW, _SLOW, "5.0", "4"]
    calls = reward_pool.stats()["calls"]
    results = verify_batch(preds, ["5"] * 5, 1.0, pool=reward_pool, chunk_size=5)
    assert [r.status for r in results] == ["ok", "timeout", "timeout", "ok", "ok"]
    assert [r.correct for r in results] == [True, False, False, True, False]
    assert reward_pool.stats()["calls"] - calls == 1 + 3  # the chunk, then cases 2-4 alone


def test_none_prediction_scores_zero_without_a_call():
    assert verify_batch([None], ["5"], 1.0) == [VerifyResult(correct=False, status="ok", reason="empty",
                                                               duration_s=0.0)]


def test_pool_must_preload_the_worker():
    class NoPreload:
        limits = SandboxLimits(preload=("sympy",))

    with pytest.raises(ValueError, match="preload"):
        verify_batch(["1"], ["1"], 1.0, pool=NoPreload())


def test_verify_batch_validates():
    with pytest.raises(ValueError, match="predictions"):
        verify_batch(["1"], [], 1.0)
    with pytest.raises(ValueError, match="timeout_s"):
        verify_batch(["1"], ["1"], 0.0)
    with pytest.raises(ValueError, match="correct"):
        VerifyResult(correct=True, status="timeout", reason="", duration_s=1.0)


def test_rewards_never_import_jax():
    code = ("import sys, rstar2_jax.rewards, rstar2_jax.rewards.worker; "
            "bad = [m for m in sys.modules if m == 'jax' or m.startswith('jax.')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
