"""Fixtures shared by the recipe's launch tests (``test_async_recipe.py``, ``test_recipe_multiprocess.py``)."""

from pathlib import Path

import pytest

# both files launch the dry-run recipe in 1 x 8 and 2 x 4 (same model, same SFT, same engines) and are one
# xdist group ("recipe_launches", their pytestmark): they run one after the other on one worker, and the
# later launches load the executables the earlier ones compiled from one persistent compilation cache
# (same programs, same results)


@pytest.fixture(scope="session")
def recipe_jax_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The persistent JAX compilation cache folder every recipe launch of this test session passes to its
    processes (``JAX_COMPILATION_CACHE_DIR``); this pytest process's JAX never reads it."""
    return tmp_path_factory.mktemp("recipe_jax_cache")
