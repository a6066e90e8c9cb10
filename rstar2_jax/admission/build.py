"""Where a ledger gets its policy (no JAX): ``POLICIES`` maps ``AdmissionConfig.policy`` to the
policy class, ``new_ledger`` builds an ``AdmissionLedger`` with it injected. The policies and the
ledger do not import each other (a policy reads ``policy.LedgerView``)."""

from __future__ import annotations

from typing import Callable, Hashable, Mapping, Sequence

from rstar2_jax.admission.book import AdmissionLedger
from rstar2_jax.admission.capacity import CapacityPolicy
from rstar2_jax.admission.config import AdmissionConfig, Policy
from rstar2_jax.admission.dynamic import DynamicPolicy
from rstar2_jax.admission.engines import EngineShape
from rstar2_jax.admission.policy import AdmissionPolicy, LedgerView
from rstar2_jax.admission.static import StaticPolicy

POLICIES: dict[Policy, Callable[[LedgerView], AdmissionPolicy]] = {
    Policy.STATIC: StaticPolicy, Policy.CAPACITY: CapacityPolicy, Policy.DYNAMIC: DynamicPolicy}


def new_ledger(cfg: AdmissionConfig, budget: int, shapes: Sequence[EngineShape], lengths: Sequence[int] = (),
               history: Mapping[Hashable, Sequence[int]] | None = None) -> AdmissionLedger:
    """An ``AdmissionLedger`` over ``shapes`` engines whose policy is ``cfg.policy``'s."""
    return AdmissionLedger(cfg, budget, shapes, lengths, history, policy=POLICIES[cfg.policy])
