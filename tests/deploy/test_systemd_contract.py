"""What tabletune.service promises systemd, checked against the real daemon: the unit's own
ExecStart runs with the variables systemd would set (NOTIFY_SOCKET, WATCHDOG_USEC) and must send
READY=1, then WATCHDOG=1, and STOPPING=1 with exit code 0 on SIGTERM (a clean stop, which
Restart=on-failure leaves alone); a configuration error must exit with the status the unit lists
in RestartPreventExitStatus= (no restart loop on a typo).

WatchdogSec=60 would mean a ping every 30 s; the test gives the daemon a 2 s watchdog instead
(systemd passes WatchdogSec to the service as WATCHDOG_USEC, which is all the daemon reads).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO, SYSTEMD
from .test_systemd import INSTALLED_TABLETUNE, _directives, _tabletune_script

pytestmark = pytest.mark.integration

UNIT = SYSTEMD / "tabletune.service"
PROFILE = REPO / "examples" / "sample-profile.json"


def _exec_start() -> list[str]:
    (command,) = _directives(UNIT.read_text())["ExecStart"]
    return shlex.split(command.replace(INSTALLED_TABLETUNE, _tabletune_script()))


def _environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TABLETUNE_")}
    # What /etc/tabletune/tabletune.env would hold: one replica (nothing listens there: the
    # cycles report it and go on), the sample profile, no HTTP server, state in a temp folder.
    env.update(
        TABLETUNE_SOURCE__REPLICAS="http://127.0.0.1:9",
        TABLETUNE_PROFILE__PATHS=str(PROFILE),
        TABLETUNE_SERVER__PORT="0",
        TABLETUNE_STATE__DIR=str(tmp_path / "state"),
        TABLETUNE_LOOP__INTERVAL_S="1",
    )
    env.update(extra)
    return env


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    try:
        yield sock, path
    finally:
        sock.close()


def _receive_until(
    sock: socket.socket, wanted: set[str], process: subprocess.Popen[bytes], timeout_s: float
) -> list[str]:
    messages: list[str] = []
    deadline = time.monotonic() + timeout_s
    while not wanted <= set(messages) and time.monotonic() < deadline:
        try:
            messages.extend(sock.recv(4096).decode().splitlines())
        except TimeoutError:
            if process.poll() is not None:
                break
    return messages


def test_ready_watchdog_and_clean_stop(
    tmp_path: Path, notify_socket: tuple[socket.socket, str]
) -> None:
    sock, path = notify_socket
    env = _environment(tmp_path, NOTIFY_SOCKET=path, WATCHDOG_USEC="2000000")
    log = (tmp_path / "daemon.log").open("wb")
    process = subprocess.Popen(_exec_start(), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        started = _receive_until(sock, {"READY=1", "WATCHDOG=1"}, process, timeout_s=30.0)
        assert started[:1] == ["READY=1"], (tmp_path / "daemon.log").read_text()
        assert "WATCHDOG=1" in started
        process.send_signal(signal.SIGTERM)
        stopping = _receive_until(sock, {"STOPPING=1"}, process, timeout_s=15.0)
        assert "STOPPING=1" in stopping
        assert process.wait(timeout=15.0) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def test_bad_configuration_exits_with_the_status_the_unit_does_not_restart(
    tmp_path: Path,
) -> None:
    (status,) = _directives(UNIT.read_text())["RestartPreventExitStatus"]
    result = subprocess.run(
        _exec_start(),
        env=_environment(tmp_path, TABLETUNE_LOOP__INTERVAL_S="-1"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == int(status), result.stderr
    assert "TABLETUNE_LOOP__INTERVAL_S" in result.stderr
