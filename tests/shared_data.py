"""The shared evaluation data (``../shared/data`` beside the checkout) for the tests that read it.

Missing data skips those tests on a developer's machine; with ``RSTAR2_REQUIRE_SHARED=1`` (set by
``.ci/run``: CI has the data) they fail instead, so a CI without the data cannot pass silently.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
REQUIRE_ENV = "RSTAR2_REQUIRE_SHARED"
NAMES = ("aime24", "aime25", "amc23", "hmmt25", "math500")  # the evaluation files it holds


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def need(path: Path) -> Path:
    """``path`` if it exists; else skip the calling test, or fail it when the data is required."""
    if not path.exists():
        msg = f"{path} not present"
        if required():
            pytest.fail(f"{msg} and {REQUIRE_ENV}=1 (the shared data is required here)")
        pytest.skip(msg)
    return path
