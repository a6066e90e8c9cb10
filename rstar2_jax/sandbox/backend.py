"""The sandbox backend protocol and the choice of backend by name (no JAX).

``SandboxBackend`` is what the rollout, the verifier and the SFT trace builder take: the embedded
``SandboxPool`` (``pool.py``, default) and the Ray cluster pool (``cluster.py``) both implement it
by inheriting it; each writes only ``submit`` (and its bookkeeping): ``run``, ``run_batch`` (results
in the order of the requests), ``run_async`` and the context manager are written here once.
``open_pool("local" / "ray")`` builds one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Protocol, Sequence, runtime_checkable

from .isolation import Isolation
from .limits import CodeRequest, CodeResult, SandboxLimits

BACKENDS = ("local", "ray")


@runtime_checkable
class SandboxBackend(Protocol):
    """Runs ``CodeRequest``s in isolated processes; every future completes with a ``CodeResult``."""

    limits: SandboxLimits
    submit_blocks: bool = False  # ``submit`` may block (a full queue): ``run_async`` calls it in a thread

    def submit(self, req: CodeRequest) -> "concurrent.futures.Future[CodeResult]":
        """Queue one request; the future completes with its result (never an exception)."""
        ...

    def stats(self) -> dict:
        """Calls, status counts, latency percentiles (ms, ``percentile_ms``) and the backend's own figures."""
        ...

    @property
    def isolation(self) -> Isolation | None:
        """What the workers achieved on this machine (None: not known yet)."""
        ...

    def end_session(self, session: str) -> None:
        """End the persistent session ``session`` (``CodeRequest.session``) after its queued cells: its
        interpreter and every process it started are killed, its files removed. An unknown or already ended
        key is a no-op; it does not wait."""
        ...

    def close(self, *, cancel_pending: bool = False) -> None:
        """Stop accepting requests; finish queued ones (or answer them with ``CodeResult.sandbox_error``)."""
        ...

    def run(self, req: CodeRequest) -> CodeResult:
        """Run one request and wait for its result."""
        return self.submit(req).result()

    def run_batch(self, reqs: Sequence[CodeRequest]) -> list[CodeResult]:
        """Run many requests concurrently; results in the order of ``reqs``."""
        futures = [self.submit(req) for req in reqs]
        return [f.result() for f in futures]

    async def run_async(self, req: CodeRequest) -> CodeResult:
        """``await`` one request from an asyncio loop (the loop is never blocked)."""
        if self.submit_blocks:
            future = await asyncio.get_running_loop().run_in_executor(None, self.submit, req)
        else:
            future = self.submit(req)
        return await asyncio.wrap_future(future)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel_pending=exc_type is not None)


def percentile_ms(sorted_values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) of ``sorted_values`` seconds, in milliseconds (None: empty)."""
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return 1000.0 * sorted_values[index]


def open_pool(backend: str = "local", *, workers: int, limits: SandboxLimits,
              ray_address: str | None = None) -> SandboxBackend:
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
