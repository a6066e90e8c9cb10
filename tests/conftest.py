"""Test configuration: force 8 fake CPU devices before JAX is imported anywhere; shared fixtures."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="module")
def pool():
    """A sandbox pool per test module that runs tools and the verifier (``rstar2_jax.rewards.worker``
    preloaded); a module needing other limits defines its own ``pool``."""
    from rstar2_jax.sandbox import SandboxLimits, SandboxPool

    limits = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with SandboxPool(workers=2, limits=limits) as p:
        yield p
