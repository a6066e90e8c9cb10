"""One engine's tensor-parallel layout over its devices (``EngineLayout``; ``deploy.placement`` lays
several over a process).

An ``EngineLayout`` is one engine's sub-mesh and its tensor-parallel sharding rules (Megatron /
vLLM style; ``model.sharding.ENGINE_RULES``, the trainer's ``ShardingRules`` type), over two mesh axes
``("kv", "rep")`` of sizes ``kv * rep = T``:

* q/k/v and gate/up are column-parallel (heads / MLP width split), o and down row-parallel (their
  input dim split: XLA adds the all-reduce after them); the vocabulary (embedding rows, LM head
  columns) is split too; norms, RoPE and biases of replicated dims are replicated.
* KV heads: with ``K % T == 0`` each device holds ``K / T`` KV heads (``kv = T, rep = 1``). With
  ``K < T`` (``T % K == 0``) each KV head is **replicated** over ``rep = T / K`` devices, as vLLM
  does: the query heads are split over ``("kv", "rep")`` kv-major, so the ``N / T`` query heads of
  a device all belong to the one KV head that device holds (``kv = K``). The paged KV cache is split
  over ``"kv"`` on its kv-head axis (in whichever ``KVLayout`` the engine stores it), so a device
  stores ``max(K / T, 1)`` heads; an attention kernel runs under ``shard_map`` over the sub-mesh.
* The page table stays on the host; only the page arrays are sharded.

The engine's jitted step then runs as one SPMD program over the sub-mesh (sharding propagation
from the params and cache: the step's code is the single-device one). A layout can also cast the
engine's copy of the weights (``dtype="bfloat16"`` while the trainer keeps fp32 masters).
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.sharding import ENGINE_AXES, ENGINE_RULES
from rstar2_jax.sampling.kv_layout import KVLayout

__all__ = ["ENGINE_AXES", "EngineLayout", "leaf_devices", "tp_split"]


def tp_split(model_cfg: ModelConfig, tp: int) -> tuple[int, int]:
    """``(kv, rep)``: KV heads split ``kv`` ways and each replicated ``rep`` times (``kv * rep = tp``).
    Raises naming the numbers when the heads cannot be split ``tp`` ways."""
    n, k = model_cfg.num_heads, model_cfg.num_kv_heads
    if n % tp:
        raise ValueError(f"tensor parallelism: num_heads ({n}) is not divisible by devices_per_engine ({tp})")
    if k % tp == 0:
        return tp, 1
    if tp % k == 0:
        return k, tp // k
    raise ValueError(f"tensor parallelism: num_kv_heads ({k}) and devices_per_engine ({tp}) must divide one "
                     f"another (shard the KV heads, or replicate each over devices_per_engine / num_kv_heads)")


class EngineLayout:
    """One engine's devices, sub-mesh ``("kv", "rep")`` and TP shardings (see module docstring)."""

    def __init__(self, devices: Sequence[jax.Device], model_cfg: ModelConfig, *, weight_dtype: str | None = None):
        self.devices = tuple(devices)
        self.tp = len(self.devices)
        self.kv, self.rep = tp_split(model_cfg, self.tp)
        self.mesh = Mesh(np.asarray(self.devices, dtype=object).reshape(self.kv, self.rep), ENGINE_AXES)
        self.weight_dtype = None if weight_dtype is None else jnp.dtype(weight_dtype)
        self.model_cfg = model_cfg

    # -- the rules ---------------------------------------------------------------------------------
    def logical_spec(self, logical: Sequence[str | None], shape: Sequence[int]) -> P:
        """PartitionSpec of a parameter by its logical axes (``model.sharding.ENGINE_RULES``; a dim the
        axes do not divide, or axes of size 1: replicated)."""
        return ENGINE_RULES.spec(logical, shape, {"kv": self.kv, "rep": self.rep})

    def param_shardings(self, params: nnx.State) -> nnx.State:
        """A pytree like ``params`` whose leaves are the engine's ``NamedSharding`` of each parameter."""
        def one(v: nnx.Variable):
            x = v.get_value()
            logical = v.get_metadata().get("logical_axes") or (None,) * x.ndim
            return v.replace(NamedSharding(self.mesh, self.logical_spec(logical, x.shape)))
        return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))

    def cache_sharding(self, kv_layout: KVLayout = KVLayout.TOKEN_MAJOR) -> NamedSharding:
        """K/V pages in ``kv_layout``: KV heads over ``"kv"`` (replicated over ``"rep"``)."""
        return NamedSharding(self.mesh, kv_layout.partition_spec("kv" if self.kv > 1 else None))

    # -- placing -----------------------------------------------------------------------------------
    def put_params(self, params: nnx.State) -> nnx.State:
        """``params`` in the engine's layout and weight dtype (a no-op for params already there).
        From a trainer's mesh use ``deploy.weight_sync.WeightSync``, which never goes via the host."""
        if self.weight_dtype is not None:
            params = jax.tree.map(lambda x: x if x.dtype == self.weight_dtype or not jnp.issubdtype(
                x.dtype, jnp.floating) else x.astype(self.weight_dtype), params)
        return jax.device_put(params, self.param_shardings(params))

    def put_cache(self, cache: list, kv_layout: KVLayout = KVLayout.TOKEN_MAJOR) -> list:
        return jax.device_put(cache, self.cache_sharding(kv_layout))

    def __repr__(self) -> str:
        return f"EngineLayout(devices={[d.id for d in self.devices]}, kv={self.kv}, rep={self.rep})"


def leaf_devices(tree: Any) -> set[int]:
    """Ids of every device holding a shard of some leaf of ``tree`` (tests, placement checks)."""
    return {d.id for x in jax.tree.leaves(tree) for d in x.sharding.device_set}
