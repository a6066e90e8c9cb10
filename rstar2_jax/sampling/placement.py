"""Where generation runs: engines over each process's local devices, each tensor-parallel over its own.

``PlacementConfig(devices_per_engine=T, engines_per_process=E)`` lays E engines of T devices each
over a process's ``jax.local_devices()`` in order: engine ``i`` gets local devices
``[i*T, (i+1)*T)``. ``plan_placement`` validates it (T must divide the local device count; E*T must
fit) and returns one ``EngineLayout`` per local engine.

An ``EngineLayout`` is one engine's sub-mesh and its tensor-parallel sharding rules (Megatron /
vLLM style; ``model.sharding.ENGINE_RULES``, the trainer's ``ShardingRules`` type), over two mesh axes
``("kv", "rep")`` of sizes ``kv * rep = T``:

* q/k/v and gate/up are column-parallel (heads / MLP width split), o and down row-parallel (their
  input dim split: XLA adds the all-reduce after them); the vocabulary (embedding rows, LM head
  columns) is split too; norms, RoPE and biases of replicated dims are replicated.
* KV heads: with ``K % T == 0`` each device holds ``K / T`` KV heads (``kv = T, rep = 1``). With
  ``K < T`` (``T % K == 0``) each KV head is **replicated** over ``rep = T / K`` devices, as vLLM
  does: the query heads are split over ``("kv", "rep")`` kv-major, so the ``N / T`` query heads of
  a device all belong to the one KV head that device holds (``kv = K``). The paged KV cache
  ``[P, Z, K, H]`` is split over ``"kv"`` the same way, so a device stores ``max(K / T, 1)`` heads.
* The page table stays on the host; only the page arrays are sharded.

The engine's jitted step then runs as one SPMD program over the sub-mesh (sharding propagation
from the params and cache: the step's code is the single-device one). A layout can also cast the
engine's copy of the weights (``dtype="bfloat16"`` while the trainer keeps fp32 masters).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.sharding import ENGINE_AXES, ENGINE_RULES

WEIGHT_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PlacementConfig:
    """Engines per process and devices per engine (the tensor-parallel degree T)."""

    devices_per_engine: int = 1  # T: the TP degree of every engine
    engines_per_process: int | None = None  # E; None: as many as fit (local devices // T)
    weight_dtype: str | None = None  # the engines' copy of the weights; None: the trainer's dtype

    def __post_init__(self) -> None:
        t, e = self.devices_per_engine, self.engines_per_process
        if not isinstance(t, int) or isinstance(t, bool) or t < 1:
            raise ValueError(f"PlacementConfig.devices_per_engine must be a positive int, got {t!r}")
        if e is not None and (not isinstance(e, int) or isinstance(e, bool) or e < 1):
            raise ValueError(f"PlacementConfig.engines_per_process must be a positive int or None, got {e!r}")
        if self.weight_dtype is not None and self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"PlacementConfig.weight_dtype must be one of {WEIGHT_DTYPES} or None, "
                             f"got {self.weight_dtype!r}")


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

    @property
    def cache_sharding(self) -> NamedSharding:
        """K/V pages ``[P, Z, K, H]``: KV heads over ``"kv"`` (replicated over ``"rep"``)."""
        return NamedSharding(self.mesh, P(None, None, "kv" if self.kv > 1 else None, None))

    # -- placing -----------------------------------------------------------------------------------
    def put_params(self, params: nnx.State) -> nnx.State:
        """``params`` in the engine's layout and weight dtype (a no-op for params already there).
        From a trainer's mesh use ``sampling.weight_sync.WeightSync``, which never goes via the host."""
        if self.weight_dtype is not None:
            params = jax.tree.map(lambda x: x if x.dtype == self.weight_dtype or not jnp.issubdtype(
                x.dtype, jnp.floating) else x.astype(self.weight_dtype), params)
        return jax.device_put(params, self.param_shardings(params))

    def put_cache(self, cache: list) -> list:
        return jax.device_put(cache, self.cache_sharding)

    def __repr__(self) -> str:
        return f"EngineLayout(devices={[d.id for d in self.devices]}, kv={self.kv}, rep={self.rep})"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """The resolved layout of every process (the local layouts are this process's engines)."""

    process_index: int
    num_processes: int
    devices_per_engine: int
    engines_per_process: int
    local_devices: int  # per process
    layouts: tuple[EngineLayout, ...]  # this process's engines

    @property
    def engines(self) -> int:
        return self.engines_per_process * self.num_processes

    @property
    def devices_used(self) -> int:
        return self.engines * self.devices_per_engine

    @property
    def devices_total(self) -> int:
        return self.local_devices * self.num_processes

    def line(self) -> str:
        return (f"placement: processes = {self.num_processes}, engines = {self.engines}, devices_per_engine = "
                f"{self.devices_per_engine}, devices_used = {self.devices_used}/{self.devices_total}")

    def table(self) -> str:
        """This process's rows: ``process  engine  devices`` (global engine index)."""
        rows = ["process  engine  devices"]
        for i, lay in enumerate(self.layouts):
            rows.append(f"{self.process_index:>7d}  {self.process_index * self.engines_per_process + i:>6d}  "
                        f"{','.join(str(d.id) for d in lay.devices)}")
        return "\n".join(rows)


def plan_placement(cfg: PlacementConfig, model_cfg: ModelConfig, local_devices: Sequence[jax.Device] | None = None,
                   *, process_index: int | None = None, num_processes: int | None = None) -> Placement:
    """Lay ``cfg`` over this process's devices (default ``jax.local_devices()``). Raises
    ``ValueError`` naming the numbers when T does not divide them or E engines do not fit."""
    devs = list(jax.local_devices() if local_devices is None else local_devices)
    t = cfg.devices_per_engine
    if len(devs) % t:
        raise ValueError(f"placement: {len(devs)} local devices are not divisible by devices_per_engine={t}")
    fit = len(devs) // t
    e = fit if cfg.engines_per_process is None else cfg.engines_per_process
    if e > fit:
        raise ValueError(f"placement: engines_per_process={e} x devices_per_engine={t} = {e * t} devices, but this "
                         f"process has {len(devs)} local devices")
    layouts = tuple(EngineLayout(devs[i * t:(i + 1) * t], model_cfg, weight_dtype=cfg.weight_dtype) for i in range(e))
    return Placement(process_index=jax.process_index() if process_index is None else process_index,
                     num_processes=jax.process_count() if num_processes is None else num_processes,
                     devices_per_engine=t, engines_per_process=e, local_devices=len(devs), layouts=layouts)


def leaf_devices(tree: Any) -> set[int]:
    """Ids of every device holding a shard of some leaf of ``tree`` (tests, placement checks)."""
    return {d.id for x in jax.tree.leaves(tree) for d in x.sharding.device_set}
