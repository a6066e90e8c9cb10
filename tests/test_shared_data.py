"""The shared-data guard: a missing file skips a test, or fails it under RSTAR2_REQUIRE_SHARED=1 (CI)."""

import pytest

from tests.shared_data import REQUIRE_ENV, need


def test_present_path_is_returned(tmp_path):
    assert need(tmp_path) == tmp_path


@pytest.mark.parametrize("value", ["", "0"])
def test_missing_data_skips_when_not_required(tmp_path, monkeypatch, value):
    monkeypatch.setenv(REQUIRE_ENV, value)
    with pytest.raises(pytest.skip.Exception, match="not present"):
        need(tmp_path / "aime24.jsonl")


def test_missing_data_fails_when_required(tmp_path, monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV}=1"):
        need(tmp_path / "aime24.jsonl")
