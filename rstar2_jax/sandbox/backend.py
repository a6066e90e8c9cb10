"""Choose the sandbox backend by name: the embedded ``SandboxPool`` (default) or the Ray cluster pool.

Both have the same API (``submit``, ``run``, ``run_batch``, ``run_async``, ``stats``, ``close``, ``limits``,
``isolation``) and are context managers, so the rollout, the verifier and the SFT trace builder take either.
"""

from __future__ import annotations

from .limits import SandboxLimits

BACKENDS = ("local", "ray")


def open_pool(backend: str = "local", *, workers: int, limits: SandboxLimits, ray_address: str | None = None):
    """``"local"``: ``SandboxPool(workers)`` on this machine. ``"ray"``: ``RaySandboxPool`` with one actor per
    Ray node of up to ``workers`` sandbox workers (capped at the node's CPUs); ``ray_address`` is passed to
    ``ray.init`` when Ray is not initialised yet (None: a local Ray instance)."""
    if backend == "local":
        from .pool import SandboxPool

        return SandboxPool(workers=workers, limits=limits)
    if backend == "ray":
        from .cluster import ClusterConfig, RaySandboxPool

        return RaySandboxPool(limits=limits, config=ClusterConfig(workers_per_node=workers, address=ray_address))
    raise ValueError(f"sandbox backend must be one of {BACKENDS}, got {backend!r}")
