"""The real-server helpers skip when a binary is missing, and fail instead when servers are
required (CI sets TABLETUNE_REQUIRE_SERVERS=1)."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import ClassVar

import pytest

from tests.support import servers
from tests.support.servers import REQUIRE_ENV, free_port, free_port_range, require_binary


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


class _ScriptedSocket:
    """bind(0) gives the next port of a script, as an OS that hands a port just closed back."""

    script: ClassVar[list[int]] = []

    def __init__(self, *_args: object) -> None:
        self.port = 0

    def __enter__(self) -> _ScriptedSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        self.port = address[1] or self.script.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        pass


def test_a_port_handed_out_once_is_not_handed_out_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # CI, 2026-12-02: the daemon's port, taken first and closed, came back as its emulator's;
    # the daemon could not serve and never said READY=1.
    monkeypatch.setattr(servers, "_HANDED_OUT", set())
    monkeypatch.setattr(_ScriptedSocket, "script", [41000, 41000, 41001])
    # Only the helpers' view of the socket module: other threads keep the real one.
    scripted = SimpleNamespace(
        socket=_ScriptedSocket, AF_INET=socket.AF_INET, SOCK_STREAM=socket.SOCK_STREAM
    )
    monkeypatch.setattr(servers, "socket", scripted)
    assert [free_port(), free_port()] == [41000, 41001]


def test_distinct_ports_from_the_real_os() -> None:
    ports = [free_port() for _ in range(50)] + free_port_range(3)
    assert len(set(ports)) == len(ports)
