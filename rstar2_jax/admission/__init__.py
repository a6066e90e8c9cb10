"""Admission: which engine a group of samples goes to, and when (no JAX).

Shared by the real rollout dispatcher (``rollout.dispatcher``) and the discrete-event simulators
(``rstar2_jax.sim``): ``config`` (``AdmissionConfig``, ``Policy``), ``forecast`` (the online
length model and the KV forecast), ``engines`` (``EngineShape``, ``EngineBook``), ``book``
(``AdmissionLedger``: per-engine live members), ``policy`` (the ``AdmissionPolicy`` protocol, the
``LedgerView`` protocol a policy reads the ledger through, and the one ``admit`` loop), one file per
policy (``static``, ``capacity``, ``dynamic``), ``build`` (``new_ledger``: the ledger with
``cfg.policy``'s policy injected).
"""

from rstar2_jax.admission.book import Admission, AdmissionLedger
from rstar2_jax.admission.build import POLICIES, new_ledger
from rstar2_jax.admission.config import AdmissionConfig, Policy, Reserve
from rstar2_jax.admission.engines import EngineBook, EngineShape
from rstar2_jax.admission.forecast import AdaptiveRatio, LengthModel, fits, forecast
from rstar2_jax.admission.policy import (AdmissionPolicy, LedgerPolicy, LedgerView, PendingGroup, Placement,
                                         admit)

__all__ = [
    "POLICIES", "AdaptiveRatio", "Admission", "AdmissionConfig", "AdmissionLedger", "AdmissionPolicy", "EngineBook",
    "EngineShape", "LedgerPolicy", "LedgerView", "LengthModel", "PendingGroup", "Placement", "Policy", "Reserve",
    "admit", "fits", "forecast", "new_ledger",
]
