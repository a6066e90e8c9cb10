"""Device meshes and the one rules type from logical axes to mesh axes (``ShardingRules``).

Every ``nnx.Param`` carries ``logical_axes`` where it is created (e.g. ``("embed", "mlp")``). A
``ShardingRules`` (frozen, one field per logical axis) maps them to mesh axes; there are two
instances: ``TRAINER_RULES`` over the trainer's mesh ``("data", "fsdp", "tensor")`` (FSDP + tensor
parallelism) and ``ENGINE_RULES`` over an engine's tensor-parallel sub-mesh ``("kv", "rep")``
(``deploy.placement``, Megatron / vLLM style). ``param_shardings`` maps parameters through the
trainer's rules to ``NamedSharding``s. A dimension that its mesh axes do not divide is replicated
instead (tiny test configs on 8 devices); a spec that would use one mesh axis twice raises.

Activations are constrained inside the forward with ``constrain`` under the mesh set with
``jax.set_mesh(mesh)``, by that mesh's rules (``rules_for``: a mesh no rules cover raises, naming
its missing axes); without a mesh there is nothing to constrain (single-device code).

Multi-host: call ``jax.distributed.initialize()`` (coordinator address, process count and id from
the cluster's env: SLURM is auto-detected) in every process before building the mesh; ``make_mesh``
then spans ``jax.devices()`` of all processes and the same jitted code runs unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rstar2_jax.model.config import MeshConfig

MeshAxis = str | tuple[str, ...] | None  # one mesh axis, several (major first), or None: replicated
LOGICAL_AXES = ("batch", "vocab", "embed", "q_heads", "kv_heads", "mlp", "head_dim", "norm")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ShardingRules:
    """Logical axis -> mesh axis over a mesh with axes ``axes`` (one field per logical axis)."""

    axes: tuple[str, ...]  # the mesh's axis names these rules are written for
    batch: MeshAxis = None  # rows of a batch (data parallelism)
    vocab: MeshAxis = None  # embedding rows, LM-head columns
    embed: MeshAxis = None  # the model width D
    q_heads: MeshAxis = None  # N query heads
    kv_heads: MeshAxis = None  # K key/value heads
    mlp: MeshAxis = None  # the MLP width
    head_dim: MeshAxis = None
    norm: MeshAxis = None
    replicate_size_one: bool = False  # a mesh axis of size 1 is written as None (replicated) in specs

    def __post_init__(self) -> None:
        for name in LOGICAL_AXES:
            for a in _names(getattr(self, name)):
                if a not in self.axes:
                    raise ValueError(f"ShardingRules.{name} maps to mesh axis {a!r}, not one of {self.axes}")

    def spec(self, logical: Sequence[str | None], shape: Sequence[int] | None = None,
             sizes: Mapping[str, int] | None = None) -> P:
        """The ``PartitionSpec`` of an array by its logical axes; with ``shape`` and the mesh's axis
        ``sizes``, a dim its mesh axes do not divide is replicated. Raises when a mesh axis would
        shard two dims of one array, or a logical axis is unknown."""
        spec, used = [], set()
        for i, name in enumerate(logical):
            if name is not None and name not in LOGICAL_AXES:
                raise ValueError(f"unknown logical axis {name!r} (known: {LOGICAL_AXES})")
            axis = getattr(self, name) if name is not None else None
            if axis is not None and shape is not None and sizes is not None:
                size = int(np.prod([sizes[a] for a in _names(axis)]))
                if shape[i] % size or (self.replicate_size_one and size == 1):
                    axis = None
            if set(_names(axis)) & used:
                raise ValueError(f"logical axes {tuple(logical)} map mesh axis {set(_names(axis)) & used} twice")
            used |= set(_names(axis))
            spec.append(axis)
        return P(*spec)


def _names(axis: MeshAxis) -> tuple[str, ...]:
    return () if axis is None else (axis if isinstance(axis, tuple) else (axis,))


AXES = ("data", "fsdp", "tensor")
TRAINER_RULES = ShardingRules(axes=AXES, batch=("data", "fsdp"), vocab="tensor", embed="fsdp", q_heads="tensor",
                              kv_heads="tensor", mlp="tensor")
# an engine's TP sub-mesh: KV heads split over "kv" (each replicated over "rep"); q heads, MLP width and
# vocabulary split over both, kv-major (the query heads of a device belong to the KV head it holds)
ENGINE_AXES = ("kv", "rep")
ENGINE_RULES = ShardingRules(axes=ENGINE_AXES, q_heads=ENGINE_AXES, kv_heads="kv", mlp=ENGINE_AXES,
                             vocab=ENGINE_AXES, replicate_size_one=True)
_BY_AXES = {r.axes: r for r in (TRAINER_RULES, ENGINE_RULES)}


def rules_for(mesh: Any) -> ShardingRules:
    """The rules written for ``mesh``'s axis names; raises naming what is missing."""
    names = tuple(mesh.axis_names)
    if names in _BY_AXES:
        return _BY_AXES[names]
    near = max(_BY_AXES.values(), key=lambda r: len(set(r.axes) & set(names)))
    missing = [a for a in near.axes if a not in names]
    raise ValueError(f"no ShardingRules for a mesh with axes {names}: the closest rules want axes {near.axes} "
                     f"(missing {missing}); pass rules= explicitly")


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``Mesh`` over ``devices`` (default: all, across processes) shaped by ``cfg``."""
    devices = list(jax.devices() if devices is None else devices)
    shape = cfg.shape(len(devices))
    return Mesh(np.asarray(devices).reshape(shape), AXES)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None, rules: ShardingRules = TRAINER_RULES) -> P:
    """Map logical axis names to a ``PartitionSpec`` by ``rules``; replicate dims the mesh axis does not divide."""
    return rules.spec(logical, shape, None if mesh is None else dict(mesh.shape))


def _is_var(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def param_shardings(params: nnx.State, mesh: Mesh, rules: ShardingRules | None = None) -> nnx.State:
    """A pytree like ``params`` whose leaves are the ``NamedSharding`` of each parameter (by ``rules``,
    default the mesh's: ``rules_for``)."""
    rules = rules_for(mesh) if rules is None else rules
    sizes = dict(mesh.shape)

    def one(v: nnx.Variable):
        logical = v.get_metadata().get("logical_axes") or (None,) * v.get_value().ndim
        return v.replace(NamedSharding(mesh, rules.spec(logical, v.get_value().shape, sizes)))
    return jax.tree.map(one, params, is_leaf=_is_var)


def shard_params(params: nnx.State, mesh: Mesh) -> nnx.State:
    """Place every parameter with its ``NamedSharding``."""
    return jax.device_put(params, param_shardings(params, mesh))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a ``[B, ...]`` batch array: B over ``("data","fsdp")``, the rest replicated."""
    return NamedSharding(mesh, P(("data", "fsdp"), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def constrain(x: jax.Array, logical: Sequence[str | None], rules: ShardingRules | None = None) -> jax.Array:
    """``with_sharding_constraint`` of ``x`` by its logical axes under the current mesh (``jax.set_mesh``),
    by ``rules`` (default: the mesh's, ``rules_for``, which raises for a mesh no rules cover). Without
    a mesh there is no sharding to constrain: ``x`` is returned as is."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return x
    rules = rules_for(mesh) if rules is None else rules
    missing = [a for a in rules.axes if a not in mesh.axis_names]
    if missing:
        raise ValueError(f"constrain: the mesh {tuple(mesh.axis_names)} lacks the rules' axes {missing}")
    return jax.lax.with_sharding_constraint(x, rules.spec(logical, x.shape, dict(mesh.shape)))
