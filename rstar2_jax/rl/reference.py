"""The frozen reference policy π_ref of the optional KL penalty (``LossConfig.kl_coef`` > 0).

One copy of the weights, made once, with the same shardings as the policy's parameters (so the
reference pass runs with the policy's layout and costs one more no-grad pass, not a second layout):
it must be a copy because the train step donates the state's buffers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def reference_params(params: nnx.State, like: nnx.State | None = None) -> nnx.State:
    """A copy of ``params`` (e.g. the SFT policy) laid out with the shardings of ``like`` (the policy's
    params, the same tree) or, without it, each leaf's own."""
    shardings = jax.tree.map(lambda x: x.sharding, params if like is None else like)
    return jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=shardings)(params)
