"""Rewards: answer extraction, answer equivalence, format statistics, batched hard-timeout verification.

No JAX here, directly or indirectly (verification runs in CPU worker processes). Entry points:
``RewardFn`` (rollouts), ``verify_batch`` (many checks, hard timeouts), ``check`` (one pure
comparison, no timeout), ``extract_answer``, ``format_stats``. The verification policy is written
down in ``rstar2_jax.rewards.equivalence``.
"""

from .equivalence import Verdict, check
from .extract import Extraction, extract_answer, find_boxes
from .format import FormatStats, ResponseStats, format_stats
from .reward_fn import RewardFn
from .verify import VerifyResult, close_default_pool, default_pool, verify_batch

__all__ = ["Extraction", "FormatStats", "ResponseStats", "RewardFn", "Verdict", "VerifyResult", "check", "close_default_pool",
           "default_pool", "extract_answer", "find_boxes", "format_stats", "verify_batch"]
