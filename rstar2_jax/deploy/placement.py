"""Where generation runs: engines over each process's local devices, each tensor-parallel over its own.

``PlacementConfig(devices_per_engine=T, engines_per_process=E)`` lays E engines of T devices each
over a process's ``jax.local_devices()`` in order: engine ``i`` gets local devices
``[i*T, (i+1)*T)``. ``plan_placement`` validates it (T must divide the local device count; E*T must
fit) and returns one ``EngineLayout`` per local engine (``sampling.layout``: one engine's sub-mesh
and tensor-parallel shardings).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax

from rstar2_jax.deploy.weight_sync import WeightSync
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling.engine import EngineConfig, PagedEngine
from rstar2_jax.sampling.layout import EngineLayout

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


def place_engines(placement: Placement, graphdef: Any, params: Any, model_cfg: ModelConfig, engine_cfg: EngineConfig,
                  decode_fn: Callable[[Sequence[int]], str]) -> list[PagedEngine]:
    """One ``PagedEngine`` per local layout of ``placement``, each with ``params`` resharded to its
    layout on device (``WeightSync``: never through the host)."""
    placed = WeightSync(placement.layouts).place(params)
    return [PagedEngine(graphdef, p, model_cfg, engine_cfg, decode_fn=decode_fn, layout=lay)
            for p, lay in zip(placed, placement.layouts)]
