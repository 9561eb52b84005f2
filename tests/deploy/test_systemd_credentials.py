"""systemd/: the admin token reaches vLLM and the daemon as a systemd credential that must exist
(never an optional EnvironmentFile=-), and the daemon's configuration errors (an unusable token, a
busy /metrics port) end with the exit status the unit does not restart on, in one line."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tabletune.admin.auth import TOKEN_FILE_ENV

from .test_systemd import DROP_IN, UNIT, _directives
from .test_systemd_contract import _environment, _exec_start

TOKEN_SOURCE = "/etc/tabletune/admin-token"


@pytest.mark.parametrize("path", [UNIT, DROP_IN], ids=["unit", "drop-in"])
def test_the_token_is_a_credential_that_must_exist(path: Path) -> None:
    directives = _directives(path.read_text())
    assert not [f for f in directives.get("EnvironmentFile", []) if f.startswith("-")]
    [credential] = directives["LoadCredential"]
    name, _, source = credential.partition(":")
    assert source == TOKEN_SOURCE  # the same root-only file for both
    environment = dict(value.split("=", 1) for value in directives["Environment"])
    assert environment[TOKEN_FILE_ENV] == f"%d/{name}"  # %d: the credentials directory


def _run_daemon(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _exec_start(), env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _restart_prevented() -> int:
    (status,) = _directives(UNIT.read_text())["RestartPreventExitStatus"]
    return int(status)


@pytest.mark.integration
def test_a_missing_token_file_stops_the_daemon_for_good(tmp_path: Path) -> None:
    env = _environment(tmp_path, **{TOKEN_FILE_ENV: str(tmp_path / "missing")})
    result = _run_daemon(env)
    assert result.returncode == _restart_prevented(), result.stderr
    assert TOKEN_FILE_ENV in result.stderr and "Traceback" not in result.stderr


@pytest.mark.integration
def test_a_busy_metrics_port_stops_the_daemon_for_good_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = _environment(tmp_path, TABLETUNE_SERVER__PORT=str(port), PYTHONWARNINGS="ignore")
        result = _run_daemon(env)
    assert result.returncode == _restart_prevented(), result.stderr
    errors = [line for line in result.stderr.splitlines() if "tabletune: error" in line]
    assert errors == [
        f"tabletune: error: cannot serve /metrics on 127.0.0.1:{port}: Address already in use "
        "(TABLETUNE_SERVER__HOST, TABLETUNE_SERVER__PORT)"
    ]
    assert "Traceback" not in result.stderr
