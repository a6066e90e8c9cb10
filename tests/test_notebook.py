"""The RoC ablation notebook executes end to end with a tiny budget (parameters injected)."""

import json
import math
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
# with tests/test_objective_notebook.py: one xdist group, one compilation cache (``notebook_jax_cache``)
pytestmark = pytest.mark.xdist_group("notebooks")
TINY = dict(SEEDS=[0, 1], MODES=["none", "paper", "deterministic"], RL_STEPS=2, PROBLEMS_PER_STEP=2,
            GROUP=2, N_EVAL=4, SFT_TRACES=8, SFT_EPOCHS=1.0, BUDGET=160, N_BOOT=50,
            EXTRA_ARGS=["--hidden", "32", "--layers", "1", "--slots", "8", "--sandbox-workers", "1",
                        "--copy-drills", "8"])


def inject_parameters(nb: nbformat.NotebookNode, params: dict) -> None:
    """Insert an override cell after the cell tagged "parameters" (papermill's convention), replacing the
    override cell a committed run left there."""
    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.get("metadata", {}).get("tags", [])]
    idx = next(i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    src = "\n".join(f"{k} = {json.dumps(v)}" for k, v in params.items())
    nb.cells.insert(idx + 1, nbformat.v4.new_code_cell(src, metadata={"tags": ["injected-parameters"]}))


def share_compilation_cache(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """The notebook's kernel (and the demo processes it starts) inherit a persistent JAX compilation cache in
    ``folder``: the runs share their shapes, so every run after the first loads the executables the first
    compiled (same programs, same results) instead of compiling them again. This process's JAX, already
    started, does not read these variables."""
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(folder))
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def run_notebook(name: str, params: dict, monkeypatch: pytest.MonkeyPatch, cache: Path) -> nbformat.NotebookNode:
    """Execute ``notebooks/<name>.ipynb`` with ``params`` injected, from ``notebooks/``, its processes sharing
    the compilation cache ``cache``; returns the executed notebook (its outputs)."""
    share_compilation_cache(monkeypatch, cache)
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    inject_parameters(nb, params)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    return nb


@pytest.mark.slow
def test_roc_ablation_notebook_runs(tmp_path, monkeypatch, notebook_jax_cache):
    results_path = tmp_path / "roc_ablation.json"
    run_notebook("roc_ablation", {**TINY, "OUT": str(tmp_path / "runs"), "RESULTS": str(results_path)},
                 monkeypatch, notebook_jax_cache)
    res = json.loads(results_path.read_text())
    check_results_schema(res, TINY)
    # a fresh run saves the kept-set rate too (the positives each mode trained on)
    assert all("kept_tool_error_rate_pos" in run for per_seed in res["modes"].values() for run in per_seed.values())
    assert (tmp_path / "runs" / "roc_ablation.png").stat().st_size > 0
    # the three modes trained from one cached SFT policy per seed
    assert len(list((tmp_path / "runs" / "sft_cache").iterdir())) == len(TINY["SEEDS"])
    for seed in TINY["SEEDS"]:  # the noisy-tools regime was the one used
        spec = json.loads((tmp_path / "runs" / f"paper_seed{seed}" / "run_spec.json").read_text())
        assert spec["data"]["regime"] == "noisy-tools"
    check_demo_default_records(tmp_path / "runs")


MISMATCH_KEYS = ("abs_mean", "abs_max", "k3", "frac_abs_gt_0.1", "log_ppl_diff", "coverage")


def check_demo_default_records(runs: Path) -> None:
    """The notebook's runs are the demo's default configuration (π_old from the sampler, no scripted
    policy) for RL_STEPS steps: every step records its rollout metrics, and every RL step that updated
    records the sampler/trainer mismatch, from the update's own forward, finite. (The tiny policy rarely
    earns a reward, so RoC may keep nothing: tests/test_demo.py checks a run whose every step updates.)"""
    for run in sorted(p for p in runs.iterdir() if (p / "run_spec.json").exists()):
        spec = json.loads((run / "run_spec.json").read_text())
        assert (spec["rl"]["old_logp_source"], spec["rollout"]["scripted_policy"], spec["rl"]["correction"]["is_level"],
                spec["rl"]["correction"]["mask_level"]) == ("sampler", False, "none", "none"), run
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        rl = [r for r in rows if r.get("stage") == "rl" and "reward" in r]
        assert [r["step"] for r in rl] == list(range(1, TINY["RL_STEPS"] + 1)), run
        for r in rl:
            assert all(isinstance(r[k], (int, float)) for k in ("reward", "response_len", "n_sampled", "n_kept")), r
            if r["n_kept"] > 0:
                for k in MISMATCH_KEYS:
                    v = r.get(f"train/mismatch/{k}")
                    assert isinstance(v, float) and math.isfinite(v), (run.name, r["step"], k, v)
                assert r["train/mismatch/coverage"] == 1.0 and 0.0 <= r["train/mismatch/frac_abs_gt_0.1"] <= 1.0


def check_results_schema(res: dict, params: dict) -> None:
    """``notebooks/results/roc_ablation.json``: {"rl_steps", "minutes", "modes": {mode: {seed: {...}}}}."""
    assert set(res) == {"rl_steps", "minutes", "modes"}
    assert res["rl_steps"] == params["RL_STEPS"] and isinstance(res["minutes"], float) and res["minutes"] > 0
    assert list(res["modes"]) == params["MODES"]
    for mode, per_seed in res["modes"].items():
        assert list(per_seed) == [str(s) for s in params["SEEDS"]], mode
        for run in per_seed.values():
            # kept_tool_error_rate_pos: saved since it was added (the committed results predate it)
            assert set(run) - {"kept_tool_error_rate_pos"} == {"heldout_acc_sft", "heldout_acc_rl", "steps",
                                                              "tool_error_rate_pos", "response_len", "reward"}
            assert all(isinstance(run[k], float) and 0.0 <= run[k] <= 1.0 for k in ("heldout_acc_sft", "heldout_acc_rl"))
            assert run["steps"] == list(range(1, params["RL_STEPS"] + 1))
            for k in {"tool_error_rate_pos", "response_len", "reward", "kept_tool_error_rate_pos"} & set(run):
                assert len(run[k]) == len(run["steps"]), k
                assert all(v is None or isinstance(v, float) for v in run[k]), k
            assert all(v is not None for v in run["response_len"] + run["reward"])


def test_committed_results_follow_the_schema():
    res = json.loads((ROOT / "notebooks" / "results" / "roc_ablation.json").read_text())
    seeds = [int(s) for s in next(iter(res["modes"].values()))]
    check_results_schema(res, {"RL_STEPS": res["rl_steps"], "MODES": ["none", "paper", "deterministic"],
                               "SEEDS": seeds})
    assert len(seeds) >= 5
