"""Server side of the Ray backend: ``ClusterConfig`` and ``SandboxActor`` (one per node, a ``SandboxPool``).

The client is ``cluster.RaySandboxPool``. Ray is imported lazily (``ping``), so this module imports without it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

from .limits import CodeRequest, SandboxLimits


class SandboxBusyError(TimeoutError):
    """``submit`` waited ``submit_timeout_s`` for room in a full cluster queue."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ClusterConfig:
    """How the Ray backend places its actors and batches calls. Times in seconds."""

    workers_per_node: int | None = None  # sandbox workers per actor; None: the node's CPUs (capped at them)
    max_nodes: int | None = None  # at most this many actors (None: every eligible node)
    node_resource: str | None = None  # only nodes with this custom Ray resource (e.g. "sandbox") get an actor
    batch_size: int = 64  # calls per actor request at most
    batch_deadline_s: float = 0.02  # a partial batch is sent once its oldest call waited this long
    inflight_per_worker: int = 32  # outstanding calls an actor may hold, per worker (at least 4 batches)
    max_pending: int = 100_000  # calls queued or in flight in this client (backpressure bound)
    submit_timeout_s: float = 60.0  # a submit into a full queue waits this long, then SandboxBusyError
    max_restarts: int = 4  # Ray restarts of each actor (-1: unbounded)
    restart_timeout_s: float = 300.0  # an actor that does not answer a ping this long after a failure is dropped
    startup_timeout_s: float = 300.0  # actors (their SandboxPools) must be ready by then
    address: str | None = None  # ray.init(address=...) when Ray is not initialised yet (None: a local instance)
    runtime_env: dict | None = None  # the actors' Ray runtime_env (e.g. {"py_modules": [rstar2_jax]} where the
    # package is not installed on the nodes)

    def __post_init__(self) -> None:
        for name in ("workers_per_node", "max_nodes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"ClusterConfig.{name} must be None or a positive int, got {value!r}")
        for name in ("batch_size", "inflight_per_worker", "max_pending"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ClusterConfig.{name} must be a positive int, got {value!r}")
        for name in ("batch_deadline_s", "submit_timeout_s", "restart_timeout_s", "startup_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ValueError(f"ClusterConfig.{name} must be a positive finite number, got {value!r}")
        if not isinstance(self.max_restarts, int) or self.max_restarts < -1:
            raise ValueError(f"ClusterConfig.max_restarts must be an int >= -1, got {self.max_restarts!r}")


class SandboxActor:
    """Ray actor (async: many batches at once) hosting one ``SandboxPool`` on its node."""

    def __init__(self, workers: int, limits: SandboxLimits) -> None:
        from .pool import SandboxPool

        self.pool = SandboxPool(workers=workers, limits=limits)

    async def run_batch(self, reqs: list[tuple]) -> list[tuple]:
        """(code, stdin, wrap, timeout_s, session, history) tuples -> ``CodeResult`` fields as tuples."""
        futures = [self.pool.run_async(CodeRequest(code=c, stdin=s, wrap=w, timeout_s=t, session=k, history=tuple(h)))
                   for c, s, w, t, k, h in reqs]
        return [dataclasses.astuple(r) for r in await asyncio.gather(*futures)]

    async def end_session(self, key: str) -> None:
        self.pool.end_session(key)

    async def ping(self) -> dict:
        """Who and where this actor is, and what isolation its workers achieved."""
        iso = self.pool.isolation
        return {"pid": os.getpid(), "node_id": _node_id(),
                "workers": len(self.pool._slots), "isolation": dataclasses.asdict(iso) if iso else None}

    async def stats(self) -> dict:
        return self.pool.stats()




def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()
