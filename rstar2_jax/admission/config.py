"""What an admission policy is told: ``AdmissionConfig`` (no JAX; ``RolloutConfig.admission`` holds one,
the simulator takes one directly). The policies themselves are ``admission.static``, ``.capacity``
and ``.dynamic``; docs/design.md §2 says which file holds what."""

from __future__ import annotations

import dataclasses
import enum


class Policy(enum.StrEnum):
    """How groups reach engines (one ``admission.policy.AdmissionPolicy`` each)."""

    STATIC = "static"  # even contiguous split, everything handed over at once (admission.static)
    CAPACITY = "capacity"  # head group to the engine with the most forecast capacity, if it fits (admission.capacity)
    DYNAMIC = "dynamic"  # long-first, to the engine that frees a slot first, up to the memory limit (admission.dynamic)


class Reserve(enum.StrEnum):
    """What a live trajectory reserves in the forecast."""

    ESTIMATE = "estimate"  # the learnt length model (admission.forecast.LengthModel)
    BUDGET = "budget"  # the worst case: the whole budget, always


def _enum(cls: type[enum.StrEnum], owner: str, field: str, value) -> enum.StrEnum:
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"{owner}.{field} must be one of {[p.value for p in cls]}, got {value!r}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdmissionConfig:
    """How a dispatcher admits groups to engines (shared by the real dispatcher and the simulation)."""

    policy: Policy | str = Policy.CAPACITY  # a ``Policy`` or its value; stored as the ``Policy``
    reserve: Reserve | str = Reserve.ESTIMATE  # what a live trajectory reserves; stored as the ``Reserve``
    prior_weight: float = 4.0  # pseudo-trajectories at the full budget in the length model
    reserve_sigma: float = 1.0  # safety margin: standard deviations of the forecast pages
    reserve_ratio: float = 1.0  # initial reservation scale
    reserve_ratio_min: float = 1.0
    reserve_ratio_max: float = 2.0
    ratio_up: float = 0.25  # added when a preemption is seen
    ratio_decay: float = 0.98  # multiplied per admission without preemption
    length_memory: int = 1  # batches whose final lengths seed the next batch's length model
    # Policy.DYNAMIC only:
    growth_reserve: float = 0.5  # kappa / ratio: share of the forecast growth (peak - now) to fit
    running_reserve: float = 1.0  # share of the live members' expected growth that must fit besides what they hold
    migrate: bool = False  # a trajectory back from a tool may move (re-prefill) to a faster engine
    migrate_margin: float = 0.25  # ... if its predicted finish there is this fraction earlier at least
    move_kv: bool = True  # a migration carries the K/V (Engine.export_seq/import_seq) instead of a re-prefill
    history_weight: float = 2.0  # pseudo-lengths at the batch mean in a problem's predicted length
    history_per_key: int = 16  # final lengths remembered per problem (across batches)

    def __post_init__(self) -> None:
        name = type(self).__name__
        object.__setattr__(self, "policy", _enum(Policy, name, "policy", self.policy))
        object.__setattr__(self, "reserve", _enum(Reserve, name, "reserve", self.reserve))
        if self.growth_reserve < 0 or self.running_reserve < 0:
            raise ValueError(f"{name}: growth_reserve and running_reserve must be >= 0, got "
                             f"{self.growth_reserve}, {self.running_reserve}")
        if not 0 <= self.migrate_margin < 1:
            raise ValueError(f"{name}.migrate_margin must be in [0, 1), got {self.migrate_margin}")
        if self.history_weight <= 0 or self.history_per_key < 1:
            raise ValueError(f"{name}: need history_weight > 0 and history_per_key >= 1, got "
                             f"{self.history_weight}, {self.history_per_key}")
        if self.length_memory < 1:
            raise ValueError(f"{name}.length_memory must be >= 1, got {self.length_memory}")
        if not 0 < self.reserve_ratio_min <= self.reserve_ratio <= self.reserve_ratio_max:
            raise ValueError(f"{name}: need 0 < reserve_ratio_min <= reserve_ratio <= reserve_ratio_max")
