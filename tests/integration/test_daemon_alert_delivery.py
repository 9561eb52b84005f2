"""What a real Alertmanager holds while things go wrong around it: one-off alerts survive its
restart (the daemon re-sends them until they end), and a replica that left has its alerts
resolved once it is forgotten. The daemon scrapes the emulator directly (one process, one port
per engine)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tabletune.daemon.service import Daemon, build_daemon
from tabletune.daemon.settings import load_settings
from tests.support.servers import AlertmanagerServer, alertmanager, sim_server

pytestmark = pytest.mark.integration
PROFILE = Path(__file__).resolve().parents[2] / "examples" / "sample-profile.json"
CYCLE_S = 0.5
FORGET_AFTER_S = 3.0


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def start_daemon(stack: ExitStack, tmp_path: Path, replicas: list[str], am: str) -> Daemon:
    settings = load_settings(
        {
            "TABLETUNE_SOURCE__REPLICAS": ",".join(replicas),
            "TABLETUNE_PROFILE__PATHS": str(PROFILE),
            "TABLETUNE_STATE__DIR": str(tmp_path / "state"),
            "TABLETUNE_LOOP__INTERVAL_S": str(CYCLE_S),
            "TABLETUNE_LOOP__FORGET_AFTER_S": str(FORGET_AFTER_S),
            "TABLETUNE_ALERTS__ALERTMANAGER_URL": am,
            "TABLETUNE_SERVER__PORT": "0",
        }
    )
    daemon = build_daemon(settings)
    stack.callback(daemon.close)
    return daemon


def cycles_until(daemon: Daemon, done: object, *, at_most: int, what: str) -> None:
    for _ in range(at_most):
        time.sleep(CYCLE_S)
        daemon.safe_cycle()
        if done():  # type: ignore[operator]
            return
    raise AssertionError(f"{what}: not reached in {at_most} cycles")


def held(am: AlertmanagerServer, name: str) -> dict[str, dict[str, object]]:
    """Active alerts named ``name`` by replica."""
    return {a["labels"]["replica"]: a for a in am.alerts() if a["labels"]["alertname"] == name}


def test_events_survive_an_alertmanager_restart(stack: ExitStack, tmp_path: Path) -> None:
    am = stack.enter_context(alertmanager(tmp_path))
    sim = stack.enter_context(sim_server(tmp_path, "repair", replicas=2, speed=20, profile=PROFILE))
    daemon = start_daemon(stack, tmp_path, sim.urls, am.url)
    cycles_until(
        daemon,
        lambda: set(held(am, "TableTuneTableShifted")) == set(sim.urls),
        at_most=30,
        what="both tables pushed",
    )
    pushed = held(am, "TableTuneTableShifted")
    am.process.terminate()
    am.process.wait(timeout=30)
    restarted = stack.enter_context(alertmanager(tmp_path, port=am.port))
    assert restarted.alerts() == []  # Alertmanager keeps alerts in memory only
    daemon.safe_cycle()
    again = held(restarted, "TableTuneTableShifted")
    assert set(again) == set(sim.urls)
    for replica, alert in again.items():  # the same alerts: same start, end and annotations
        for field in ("startsAt", "endsAt", "annotations"):
            assert alert[field] == pushed[replica][field]


def test_a_replica_that_left_has_its_alerts_resolved(stack: ExitStack, tmp_path: Path) -> None:
    am = stack.enter_context(alertmanager(tmp_path))
    sim = stack.enter_context(sim_server(tmp_path, "repair", replicas=2, speed=20, profile=PROFILE))
    stay, leave = sim.urls
    daemon = start_daemon(stack, tmp_path, sim.urls, am.url)
    cycles_until(
        daemon,
        lambda: daemon.controller.replicas.keys() == {stay, leave},
        at_most=10,
        what="both replicas observed",
    )
    # It leaves: nothing answers on its address any more. The daemon last had its data in the
    # cycle just before: forgetting it counts from there, not from when the stale-data alert
    # came (on a loaded machine that took three cycles, and the replica was forgotten 1.6 s
    # after the alert, 3 s after it left).
    left_at = time.monotonic()
    httpx.post(f"{leave}/sim/v1/faults", json={"metrics_outage": True}).raise_for_status()
    cycles_until(
        daemon,
        lambda: leave in held(am, "TableTuneStaleData"),
        at_most=10,
        what="its stale-data alert",
    )
    cycles_until(
        daemon,
        lambda: leave not in daemon.controller.replicas,
        at_most=20,
        what="the replica forgotten",
    )
    assert time.monotonic() - left_at >= FORGET_AFTER_S - 2 * CYCLE_S
    assert leave not in held(am, "TableTuneStaleData")  # resolved in Alertmanager
    series = [  # the daemon's own series of it are gone too
        s
        for family in daemon.metrics.registry.collect()
        for s in family.samples
        if s.labels.get("replica") == leave
    ]
    assert series == []
    # Still unanswered: no new alert for it while it stays away.
    for _ in range(4):
        time.sleep(CYCLE_S)
        daemon.safe_cycle()
    assert leave not in held(am, "TableTuneStaleData")
    assert stay in daemon.controller.replicas and not held(am, "TableTuneStaleData")
