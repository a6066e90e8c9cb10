"""Shared by the engine tests: one tiny random policy for the whole session (one graphdef object,
so jitted steps of a shape compiled by one module are reused by the next)."""

import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig


@pytest.fixture(scope="session")
def policy():
    """``(ModelConfig.tiny(), graphdef, params)`` of a ``Qwen3`` initialised with ``nnx.Rngs(0)``."""
    cfg = ModelConfig.tiny()
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    return cfg, graphdef, params
