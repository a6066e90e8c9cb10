"""The main job's short version, its CLI errors, and crash-safe resume after SIGKILL."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rstar2_jax.run import demo, demo_cli
from rstar2_jax.run.spec import SPEC_FILE

ROOT = Path(__file__).resolve().parents[1]

# 2 SFT epochs (6 steps): the RL rollouts are scripted, so the SFT policy's quality does not matter to
# the RL rows; a run's time is mostly JAX start-up and compilation, not steps
TINY = ["--sft-traces", "16", "--copy-drills", "16", "--sft-epochs", "2", "--sft-lr", "1e-2", "--sft-batch", "4",
        "--sft-seq-len", "192", "--hidden", "32",
        "--layers", "1", "--rl-steps", "2", "--problems-per-step", "2", "--group", "2", "--n-eval", "4",
        "--eval-every", "1", "--budget", "200", "--slots", "8", "--sandbox-workers", "1", "--no-progress",
        "--scripted-policy"]  # RL rollouts mix right and wrong answers: every RL step keeps rows and updates
GOLDEN = ROOT / "tests" / "golden" / "demo_short_metrics.jsonl"
GOLDEN_KEYS = ("step", "n_sampled", "n_kept", "reward", "tool_calls_per_traj", "tool_calls_executed", "tool_error_rate_pos",
               "response_len", "truncation_rate", "error_rate", "p_format_pos", "kept_tool_error_rate_pos", "preemptions",
               "heldout_acc", "heldout_tool_error_rate", "heldout_response_len", "train/loss", "train/n_tokens",
               "train/grad_norm", "train/update_norm")
STEP_KEYS = ("reward", "tool_calls_per_traj", "tool_calls_executed", "response_len", "truncation_rate",
             "time_rollout_s", "time_tools_s", "time_train_s", "n_sampled", "n_kept", "heldout_acc")
NONDETERMINISTIC = ("time_", "step_s", "tokens_per_s")


@pytest.mark.parametrize("argv,match", [  # an alias's error names the spec field it sets
    (["--rl-steps", "-1"], "schedule: ScheduleSpec.rl_steps must be an int >= 0, got -1"),
    (["--roc-mode", "best"], "rl.roc.mode must be one of"),
    (["--group", "0"], "rl.roc: keep_per_group (G) must be >= 1"),
    (["--sft-lr", "0"], "sft.optim: lr must be > 0"),
    (["--correction", "tis", "--old-logp", "sampler"], "rl: correction needs old_logp_source='recompute'"),
    (["--correction", "geo-mask", "--scripted-policy"], "rl.correction needs sampler log-probs"),
    (["--correction", "best"], "--correction must be one of"),
    (["--set", "rl.loss.kindd=gspo"], "rl.loss.kindd: unknown field"),
    (["--set", "rl.temperature=0.5", "--set", "rollout.temperature=0.7"], "rl.temperature (0.5) and "
                                                                          "rollout.temperature (0.7) must agree"),
])
def test_bad_command_line_values_are_clear_errors(argv, match, capsys):
    with pytest.raises(SystemExit):
        demo_cli.parse_args(argv)
    assert match in capsys.readouterr().err


def test_flags_are_aliases_of_spec_fields(tmp_path):
    (tmp_path / "empty.yaml").write_text("{}\n")
    assert demo_cli.parse_args([]).spec == demo_cli.parse_args(["--config", str(tmp_path / "empty.yaml")]).spec
    a = demo_cli.parse_args(["--budget", "96", "--loss-kind", "gspo", "--engine-dtype", "bfloat16", "--seed", "3",
                             "--set", "engine.page_size=32", "--allow-changed", "ckpt_every,eval.every"])
    assert (a.spec.rollout.budget, a.spec.eval.budget, a.spec.rl.loss.kind, a.spec.seed) == (96, 96, "gspo", 3)
    assert a.spec.engine_config(256).page_size == 32 and a.spec.engine_config(256).kv_dtype == "bfloat16"
    assert a.spec.placement.weight_dtype == "bfloat16" and a.allow_changed == ("checkpoint.every", "eval.every")
    assert demo_cli.parse_args(["--budget", "96", "--set", "rollout.budget=64"]).spec.rollout.budget == 64  # --set wins


@pytest.mark.parametrize("argv,correction,old_logp", [
    ([], "none", "sampler"),  # synchronous: the paper's loss, π_old from the sampler
    (["--max-staleness", "1"], "tis", "recompute"),  # asynchronous: corrected (docs/design.md §5.1)
    (["--max-staleness", "1", "--correction", "none"], "none", "sampler"),  # the user's choice wins
    (["--max-staleness", "1", "--old-logp", "sampler"], "none", "sampler"),
    (["--max-staleness", "1", "--scripted-policy"], "none", "recompute"),  # no sampler log-probs to correct
    (["--correction", "token-mask"], "token-mask", "recompute"),
])
def test_correction_default_follows_staleness(argv, correction, old_logp):
    spec = demo_cli.parse_args(argv).spec
    assert (spec.rl.correction, spec.rl.old_logp_source) == (demo_cli.CORRECTIONS[correction], old_logp)
    assert demo_cli.CORRECTIONS[correction].enabled == (correction != "none")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_short_demo_writes_every_metric_and_matches_the_golden(tmp_path):
    summary = demo.main(TINY + ["--rl-steps", "3", "--exec-time", "0", "--out", str(tmp_path)])
    all_rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    sft = [r for r in all_rows if r.get("stage") == "sft"]
    rows = [r for r in all_rows if r.get("stage") != "sft"]
    assert sft and all(r["step"] == 0 for r in sft) and [r["sft_step"] for r in sft] == list(range(1, len(sft) + 1))
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        for k in STEP_KEYS:
            assert k in r and r[k] is not None and math.isfinite(r[k]), (k, r.get(k))
        assert r["n_sampled"] == 2 * 2 * 2  # problems x 2G generated
        assert r["n_kept"] <= 2 * 2  # at most G per problem trained (uniform groups dropped)
    assert sum(r["tool_calls_executed"] for r in rows[1:]) > 0  # real tool calls ran in the sandbox
    # one learner and one rollout service for the run: nothing compiles from the third RL step on
    assert rows[3]["compiles"] == 0, [r.get("compiles") for r in rows]
    for name in ("metrics.png", "summary.json", "eval_sft.jsonl", "config.json", SPEC_FILE):
        assert (tmp_path / name).exists(), name
    assert (tmp_path / "checkpoint").exists()
    assert math.isfinite(summary["delta_acc"])
    if os.environ.get("RECORD_GOLDEN"):  # re-record (see tests/golden/README.md)
        GOLDEN.write_text("".join(json.dumps({k: r[k] for k in GOLDEN_KEYS if k in r}) + "\n" for r in rows))
    # every compared RL step kept rows and updated (the scripted policy's groups are mixed)
    assert all(r["n_kept"] > 0 and r["train/update_norm"] > 0 for r in rows[1:]), [r["n_kept"] for r in rows]
    golden = [json.loads(x) for x in GOLDEN.read_text().splitlines()]
    assert len(rows) == len(golden) and all(g["n_kept"] > 0 for g in golden[1:])
    for got, want in zip(rows, golden):
        for k, v in want.items():
            tol = dict(rel=1e-4, abs=1e-7) if k.startswith("train/") else dict(rel=1e-6)  # fp32 reduction noise
            assert got[k] == (pytest.approx(v, **tol) if isinstance(v, float) else v), (got["step"], k)


class AlternatingReward:
    """A stand-in verifier: every other trajectory is right, so each group is mixed and every RL step
    updates, while the rollouts are the real engines' samples (no scripted policy)."""

    def __init__(self, **_):
        pass

    def batch(self, trajectories, golds):
        return [(float(i % 2), {"answer": None}) for i in range(len(trajectories))]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_demo_default_records_the_mismatch(tmp_path, monkeypatch):
    # the default configuration (π_old from the sampler, synchronous, fp32 engines, no scripted policy): the
    # mismatch comes from the update's own forward, on every updating step, with the recompute path's names
    import rstar2_jax.rewards

    monkeypatch.setattr(rstar2_jax.rewards, "RewardFn", AlternatingReward)  # what RunSpec.reward_fn builds
    demo.main([a for a in TINY if a != "--scripted-policy"] + ["--eval-every", "2", "--out", str(tmp_path)])
    spec = json.loads((tmp_path / SPEC_FILE).read_text())  # the run's whole spec, resolved
    assert (spec["rl"]["old_logp_source"], spec["rl"]["correction"]["is_level"], spec["rollout"]["scripted_policy"]) \
        == ("sampler", "none", False)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("stage") == "rl" and "reward" in r]
    assert [r["step"] for r in rl] == [1, 2] and all(r["n_kept"] > 0 for r in rl), [r.get("n_kept") for r in rl]
    for r in rl:
        m = {k: r[f"train/mismatch/{k}"] for k in ("abs_mean", "abs_max", "k3", "frac_abs_gt_0.1", "log_ppl_diff",
                                                    "coverage")}
        assert all(isinstance(v, float) and math.isfinite(v) for v in m.values()), m
        # fp32 engines at the learner's weights: numerics only (measured ~4e-7; design.md §5.1)
        assert m["coverage"] == 1.0 and m["abs_mean"] < 1e-3 and m["frac_abs_gt_0.1"] == 0.0, m
        assert 0.0 <= m["k3"] < 1e-5 and m["abs_max"] >= m["abs_mean"], m
    assert (tmp_path / "metrics.png").stat().st_size > 0


def _run(out: Path, cache: Path, extra=()):
    """A demo process; ``cache``: the persistent compilation cache the test's processes share (a later
    process loads the executables an earlier one compiled: same programs, same results). Its stderr goes
    to ``<out>.stderr`` (a pipe nobody reads while the test waits could fill and stall it): see ``_tail``."""
    cmd = [sys.executable, str(ROOT / "experiments" / "toy_tool_math.py"), *TINY, "--rl-steps", "4",
           "--ckpt-every", "1", "--exec-time", "0", "--out", str(out), *extra]
    with open(f"{out}.stderr", "ab") as err:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
                                env={**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
                                     "JAX_COMPILATION_CACHE_DIR": str(cache),
                                     "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})


def _tail(out: Path) -> str:
    """The last 2,000 characters of the stderr of the processes that wrote ``out``."""
    return Path(f"{out}.stderr").read_text(errors="replace")[-2000:]


def _rows(out: Path) -> list[dict]:
    """Metrics without timings and without ``compiles`` (a resumed process compiles again)."""
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC) and k != "compiles"} for r in rows]


def _wait_for_rl_step(proc: subprocess.Popen, out: Path, step: int, timeout_s: float = 600) -> bool:
    """Poll ``out``/metrics.jsonl until RL step ``step`` is logged (True), or ``proc`` exits / times out."""
    metrics, deadline = out / "metrics.jsonl", time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else []
        if any(r.get("stage") == "rl" and r.get("step", 0) >= step for r in rows):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_kill9_then_resume_equals_uninterrupted(tmp_path):
    # a non-default objective with the KL term: the resumed process reads the reference policy back; the
    # curriculum draws problems by the pass rates it learnt (restored from the checkpoint's cursor), and
    # dynamic sampling counts the problems it takes (the scripted groups all have signal: no extra round)
    objective = ["--loss-kind", "gspo", "--adv-kind", "dr_grpo", "--kl-coef", "0.05",
                 "--set", "schedule.curriculum.enabled=true", "--set", "rollout.dynamic_sampling.enabled=true"]
    cache = tmp_path / "jax_cache"
    straight = _run(tmp_path / "straight", cache, objective)
    # the second run starts once the first has compiled every program (RL step 2 logged: step 3 compiles
    # nothing), so it and the resumed run load them from the cache instead of compiling them again
    if not _wait_for_rl_step(straight, tmp_path / "straight", 2):
        straight.kill()  # exited early or stalled: its stderr says why
        pytest.fail(_tail(tmp_path / "straight"))
    killed = _run(tmp_path / "killed", cache, objective)
    # SIGKILL once the run is inside RL (RL step 2 of 4 logged; its checkpoint may or may not be written)
    if _wait_for_rl_step(killed, tmp_path / "killed", 2):
        killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert any(cache.iterdir())  # the compilation cache was written (and read by the later processes)
    resumed = _run(tmp_path / "killed", cache, [*objective, "--resume"])
    assert resumed.wait(timeout=900) == 0, _tail(tmp_path / "killed")
    assert straight.wait(timeout=900) == 0, _tail(tmp_path / "straight")
    got, want = _rows(tmp_path / "killed"), _rows(tmp_path / "straight")
    assert got == want
    rl = [r for r in want if r.get("stage") == "rl" and "reward" in r]
    assert len(rl) == 4 and all(r["n_kept"] > 0 and r["train/update_norm"] > 0 for r in rl)  # updating steps
    assert all(r["train/kl"] > 0 for r in rl[1:]) and (tmp_path / "killed" / "reference").is_dir()  # KL to pi_ref ran
    assert all(r["train/mismatch/coverage"] == 0.0 for r in rl)  # scripted tokens: no sampler log-probs to compare
    assert all(r["dyn/rounds"] == 0 and r["dyn/groups_kept"] == 2 for r in rl)
    assert rl[-1]["curriculum/normal"] + rl[-1]["curriculum/easy"] + rl[-1]["curriculum/hard"] > 0
