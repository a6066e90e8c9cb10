"""Test configuration: force 8 fake CPU devices before JAX is imported anywhere; shared fixtures."""

import os

from rstar2_jax.utils.xla_flags import force_host_device_count  # noqa: E402  (no JAX)

force_host_device_count(8, who="conftest.py")  # added to the user's XLA_FLAGS, not replacing them
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

# tests/sandbox/ is one unit (one xdist group): its Ray tests start local clusters, and its hostile calls
# (fork bombs, 10,000-call load) are timed; each worker's calls have a uid of their own (sandbox.uids), so
# a fork bomb no longer eats other pools' RLIMIT_NPROC (the CI flakes of EAGAIN on fork)
SANDBOX_DIR = "tests/sandbox/"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` (``make test``): a test file is one unit (its module-scoped
    compiled fixtures are built once, on one worker), and the sandbox's files (Ray's included) share one."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            file = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group("sandbox" if file.startswith(SANDBOX_DIR) else file))


@pytest.fixture(scope="module")
def pool():
    """A sandbox pool per test module that runs tools and the verifier (``rstar2_jax.rewards.worker``
    preloaded); a module needing other limits defines its own ``pool``."""
    from rstar2_jax.sandbox import SandboxLimits, SandboxPool

    limits = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with SandboxPool(workers=2, limits=limits) as p:
        yield p
