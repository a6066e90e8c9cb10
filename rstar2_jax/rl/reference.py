"""The frozen reference policy π_ref of the optional KL penalty (``LossConfig.kl_coef`` > 0).

One copy of the weights, made once, with the same shardings as the policy's parameters (so the
reference pass runs with the policy's layout and costs one more no-grad pass, not a second layout):
it must be a copy because the train step donates the state's buffers.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from flax import nnx


def reference_params(params: nnx.State, like: nnx.State | None = None) -> nnx.State:
    """A copy of ``params`` (e.g. the SFT policy) laid out with the shardings of ``like`` (the policy's
    params, the same tree) or, without it, each leaf's own."""
    shardings = jax.tree.map(lambda x: x.sharding, params if like is None else like)
    return jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=shardings)(params)


def save_reference(params: nnx.State, directory: Path) -> None:
    """Write π_ref once (orbax; every process calls it with its global arrays), so a resumed run
    penalises the KL to the same policy it started from. Does nothing when it already exists."""
    directory = Path(directory).absolute()
    if (directory / "_CHECKPOINT_METADATA").exists() or (directory / "_METADATA").exists():
        return
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(directory, params)
        ckpt.wait_until_finished()


def load_reference(directory: Path, like: nnx.State) -> nnx.State:
    """π_ref saved by :func:`save_reference`, laid out like ``like`` (the policy's params)."""
    directory = Path(directory).absolute()
    if not directory.exists():
        raise FileNotFoundError(f"{directory}: no saved reference policy; the KL term of a resumed run needs the "
                                f"policy saved when RL started (written there by the first RL stage)")
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like)
    with ocp.StandardCheckpointer() as ckpt:
        return ckpt.restore(directory, abstract)
