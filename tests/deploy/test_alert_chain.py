"""The shipped Prometheus config, rules and Alertmanager routing, end to end with the real
servers: a metric changes on a /metrics endpoint -> Prometheus (deploy/prometheus/prometheus.yml
with deploy/prometheus/rules/tabletune.rules.yml) fires -> Alertmanager
(deploy/alertmanager/alertmanager.yml) routes it -> the receiver's webhook gets it.

Only what a test needs is changed in copies of the shipped files: scrape/evaluation every second,
targets and webhook URLs on free local ports, Alertmanager's waits shortened.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from tabletune.daemon import alerts
from tabletune.daemon.settings import AlertSettings
from tests.support.servers import alertmanager, prometheus

from .conftest import DEPLOY

pytestmark = pytest.mark.integration

RULES = DEPLOY / "prometheus" / "rules" / "tabletune.rules.yml"
# Rollback is critical (pager); a table change is info (chat).
EXPECTED = {"TableTuneRollback": {"/page"}, "TableTuneTableShifted": {"/chat"}}


@dataclass
class FakeEndpoints:
    """/metrics with settable text; any POST is recorded as (path, JSON body)."""

    metrics: str = ""
    posts: list[tuple[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def endpoints() -> Iterator[tuple[FakeEndpoints, int]]:
    state = FakeEndpoints()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.lock:
                body = state.metrics.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            payload = json.loads(self.rfile.read(length) or b"null")
            with state.lock:
                state.posts.append((self.path, payload))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _prometheus_config(fake: str, alertmanager_address: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(RULES)]
    config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [alertmanager_address]}]
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [fake]}]
    return config


def _alertmanager_config(webhook_base: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(
        (DEPLOY / "alertmanager" / "alertmanager.yml").read_text()
    )

    def shorten(route: dict[str, Any]) -> None:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = "1s" if key == "group_interval" else "0s"
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    for receiver in config["receivers"]:
        for webhook in receiver.get("webhook_configs", []):
            path = webhook["url"].split("/", 3)[3]
            webhook["url"] = f"{webhook_base}/{path}"
    return config


def _received(state: FakeEndpoints) -> dict[str, set[str]]:
    """alertname -> receiver paths it was posted to."""
    out: dict[str, set[str]] = {}
    with state.lock:
        for path, payload in state.posts:
            for alert in payload["alerts"]:
                out.setdefault(alert["labels"]["alertname"], set()).add(path)
    return out


def test_rollback_pages_and_table_change_goes_to_chat(
    tmp_path: Path, endpoints: tuple[FakeEndpoints, int]
) -> None:
    state, port = endpoints
    state.metrics = (
        'tabletune_daemon_rollbacks_total{replica="a:8000"} 0\n'
        'tabletune_table_version{engine="0",model_name="m"} 7\n'
    )
    base = f"http://127.0.0.1:{port}"
    with alertmanager(tmp_path, config=_alertmanager_config(base)) as am:
        config = _prometheus_config(f"127.0.0.1:{port}", am.address)
        with prometheus(tmp_path, config=config) as prom:
            prom.wait_for_samples("tabletune_daemon_rollbacks_total", minimum=2)
            assert not _received(state)
            with state.lock:  # the guard rolls a table back; the plugin shows a new version
                state.metrics = (
                    'tabletune_daemon_rollbacks_total{replica="a:8000"} 1\n'
                    'tabletune_table_version{engine="0",model_name="m"} 8\n'
                )

            def both_delivered() -> dict[str, set[str]] | None:
                received = _received(state)
                return received if received.keys() >= set(EXPECTED) else None

            received = prom.wait_for(both_delivered, timeout_s=30.0, what="alerts at the webhook")
    assert {name: received[name] for name in EXPECTED} == EXPECTED


def test_alerts_posted_by_the_daemon_reach_the_same_receivers(
    tmp_path: Path, endpoints: tuple[FakeEndpoints, int]
) -> None:
    # The Prometheus-less path: the daemon's own client posts to the shipped routing.
    state, port = endpoints
    expected = {
        alerts.ROLLBACK: {"/page"},
        alerts.ACCEPTANCE_DRIFT: {"/ticket"},
        alerts.TABLE_SHIFTED: {"/chat"},
    }
    with alertmanager(tmp_path, config=_alertmanager_config(f"http://127.0.0.1:{port}")) as am:
        client = alerts.AlertmanagerClient(settings=AlertSettings(alertmanager_url=am.url))
        now = time.time()
        try:
            client.post(
                [
                    alerts.to_alertmanager(
                        alerts.Alert(name, "test", replica="a:8000"),
                        starts_at=now,
                        ends_at=now + 600,
                    )
                    for name in expected
                ]
            )
        finally:
            client.close()
        deadline = time.monotonic() + 30.0
        while not _received(state).keys() >= expected.keys() and time.monotonic() < deadline:
            time.sleep(0.1)
    received = _received(state)
    assert {name: received.get(name) for name in expected} == expected
