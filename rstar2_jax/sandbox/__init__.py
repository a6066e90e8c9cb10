"""Isolated execution of Python tool calls (rStar2-Agent's ``python_code_with_standard_io``).

No JAX here, directly or indirectly. See ``rstar2_jax.sandbox.pool`` for what a user should know.
``SandboxPool`` is imported lazily so that a worker's init (which imports this package) stays small:
a smaller process forks faster.
"""

from .isolation import Isolation
from .limits import STATUSES, CodeRequest, CodeResult, SandboxLimits

__all__ = ["STATUSES", "CodeRequest", "CodeResult", "Isolation", "SandboxLimits", "SandboxPool"]


def __getattr__(name: str):
    if name == "SandboxPool":
        from .pool import SandboxPool

        return SandboxPool
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
