"""The batch-shaping notebook (issue 45) executes end to end with a tiny budget (parameters injected):
every arm's run stops at the sampled-token budget, the results file has each arm and seed, and the
summary prints one line per arm."""

import json

import pytest

from tests.test_notebook import run_notebook

pytestmark = pytest.mark.xdist_group("notebooks")  # with the other notebooks: one worker, one compilation cache
TINY = dict(SEEDS=[0], ARMS=["grpo", "grpo+ds", "roc", "roc+ds"], TOKEN_BUDGET=300, MAX_STEPS=3,
            PROBLEMS_PER_STEP=2, GROUP=2, N_EVAL=4, SFT_TRACES=8, SFT_EPOCHS=1.0, BUDGET=160, N_BOOT=50,
            EXTRA_ARGS=["--hidden", "32", "--layers", "1", "--slots", "8", "--sandbox-workers", "1",
                        "--copy-drills", "8"])


@pytest.mark.slow
def test_batch_shaping_notebook_runs(tmp_path, monkeypatch, notebook_jax_cache):
    results_path = tmp_path / "batch_shaping.json"
    nb = run_notebook("batch_shaping", {**TINY, "OUT": str(tmp_path / "runs"), "RESULTS": str(results_path)},
                      monkeypatch, notebook_jax_cache)
    res = json.loads(results_path.read_text())
    assert res["token_budget"] == 300 and set(res["arms"]) == set(TINY["ARMS"])
    for arm, per_seed in res["arms"].items():
        run = per_seed["0"]
        spent = sum(run["sampled_tokens"])
        # the stage ended at the token budget (or the step cap): the step before the last was under it
        assert spent >= 300 or len(run["steps"]) == TINY["MAX_STEPS"], (arm, spent, run["steps"])
        assert sum(run["sampled_tokens"][:-1]) < 300, (arm, run["sampled_tokens"])
        assert all(0.0 <= f <= 1.0 for f in run["signal_token_frac"]), arm
        assert all(r is not None for r in run["dyn/rounds"]) == arm.endswith("+ds"), arm  # refill only in +ds arms
    spec = json.loads((tmp_path / "runs" / "roc+ds_seed0" / "run_spec.json").read_text())
    assert spec["rollout"]["dynamic_sampling"]["enabled"] and spec["schedule"]["sampled_token_budget"] == 300
    assert (tmp_path / "runs" / "batch_shaping.png").stat().st_size > 0
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert all(f"{arm}: acc" in text for arm in TINY["ARMS"])  # one summary line per arm
