"""The real-server helpers skip when a binary is missing, and fail instead when servers are
required (CI sets TABLETUNE_REQUIRE_SERVERS=1)."""

from __future__ import annotations

import pytest

from tests.support.servers import REQUIRE_ENV, free_port_range, require_binary


def test_missing_binary_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        require_binary("no-such-binary-tabletune")


def test_missing_binary_fails_when_servers_are_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="requires it"):
        require_binary("no-such-binary-tabletune")


def test_present_binary_is_found() -> None:
    assert require_binary("sh").endswith("/sh")


def test_port_range_is_consecutive() -> None:
    ports = free_port_range(5)
    assert ports == list(range(ports[0], ports[0] + 5))
