"""RoC penalties p_err, p_format, p_total (rStar2-Agent §3.2) on hand-computed records."""

import numpy as np
import pytest

from rstar2_jax.rl.penalties import RocRecord, p_err, p_format, p_total, stack_records

pytestmark = pytest.mark.fast


def _rec(calls=1, errs=0, opens=1, closes=1, turns=1):
    return RocRecord(n_tool_calls=calls, n_tool_errors=errs, n_answer_open=opens, n_answer_close=closes,
                     n_turns=turns)


def test_p_err_is_error_fraction_and_half_without_calls():
    # calls 4, errors 1 -> 1/4; calls 3, errors 3 -> 1; calls 0 -> 0.5 (encourage tool use); 2/0 -> 0
    got = p_err(np.array([4, 3, 0, 2]), np.array([1, 3, 0, 0]))
    np.testing.assert_allclose(got, [0.25, 1.0, 0.5, 0.0])


def test_p_err_rejects_more_errors_than_calls():
    with pytest.raises(ValueError):
        p_err(np.array([1]), np.array([2]))


def test_p_format_cases():
    opens = np.array([1, 0, 2, 1, 3, 5, 2, 1])
    closes = np.array([1, 1, 1, 0, 3, 5, 2, 1])
    turns = np.array([3, 3, 3, 3, 4, 2, 5, 0])
    # 0: one answer -> (1-1)/3 = 0
    # 1: "<answer>" missing -> 1;  2: unbalanced 2 vs 1 -> 1;  3: "</answer>" missing -> 1
    # 4: 3 answers in 4 turns -> (3-1)/4 = 0.5
    # 5: 5 answers in 2 turns -> min((5-1)/2, 1) = min(2, 1) = 1
    # 6: 2 answers in 5 turns -> 1/5 = 0.2
    # 7: no assistant turn -> 1 (as the released code)
    np.testing.assert_allclose(p_format(opens, closes, turns), [0, 1, 1, 1, 0.5, 1, 0.2, 1])


def test_p_total_is_sum_and_flags_switch_terms_off():
    recs = [
        _rec(calls=4, errs=1, opens=1, closes=1, turns=4),  # 0.25 + 0 = 0.25
        _rec(calls=0, errs=0, opens=2, closes=2, turns=2),  # 0.5 + (2-1)/2 = 1.0
        _rec(calls=2, errs=2, opens=0, closes=0, turns=3),  # 1.0 + 1 = 2.0
    ]
    np.testing.assert_allclose(p_total(recs), [0.25, 1.0, 2.0])
    np.testing.assert_allclose(p_total(recs, use_p_format=False), [0.25, 0.5, 1.0])
    np.testing.assert_allclose(p_total(recs, use_p_err=False), [0.0, 0.5, 1.0])


def test_p_total_accepts_field_arrays():
    fields = {"n_tool_calls": [2, 0], "n_tool_errors": [1, 0], "n_answer_open": [1, 1],
              "n_answer_close": [1, 1], "n_turns": [2, 1]}
    # 1/2 + 0 = 0.5 ; 0.5 + 0 = 0.5
    np.testing.assert_allclose(p_total(fields), [0.5, 0.5])
    assert stack_records(fields)["n_turns"].dtype == np.int64


def test_record_from_statuses_counts_non_ok_and_undecodable_as_errors():
    rec = RocRecord.from_tool_statuses(["ok", "timeout", None, "ok", "runtime_error"], n_answer_open=1,
                                       n_answer_close=1, n_turns=5)
    assert (rec.n_tool_calls, rec.n_tool_errors) == (5, 3)
    np.testing.assert_allclose(p_total([rec]), [3 / 5])  # 3/5 errors + single answer (0)


def test_record_validation():
    with pytest.raises(ValueError):
        _rec(calls=1, errs=2)
    with pytest.raises(ValueError):
        _rec(turns=-1)
