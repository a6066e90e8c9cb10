"""The recipe's dry run (every stage, 1 process x 8 devices) with asynchronous RL, K = 1: a stage change
the schedule cannot foresee (the truncation rule, the filter) discards the batch in flight; versions
restart from the learner's at each stage (docs/design.md §5.2)."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import rstar2_recipe  # noqa: E402


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_recipe_dry_run_async_discards_at_stage_changes(tmp_path):
    rstar2_recipe.main(["--dry-run", "--out", str(tmp_path), "--no-progress", "--set", "max_staleness=1",
                        "--set", "ckpt_every=5", "--set", "eval_every=null"])
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("stage", "").startswith("rl_") and "reward" in r]
    assert [(r["stage"], r["step"]) for r in rl] == [("rl_stage1", 1), ("rl_stage1", 2), ("rl_stage2", 3),
                                                    ("rl_stage3", 4)]
    # step 2 ends stage 1, step 3 stage 2 (then the filter), step 4 the run: each discards the batch ahead
    assert [r.get("async/discarded_batches") for r in rl] == [None, 1, 1, 1]
    # batch 1 was generated before step 1's update (version 0); after a change, with the learner's weights
    assert [r["train/version_min"] for r in rl] == [0, 0, 2, 3]
    assert all(r["train/staleness_max"] <= 1 and r["n_kept"] > 0 for r in rl)
    assert any(r.get("stage") == "filter" for r in rows)
