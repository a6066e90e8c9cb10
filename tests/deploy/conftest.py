"""The deploy tests share the engine tests' session policy (one graphdef: compiled steps are reused)."""

from tests.sampling.conftest import policy  # noqa: F401
