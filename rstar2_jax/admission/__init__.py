"""Admission: which engine a group of samples goes to, and when (no JAX).

Shared by the real rollout dispatcher (``rollout.dispatcher``) and the discrete-event simulators
(``rstar2_jax.sim``): ``config`` (``AdmissionConfig``, ``Policy``), ``forecast`` (the online
length model and the KV forecast), ``book`` (``AdmissionLedger``: per-engine live members), ``policy``
(the ``AdmissionPolicy`` protocol and the one ``admit`` loop), one file per policy (``static``,
``capacity``, ``dynamic``).
"""

from rstar2_jax.admission.book import Admission, AdmissionLedger, EngineShape
from rstar2_jax.admission.config import AdmissionConfig, Policy, Reserve
from rstar2_jax.admission.forecast import AdaptiveRatio, LengthModel, fits, forecast
from rstar2_jax.admission.policy import (AdmissionPolicy, LedgerPolicy, PendingGroup, Placement,
                                         admit)

__all__ = [
    "AdaptiveRatio", "Admission", "AdmissionConfig", "AdmissionLedger", "AdmissionPolicy", "EngineShape",
    "LedgerPolicy", "LengthModel", "PendingGroup", "Placement", "Policy", "Reserve", "admit", "fits",
    "forecast",
]
