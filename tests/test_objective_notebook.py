"""The objective ablation notebook (RoC on/off under GSPO and Dr.GRPO) executes end to end with a tiny
budget."""

import json

import pytest

from tests.test_notebook import run_notebook

# with tests/test_notebook.py: one xdist group; their demo runs share SFT, engine and evaluation shapes, so
# this notebook's processes load what the other's compiled (``notebook_jax_cache``)
pytestmark = pytest.mark.xdist_group("notebooks")
TINY = dict(SEEDS=[0], RL_STEPS=2, PROBLEMS_PER_STEP=2, GROUP=2, N_EVAL=4, SFT_TRACES=8, SFT_EPOCHS=1.0, BUDGET=160,
            N_BOOT=50, EXTRA_ARGS=["--hidden", "32", "--layers", "1", "--slots", "8", "--sandbox-workers", "1",
                                   "--copy-drills", "8"])


@pytest.mark.slow
def test_objective_ablation_notebook_runs(tmp_path, monkeypatch, notebook_jax_cache):
    results_path = tmp_path / "objective_ablation.json"
    run_notebook("objective_ablation", {**TINY, "OUT": str(tmp_path / "runs"),
                                        "SFT_CACHE": str(tmp_path / "runs" / "sft_cache"), "RESULTS": str(results_path)},
                 monkeypatch, notebook_jax_cache)
    res = json.loads(results_path.read_text())
    assert set(res) == {"rl_steps", "minutes", "objectives"} and list(res["objectives"]) == ["gspo", "dr_grpo"]
    for obj, per_mode in res["objectives"].items():
        assert list(per_mode) == ["none", "paper"], obj
        for seed in TINY["SEEDS"]:
            spec = json.loads((tmp_path / "runs" / f"{obj}_paper_seed{seed}" / "run_spec.json").read_text())
            assert spec["data"]["regime"] == "noisy-tools" and spec["rl"]["roc"]["mode"] == "paper"
    # both objectives and both modes trained from one cached SFT policy per seed
    assert len(list((tmp_path / "runs" / "sft_cache").iterdir())) == len(TINY["SEEDS"])
