"""Test configuration: force 8 fake CPU devices before JAX is imported anywhere; shared fixtures."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

# tests/sandbox/ is one unit: its pools all drop to one uid (nobody), whose RLIMIT_NPROC budget and signals
# are shared over the machine, so its hostile calls (a fork bomb, kill(-1) without a pid namespace) must not
# run beside its other files' pools (two CI flakes: EAGAIN on fork, a call SIGKILLed); and one Ray cluster
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
