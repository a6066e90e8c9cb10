"""Shared module-scoped pools of the sandbox tests (see ``sandbox_checks`` for the checks)."""

from __future__ import annotations

import dataclasses

import pytest
from sandbox_checks import FAST

from rstar2_jax.sandbox import SandboxPool


@pytest.fixture(scope="module")
def ns_pool():
    with SandboxPool(workers=2, limits=FAST) as pool:
        yield pool


@pytest.fixture(scope="module")
def fallback_pool():
    with SandboxPool(workers=1, limits=dataclasses.replace(FAST, namespaces=False)) as pool:
        yield pool


@pytest.fixture(params=["namespaces", "fallback"])
def any_pool(request):
    """Both isolation modes: namespaces (where the OS allows) and rlimits + uid drop only."""
    return request.getfixturevalue("ns_pool" if request.param == "namespaces" else "fallback_pool")
