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
# the xdist groups that take longest (seconds of one worker, measured at 2f30008 on 2 workers), started
# first: xdist hands groups out in collection order, so a long group left to the end would keep one
# worker busy while the other idles (xdist's default order, most tests first, put these last)
SLOW_GROUPS = (
    "recipe_launches",  # tests/run/test_async_recipe.py + test_recipe_multiprocess.py: ~650
    "tests/run/test_real_shapes.py",  # ~245
    "tests/test_async_demo.py",
    "tests/run/test_recipe_full.py",  # ~146
    "sandbox",
    "tests/test_demo.py",
    "tests/run/test_recipe_components.py",  # ~110
    "notebooks",  # tests/test_notebook.py + test_objective_notebook.py: ~62 + ~51
)


def pytest_configure(config):
    """Keep the collection order as xdist's work order (``--no-loadscope-reorder``): see ``SLOW_GROUPS``."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _group(item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker.args else marker.kwargs.get("name", "")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` (``make test``): a test file is one unit (its module-scoped
    compiled fixtures are built once, on one worker), and the sandbox's files (Ray's included) share one.
    The ``SLOW_GROUPS`` come first, in that order (a stable sort: each file's tests keep their order)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            file = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group("sandbox" if file.startswith(SANDBOX_DIR) else file))
    rank = {g: i for i, g in enumerate(SLOW_GROUPS)}
    items.sort(key=lambda item: rank.get(_group(item), len(SLOW_GROUPS)))


@pytest.fixture(scope="module")
def pool():
    """A sandbox pool per test module that runs tools and the verifier (``rstar2_jax.rewards.worker``
    preloaded); a module needing other limits defines its own ``pool``."""
    from rstar2_jax.sandbox import SandboxLimits, SandboxPool

    limits = SandboxLimits(wall_s=2.0, cpu_s=2.0, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with SandboxPool(workers=2, limits=limits) as p:
        yield p


@pytest.fixture(scope="session")
def notebook_jax_cache(tmp_path_factory):
    """The persistent compilation cache folder both notebooks' kernels and demo processes use (their runs
    share shapes: the later ones load what the earlier ones compiled)."""
    return tmp_path_factory.mktemp("notebook_jax_cache")
