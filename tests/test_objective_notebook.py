"""The objective ablation notebook (RoC on/off under GSPO and Dr.GRPO) executes end to end with a tiny
budget; skipped until experiments/toy_tool_math.py accepts --loss-kind / --adv-kind / --agg-mode."""

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.test_notebook import inject_parameters, share_compilation_cache

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(SEEDS=[0], RL_STEPS=2, PROBLEMS_PER_STEP=2, GROUP=2, N_EVAL=4, SFT_TRACES=8, SFT_EPOCHS=1.0, BUDGET=160,
            N_BOOT=50, EXTRA_ARGS=["--hidden", "32", "--layers", "1", "--slots", "8", "--sandbox-workers", "1",
                                   "--copy-drills", "8"])


def _demo_has_objective_flags() -> bool:
    text = (ROOT / "experiments" / "toy_tool_math.py").read_text()
    return all(f'"{flag}"' in text for flag in ("--loss-kind", "--adv-kind", "--agg-mode"))


@pytest.mark.slow
def test_objective_ablation_notebook_runs(tmp_path, monkeypatch):
    if not _demo_has_objective_flags():
        pytest.skip("experiments/toy_tool_math.py has no --loss-kind / --adv-kind / --agg-mode yet")
    share_compilation_cache(monkeypatch, tmp_path / "jax_cache")
    nb = nbformat.read(ROOT / "notebooks" / "objective_ablation.ipynb", as_version=4)
    results_path = tmp_path / "objective_ablation.json"
    inject_parameters(nb, {**TINY, "OUT": str(tmp_path / "runs"), "SFT_CACHE": str(tmp_path / "runs" / "sft_cache"),
                           "RESULTS": str(results_path)})
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    res = json.loads(results_path.read_text())
    assert set(res) == {"rl_steps", "minutes", "objectives"} and list(res["objectives"]) == ["gspo", "dr_grpo"]
    for obj, per_mode in res["objectives"].items():
        assert list(per_mode) == ["none", "paper"], obj
        for seed in TINY["SEEDS"]:
            args = json.loads((tmp_path / "runs" / f"{obj}_paper_seed{seed}" / "args.json").read_text())
            assert args["regime"] == "noisy-tools" and args["roc_mode"] == "paper"
    # both objectives and both modes trained from one cached SFT policy per seed
    assert len(list((tmp_path / "runs" / "sft_cache").iterdir())) == len(TINY["SEEDS"])
