"""Trainer params -> every engine's tensor-parallel layout, device to device (never through the host).

``jax.device_put`` of an array sharded over the training mesh (e.g. FSDP over the hidden dim) to an
engine's TP sharding (heads split, hidden dim whole) finds no source shard holding a target slice
and falls back to the host (``array.shard_sharded_device_array_slow_path`` reads ``x._value``).
``WeightSync`` avoids that in two steps:

1. **stage** (one jitted reshard over the training mesh, built once): every parameter is resharded
   to the engines' TP specs on the training devices viewed as ``("stage", "kv", "rep")``, i.e.
   every block of T training devices holds one full TP-sharded copy (an all-gather over the FSDP
   axis, done by XLA's collectives), cast to the engines' weight dtype in the same program;
2. **assemble**: each engine's array is built from the staged shard with the same slice, copied to
   the engine's device (``jax.device_put`` of a single-device buffer: a device-to-device copy, or
   no copy at all when the engine's device already holds it), then
   ``jax.make_array_from_single_device_arrays``.

Multi-process: the training mesh spans the processes; each process reads only its addressable
staged shards, so every process needs one full staged copy on its own devices (its local device
count a multiple of T, the mesh's devices ordered by process: ``make_mesh`` does that).
Params that are not on a mesh (one device, or replicated) skip the stage and are sliced on device.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rstar2_jax.sampling.layout import ENGINE_AXES, EngineLayout

Index = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SyncStats:
    seconds: float  # wall time until every engine holds the new weights
    bytes: int  # parameter bytes of one engine's copy (its weight dtype)
    engines: int
    moved_bytes: int = 0  # bytes copied between devices (shards an engine's device already held: 0)


def _norm(index: tuple[slice, ...], shape: tuple[int, ...]) -> Index:
    return tuple((s.start or 0, n if s.stop is None else s.stop) for s, n in zip(index, shape))


def _is_var(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


class WeightSync:
    """Built once per run for the engines' ``layouts`` (same TP degree and weight dtype)."""

    def __init__(self, layouts: Sequence[EngineLayout]):
        if not layouts:
            raise ValueError("WeightSync needs at least one engine layout")
        first = layouts[0]
        if any((lay.tp, lay.kv, lay.weight_dtype) != (first.tp, first.kv, first.weight_dtype) for lay in layouts):
            raise ValueError("WeightSync: every engine must have the same devices_per_engine and weight dtype")
        self.layouts, self.rule = list(layouts), first
        self._stage_fns: dict[Any, Any] = {}  # source mesh -> jitted stage (one per run in practice)

    # -- stage -------------------------------------------------------------------------------------
    def _staging(self, params: nnx.State, mesh: Mesh) -> Any:
        devs = np.asarray(mesh.devices).reshape(-1)
        t = self.rule.tp
        if len(devs) % t:
            raise ValueError(f"WeightSync: the training mesh's {len(devs)} devices are not divisible by "
                             f"devices_per_engine={t}")
        smesh = Mesh(devs.reshape(len(devs) // t, self.rule.kv, self.rule.rep), ("stage", *ENGINE_AXES))

        def one(v: nnx.Variable):
            x = v.get_value()
            logical = v.get_metadata().get("logical_axes") or (None,) * x.ndim
            return v.replace(NamedSharding(smesh, self.rule.logical_spec(logical, x.shape)))
        return jax.tree.map(one, params, is_leaf=_is_var)

    def stage(self, params: nnx.State) -> nnx.State:
        """``params`` resharded (and cast) for the engines on their training devices (see module doc)."""
        dt = self.rule.weight_dtype
        cast = (lambda p: p) if dt is None else (lambda p: jax.tree.map(
            lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) else x, p))
        leaf = jax.tree.leaves(params)[0]
        mesh = getattr(leaf.sharding, "mesh", None)
        if not isinstance(mesh, Mesh) or mesh.size == 1:
            return params if dt is None else jax.jit(cast)(params)  # on its one device
        key = (mesh, jax.tree.structure(params))
        if key not in self._stage_fns:
            self._stage_fns[key] = jax.jit(cast, out_shardings=self._staging(params, mesh))
        return self._stage_fns[key](params)

    # -- assemble ----------------------------------------------------------------------------------
    def assemble(self, staged: nnx.State, layout: EngineLayout) -> tuple[nnx.State, int]:
        """One engine's params from ``staged`` (device-to-device); returns them and the bytes moved."""
        moved = 0

        def one(x: jax.Array, target: NamedSharding) -> jax.Array:
            nonlocal moved
            shards = [(_norm(s.index, x.shape), s.data) for s in x.addressable_shards]
            bufs = []
            for dev, idx in target.addressable_devices_indices_map(x.shape).items():
                want = _norm(idx, x.shape)
                holders = [(have, buf) for have, buf in shards
                           if all(a <= c and d <= b for (a, b), (c, d) in zip(have, want))]
                if not holders:
                    raise ValueError(f"WeightSync: no shard on this process holds slice {want} of a {x.shape} "
                                     "parameter (local devices not a multiple of devices_per_engine?)")
                have, buf = next(((h, b) for h, b in holders if b.devices() == {dev}), holders[0])
                if have != want:  # a larger shard: slice it on its device
                    buf = buf[tuple(slice(c - a, d - a) for (a, _), (c, d) in zip(have, want))]
                if buf.devices() != {dev}:
                    moved += buf.nbytes
                    buf = jax.device_put(buf, dev)
                bufs.append(buf)
            return jax.make_array_from_single_device_arrays(x.shape, target, bufs)

        targets = layout.param_shardings(staged)
        out = jax.tree.map(lambda v, s: v.replace(one(v.get_value(), s.get_value())), staged, targets,
                           is_leaf=_is_var)
        return out, moved

    def place(self, params: nnx.State) -> list[nnx.State]:
        """Each layout's copy of ``params`` (e.g. to build the engines from trainer params)."""
        staged = self.stage(params)
        return [self.assemble(staged, lay)[0] for lay in self.layouts]

    def __call__(self, params: nnx.State, engines: Sequence[Any]) -> SyncStats:
        """Stage once, then give every engine (``layout`` attribute; ``set_params``) its copy."""
        t0 = time.perf_counter()
        staged = self.stage(params)
        moved = 0
        for e, layout in zip(engines, self.layouts):
            placed, m = self.assemble(staged, layout)
            moved += m
            e.set_params(placed)
        for e in engines:
            jax.block_until_ready(e.params)
        nbytes = sum(int(x.nbytes) for x in jax.tree.leaves(staged))
        return SyncStats(seconds=time.perf_counter() - t0, bytes=nbytes, engines=len(engines), moved_bytes=moved)
