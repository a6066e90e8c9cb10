"""Device mesh ``("data", "fsdp", "tensor")`` and the one rule table from logical axes to mesh axes.

Every ``nnx.Param`` carries ``logical_axes`` where it is created (e.g. ``("embed", "mlp")``);
``param_shardings`` maps them through ``RULES`` to ``NamedSharding``s. A dimension that the mesh
axis does not divide is replicated instead (tiny test configs on 8 devices).

Activations are constrained inside the forward with ``constrain`` when a mesh is set
(``jax.set_mesh(mesh)``); without one it is a no-op, so single-device code is unchanged.

Multi-host: call ``jax.distributed.initialize()`` (coordinator address, process count and id from
the cluster's env: SLURM is auto-detected) in every process before building the mesh; ``make_mesh``
then spans ``jax.devices()`` of all processes and the same jitted code runs unchanged.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rstar2_jax.config import MeshConfig

AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of axes, or None = replicated)
RULES: dict[str, Any] = {
    "batch": ("data", "fsdp"),
    "vocab": "tensor",
    "embed": "fsdp",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "head_dim": None,
    "norm": None,
}


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``Mesh`` over ``devices`` (default: all, across processes) shaped by ``cfg``."""
    devices = list(jax.devices() if devices is None else devices)
    shape = cfg.shape(len(devices))
    return Mesh(np.asarray(devices).reshape(shape), AXES)


def _axis_size(mesh: Mesh, axis: Any) -> int:
    if axis is None:
        return 1
    names = axis if isinstance(axis, tuple) else (axis,)
    return int(np.prod([mesh.shape[a] for a in names]))


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None) -> P:
    """Map logical axis names to a ``PartitionSpec``; replicate dims the mesh axis does not divide."""
    spec = []
    for i, name in enumerate(logical):
        axis = RULES.get(name) if name is not None else None
        if axis is not None and shape is not None and mesh is not None and shape[i] % _axis_size(mesh, axis):
            axis = None
        spec.append(axis)
    return P(*spec)


def _is_var(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def param_shardings(params: nnx.State, mesh: Mesh) -> nnx.State:
    """A pytree like ``params`` whose leaves are the ``NamedSharding`` of each parameter."""
    def one(v: nnx.Variable):
        logical = v.get_metadata().get("logical_axes") or (None,) * v.get_value().ndim
        return v.replace(NamedSharding(mesh, logical_to_spec(logical, v.get_value().shape, mesh)))
    return jax.tree.map(one, params, is_leaf=_is_var)


def shard_params(params: nnx.State, mesh: Mesh) -> nnx.State:
    """Place every parameter with its ``NamedSharding``."""
    return jax.device_put(params, param_shardings(params, mesh))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a ``[B, ...]`` batch array: B over ``("data","fsdp")``, the rest replicated."""
    return NamedSharding(mesh, P(("data", "fsdp"), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    """``with_sharding_constraint`` by logical axes under the current mesh; no-op without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or tuple(mesh.axis_names) != AXES:
        return x
    spec = []
    for i, name in enumerate(logical):
        axis = RULES.get(name) if name is not None else None
        if axis is not None and x.shape[i] % _axis_size(mesh, axis):
            axis = None
        spec.append(axis)
    return jax.lax.with_sharding_constraint(x, P(*spec))
