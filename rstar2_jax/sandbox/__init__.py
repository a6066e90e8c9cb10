"""Isolated execution of Python tool calls (rStar2-Agent's ``python_code_with_standard_io``).

No JAX here, directly or indirectly. See ``rstar2_jax.sandbox.pool`` for what a user should know.
``SandboxPool`` and ``SandboxBackend`` are imported lazily so that a worker's init (which imports this
package) stays small: a smaller process forks faster.
"""

from .isolation import Isolation
from .limits import STATUSES, CodeRequest, CodeResult, ResultStatus, SandboxLimits, SessionState

__all__ = ["STATUSES", "CodeRequest", "CodeResult", "Isolation", "ResultStatus", "SandboxBackend", "SandboxLimits",
           "SandboxPool", "SessionState", "open_pool"]


def __getattr__(name: str):
    if name == "SandboxPool":
        from .pool import SandboxPool

        return SandboxPool
    if name in ("SandboxBackend", "open_pool"):
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
