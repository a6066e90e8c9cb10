"""The recipe run by every process (multi-controller): 2 processes x 4 fake CPU devices (gloo), killed
(SIGKILL, both processes) in RL stage 1 and resumed with ``--resume``, end exactly where 1 process x 8
ends uninterrupted (SFT, every RL stage, the filter, stage 3, evaluation; every metric and the final
params); and each ``--resume`` refusal (changed config, garbled checkpoint, removed checkpoint folder)
exits non-zero with its reason, leaving ``metrics.jsonl`` byte-identical.

One chain checks both claims (2 x 4 = 1 x 8, and resume = uninterrupted) with three launches instead of
four; a mismatch names the stage and metric, and ``killed.log<i>`` shows where the resume restarted.
The runs share a persistent compilation cache (``recipe_jax_cache``, with ``test_async_recipe.py``'s
launches: one xdist group), so the resumed processes load the executables the killed ones compiled (same
programs, same results) instead of compiling them again.
"""

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from rstar2_jax import distributed
pytestmark = pytest.mark.xdist_group("recipe_launches")  # tests/run/conftest.py: recipe_jax_cache

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "rstar2_recipe.py"
LAYOUT_VARS = [n for names in distributed.ENV_VARS.values() for n in names] + list(distributed.SLURM_VARS) + [
    "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_hnp_uri"]
NONDETERMINISTIC = ("time_", "step_s", "tokens_per_s", "compiles", "sync_moved_bytes")
STAGES = ("sft", "rl_stage1", "rl_stage2", "filter", "rl_stage3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path, n_proc: int, cache: Path, extra: tuple[str, ...] = ()) -> list[tuple[subprocess.Popen, Path]]:
    """The same command in every process (the JAX env vars each launcher sets); logs in ``out``.log<i>."""
    port = _free_port()
    procs = []
    for i in range(n_proc):
        env = {k: v for k, v in os.environ.items() if k not in LAYOUT_VARS and "_proxy" not in k.lower()}
        env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // n_proc}", JAX_PLATFORMS="cpu",
                   JAX_COMPILATION_CACHE_DIR=str(cache), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        if n_proc > 1:
            env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(n_proc),
                       JAX_PROCESS_ID=str(i))
        log = out.with_name(f"{out.name}.log{i}")
        with log.open("a") as f:
            procs.append((subprocess.Popen([sys.executable, str(SCRIPT), "--dry-run", "--out", str(out),
                                            "--no-progress", *extra], env=env, cwd=ROOT, stdout=f,
                                           stderr=subprocess.STDOUT), log))
    return procs


def _wait(procs, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for p, _ in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            for q, _ in procs:
                q.kill()
            pytest.fail(f"timed out after {timeout_s:.0f} s: {[log.read_text()[-2000:] for _, log in procs]}")
    bad = [(p.returncode, log.read_text()[-3000:]) for p, log in procs if p.returncode != 0]
    assert not bad, bad


def _whole_rows(path: Path) -> list[dict]:
    """The rows of a metrics file another process is appending to (or was killed writing): whole lines only,
    a row caught mid-write is not read (the next poll reads it)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(x) for x in text[:text.rfind("\n") + 1].splitlines() if x.strip()]


def _raw(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _rows(out: Path) -> list[dict]:
    rows = _raw(out)
    return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)} for r in rows]


def _close(a, b, rtol=1e-4) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=rtol, abs_tol=1e-6)
    return a == b


def _assert_rows_equal(got: list[dict], want: list[dict], what: str) -> None:
    assert [(r.get("stage"), r["step"]) for r in got] == [(r.get("stage"), r["step"]) for r in want], what
    for g, w in zip(got, want):
        assert set(g) == set(w), (what, set(g) ^ set(w))
        bad = {k: (g[k], w[k]) for k in w if not _close(g[k], w[k])}
        assert not bad, (what, g.get("stage"), g["step"], bad)


def _final(out: Path) -> tuple[dict, list[np.ndarray]]:
    """The newest checkpoint's cursor and params, restored in this (one) process."""
    from flax import nnx

    from rstar2_jax.model import Qwen3, split_policy
    from rstar2_jax.model.config import ModelConfig
    from rstar2_jax.rl.checkpoint import Checkpointer, abstract_train_state
    from rstar2_jax.run.spec import load_spec
    from rstar2_jax.text.tokenizer import ByteTokenizer

    _, params = split_policy(Qwen3(ModelConfig.tiny(vocab_size=ByteTokenizer().vocab_size), rngs=nnx.Rngs(0)))
    with Checkpointer(out / "checkpoint", create=False) as ckpt:
        r = ckpt.restore_latest(abstract_train_state(params, load_spec(preset="recipe_dry_run").rl))
    return r.data_cursor, [np.asarray(x) for x in jax.tree.leaves(r.state.params)]


# the batch shaping of issue 45 on: dynamic sampling gathers every process's group signal (one refill round, in
# stage 2), the curriculum every process's pass rates, restored from the cursor on resume
BATCH_SHAPING = ("--set", "rollout.dynamic_sampling.enabled=true", "--set", "schedule.curriculum.enabled=true")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, recipe_jax_cache):
    """1 x 8 uninterrupted, alongside 2 x 4 killed (SIGKILL, both processes) in RL stage 1, then resumed."""
    root = tmp_path_factory.mktemp("recipe_mp")
    cache = recipe_jax_cache
    one, killed = root / "one", root / "killed"
    straight = _launch(one, 1, cache, BATCH_SHAPING)
    procs = _launch(killed, 2, cache, BATCH_SHAPING)
    deadline, fired = time.monotonic() + 1500, False
    while time.monotonic() < deadline and all(p.poll() is None for p, _ in procs):
        rows = _whole_rows(killed / "metrics.jsonl")
        if any(r.get("stage") == "rl_stage1" and r.get("stage_step") == 1 for r in rows):
            for p, _ in procs:
                p.send_signal(signal.SIGKILL)
            fired = True
            break
        time.sleep(0.2)
    for p, _ in procs:
        p.wait()
    assert fired and all(p.returncode == -signal.SIGKILL for p, _ in procs), (
        "the run ended before it was killed", [log.read_text()[-2000:] for _, log in procs])
    at_kill = _whole_rows(killed / "metrics.jsonl")  # a row SIGKILL cut mid-write is not one
    _wait(_launch(killed, 2, cache, (*BATCH_SHAPING, "--resume")) + straight, timeout_s=1500)
    return {"one": one, "killed": killed, "at_kill": at_kill}


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the module fixture runs 3 recipe launches (5 processes) on 2 cores
def test_two_processes_killed_and_resumed_run_the_recipe_like_one(runs):
    one, two = runs["one"], runs["killed"]
    placement = "placement: processes = {}, engines = 4, devices_per_engine = 2, devices_used = 8/8"
    assert placement.format(1) in one.with_name("one.log0").read_text()
    for i in range(2):
        assert placement.format(2) in two.with_name(f"killed.log{i}").read_text()
    assert "resume: from" in two.with_name("killed.log0").read_text()
    assert any(r.get("stage") == "rl_stage1" for r in runs["at_kill"])  # killed inside RL stage 1
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert s1["processes"] == 1 and s2["processes"] == 2 and s1["mesh"] == s2["mesh"] == [1, 8, 1]
    assert s1["stages"] == list(STAGES) and s2["stages"] == list(STAGES[1:])  # the resumed process: RL on
    r1, r2 = _rows(one), _rows(two)
    for stage in STAGES:  # the comparison per stage, every metric at rtol 1e-4
        _assert_rows_equal([r for r in r2 if r.get("stage") == stage], [r for r in r1 if r.get("stage") == stage],
                           stage)
    assert len([r for r in r1 if r.get("stage") == "sft"]) >= 1
    rl = [r for r in _raw(one) if r.get("stage", "").startswith("rl_") and "reward" in r]
    assert s1["steps_per_stage"] == s2["steps_per_stage"] == {"rl_stage1": 2, "rl_stage2": 1, "filter": 0,
                                                               "rl_stage3": 1}
    assert all(r["n_kept"] > 0 and r["train/update_norm"] > 0 for r in rl)  # every RL step updated
    assert all(r["tool_calls_executed"] > 0 for r in rl)  # the scripted policy's calls ran in the sandbox
    # every step trained problems_per_step groups with signal; stage 2's first batch had a group without
    # signal, so a refill round ran, in 2 x 4 (resumed) as in 1 x 8 (the rows above are equal)
    assert all(r["dyn/groups_kept"] == 4 and r["dyn/short"] == 0 for r in rl)
    assert [r["dyn/rounds"] for r in rl] == [0, 0, 1, 0], [r["dyn/rounds"] for r in rl]
    assert all(sum(r[f"curriculum/{p}"] for p in ("easy", "normal", "hard", "retired")) > 0 for r in rl)
    # the learner and the rollout service are built once: nothing compiles after the first RL step
    assert [r["compiles"] for r in rl[1:]] == [0] * (len(rl) - 1), [r["compiles"] for r in rl]
    assert sum(r.get("heldout_acc") is not None for r in r1) >= 2  # evaluation after SFT and later
    (c1, p1), (c2, p2) = _final(one), _final(two)
    assert c1["stage"] == c2["stage"] == "done" and c1["global_step"] == c2["global_step"]
    assert c1["kept_ids"] == c2["kept_ids"] and c1["kept_ids"]  # the filter kept the same problems
    pool = [json.loads(x)["id"] for x in (one / "dry_rl.jsonl").read_text().splitlines()][:4]  # filter_pool 4
    assert c1["kept_ids"] == pool[1:]  # the scripted policy solves the first problem 2/2: it was dropped
    filt = [r for r in r1 if r.get("stage") == "filter"]
    assert [(r["filter_pool"], r["filter_kept"]) for r in filt] == [(4, 3)]
    assert c2["rollout"] is not None and len(c2["rollout"]) == 2  # each process's dispatcher state
    for a, b in zip(p1, p2):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
    # process 0 alone wrote the files
    assert (two / "metrics.png").exists() and (two / "run_spec.json").exists()
    moved = list(two.glob("metrics.after_*.jsonl"))  # rows after the restored checkpoint, if any, kept aside
    n_after = sum(len(p.read_text().splitlines()) for p in moved)
    assert len(runs["at_kill"]) - n_after <= len(_rows(two))


def _refused(run_dir: Path, argv: list[str], match: str, capsys) -> None:
    from rstar2_jax.run import recipe_main

    before = (run_dir / "metrics.jsonl").read_bytes()
    listing = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    with pytest.raises(SystemExit) as e:
        recipe_main.main(["--dry-run", "--out", str(run_dir), "--no-progress", "--resume", *argv])
    assert e.value.code not in (0, None) and str(e.value.code).startswith("--resume"), e.value.code
    assert __import__("re").search(match, str(e.value.code)), str(e.value.code)
    print(f"refusal: {e.value.code}")
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # byte-identical
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == listing  # nothing written


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_resume_refusals_name_the_reason_and_write_nothing(runs, tmp_path, capsys):
    base = tmp_path / "base"
    shutil.copytree(runs["one"], base, ignore=shutil.ignore_patterns("*.log*"))
    changed = tmp_path / "changed"
    shutil.copytree(base, changed)
    _refused(changed, ["--set", "rl.optim.lr=0.001"], r"configuration differs .*rl.optim.lr: saved 0.0001, now 0.001",
             capsys)
    garbled = tmp_path / "garbled"
    shutil.copytree(base, garbled)
    for p in (garbled / "checkpoint").rglob("*"):
        if p.is_file() and "state" in p.parts:
            p.write_bytes(os.urandom(max(p.stat().st_size, 16)))
    _refused(garbled, [], r"no checkpoint in .*checkpoint restores: step \d+: ", capsys)
    removed = tmp_path / "removed"
    shutil.copytree(base, removed)
    shutil.rmtree(removed / "checkpoint")
    _refused(removed, [], r"nothing to resume in .*removed: no checkpoint folder", capsys)
