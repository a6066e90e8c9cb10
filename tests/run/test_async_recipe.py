"""The recipe's dry run (every stage) with asynchronous RL, K = 1, in 2 processes x 4 devices and 1 x 8: equal,
and a stage change the schedule cannot foresee (the truncation rule, the filter) discards the batch in
flight; versions restart from the learner's at each stage (docs/design.md §5.2). One pair of launches checks
both (the 1 x 8 run's rows carry the discards)."""

import numpy as np
import pytest

pytestmark = pytest.mark.xdist_group("recipe_launches")  # tests/run/conftest.py: recipe_jax_cache


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_two_processes_async_run_the_recipe_like_one(tmp_path, recipe_jax_cache):
    """K = 1 in 2 processes x 4 devices (gloo) equals 1 x 8: every row (timings aside) and the final params.
    Each process's rollout thread generates its shard; the collectives (learner, metrics, the weights'
    resharding) run on the main thread in step order."""
    from tests.run.test_recipe_multiprocess import _assert_rows_equal, _final, _launch, _rows, _wait

    extra = ("--set", "async_rl.max_staleness=1", "--set", "checkpoint.every=5", "--set", "eval.every=null")
    cache = recipe_jax_cache
    one, two = tmp_path / "one", tmp_path / "two"
    _wait(_launch(one, 1, cache, extra) + _launch(two, 2, cache, extra), timeout_s=2000)

    def strip(rows):
        return [{k: v for k, v in r.items() if not k.startswith(("async/trainer_idle", "async/engine_idle"))}
                for r in rows]

    got, want = strip(_rows(two)), strip(_rows(one))
    _assert_rows_equal(got, want, "2 x 4 vs 1 x 8, async K = 1")
    _assert_discards_at_stage_changes(_rows(one))
    (c1, p1), (c2, p2) = _final(one), _final(two)
    assert c1["stage"] == c2["stage"] == "done" and c1["global_step"] == c2["global_step"] == 4
    assert c1["kept_ids"] == c2["kept_ids"] and len(c2["rollout"]) == 2  # each process's dispatcher state
    for a, b in zip(p1, p2):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _assert_discards_at_stage_changes(rows: list[dict]) -> None:
    rl = [r for r in rows if r.get("stage", "").startswith("rl_") and "reward" in r]
    assert [(r["stage"], r["step"]) for r in rl] == [("rl_stage1", 1), ("rl_stage1", 2), ("rl_stage2", 3),
                                                    ("rl_stage3", 4)]
    # step 2 ends stage 1, step 3 stage 2 (then the filter), step 4 the run: each discards the batch ahead
    assert [r.get("async/discarded_batches") for r in rl] == [None, 1, 1, 1]
    # batch 1 was generated before step 1's update (version 0); after a change, with the learner's weights
    assert [r["train/version_min"] for r in rl] == [0, 0, 2, 3]
    assert all(r["train/staleness_max"] <= 1 and r["n_kept"] > 0 for r in rl)
    assert any(r.get("stage") == "filter" for r in rows)
