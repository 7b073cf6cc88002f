"""A missing test dependency skips on a developer's machine and fails in CI."""

from __future__ import annotations

import pytest

from tests.needs import in_ci, missing


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_in_ci_a_missing_dependency_fails(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci()
    with pytest.raises(pytest.fail.Exception, match="redis-server is not installed"):
        missing("redis-server is not installed")


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_elsewhere_a_missing_dependency_skips(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()
    with pytest.raises(pytest.skip.Exception, match="chromium is missing"):
        missing("chromium is missing")
