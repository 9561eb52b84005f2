"""Runtime pieces: retries (one place, temporary errors only), sd_notify over a real unix
socket, the /metrics + /healthz server, atomic state files."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
import structlog
from prometheus_client.metrics import MetricWrapperBase

from tabletune.daemon.metrics import DaemonMetrics, MetricsServer
from tabletune.daemon.retry import with_retries
from tabletune.daemon.sdnotify import Notifier
from tabletune.daemon.state import DaemonState, ReplicaRecord, StateStore
from tabletune.errors import PermanentError, TemporaryError


def test_retries_follow_the_schedule_and_log_attempts() -> None:
    slept: list[float] = []
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise TemporaryError("HTTP 503")
        return "ok"

    with structlog.testing.capture_logs() as logs:
        assert (
            with_retries(flaky, what="PUT", backoffs_s=(1, 1, 2, 3, 5), sleep=slept.append) == "ok"
        )
    assert slept == [1, 1, 2]
    assert [entry["attempt"] for entry in logs] == ["1/6", "2/6", "3/6"]


def test_retries_give_up_with_the_last_error() -> None:
    slept: list[float] = []

    def down() -> None:
        raise TemporaryError("connection refused")

    with pytest.raises(TemporaryError, match="refused"):
        with_retries(down, what="GET", backoffs_s=(1, 2), sleep=slept.append)
    assert slept == [1, 2]


def test_permanent_errors_are_not_retried() -> None:
    slept: list[float] = []

    def refused() -> None:
        raise PermanentError("HTTP 422")

    with pytest.raises(PermanentError):
        with_retries(refused, what="PUT", backoffs_s=(1, 2), sleep=slept.append)
    assert slept == []


def test_sd_notify_writes_datagrams(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(2)
        notifier = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "20000000"})
        assert notifier.enabled and notifier.watchdog_s == 20.0
        assert notifier.ready() and notifier.watchdog()
        assert listener.recv(64) == b"READY=1"
        assert listener.recv(64) == b"WATCHDOG=1"


def test_sd_notify_is_a_no_op_outside_systemd() -> None:
    notifier = Notifier({})
    assert not notifier.enabled and notifier.watchdog_s is None
    assert notifier.ready() is False


def test_watchdog_for_another_pid_is_ignored() -> None:
    assert Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}).watchdog_s is None


def test_metrics_and_healthz_served() -> None:
    metrics = DaemonMetrics()
    metrics.set_table("r1", [(1, 64, 3), (65, 256, 1)], 7)
    metrics.set_table("r1", [(1, 256, 2)], 8)  # old ranges disappear
    healthy = [True]
    server = MetricsServer(
        registry=metrics.registry, healthy=lambda: healthy[0], host="127.0.0.1", port=0
    )
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        text = httpx.get(f"{base}/metrics").text
        assert (
            'tabletune_daemon_table_range_k{range_end="256",range_start="1",replica="r1"} 2.0'
            in text
        )
        assert 'range_start="65"' not in text
        assert 'tabletune_daemon_table_version{replica="r1"} 8.0' in text
        assert httpx.get(f"{base}/healthz").status_code == 200
        healthy[0] = False
        assert httpx.get(f"{base}/healthz").status_code == 503
        assert httpx.get(f"{base}/nope").status_code == 404
    finally:
        server.stop()


def _every_series(metrics: DaemonMetrics, replica: str) -> None:
    """One series of every family that belongs to a replica (or to its estimator unit)."""
    metrics.set_table(replica, [(1, 64, 3), (65, 256, 1)], 7)
    metrics.last_push.labels(replica).set(1.0)
    metrics.pushes.labels(replica, "ok").inc()
    metrics.rollbacks.labels(replica).inc()
    metrics.predicted_gain.labels(replica).set(0.02)
    metrics.set_step_time_ratios(replica, [(3, (17, 24), 1.1)])
    metrics.stale.labels(replica).set(0)
    metrics.alerts.labels("TableTuneStaleData", replica, "").set(1)
    metrics.acceptance.labels(replica, "1").set(0.8)
    metrics.acceptance_prior.labels(replica, "1").set(0.8)


def _series_of(metrics: DaemonMetrics, replica: str) -> list[str]:
    return [
        sample.name
        for family in metrics.registry.collect()
        for sample in family.samples
        if replica in (sample.labels.get("replica"), sample.labels.get("unit"))
    ]


def test_forgetting_a_replica_removes_every_series_of_it() -> None:
    metrics = DaemonMetrics()
    _every_series(metrics, "gone")
    _every_series(metrics, "kept")
    metrics.cycles.labels("ok").inc()
    before = _series_of(metrics, "kept")
    metrics.forget("gone")
    assert _series_of(metrics, "gone") == []
    assert _series_of(metrics, "kept") == before
    assert metrics.sample("tabletune_daemon_cycles_total", {"outcome": "ok"}) == 1
    # Its table comes back cleanly if it does.
    metrics.set_table("gone", [(1, 256, 2)], 1)
    assert (
        metrics.sample(
            "tabletune_daemon_table_range_k",
            {"replica": "gone", "range_start": "1", "range_end": "256"},
        )
        == 2
    )


def test_every_family_labelled_by_replica_is_forgotten() -> None:
    metrics = DaemonMetrics()
    labelled = {
        name
        for name, family in vars(metrics).items()
        if isinstance(family, MetricWrapperBase) and "replica" in family._labelnames
    }
    forgotten = {
        name
        for name, family in vars(metrics).items()
        if any(family is f for f, label in metrics.per_replica() if label == "replica")
    }
    assert labelled == forgotten


def test_state_round_trip_and_incompatible_file(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    state = DaemonState(replicas={"r1": ReplicaRecord(pushed=[[1, 8, 3]], version=4)})
    store.save(state)
    loaded, problem = store.load()
    assert problem is None and loaded.replicas["r1"].version == 4
    store.path.write_text('{"schema_version": 2, "kind": "tabletune.daemon-state"}')
    fresh, problem = store.load()
    assert problem is not None and "moved aside" in problem
    assert fresh == DaemonState()
    assert not store.path.exists()
    assert len(list(tmp_path.glob("daemon-state.json.bad-*"))) == 1
