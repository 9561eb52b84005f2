"""Hung replicas against the real ``tabletune daemon`` process and the emulator (one process,
one port per engine): the others' tables are repaired as if nothing hung, no false stale alert,
/healthz stays 200, and SIGTERM ends the daemon within 10 s (exit 0, state saved) whatever it
was waiting for: a hung scrape, a hung admin call, a retry's wait, or nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tabletune.daemon.state import StateStore
from tests.support.servers import SimServer, free_port, poll_until, sim_server

pytestmark = pytest.mark.integration
PROFILE = Path(__file__).resolve().parents[2] / "examples" / "sample-profile.json"
HEALTHY, HUNG_SCRAPE, HUNG_ADMIN, BUSY = range(4), 4, 5, 6
INTERVAL_S = 4.0  # cycle budget 3.2 s: scrapes until 1.6 s, admin calls until 3.2 s
SIGTERM_LIMIT_S = 10.0  # systemd's and Kubernetes' default stop timeouts are 30 s


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    workdir = tmp_path_factory.mktemp("sim")
    with sim_server(workdir, "repair", replicas=7, speed=20.0, profile=PROFILE) as server:
        faults = {
            HUNG_SCRAPE: {"metrics_delay_s": 600},
            HUNG_ADMIN: {"admin_latency_s": 600},
            BUSY: {"admin_error_status": 503},
        }
        for index, body in faults.items():
            httpx.post(f"{server.urls[index]}/sim/v1/faults", json=body).raise_for_status()
        yield server
        server.process.kill()  # its hung answers would hold a graceful stop for minutes


@contextmanager
def daemon(tmp_path: Path, replicas: list[str], **env: str) -> Iterator[tuple[Any, str, Path]]:
    port = free_port()
    settings = {
        "TABLETUNE_SOURCE__REPLICAS": ",".join(replicas),
        "TABLETUNE_PROFILE__PATHS": str(PROFILE),
        "TABLETUNE_STATE__DIR": str(tmp_path / "state"),
        "TABLETUNE_LOOP__INTERVAL_S": str(INTERVAL_S),
        # Longer than the cycle: the hung requests are still in flight when it ends.
        "TABLETUNE_SOURCE__TIMEOUT_S": "60",
        "TABLETUNE_ADMIN__TIMEOUT_S": "60",
        "TABLETUNE_SERVER__PORT": str(port),
        **{f"TABLETUNE_{k}": v for k, v in env.items()},
    }
    log_path = tmp_path / "daemon.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "tabletune.cli.main", "daemon"],
            env={**os.environ, **settings},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process, f"http://127.0.0.1:{port}", log_path
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def events(log_path: Path, name: str) -> list[dict[str, Any]]:
    lines = log_path.read_text().splitlines()
    return [
        e
        for e in (json.loads(line) for line in lines if line.startswith("{"))
        if e.get("event") == name
    ]


def cycle_starts(log_path: Path) -> list[float]:
    return [
        datetime.fromisoformat(e["timestamp"]).timestamp() - e["seconds"]
        for e in events(log_path, "cycle done")
    ]


def stop_and_time(process: Any) -> float:
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    return time.monotonic() - started


def metric(base: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.split()[-1])
    return None


def test_hung_replicas_delay_no_other(sim: SimServer, tmp_path: Path) -> None:
    urls = sim.urls
    with daemon(tmp_path, urls[: HUNG_ADMIN + 1]) as (process, base, log_path):
        poll_until(lambda: len(events(log_path, "cycle done")) >= 1, timeout_s=30, what="cycle")
        unhealthy: list[int] = []

        def repaired() -> bool:
            status = httpx.get(f"{base}/healthz").status_code
            if status != 200:
                unhealthy.append(status)
            return all(
                (t := httpx.get(f"{urls[i]}/sim/v1/truth", params={"last": 0}).json())["table"]
                == t["oracle_table"]
                for i in HEALTHY
            )

        poll_until(repaired, timeout_s=60, what="the healthy replicas' tables repaired")
        assert unhealthy == []
        for i in HEALTHY:
            assert metric(base, "tabletune_daemon_replica_stale", replica=urls[i]) == 0
        # The hung ones are their own problems, and nobody else's.
        assert metric(base, "tabletune_daemon_replica_stale", replica=urls[HUNG_SCRAPE]) == 1
        expected = {
            ("TableTuneStaleData", urls[HUNG_SCRAPE]),
            ("TableTunePushFailed", urls[HUNG_ADMIN]),
        }

        def firing() -> set[tuple[str, str]]:
            return {(e["alertname"], e["replica"]) for e in events(log_path, "alert firing")}

        poll_until(lambda: firing() >= expected, timeout_s=20, what="the hung ones' alerts")
        poll_until(lambda: len(events(log_path, "cycle done")) >= 5, timeout_s=30, what="cycles")
        assert firing() == expected
        # Every cycle ended within its budget (plus the CPU work after the last answer).
        durations = [e["seconds"] for e in events(log_path, "cycle done")]
        assert max(durations) < INTERVAL_S
        assert stop_and_time(process) <= SIGTERM_LIMIT_S


@pytest.mark.parametrize(
    ("into_cycle_s", "waiting_for"),
    [(0.8, "a hung scrape"), (2.4, "a hung admin call"), (3.7, "nothing (between cycles)")],
)
def test_sigterm_is_prompt_whatever_the_daemon_waits_for(
    sim: SimServer, tmp_path: Path, into_cycle_s: float, waiting_for: str
) -> None:
    urls = sim.urls
    with daemon(tmp_path, [urls[0], urls[HUNG_SCRAPE], urls[HUNG_ADMIN]]) as (process, _, log):
        # The scrape hangs from the first cycle, the admin call from the second (the first
        # only sets the scrape baseline); cycles start every INTERVAL_S from the first.
        first = poll_until(lambda: cycle_starts(log)[:1], timeout_s=30, what="a cycle")[0]
        target = first + INTERVAL_S + into_cycle_s
        time.sleep(max(0.0, target - time.time()))
        assert stop_and_time(process) <= SIGTERM_LIMIT_S, waiting_for
    assert events(log, "daemon stopped; state saved")
    assert StateStore(tmp_path / "state").load()[1] is None


def test_sigterm_during_a_retry_wait_is_prompt(sim: SimServer, tmp_path: Path) -> None:
    urls = sim.urls
    # The second cycle (8 s in) gets a 503, then waits 4 s before the next try (its 6.4 s
    # budget holds a 1 s try after that wait).
    env = {"LOOP__INTERVAL_S": "8", "ADMIN__TIMEOUT_S": "1", "ADMIN__RETRY_BACKOFFS_S": "4"}
    with daemon(tmp_path, [urls[0], urls[BUSY]], **env) as (process, _, log):
        poll_until(
            lambda: events(log, "temporary failure, retrying"), timeout_s=30, what="a retry wait"
        )
        assert stop_and_time(process) <= SIGTERM_LIMIT_S
    assert events(log, "daemon stopped; state saved")
