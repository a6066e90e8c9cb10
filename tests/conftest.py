"""Test configuration: force 8 fake CPU devices before JAX is imported anywhere; shared fixtures."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

RAY_FILES = ("test_sandbox_ray.py", "test_sandbox_ray_cluster.py")  # one local Ray cluster at a time


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` (``make test``): a test file is one unit (its module-scoped
    compiled fixtures are built once, on one worker), and the Ray files share one worker."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            file = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group("ray" if file.endswith(RAY_FILES) else file))


@pytest.fixture(scope="module")
def pool():
    """A sandbox pool per test module that runs tools and the verifier (``rstar2_jax.rewards.worker``
    preloaded); a module needing other limits defines its own ``pool``."""
    from rstar2_jax.sandbox import SandboxLimits, SandboxPool

    limits = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with SandboxPool(workers=2, limits=limits) as p:
        yield p
