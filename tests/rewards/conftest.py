"""One verifier pool for the rewards tests (starting workers costs about a second)."""

from __future__ import annotations

import pytest

from rstar2_jax.sandbox import SandboxLimits, SandboxPool


@pytest.fixture(scope="session")
def reward_pool():
    limits = SandboxLimits(wall_s=10.0, cpu_s=10.0, memory_mb=2048, preload=("rstar2_jax.rewards.worker",))
    with SandboxPool(workers=2, limits=limits) as pool:
        yield pool
