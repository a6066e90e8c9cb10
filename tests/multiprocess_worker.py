"""Subprocess for tests/test_multiprocess.py (not a test module): 2 GRPO-RoC updates of a tiny policy.

  python multiprocess_worker.py OUT_DIR DATA,FSDP,TENSOR

The same script is the 1-process reference (no env: ``distributed.initialize`` is a no-op) and each
process of the N-process run (``RSTAR2_COORDINATOR``, ``RSTAR2_NUM_PROCESSES``, ``RSTAR2_PROCESS_ID``
set by the test). Params and batches come from fixed seeds, identical in every process; step 1 passes
the whole batch in every process (``shard_batch``), step 2 only this process's rows
(``distributed.process_local_batch``). Each process writes ``OUT_DIR/proc{i}.npz``: the final params
gathered to the host, per-step metrics, and the layout (process count, devices, its batch rows,
whether params had shards on other processes).
"""

import os
import sys

from rstar2_jax.utils.xla_flags import force_host_device_count  # noqa: E402  (no JAX)

force_host_device_count(4, who="multiprocess_worker.py")  # added to the user's XLA_FLAGS, not replacing them
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402

from rstar2_jax import distributed  # noqa: E402

SETUP = distributed.initialize(initialization_timeout=60)  # before any other JAX call

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from rstar2_jax.model import Qwen3, make_mesh, split_policy  # noqa: E402
from rstar2_jax.model.config import MeshConfig, ModelConfig  # noqa: E402
from rstar2_jax.rl.config import OptimConfig, RLConfig  # noqa: E402
from rstar2_jax.rl.train_step import init_train_state, make_train_step, shard_batch  # noqa: E402

B, T = 8, 16
# Adam's first steps are sign-like (g / (|g| + ε)): ε = 1e-4 keeps fp32 reduction-order noise on
# near-zero gradient entries from being amplified to ~lr (as in tests/rl/test_rl_train_step.py).
CFG = dataclasses.replace(RLConfig.tiny(), micro_batch_size=4, optim=OptimConfig(lr=1e-3, warmup_steps=0, eps=1e-4))
METRICS = ("loss", "loss_denom", "n_tokens", "grad_norm", "update_norm", "ratio_mean", "approx_kl")


def make_batch(seed: int) -> dict:
    """8 rows of 16 tokens, the same in every process (host numpy from a seed)."""
    rng = np.random.default_rng(seed)
    tok = rng.integers(0, 128, (B, T + 1)).astype(np.int32)
    mask = np.ones((B, T), np.float32)
    mask[:, :4] = 0  # prompt
    mask[:, 8:10] = 0  # a "tool response"
    adv = rng.normal(size=B).astype(np.float32)
    return dict(tokens=tok[:, :-1], targets=tok[:, 1:], loss_mask=mask, advantages=adv)


def main(out_dir: str, mesh_shape: str) -> None:
    data, fsdp, tensor = (int(x) for x in mesh_shape.split(","))
    mesh = make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor))
    graphdef, params = split_policy(Qwen3(ModelConfig.tiny(), rngs=nnx.Rngs(0)))
    params = distributed.global_params(params, mesh)
    cross = [not x.is_fully_addressable for x in jax.tree.leaves(params)]
    state = init_train_state(params, CFG, 0, mesh=mesh)
    step = make_train_step(graphdef, CFG, mesh=mesh)
    metrics = {k: [] for k in METRICS}
    rows = distributed.process_rows(mesh, B)
    batches = [shard_batch(make_batch(0), mesh),  # every process passes the whole batch
               distributed.process_local_batch({k: v[rows] for k, v in make_batch(1).items()}, mesh)]  # its rows
    for batch in batches:
        state, m = step(state, batch)
        for k in METRICS:
            metrics[k].append(float(m[k]))  # replicated scalars: readable in every process
    leaves = distributed.to_host(jax.tree.leaves(state.params))
    np.savez(os.path.join(out_dir, f"proc{jax.process_index()}.npz"),
             **{f"p{i}": x for i, x in enumerate(leaves)}, **{f"m_{k}": np.asarray(v) for k, v in metrics.items()},
             process_count=jax.process_count(), num_devices=jax.device_count(),
             local_devices=jax.local_device_count(), step=int(state.step), rows=np.asarray([rows.start, rows.stop]),
             sharded_across_processes=np.asarray(any(cross)))
    distributed.sync("multiprocess_worker_done")  # nobody exits while another still needs a collective


if __name__ == "__main__":
    main(*sys.argv[1:])
