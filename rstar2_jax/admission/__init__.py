"""Admission: which engine a group of samples goes to, and when (no JAX).

Shared by the real rollout dispatcher (``rollout.dispatcher``) and the discrete-event simulator
(``admission.simulate``): ``config`` (``AdmissionConfig``, ``Policy``), ``forecast`` (the online
length model and the KV forecast), ``book`` (``AdmissionLedger``: per-engine live members), ``policy``
(the ``AdmissionPolicy`` protocol and the one ``admit`` loop), one file per policy (``static``,
``capacity``, ``dynamic``), ``simulate``.
"""

from rstar2_jax.admission.book import Admission, AdmissionLedger, EngineShape
from rstar2_jax.admission.config import AdmissionConfig, Policy, Reserve
from rstar2_jax.admission.forecast import AdaptiveRatio, LengthModel, fits, forecast
from rstar2_jax.admission.policy import (AdmissionPolicy, LedgerPolicy, PendingGroup, Placement,
                                         admit)
from rstar2_jax.admission.sim_types import SimEngine, SimGroup, SimResult, SimTrajectory
from rstar2_jax.admission.simulate import Simulator, simulate

__all__ = [
    "AdaptiveRatio", "Admission", "AdmissionConfig", "AdmissionLedger", "AdmissionPolicy", "EngineShape",
    "LedgerPolicy", "LengthModel", "PendingGroup", "Placement", "Policy", "Reserve", "SimEngine", "SimGroup", "SimResult",
    "SimTrajectory", "Simulator", "admit", "fits", "forecast", "simulate",
]
