"""Subprocess for the resume test (not a test module): a tiny GRPO-RoC run on a (2,2,2) CPU mesh.

  python rl_resume_worker.py straight DIR OUT  -> 3 steps, checkpoint after step 2, dump after 3
  python rl_resume_worker.py resume   DIR OUT  -> fresh objects restore step 2, 1 step, dump
Each step's batch comes from the data cursor and the state's step (the "sampling" noise), so the
resumed run matches only if params, optimizer state, step and cursor all come back.
"""

import os
import sys

from rstar2_jax.utils.xla_flags import force_host_device_count  # noqa: E402  (no JAX)

force_host_device_count(8, who="rl_resume_worker.py")  # added to the user's XLA_FLAGS, not replacing them
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from rstar2_jax.model import Qwen3, make_mesh, shard_params, split_policy  # noqa: E402
from rstar2_jax.model.config import MeshConfig, ModelConfig  # noqa: E402
from rstar2_jax.rl.checkpoint import Checkpointer, abstract_train_state  # noqa: E402
from rstar2_jax.rl.config import OptimConfig, RLConfig  # noqa: E402
from rstar2_jax.rl.train_step import init_train_state, make_train_step, shard_batch  # noqa: E402

B, T = 8, 16
CFG = dataclasses.replace(RLConfig.tiny(), micro_batch_size=4, optim=OptimConfig(lr=1e-3, warmup_steps=2))


def make_batch(cursor: int, step: int) -> dict:
    data = np.random.default_rng(cursor)  # the "dataset" row block at this cursor
    tok = data.integers(0, 128, (B, T + 1)).astype(np.int32)
    mask = np.ones((B, T), np.float32)
    mask[:, :3] = 0
    adv = np.random.default_rng([1, step]).normal(size=B).astype(np.float32)  # "sampling" noise
    return dict(tokens=tok[:, :-1], targets=tok[:, 1:], loss_mask=mask, advantages=adv)


def main(mode: str, ckpt_dir: str, out: str) -> None:
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=2))
    model_cfg = ModelConfig.tiny(num_layers=1)
    graphdef, params = split_policy(Qwen3(model_cfg, rngs=nnx.Rngs(0)))
    step_fn = make_train_step(graphdef, CFG, mesh=mesh)
    ckpt = Checkpointer(ckpt_dir, max_to_keep=2)
    if mode == "straight":
        state, cursor, n_steps = init_train_state(shard_params(params, mesh), CFG, 42, mesh=mesh), 0, 3
    else:
        _, abstract_params = split_policy(nnx.eval_shape(lambda: Qwen3(model_cfg, rngs=nnx.Rngs(1))))
        restored = ckpt.restore(abstract_train_state(abstract_params, CFG, mesh))
        assert restored is not None and restored.step == 2, restored
        assert RLConfig.from_json_dict(restored.config) == CFG
        state, cursor, n_steps = restored.state, restored.data_cursor["cursor"], 1
    for _ in range(n_steps):
        state, metrics = step_fn(state, shard_batch(make_batch(cursor, int(state.step)), mesh))
        cursor += 1
        if mode == "straight" and int(state.step) == 2:
            ckpt.save(state, data_cursor={"cursor": cursor}, config=CFG, metrics=metrics)
    ckpt.close()
    leaves = {f"p{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(state))}
    np.savez(out, **leaves, **{f"m_{k}": np.asarray(v) for k, v in metrics.items()}, cursor=cursor)


if __name__ == "__main__":
    main(*sys.argv[1:])
