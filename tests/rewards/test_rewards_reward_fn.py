"""RewardFn: text or turns in, (reward, info) out; batched through verify_batch."""

from __future__ import annotations

import pytest

from rstar2_jax.rewards import RewardFn


@pytest.fixture(scope="module")
def reward_fn(reward_pool):
    return RewardFn(timeout_s=3.0, pool=reward_pool)


def test_correct_trajectory(reward_fn):
    reward, info = reward_fn("<reason>2+3</reason><answer>The answer is \\boxed{5}.</answer>", "5")
    assert reward == 1.0
    assert (info["answer"], info["extract_status"], info["status"], info["correct"]) == ("5", "ok", "ok", True)
    assert info["time_s"] >= info["verify_s"] >= 0.0


def test_turns_and_wrong_answer(reward_fn):
    reward, info = reward_fn(["<reason>tool</reason>", "<answer>\\boxed{\\frac{1}{3}}</answer>"], "0.333")
    assert reward == 0.0 and info["reason"] == "different" and "format" not in info


def test_no_box_scores_zero(reward_fn):
    reward, info = reward_fn("The answer is 5.", "5")  # never the last number
    assert reward == 0.0 and info["extract_status"] == "no_box" and info["answer"] is None


@pytest.mark.parametrize("gold,reward,reason", [
    ("5", 0.0, "several"),  # two different answers to one question: a hedge
    ("5, 6", 1.0, "string"), ("\\{6, 5\\}", 1.0, "equivalent"), ("(5, 6)", 1.0, "string"),
    ("(6, 5)", 0.0, "different"), ("5, 6, 7", 0.0, "different"),
])
def test_several_boxes_answer_a_collection_gold_only(reward_fn, gold, reward, reason):
    got, info = reward_fn("<answer>\\boxed{5} or \\boxed{6}</answer>", gold)
    assert (got, info["extract_status"], info["reason"]) == (reward, "several", reason)


def test_batch_keeps_order(reward_fn):
    texts = ["\\boxed{1}", "\\boxed{2}", "no box", "\\boxed{(1,2)}", "\\boxed{5^{5^{5^{5^5}}}}"]
    out = reward_fn.batch(texts, ["1", "3", "3", "\\{1,2\\}", "5"])
    assert [r for r, _ in out] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert out[4][1]["reason"] == "refused"


def test_reward_fn_validates():
    with pytest.raises(ValueError, match="timeout_s"):
        RewardFn(timeout_s=0)
    with pytest.raises(ValueError, match="golds"):
        RewardFn().batch(["a"], [])
