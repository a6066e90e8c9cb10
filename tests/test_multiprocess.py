"""Multi-process JAX (``rstar2_jax.distributed``): where the process layout comes from, global arrays
from host data, and a 2-process CPU run (gloo collectives) of 2 GRPO-RoC updates equal to 1 process.
Rollouts over several processes (each its own engines, sandbox pool and shard of the problems) are
checked end to end by tests/run/test_recipe_multiprocess.py (2 x 4 devices = 1 x 8, every stage)."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from rstar2_jax import distributed
from rstar2_jax.model import Qwen3, make_mesh, shard_params, split_policy
from rstar2_jax.model.config import MeshConfig, ModelConfig
from rstar2_jax.rl.train_step import shard_batch

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("multiprocess_worker.py")
LAYOUT_VARS = [n for names in distributed.ENV_VARS.values() for n in names] + list(distributed.SLURM_VARS) + [
    "OMPI_COMM_WORLD_SIZE", "OMPI_MCA_orte_hnp_uri"]
SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "4", "SLURM_PROCID": "3",
         "SLURM_LOCALID": "1"}


def test_resolve_without_layout_is_single_process():
    setup = distributed.resolve(env={})
    assert not setup.multi and (setup.num_processes, setup.process_id, setup.source) == (1, 0, "single")
    assert not distributed.resolve(env={"RSTAR2_NUM_PROCESSES": "1"}).multi
    assert not distributed.resolve(env={**SLURM, "SLURM_NTASKS": "1"}).multi  # srun -n 1


def test_resolve_order_args_then_rstar2_env_then_jax_env():
    env = {"RSTAR2_NUM_PROCESSES": "4", "RSTAR2_PROCESS_ID": "2", "JAX_PROCESS_ID": "3",
           "JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "8"}
    setup = distributed.resolve(env=env)
    assert (setup.coordinator_address, setup.num_processes, setup.process_id, setup.source) == (
        "10.0.0.1:1234", 4, 2, "env")
    setup = distributed.resolve("h:1", 2, 1, env=env)
    assert (setup.coordinator_address, setup.num_processes, setup.process_id, setup.source) == ("h:1", 2, 1, "args")


def test_resolve_under_srun_leaves_the_gaps_to_jax_slurm_detection():
    setup = distributed.resolve(env=SLURM)
    assert setup.multi and setup.source == "slurm"
    assert (setup.coordinator_address, setup.num_processes, setup.process_id) == (None, None, None)
    setup = distributed.resolve(env={**SLURM, "RSTAR2_COORDINATOR": "node1:5000"})
    assert setup.coordinator_address == "node1:5000" and setup.source == "slurm"


def test_resolve_incomplete_layout_names_the_missing_variables():
    with pytest.raises(ValueError, match="RSTAR2_COORDINATOR.*RSTAR2_PROCESS_ID"):
        distributed.resolve(env={"RSTAR2_NUM_PROCESSES": "2"})
    with pytest.raises(ValueError, match="RSTAR2_NUM_PROCESSES"):
        distributed.resolve(env={"RSTAR2_PROCESS_ID": "1"})


def test_initialize_is_a_no_op_for_one_process(monkeypatch):
    for name in LAYOUT_VARS:
        monkeypatch.delenv(name, raising=False)
    setup = distributed.initialize()
    assert not setup.multi and not jax.distributed.is_initialized()
    assert distributed.is_main_process()
    distributed.sync("single")  # no barrier with one process


def test_global_arrays_in_one_process_equal_shard_batch_and_shard_params():
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    rng = np.random.default_rng(0)
    batch = {"tokens": rng.integers(0, 128, (8, 16)).astype(np.int32),
             "advantages": rng.normal(size=8).astype(np.float32)}
    got, want = distributed.global_batch(batch, mesh), shard_batch(batch, mesh)
    for k in batch:
        assert got[k].sharding == want[k].sharding
        np.testing.assert_array_equal(np.asarray(got[k]), batch[k])
    _, params = split_policy(Qwen3(ModelConfig.tiny(num_layers=1), rngs=nnx.Rngs(0)))
    got, want = distributed.global_params(params, mesh), shard_params(params, mesh)
    assert [x.sharding for x in jax.tree.leaves(got)] == [x.sharding for x in jax.tree.leaves(want)]
    for a, b, h in zip(jax.tree.leaves(got), jax.tree.leaves(params), jax.tree.leaves(distributed.to_host(got))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert isinstance(h, np.ndarray)


def test_process_local_batch_in_one_process_is_the_global_batch():
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    assert distributed.process_rows(mesh, 8) == slice(0, 8)
    x = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    got = distributed.process_local_batch({"x": x}, mesh)["x"]
    assert got.sharding == shard_batch({"x": x}, mesh)["x"].sharding
    np.testing.assert_array_equal(np.asarray(got), x)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(out: Path, log: Path, devices: int, layout: dict[str, str], worker: Path = WORKER,
           args: tuple[str, ...] = ("1,2,2",)) -> subprocess.Popen:
    # no inherited layout; no proxy (gRPC to the loopback coordinator could be sent through it)
    env = {k: v for k, v in os.environ.items() if k not in LAYOUT_VARS and "_proxy" not in k.lower()}
    # --xla_backend_optimization_level=0: XLA:CPU without LLVM optimization compiles the train step in
    # about half the CPU time (the run is mostly start-up and compilation); all processes use it
    flags = f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"
    env.update(layout, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.Popen([sys.executable, str(worker), str(out), *args], env=env, cwd=ROOT,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _run_all(procs: list[tuple[subprocess.Popen, Path]], timeout_s: float) -> None:
    """Wait for every process; a hang (e.g. a peer that never joins a collective) kills all and fails."""
    deadline = time.monotonic() + timeout_s
    try:
        for p, _ in procs:
            p.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        hung = [p for p, _ in procs if p.poll() is None]
        for p in hung:
            p.kill()
            p.wait()
    bad = [(p.returncode, log.read_text()[-3000:]) for p, log in procs if p.returncode != 0]
    if hung or bad:
        pytest.fail(f"{len(hung)} worker(s) timed out after {timeout_s:.0f} s; failures: {bad}")


@pytest.mark.slow
def test_two_processes_train_like_one_process(tmp_path):
    """fsdp=2 x tensor=2 over 2 processes x 2 CPU devices (params, batch and the gradient
    reduction cross processes) vs the same mesh shape on 4 devices of one process."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    port = _free_port()
    procs = [(_spawn(one, tmp_path / "one.log", 4, {}), tmp_path / "one.log")]
    for i in range(2):
        layout = {"RSTAR2_COORDINATOR": f"127.0.0.1:{port}", "RSTAR2_NUM_PROCESSES": "2", "RSTAR2_PROCESS_ID": str(i)}
        procs.append((_spawn(two, tmp_path / f"two{i}.log", 2, layout), tmp_path / f"two{i}.log"))
    _run_all(procs, timeout_s=400)

    ref = np.load(one / "proc0.npz")
    assert int(ref["process_count"]) == 1 and int(ref["num_devices"]) == 4 and int(ref["step"]) == 2
    assert not ref["sharded_across_processes"]
    n_params = sum(k.startswith("p") and k[1:].isdigit() for k in ref.files)
    assert all(ref["m_update_norm"] > 0)  # the updates did move the params
    for i in range(2):
        got = np.load(two / f"proc{i}.npz")
        assert (int(got["process_count"]), int(got["num_devices"]), int(got["local_devices"])) == (2, 4, 2)
        assert got["sharded_across_processes"]  # some params really had shards in the other process
        assert list(got["rows"]) == [4 * i, 4 * i + 4]  # fsdp spans the processes: 4 of the 8 rows each
        for k in ("m_loss", "m_grad_norm", "m_update_norm", "m_loss_denom"):
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=k)
        diff = max(float(np.abs(got[f"p{j}"] - ref[f"p{j}"]).max()) for j in range(n_params))
        assert diff < 1e-5, diff
