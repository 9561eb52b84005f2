"""``tabletune daemon`` as systemd runs it: READY=1 and WATCHDOG=1 on $NOTIFY_SOCKET, JSON
logs, /healthz and /metrics, a push to the emulator, then SIGTERM -> state saved, exit 0."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tabletune.daemon.state import StateStore
from tabletune.demo.emulator import emulator
from tests.support.servers import free_port, poll_until

pytestmark = pytest.mark.integration
PROFILE = Path(__file__).resolve().parents[2] / "examples" / "sample-profile.json"
TOKEN = "not-in-the-logs-0123456789"


def test_systemd_style_run_and_clean_sigterm(tmp_path: Path) -> None:
    notify_path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify_path))
    listener.settimeout(0.2)
    port = free_port()
    with emulator(scenario="repair", profile=PROFILE, speed=20.0, admin_token=TOKEN) as sim:
        env = {
            **os.environ,
            "NOTIFY_SOCKET": str(notify_path),
            "WATCHDOG_USEC": "1000000",
            "TABLETUNE_SOURCE__REPLICAS": sim,
            "TABLETUNE_PROFILE__PATHS": str(PROFILE),
            "TABLETUNE_STATE__DIR": str(tmp_path / "state"),
            "TABLETUNE_LOOP__INTERVAL_S": "0.5",
            "TABLETUNE_SERVER__HOST": "127.0.0.1",
            "TABLETUNE_SERVER__PORT": str(port),
            "TABLETUNE_ADMIN_TOKEN": TOKEN,
        }
        log_path = tmp_path / "daemon.log"
        with log_path.open("wb") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "tabletune.cli.main", "daemon"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                messages: list[bytes] = []

                def heard(message: bytes) -> bool:
                    with contextlib.suppress(TimeoutError):
                        messages.append(listener.recv(64))
                    return message in messages

                poll_until(lambda: heard(b"READY=1"), timeout_s=20, what="READY=1")
                poll_until(lambda: heard(b"WATCHDOG=1"), timeout_s=10, what="WATCHDOG=1")
                base = f"http://127.0.0.1:{port}"
                assert httpx.get(f"{base}/healthz").status_code == 200

                def converged() -> bool:
                    truth = httpx.get(f"{sim}/sim/v1/truth", params={"last": 0}).json()
                    return bool(truth["table"] == truth["oracle_table"])

                poll_until(converged, timeout_s=20, what="the oracle table pushed")
                metrics = httpx.get(f"{base}/metrics").text
                assert 'tabletune_daemon_pushes_total{outcome="ok"' in metrics
                assert "tabletune_daemon_cycles_total" in metrics
                daemon.send_signal(signal.SIGTERM)
                assert daemon.wait(timeout=15) == 0
                poll_until(lambda: heard(b"STOPPING=1"), timeout_s=5, what="STOPPING=1")
            finally:
                if daemon.poll() is None:
                    daemon.kill()
                    daemon.wait()
    listener.close()
    state, problem = StateStore(tmp_path / "state").load()
    assert problem is None
    assert state.units and next(iter(state.replicas.values())).pushed is not None
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    events = [line["event"] for line in lines]
    assert "effective configuration" in events and "daemon stopped; state saved" in events
    assert TOKEN not in log_path.read_text()
